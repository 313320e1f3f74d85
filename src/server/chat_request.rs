//! A chat request's prompt and output rules: messages (with tool calls and tool results)
//! rendered through the model's template with the request's tools, the constraint that
//! applies (a response format, or the grammar of a required call), and how the answer is
//! split (reasoning, content, calls).

use super::api::{ChatRequest, Message};
use super::chat_output::ChatOutput;
use super::error::ApiError;
use super::tools::{self, Choice, Syntax, Tool};
use crate::grammar::ConstraintSpec;
use crate::tokenizer::{ChatMessage, ChatTemplate};
use serde_json::{json, Value};

/// How each choice's text is split into reasoning, content and calls.
#[derive(Clone)]
pub struct OutputRules {
    tools: Option<(Syntax, Vec<Tool>)>,
    reasoning: bool,
    opened: bool,
}

impl OutputRules {
    pub fn output(&self) -> ChatOutput {
        ChatOutput::new(self.tools.clone(), self.reasoning, self.opened)
    }
}

pub struct ChatSetup {
    pub prompt: String,
    pub constraint: Option<ConstraintSpec>,
    pub rules: OutputRules,
}

pub fn prepare(
    tmpl: &ChatTemplate,
    req: &ChatRequest,
    response_format: Option<ConstraintSpec>,
) -> Result<ChatSetup, ApiError> {
    let source = tmpl.source();
    if req.tools.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::bad_request("tools must not be empty (leave it out)").param("tools"));
    }
    let tools = req.tools.clone().unwrap_or_default();
    tools::check_tools(&tools)?;
    let choice = tools::parse_choice(req.tool_choice.as_ref(), &tools)?;
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let syntax = Syntax::of_template(source);
    let calling = choice != Choice::None;
    let mut msgs = chat_messages(&req.messages, syntax)?;
    if calling && !Syntax::template_shows_tools(source) {
        let text = tools::generic_instructions(&tools, parallel);
        match msgs.first_mut() {
            Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
            _ => msgs.insert(
                0,
                ChatMessage {
                    role: "system".into(),
                    content: text,
                    ..Default::default()
                },
            ),
        }
    }
    let tools_json = calling.then(|| tools::template_tools(&tools));
    let prompt = tmpl
        .render_with_tools(&msgs, tools_json.as_ref(), true)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("messages"))?;
    let forced = tools::forcing_grammar(syntax, &tools, &choice, parallel);
    if forced.is_some() && response_format.is_some() {
        return Err(ApiError::bad_request(
            "a required tool call cannot be combined with a response format",
        )
        .param("tool_choice"));
    }
    let reasoning = source.contains("<think>");
    let opened = prompt.trim_end().ends_with("<think>");
    let constraint = forced.or(response_format).map(|spec| {
        if reasoning {
            spec.after_reasoning(opened)
        } else {
            spec
        }
    });
    Ok(ChatSetup {
        prompt,
        constraint,
        rules: OutputRules {
            tools: calling.then_some((syntax, tools)),
            reasoning,
            opened,
        },
    })
}

/// The request's messages as the template reads them. Assistant calls carry their arguments
/// as objects; a template with no tool syntax sees them as the generic JSON text instead.
pub fn chat_messages(messages: &[Message], syntax: Syntax) -> Result<Vec<ChatMessage>, ApiError> {
    messages
        .iter()
        .map(|m| {
            if !matches!(
                m.role.as_str(),
                "system" | "user" | "assistant" | "tool" | "developer"
            ) {
                return Err(
                    ApiError::bad_request(format!("unknown message role '{}'", m.role))
                        .param("messages"),
                );
            }
            let mut content = m.text()?;
            let tool_calls = match &m.tool_calls {
                Some(calls) if m.role == "assistant" => {
                    let calls: Vec<Value> = calls.iter().map(template_call).collect::<Result<_, _>>()?;
                    if syntax == Syntax::Generic && content.is_empty() {
                        let generic: Vec<Value> = calls
                            .iter()
                            .map(|c| json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}))
                            .collect();
                        content = json!({"tool_calls": generic}).to_string();
                    }
                    Some(Value::Array(calls))
                }
                Some(_) => {
                    return Err(ApiError::bad_request("only assistant messages carry tool_calls")
                        .param("messages"))
                }
                None => None,
            };
            Ok(ChatMessage {
                role: m.role.clone(),
                content,
                tool_calls,
                tool_call_id: m.tool_call_id.clone(),
                name: m.name.clone(),
            })
        })
        .collect()
}

/// One OpenAI call (`arguments` a JSON string) as templates read it (`arguments` an object).
fn template_call(c: &Value) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::bad_request("a tool call needs function.name and function.arguments")
            .param("messages")
    };
    let f = c.get("function").ok_or_else(bad)?;
    let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
    let args = match f.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(v) => v.clone(),
        None => json!({}),
    };
    Ok(json!({
        "id": c.get("id").cloned().unwrap_or(Value::Null),
        "type": "function",
        "function": {"name": name, "arguments": args},
        "name": name,
        "arguments": args,
    }))
}
