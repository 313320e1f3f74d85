//! Function calling: the request's `tools` and `tool_choice`, the call syntax the model's chat
//! template speaks, the grammar that forces a call when one is required, and the parser that
//! finds calls in the generated text.
//!
//! Five syntaxes, chosen from the template:
//! - Hermes/Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call;
//! - Llama 3.x: a bare `{"name": ..., "parameters": {...}}` object;
//! - harmony (gpt-oss): a message `<|channel|>commentary to=functions.NAME <|constrain|>json
//!   <|message|>{...}<|call|>`, split with the rest of the answer by `harmony`;
//! - Mistral: `[TOOL_CALLS]` and a JSON list of `{"name": ..., "arguments": {...}}` (Nemo,
//!   Magistral), or `[TOOL_CALLS]NAME[ARGS]{...}` per call (newer templates);
//! - generic, for templates with no syntax of their own: `{"tool_calls": [{"name": ...,
//!   "arguments": {...}}]}`, taught to the model by a system message edgelm adds.

use super::call_scan::{Lexed, Region, MISTRAL_ARGS, MISTRAL_CALLS, MISTRAL_CALL_ID};
use super::error::ApiError;
use super::harmony_grammar::{self, Markers};
use crate::grammar::ConstraintSpec;
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Function,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

impl Function {
    /// The arguments' schema (an object with any fields when the tool declares none).
    pub fn parameters(&self) -> Value {
        self.parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object"}))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    Hermes,
    Llama3,
    Harmony,
    Mistral,
    Generic,
}

impl Syntax {
    /// The syntax a chat template teaches its model.
    pub fn of_template(source: &str) -> Syntax {
        if source.contains("<|channel|>") && source.contains("<|call|>") {
            Syntax::Harmony
        } else if source.contains(MISTRAL_CALLS) {
            Syntax::Mistral
        } else if source.contains("<tool_call>") {
            Syntax::Hermes
        } else if source.contains("<|python_tag|>") || source.contains("\"parameters\"") {
            Syntax::Llama3
        } else {
            Syntax::Generic
        }
    }

    /// Does the template render `tools` itself? Otherwise edgelm describes them.
    pub fn template_shows_tools(source: &str) -> bool {
        source.contains("tools")
    }
}

/// What the request allows: `none` (tools ignored), `auto` (the model may call), or a call
/// is required, of any tool or of one named tool.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    None,
    Auto,
    Required,
    Named(String),
}

pub fn parse_choice(v: Option<&Value>, tools: &[Tool]) -> Result<Choice, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).param("tool_choice");
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

