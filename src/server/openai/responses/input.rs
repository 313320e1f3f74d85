//! A Responses conversation's items: as chat messages (`chat_messages`), and as the SDK types
//! them when a kept response lists its input (`as_listed`). Items are kept as the client sent
//! them (plus ids), since a later turn continues from them.

use super::super::error::ApiError;
use crate::chat::{ContentPart, ImageUrl, Message, MessageContent};
use serde_json::{json, Value};

/// `input` as a list of items: a string is one user message.
pub fn input_items(input: &Value) -> Result<Vec<Value>, ApiError> {
    match input {
        Value::String(s) => Ok(vec![
            json!({"type": "message", "role": "user", "content": s}),
        ]),
        Value::Array(list) => Ok(list.clone()),
        _ => Err(ApiError::bad_request("input must be a string or a list of items").param("input")),
    }
}

fn bad_input(m: impl Into<String>) -> ApiError {
    ApiError::bad_request(m).param("input")
}

/// An item's type; a bare `{role, content}` is a message.
fn item_type(item: &Value) -> &str {
    item.get("type")
        .and_then(Value::as_str)
        .unwrap_or(if item.get("role").is_some() {
            "message"
        } else {
            ""
        })
}

/// The conversation's items as chat messages. A function call joins the assistant turn
/// before it (or starts one); a reasoning item is the reasoning of the assistant turn that
/// follows it.
pub fn chat_messages(items: &[Value]) -> Result<Vec<Message>, ApiError> {
    let mut messages: Vec<Message> = Vec::new();
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn a call may still join.
    let mut open_turn = false;
    for item in items {
        match item_type(item) {
            "message" => {
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad_input("a message item needs a role"))?;
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(bad_input(format!("unknown message role '{role}'")));
                }
                let mut m = Message::text_of(role, "");
                m.content = Some(message_content(item.get("content"))?);
                if role == "assistant" {
                    m.reasoning_content = reasoning.take();
                }
                open_turn = role == "assistant";
                messages.push(m);
            }
            "function_call" => {
                let call = function_call(item)?;
                match messages.last_mut() {
                    Some(m) if open_turn => m.tool_calls.get_or_insert_with(Vec::new).push(call),
                    _ => {
                        let mut m = Message::text_of("assistant", "");
                        m.content = None;
                        m.tool_calls = Some(vec![call]);
                        m.reasoning_content = reasoning.take();
                        messages.push(m);
                        open_turn = true;
                    }
                }
            }
            "function_call_output" => {
                messages.push(call_output(item)?);
                open_turn = false;
            }
            "reasoning" => {
                let text = reasoning_text(item);
                if !text.is_empty() {
                    reasoning = Some(text);
                }
            }
            "" => return Err(bad_input("an input item needs a type")),
            other => {
                return Err(bad_input(format!(
                    "input items of type '{other}' are not supported (message, function_call, function_call_output and reasoning are)"
                )))
            }
        }
    }
    Ok(messages)
}

/// A `function_call_output` item as the tool message that answers its call.
fn call_output(item: &Value) -> Result<Message, ApiError> {
    let id = item
        .get("call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad_input("a function_call_output item needs call_id"))?;
    let output = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(parts @ Value::Array(_)) => content_text(Some(parts))?,
        _ => {
            return Err(bad_input(
                "a function_call_output item needs output (a string)",
            ))
        }
    };
    let mut m = Message::text_of("tool", output);
    m.tool_call_id = Some(id.to_string());
    Ok(m)
}

