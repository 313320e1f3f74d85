//! A chat's prompt: its messages (with tool calls and tool results) rendered through the
//! model's template, with the tools it offers and its reasoning effort.

use super::error::Error;
use super::tools::{check_tools, generic_instructions, parse_choice, template_tools, Choice};
use super::types::{ImagePart, Message, Syntax, Tool};
use crate::tokenizer::{ChatMessage, ChatTemplate, TemplateInputs};
use serde::Deserialize;
use serde_json::{json, Value};

/// The parts of a chat request that make its prompt: what `/v1/chat/completions` and
/// `/tokenize` (with `messages`) both take.
#[derive(Deserialize, Debug, Default)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub tools: Option<Vec<Tool>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `low`, `medium` or `high`: for templates that set a reasoning budget (gpt-oss).
    pub reasoning_effort: Option<Value>,
}

impl Conversation {
    /// Every image of its messages, in the order their markers stand in the prompt.
    pub fn images(&self) -> Vec<ImagePart> {
        (self.messages.iter().enumerate())
            .flat_map(|(i, m)| m.images(i))
            .collect()
    }
}

/// The tools a conversation offers, checked, and what the model may do with them.
pub struct Offer {
    pub tools: Vec<Tool>,
    pub choice: Choice,
    /// Several calls in one answer.
    pub parallel: bool,
}

impl Offer {
    pub fn of(conversation: &Conversation) -> Result<Offer, Error> {
        let tools = conversation.tools.clone().unwrap_or_default();
        check_tools(&tools)?;
        let choice = parse_choice(conversation.tool_choice.as_ref(), &tools)?;
        Ok(Offer {
            tools,
            choice,
            parallel: conversation.parallel_tool_calls.unwrap_or(true),
        })
    }

    /// The tools the model is shown: none when the request says `tool_choice: none`.
    pub fn shown(&self) -> &[Tool] {
        if self.choice == Choice::None {
            &[]
        } else {
            &self.tools
        }
    }
}

/// The prompt of a chat: its messages through the template with the `tools` it may call
/// (shown by the template, or taught in the system message where the template shows none)
/// and its reasoning effort. `/tokenize` counts the same prompt.
pub fn render_prompt(
    tmpl: &ChatTemplate,
    conversation: &Conversation,
    offer: &Offer,
    add_generation_prompt: bool,
) -> Result<String, Error> {
    let source = tmpl.source();
    let tools = offer.shown();
    let mut msgs = chat_messages(&conversation.messages, Syntax::of_template(source))?;
    if !tools.is_empty() && !Syntax::template_shows_tools(source) {
        add_generic_instructions(&mut msgs, tools, offer.parallel);
    }
    let tools_json = (!tools.is_empty()).then(|| template_tools(tools));
    let inputs = TemplateInputs {
        tools: tools_json.as_ref(),
        reasoning_effort: reasoning_effort(conversation.reasoning_effort.as_ref())?,
    };
    tmpl.render_with(&msgs, &inputs, add_generation_prompt)
        .map_err(|e| Error::new("messages", e.to_string()))
}

/// Teaches a model whose template shows no tools the generic call syntax, in the system
/// message (one is added when the conversation has none).
fn add_generic_instructions(msgs: &mut Vec<ChatMessage>, tools: &[Tool], parallel: bool) {
    let text = generic_instructions(tools, parallel);
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

/// The request's `reasoning_effort`: one of OpenAI's three levels. Every template receives it;
/// only those that set a reasoning budget (gpt-oss) read it.
fn reasoning_effort(v: Option<&Value>) -> Result<Option<&str>, Error> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high") => Ok(Some(s)),
        Some(other) => Err(Error::new(
            "reasoning_effort",
            format!("reasoning_effort must be 'low', 'medium' or 'high', got {other}"),
        )),
    }
}

/// The request's messages as the template reads them. Assistant calls carry their arguments
/// as objects; a template with no tool syntax sees them as the generic JSON text instead.
fn chat_messages(messages: &[Message], syntax: Syntax) -> Result<Vec<ChatMessage>, Error> {
    messages
        .iter()
        .map(|m| {
            // The legacy `function` role is a tool result, named by its function.
            let role = if m.role == "function" { "tool" } else { m.role.as_str() };
            if !matches!(role, "system" | "user" | "assistant" | "tool" | "developer") {
                return Err(Error::new(
                    "messages",
                    format!("unknown message role '{}'", m.role),
                ));
            }
            let mut content = m.text()?;
            let calls = assistant_calls(m)?;
            // gpt-oss's template refuses a call turn with both content and reasoning (it shows
            // the content as the reasoning then), so the reasoning is left out there.
            let thinking = m
                .reasoning_content
                .clone()
                .filter(|r| m.role == "assistant" && !r.is_empty())
                .filter(|_| calls.is_none() || content.is_empty());
            let tool_calls = match calls {
                Some(calls) => {
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
                None => None,
            };
            let legacy_result = (m.role == "function").then(|| legacy_call_id(m.name.as_deref()));
            Ok(ChatMessage {
                role: role.to_string(),
                content,
                tool_calls,
                tool_call_id: m.tool_call_id.clone().or(legacy_result),
                thinking,
                name: m.name.clone(),
            })
        })
        .collect()
}

/// An assistant message's calls in OpenAI's shape: its `tool_calls`, or its legacy
/// `function_call` as one call. Other roles carry none.
fn assistant_calls(m: &Message) -> Result<Option<Vec<Value>>, Error> {
    let only_assistants = || {
        Error::new(
            "messages",
            "only assistant messages carry tool_calls or function_call",
        )
    };
    match (&m.tool_calls, &m.function_call) {
        (None, None) => Ok(None),
        _ if m.role != "assistant" => Err(only_assistants()),
        (Some(calls), _) => Ok(Some(calls.clone())),
        (None, Some(f)) => {
            let id = legacy_call_id(f.get("name").and_then(Value::as_str));
            Ok(Some(vec![
                json!({"id": id, "type": "function", "function": f}),
            ]))
        }
    }
}

/// The id a legacy call and its `function` result share: they are matched by name.
fn legacy_call_id(name: Option<&str>) -> String {
    format!("call_{}", name.unwrap_or("function"))
}

/// One OpenAI call (`arguments` a JSON string) as templates read it (`arguments` an object).
fn template_call(c: &Value) -> Result<Value, Error> {
    let bad = || {
        Error::new(
            "messages",
            "a tool call needs function.name and function.arguments",
        )
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