pub fn check_tools(tools: &[Tool]) -> Result<(), ApiError> {
    for t in tools {
        if t.kind != "function" {
            return Err(ApiError::bad_request(format!(
                "tool type '{}' is not supported (function only)",
                t.kind
            ))
            .param("tools"));
        }
        let n = &t.function.name;
        if n.is_empty()
            || n.len() > 64
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(ApiError::bad_request(format!(
                "tool name '{n}' must be 1 to 64 of a-z, A-Z, 0-9, _ and -"
            ))
            .param("tools"));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::bad_request(format!(
                    "the parameters of tool '{n}' must be a JSON schema object"
                ))
                .param("tools"));
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

/// The markers of Mistral's call syntax (control tokens in Mistral vocabularies).
pub const MISTRAL_MARKERS: [&str; 3] = [MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID];

/// One call's JSON in `syntax` (the key its arguments go under).
fn call_schema(syntax: Syntax, t: &Tool) -> Value {
    let args_key = if syntax == Syntax::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    json!({
        "type": "object",
        "properties": {"name": {"const": t.function.name}, args_key: t.function.parameters()},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// The grammar that makes the output a call (of the named tool, or of any tool), so that the
/// arguments always validate. `None` when nothing is forced. `markers`: how the vocabulary
/// holds harmony's markers (harmony only).
pub fn forcing_grammar(
    syntax: Syntax,
    tools: &[Tool],
    choice: &Choice,
    parallel: bool,
    markers: &Markers,
) -> Option<ConstraintSpec> {
    if matches!(choice, Choice::None | Choice::Auto) {
        return None;
    }
    let allowed = allowed(tools, choice);
    let allowed: Vec<&Tool> = allowed.iter().collect();
    let one = json!({"anyOf": allowed.iter().map(|t| call_schema(syntax, t)).collect::<Vec<_>>()});
    // Parallel calls only where a call may be of any tool, and at most one per tool offered:
    // a small model left an open-ended list keeps adding calls until its tokens run out.
    let most = if parallel && matches!(choice, Choice::Required) {
        allowed.len()
    } else {
        1
    };
    Some(match syntax {
        // One call per answer: `<|call|>` ends it.
        Syntax::Harmony => harmony_grammar::forced_call(&allowed, markers),
        Syntax::Hermes => {
            let rep = " (\"\\n\" call)?".repeat(most - 1);
            ConstraintSpec::Lark(format!(
                "start: call{rep}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {}\n",
                crate::grammar::schema_as_generated(&one)
            ))
        }
        Syntax::Llama3 => ConstraintSpec::JsonSchema(one),
        Syntax::Mistral => mistral_grammar(&allowed, &one, most, markers),
        Syntax::Generic => {
            let calls = json!({"type": "array", "items": one, "minItems": 1, "maxItems": most});
            ConstraintSpec::JsonSchema(json!({
                "type": "object",
                "properties": {"tool_calls": calls},
                "required": ["tool_calls"],
                "additionalProperties": false,
            }))
        }
    })
}

/// Mistral's calls in either of its forms (the model takes the one its template taught it):
/// `[TOOL_CALLS]` and a JSON list, or `[TOOL_CALLS]NAME[ARGS]{...}` per call.
fn mistral_grammar(
    allowed: &[&Tool],
    one: &Value,
    most: usize,
    markers: &Markers,
) -> ConstraintSpec {
    let calls = markers.lit(MISTRAL_CALLS);
    let list = json!({"type": "array", "items": one, "minItems": 1, "maxItems": most});
    let named: Vec<String> = allowed
        .iter()
        .map(|t| {
            format!(
                "{calls} \"{}\" {} %json {}",
                t.function.name,
                markers.lit(MISTRAL_ARGS),
                crate::grammar::schema_as_generated(&t.function.parameters())
            )
        })
        .collect();
    ConstraintSpec::Lark(format!(
        "start: list | named{}\nlist: {calls} %json {}\nnamed: {}\n",
        " named?".repeat(most - 1),
        crate::grammar::schema_as_generated(&list),
        named.join(" | ")
    ))
}

/// A call found in the output.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

/// Splits finished output into its text and its calls. Calls that do not parse, or name a
/// tool the request did not offer, stay text.
pub fn parse_calls(syntax: Syntax, text: &str, tools: &[Tool]) -> (String, Vec<Call>) {
    let known = |n: &str| tools.iter().any(|t| t.function.name == n);
    let call_of = |v: &Value, args_keys: &[&str]| -> Option<Call> {
        let name = v.get("name")?.as_str()?;
        let args = args_keys.iter().find_map(|k| v.get(*k))?;
        (known(name) && args.is_object()).then(|| Call {
            name: name.to_string(),
            arguments: args.to_string(),
        })
    };
    match syntax {
        Syntax::Harmony => {
            let mut h = super::harmony::HarmonyOutput::new(tools.to_vec());
            let mut deltas = h.push(text);
            deltas.extend(h.finish());
            let mut rest = String::new();
            let mut calls = Vec::new();
            for d in deltas {
                match d {
                    super::chat_output::Delta::Content(t) => rest.push_str(&t),
                    super::chat_output::Delta::Call(_, c) => calls.push(c),
                    _ => {}
                }
            }
            (rest, calls)
        }
        Syntax::Hermes => {
            let mut rest = String::new();
            let mut calls = Vec::new();
            let mut s = text;
            while let Some(open) = s.find("<tool_call>") {
                let after = &s[open + "<tool_call>".len()..];
                let Some(close) = after.find("</tool_call>") else {
                    break;
                };
                match serde_json::from_str::<Value>(after[..close].trim())
                    .ok()
                    .and_then(|v| call_of(&v, &["arguments", "parameters"]))
                {
                    Some(c) => {
                        rest.push_str(&s[..open]);
                        calls.push(c);
                    }
                    None => rest.push_str(&s[..open + "<tool_call>".len() + close + 12]),
                }
                s = &after[close + "</tool_call>".len()..];
            }
            rest.push_str(s);
            if calls.is_empty() {
                (text.to_string(), calls)
            } else {
                (rest.trim().to_string(), calls)
            }
        }
        Syntax::Mistral => parse_mistral(text, tools),
        Syntax::Llama3 | Syntax::Generic => {
            let body = text.trim().trim_start_matches("<|python_tag|>").trim();
            let Ok(v) = serde_json::from_str::<Value>(body) else {
                return (text.to_string(), Vec::new());
            };
            let calls: Option<Vec<Call>> = if let Some(list) = v.get("tool_calls") {
                list.as_array().and_then(|l| {
                    l.iter()
                        .map(|c| call_of(c, &["arguments", "parameters"]))
                        .collect()
                })
            } else {
                call_of(&v, &["parameters", "arguments"]).map(|c| vec![c])
            };
            match calls {
                Some(c) if !c.is_empty() => (String::new(), c),
                _ => (text.to_string(), Vec::new()),
            }
        }
    }
}

/// Mistral's calls: each `[TOOL_CALLS]` region whose calls are complete and name offered
/// tools; the text before the first is the rest (other regions stay text).
fn parse_mistral(text: &str, tools: &[Tool]) -> (String, Vec<Call>) {
    let known = |n: &str| tools.iter().any(|t| t.function.name == n);
    let mut rest = String::new();
    let mut calls = Vec::new();
    let mut s = text;
    while let Some(open) = s.find(MISTRAL_CALLS) {
        rest.push_str(&s[..open]);
        s = &s[open..];
        let r = Region::of(Syntax::Mistral, s);
        let found: Option<Vec<Call>> = r
            .calls
            .iter()
            .map(|p| {
                let (name, true) = p.name.clone()? else {
                    return None;
                };
                let (start, Lexed::Done(n)) = p.args.clone()? else {
                    return None;
                };
                let args = &s[start..start + n];
                let object = serde_json::from_str::<Value>(args).ok()?.is_object();
                (known(&name) && object).then(|| Call {
                    name,
                    arguments: args.to_string(),
                })
            })
            .collect();
        match (r.end, found) {
            (Some(end), Some(found)) if !found.is_empty() => {
                calls.extend(found);
                s = &s[end..];
            }
            _ => {
                rest.push_str(MISTRAL_CALLS);
                s = &s[MISTRAL_CALLS.len()..];
            }
        }
    }
    rest.push_str(s);
    if calls.is_empty() {
        (text.to_string(), calls)
    } else {
        (rest.trim().to_string(), calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools() -> Vec<Tool> {
        serde_json::from_value(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "set_lamp", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}}}}
        ]))
        .unwrap()
    }

    #[test]
    fn hermes_calls_are_found_and_the_rest_is_text() {
        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (text, calls) = parse_calls(Syntax::Hermes, out, &tools());
        assert_eq!(text, "Let me check.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"city": "Oslo"})
        );
    }

    #[test]
    fn unknown_tools_and_bad_json_stay_text() {
        let out = "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>";
        assert!(parse_calls(Syntax::Hermes, out, &tools()).1.is_empty());
        assert!(parse_calls(Syntax::Generic, "{\"tool_calls\": [", &tools())
            .1
            .is_empty());
        let (text, calls) = parse_calls(Syntax::Generic, "hello", &tools());
        assert_eq!((text.as_str(), calls.len()), ("hello", 0));
    }

    #[test]
    fn generic_and_llama3_forms() {
        let g = r#"{"tool_calls": [{"name": "set_lamp", "arguments": {"on": true}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]}"#;
        let (_, calls) = parse_calls(Syntax::Generic, g, &tools());
        assert_eq!(calls.len(), 2);
        let l = r#"<|python_tag|>{"name": "set_lamp", "parameters": {"on": false}}"#;
        let (text, calls) = parse_calls(Syntax::Llama3, l, &tools());
        assert_eq!((text.as_str(), calls[0].name.as_str()), ("", "set_lamp"));
    }

    #[test]
    fn mistral_forms() {
        let list = r#"[TOOL_CALLS][{"name": "set_lamp", "arguments": {"on": true}, "id": "abc123def"}, {"name": "get_weather", "arguments": {"city": "Rome"}}]"#;
        let (text, calls) = parse_calls(Syntax::Mistral, list, &tools());
        assert_eq!((text.as_str(), calls.len()), ("", 2));
        assert_eq!(calls[1].arguments, r#"{"city": "Rome"}"#);
        let named = r#"Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]set_lamp[ARGS]{"on": false}"#;
        let (text, calls) = parse_calls(Syntax::Mistral, named, &tools());
        assert_eq!((text.as_str(), calls.len()), ("Checking.", 2));
        let bad = "[TOOL_CALLS]launch[ARGS]{}";
        assert_eq!(parse_calls(Syntax::Mistral, bad, &tools()).0, bad);
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

    #[test]
    fn syntax_follows_the_template() {
        assert_eq!(Syntax::of_template("{{ '<tool_call>' }}"), Syntax::Hermes);
        assert_eq!(Syntax::of_template("<|python_tag|>"), Syntax::Llama3);
        assert_eq!(Syntax::of_template("<|im_start|>"), Syntax::Generic);
        let mistral = "{%- if message.tool_calls %}{{- '[TOOL_CALLS]' }}{%- for t in message.tool_calls %}{{- t.function.name + '[ARGS]' + t.function.arguments|tojson }}{%- endfor %}{%- endif %}";
        assert_eq!(Syntax::of_template(mistral), Syntax::Mistral);
        let gpt_oss = include_str!("../../tests/data/gpt-oss-chat-template.jinja");
        assert_eq!(Syntax::of_template(gpt_oss), Syntax::Harmony);
        assert!(forcing_grammar(
            Syntax::Generic,
            &tools(),
            &Choice::Auto,
            true,
            &Markers::default()
        )
        .is_none());
    }
}

#[cfg(test)]
mod grammar_tests {
    use super::*;
    use crate::grammar::Grammars;
    use crate::tokenizer::Tokenizer;

    #[test]
    fn forcing_grammars_compile_and_accept_a_call_in_each_syntax() {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let g = Grammars::new(&tok).unwrap();
        let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function", "function": {"name": "lamp", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}])).unwrap();
        for (syntax, text) in [
            (
                Syntax::Hermes,
                "<tool_call>\n{\"name\": \"lamp\", \"arguments\": {\"on\": true}}\n</tool_call>",
            ),
            (
                Syntax::Llama3,
                "{\"name\": \"lamp\", \"parameters\": {\"on\": false}}",
            ),
            (
                Syntax::Generic,
                "{\"tool_calls\": [{\"name\": \"lamp\", \"arguments\": {\"on\": true}}]}",
            ),
            (
                Syntax::Harmony,
                "<|channel|>commentary to=functions.lamp <|constrain|>json<|message|>{\"on\": true}<|call|>",
            ),
            (
                Syntax::Mistral,
                "[TOOL_CALLS][{\"name\": \"lamp\", \"arguments\": {\"on\": true}}]",
            ),
            (Syntax::Mistral, "[TOOL_CALLS]lamp[ARGS]{\"on\": false}"),
        ] {
            let spec =
                forcing_grammar(syntax, &tools, &Choice::Required, true, &Markers::of(&tok))
                    .unwrap();
            let mut c = g
                .compile(&spec)
                .unwrap_or_else(|e| panic!("{syntax:?}: {e}"));
            let eog = c.eog().to_vec();
            for t in tok.encode(text, false).unwrap() {
                assert!(c.mask().unwrap().allows(t, &eog), "{syntax:?}: {text}");
                c.accept(t).unwrap();
            }
            assert!(c.mask().unwrap().allows(eog[0], &eog), "{syntax:?} may end");
            assert_eq!(parse_calls(syntax, text, &tools).1.len(), 1);
        }
    }

    #[test]
    fn mistral_markers_that_are_tokens_are_forced_as_tokens() {
        let tok = super::super::harmony_grammar::tests::with_markers(&MISTRAL_MARKERS);
        let g = Grammars::new(&tok).unwrap();
        let markers = Markers::of_list(&tok, &MISTRAL_MARKERS);
        assert_eq!(markers.ids().len(), 3);
        let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function", "function": {"name": "lamp", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}])).unwrap();
        let spec =
            forcing_grammar(Syntax::Mistral, &tools, &Choice::Required, true, &markers).unwrap();
        let ids = tok
            .encode("[TOOL_CALLS]lamp[ARGS]{\"on\": true}", false)
            .unwrap();
        assert_eq!(ids[0], markers.ids()[0], "the marker is one token");
        let mut c = g.compile(&spec).unwrap();
        let eog = c.eog().to_vec();
        for t in ids {
            assert!(c.mask().unwrap().allows(t, &eog));
            c.accept(t).unwrap();
        }
        assert!(c.mask().unwrap().allows(eog[0], &eog));
    }

    #[test]
    fn a_schema_after_reasoning_allows_the_think_block() {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let g = Grammars::new(&tok).unwrap();
        let spec = ConstraintSpec::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        let mut c = g.compile(&spec.after_reasoning(false)).unwrap();
        let eog = c.eog().to_vec();
        for t in tok
            .encode("<think>\nSome thoughts.\n</think>\n\n{\"a\": 1}", false)
            .unwrap()
        {
            assert!(c.mask().unwrap().allows(t, &eog));
            c.accept(t).unwrap();
        }
        assert!(c.mask().unwrap().allows(eog[0], &eog));
    }
}