/// A message's content: its text, or where it holds images, its parts in order (text parts as
/// chat text parts, each `input_image` as a chat `image_url` part).
fn message_content(content: Option<&Value>) -> Result<MessageContent, ApiError> {
    let parts = match content {
        Some(Value::Array(parts)) if parts.iter().any(|p| p["type"] == "input_image") => parts,
        _ => return Ok(MessageContent::Text(content_text(content)?)),
    };
    let part = |p: &Value| -> Result<ContentPart, ApiError> {
        if p["type"] != "input_image" {
            let text = content_text(Some(&Value::Array(vec![p.clone()])))?;
            return Ok(ContentPart {
                kind: "text".into(),
                text: Some(text),
                image_url: None,
            });
        }
        if p.get("file_id").is_some_and(|f| !f.is_null()) {
            return Err(bad_input(
                "input_image by file_id is not supported (there is no files API): send image_url as a data: URL",
            ));
        }
        let url = p
            .get("image_url")
            .and_then(Value::as_str)
            .ok_or_else(|| bad_input("an input_image part needs image_url (a data: URL)"))?;
        Ok(ContentPart {
            kind: "image_url".into(),
            text: None,
            image_url: Some(ImageUrl {
                url: url.to_string(),
                detail: p.get("detail").and_then(Value::as_str).map(str::to_string),
            }),
        })
    };
    Ok(MessageContent::Parts(
        parts.iter().map(part).collect::<Result<_, _>>()?,
    ))
}

/// A message's content as text: a string, or its text parts (`input_text`, `output_text`,
/// `refusal`) joined. Images (outside a message's content), files and audio are refused by
/// name.
fn content_text(content: Option<&Value>) -> Result<String, ApiError> {
    match content {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for p in parts {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                let field = match kind {
                    "input_text" | "output_text" | "text" | "summary_text" | "reasoning_text" => {
                        "text"
                    }
                    "refusal" => "refusal",
                    _ => {
                        return Err(bad_input(format!(
                            "content parts of type '{kind}' are not supported (text only)"
                        )))
                    }
                };
                text += p.get(field).and_then(Value::as_str).unwrap_or("");
            }
            Ok(text)
        }
        Some(_) => Err(bad_input("content must be a string or a list of parts")),
    }
}

/// A reasoning item's text: its full content where given, else its summary.
fn reasoning_text(item: &Value) -> String {
    let joined = |k: &str| -> String {
        item.get(k)
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    };
    let content = joined("content");
    if content.is_empty() {
        joined("summary")
    } else {
        content
    }
}

/// A `function_call` item as a chat tool call.
fn function_call(item: &Value) -> Result<Value, ApiError> {
    let field = |k: &str| {
        item.get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| bad_input(format!("a function_call item needs {k}")))
    };
    Ok(json!({
        "id": field("call_id")?,
        "type": "function",
        "function": {"name": field("name")?, "arguments": field("arguments")?},
    }))
}

/// Items as a kept conversation lists them (`GET /v1/responses/{id}/input_items`), in the
/// shapes OpenAI's SDK types them: each with its type and an id (`{prefix}_{response}_in{n}`
/// where the client gave none) and `status: completed`; a message's content as a list of
/// parts (`input_text`, or `output_text` for an assistant's), however it was sent.
pub fn as_listed(items: Vec<Value>, response_id: &str) -> Vec<Value> {
    let tag = response_id.trim_start_matches("resp_");
    items
        .into_iter()
        .enumerate()
        .map(|(n, mut item)| {
            let kind = item_type(&item).to_string();
            if let Some(o) = item.as_object_mut() {
                o.entry("type").or_insert_with(|| kind.clone().into());
                let prefix = match kind.as_str() {
                    "message" => "msg",
                    "function_call_output" => "fco",
                    "function_call" => "fc",
                    "reasoning" => "rs",
                    _ => "item",
                };
                o.entry("id")
                    .or_insert_with(|| format!("{prefix}_{tag}_in{n}").into());
                if kind != "reasoning" {
                    o.entry("status").or_insert_with(|| "completed".into());
                }
                if kind == "message" {
                    let assistant = o.get("role").and_then(Value::as_str) == Some("assistant");
                    if let Some(content) = o.get_mut("content") {
                        *content = content_parts(content.take(), assistant);
                    }
                }
            }
            item
        })
        .collect()
}

/// A message's content as a list of parts: a string becomes one text part (`output_text`
/// with its annotations for an assistant's, `input_text` for the others').
fn content_parts(content: Value, assistant: bool) -> Value {
    match content {
        Value::String(text) if assistant => {
            json!([{"type": "output_text", "text": text, "annotations": []}])
        }
        Value::String(text) => json!([{"type": "input_text", "text": text}]),
        Value::Null => json!([]),
        parts => parts,
    }
}
