//! The request side of function calling: the `tools` a request offers and its `tool_choice`,
//! checked, and the tools as a template (or, for a template that shows none, a system message)
//! presents them to the model.

use super::error::Error;
use super::types::Tool;
use serde_json::{json, Value};

/// What the request allows: `none` (tools ignored), `auto` (the model may call), or a call
/// is required, of any tool or of one named tool.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

/// The request's `tool_choice` over its `tools` (`auto` where there are tools, else `none`).
pub fn parse_choice(v: Option<&Value>, tools: &[Tool]) -> Result<Choice, Error> {
    let bad = |m: String| Error::new("tool_choice", m);
    let choice = match v {
        None => {
            if tools.is_empty() {
                Choice::None
            } else {
                Choice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => return Err(bad(format!("unknown tool_choice '{other}'"))),
        },
        Some(obj @ Value::Object(_)) => {
            let name = obj
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice must name a function".into()))?;
            Choice::Named(name.to_string())
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object".into())),
    };
    if choice != Choice::None && tools.is_empty() {
        return Err(bad("tool_choice needs tools".into()));
    }
    if let Choice::Named(n) = &choice {
        if !tools.iter().any(|t| &t.function.name == n) {
            return Err(bad(format!(
                "tool_choice names '{n}', which is not in tools"
            )));
        }
    }
    Ok(choice)
}

/// Each tool is a function with a usable name and an object schema.
pub fn check_tools(tools: &[Tool]) -> Result<(), Error> {
    for t in tools {
        if t.kind != "function" {
            return Err(Error::new(
                "tools",
                format!("tool type '{}' is not supported (function only)", t.kind),
            ));
        }
        let n = &t.function.name;
        if n.is_empty()
            || n.len() > 64
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(Error::new(
                "tools",
                format!("tool name '{n}' must be 1 to 64 of a-z, A-Z, 0-9, _ and -"),
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(Error::new(
                    "tools",
                    format!("the parameters of tool '{n}' must be a JSON schema object"),
                ));
            }
        }
    }
    Ok(())
}

/// The tools as the template receives them (OpenAI's shape).
pub fn template_tools(tools: &[Tool]) -> Value {
    Value::Array(
        tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {
                    "name": t.function.name,
                    "description": t.function.description.clone().unwrap_or_default(),
                    "parameters": t.function.parameters(),
                }})
            })
            .collect(),
    )
}

/// The system text that teaches a model whose template has no tool syntax the generic form.
pub fn generic_instructions(tools: &[Tool], parallel: bool) -> String {
    let list: Vec<Value> = tools
        .iter()
        .map(|t| {
            json!({"name": t.function.name, "description": t.function.description.clone().unwrap_or_default(), "parameters": t.function.parameters()})
        })
        .collect();
    format!(
        "You can call these tools:\n{}\nTo call {}, answer with only this JSON: \
         {{\"tool_calls\": [{{\"name\": \"<tool name>\", \"arguments\": {{<arguments>}}}}]}}",
        serde_json::to_string_pretty(&list).unwrap_or_default(),
        if parallel { "tools" } else { "a tool" }
    )
}

/// The tools a call may name: the named one, or all.
pub fn allowed(tools: &[Tool], choice: &Choice) -> Vec<Tool> {
    match choice {
        Choice::Named(n) => tools
            .iter()
            .filter(|t| &t.function.name == n)
            .cloned()
            .collect(),
        _ => tools.to_vec(),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Two tools: `get_weather(city)` and `set_lamp(on)`.
    pub(in crate::chat) fn tools() -> Vec<Tool> {
        serde_json::from_value(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "set_lamp", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}}}}
        ]))
        .unwrap()
    }

    #[test]
    fn choice_is_checked_against_the_tools() {
        let t = tools();
        assert_eq!(parse_choice(None, &t).unwrap(), Choice::Auto);
        assert_eq!(parse_choice(None, &[]).unwrap(), Choice::None);
        assert_eq!(
            parse_choice(
                Some(&json!({"type": "function", "function": {"name": "set_lamp"}})),
                &t
            )
            .unwrap(),
            Choice::Named("set_lamp".into())
        );
        assert!(parse_choice(Some(&json!("sometimes")), &t).is_err());
        assert!(parse_choice(Some(&json!({"function": {"name": "nope"}})), &t).is_err());
        assert!(parse_choice(Some(&json!("required")), &[]).is_err());
    }
}
