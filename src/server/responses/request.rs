//! A Responses request as the chat request it means: `instructions` and `input` (a string, or
//! items: messages, function calls and their outputs, reasoning) become chat messages, after
//! the conversation of `previous_response_id`; function tools, `tool_choice`, `text.format`,
//! `reasoning.effort` and `max_output_tokens` become their chat fields. What a response object
//! echoes back is kept beside it.

use super::super::error::ApiError;
use serde_json::{json, Map, Value};

/// Keys of a Responses request. Sampling extensions the chat endpoint takes (`top_k`, `seed`,
/// `stop`, ...) pass through as they are.
const OWN_KEYS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_tool_calls",
    "text",
    "reasoning",
    "max_output_tokens",
    "previous_response_id",
    "stream",
    "stream_options",
    "store",
    "metadata",
    "user",
    "include",
    "truncation",
    "background",
    "top_logprobs",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
    "conversation",
    "prompt",
];

/// Chat sampling fields a Responses request may also carry (vLLM's extensions).
const PASSED_SAMPLING: &[&str] = &[
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "logit_bias",
    "ignore_eos",
];

/// What a Responses request becomes: the chat body, and what the response object repeats.
pub struct Translated {
    /// A /v1/chat/completions body.
    pub chat: Value,
    /// The conversation so far as items (the previous response's, then this input): kept
    /// with the response, so that a later turn can continue it.
    pub items: Vec<Value>,
    /// Request fields a response object echoes (`instructions`, `tools`, `text`, ...).
    pub echo: Map<String, Value>,
    pub store: bool,
}

/// Translates a Responses request; `previous` is the stored conversation its
/// `previous_response_id` names (the caller looks it up: unknown ids are its 404).
pub fn translate(body: &Value, previous: Vec<Value>) -> Result<Translated, ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    for k in obj.keys() {
        if !OWN_KEYS.contains(&k.as_str()) && !PASSED_SAMPLING.contains(&k.as_str()) {
            return Err(
                ApiError::bad_request(format!("unrecognized request argument: {k}")).param(k),
            );
        }
    }
    refuse_unsupported(obj)?;
    let input = obj
        .get("input")
        .ok_or_else(|| ApiError::bad_request("input is required").param("input"))?;
    let mut items = previous;
    items.extend(input_items(input)?);
    let mut messages = Vec::new();
    if let Some(i) = obj.get("instructions").filter(|v| !v.is_null()) {
        let text = i.as_str().ok_or_else(|| {
            ApiError::bad_request("instructions must be a string").param("instructions")
        })?;
        messages.push(json!({"role": "system", "content": text}));
    }
    messages.extend(chat_messages(&items)?);
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for k in PASSED_SAMPLING {
        if let Some(v) = obj.get(*k).filter(|v| !v.is_null()) {
            chat.insert((*k).into(), v.clone());
        }
    }
    if let Some(m) = obj.get("max_output_tokens").filter(|v| !v.is_null()) {
        chat.insert("max_completion_tokens".into(), m.clone());
    }
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    chat.insert("stream".into(), json!(stream));
    if let Some(tools) = obj.get("tools").filter(|v| !v.is_null()) {
        let tools = chat_tools(tools)?;
        if !tools.is_empty() {
            chat.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(c) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        chat.insert("tool_choice".into(), chat_tool_choice(c)?);
    }
    let single_call = obj.get("max_tool_calls").and_then(Value::as_u64) == Some(1);
    match obj.get("parallel_tool_calls") {
        Some(Value::Bool(p)) => {
            chat.insert("parallel_tool_calls".into(), json!(*p && !single_call));
        }
        _ if single_call => {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
        _ => {}
    }
    if let Some(f) = obj.get("text").and_then(|t| t.get("format")) {
        chat.insert("response_format".into(), response_format(f)?);
    }
    if let Some(e) = obj.get("reasoning").and_then(|r| r.get("effort")) {
        if let Some(effort) = reasoning_effort(e)? {
            chat.insert("reasoning_effort".into(), json!(effort));
        }
    }
    Ok(Translated {
        chat: Value::Object(chat),
        items,
        echo: echo_fields(obj),
        store: obj.get("store").and_then(Value::as_bool).unwrap_or(true),
    })
}

/// Fields that ask for what this server does not do: refused by name rather than ignored.
fn refuse_unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    let refuse = |k: &str, why: &str| Err(ApiError::bad_request(why.to_string()).param(k));
    if obj.get("background").and_then(Value::as_bool) == Some(true) {
        return refuse(
            "background",
            "background responses are not supported: leave background out or false",
        );
    }
    if obj.get("conversation").is_some_and(|v| !v.is_null()) {
        return refuse(
            "conversation",
            "conversations are not stored here: use previous_response_id",
        );
    }
    if obj.get("prompt").is_some_and(|v| !v.is_null()) {
        return refuse(
            "prompt",
            "prompt templates are not supported: send input (and instructions)",
        );
    }
    if obj
        .get("top_logprobs")
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 0)
    {
        return refuse(
            "top_logprobs",
            "top_logprobs is not supported on /v1/responses (use /v1/chat/completions)",
        );
    }
    if let Some(t) = obj.get("truncation").and_then(Value::as_str) {
        if !matches!(t, "disabled" | "auto") {
            return refuse("truncation", "truncation must be 'disabled' or 'auto'");
        }
    }
    Ok(())
}

/// The request fields a response object repeats, with OpenAI's defaults where absent.
fn echo_fields(obj: &Map<String, Value>) -> Map<String, Value> {
    let get = |k: &str, default: Value| {
        obj.get(k)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    let mut echo = Map::new();
    echo.insert("instructions".into(), get("instructions", Value::Null));
    echo.insert(
        "max_output_tokens".into(),
        get("max_output_tokens", Value::Null),
    );
    echo.insert("max_tool_calls".into(), get("max_tool_calls", Value::Null));
    echo.insert("metadata".into(), get("metadata", json!({})));
    echo.insert(
        "parallel_tool_calls".into(),
        get("parallel_tool_calls", json!(true)),
    );
    echo.insert(
        "previous_response_id".into(),
        get("previous_response_id", Value::Null),
    );
    echo.insert(
        "reasoning".into(),
        get("reasoning", json!({"effort": null, "summary": null})),
    );
    echo.insert("store".into(), get("store", json!(true)));
    echo.insert("temperature".into(), get("temperature", json!(1.0)));
    echo.insert(
        "text".into(),
        get("text", json!({"format": {"type": "text"}})),
    );
    echo.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    echo.insert("tools".into(), get("tools", json!([])));
    echo.insert("top_p".into(), get("top_p", json!(1.0)));
    echo.insert("truncation".into(), get("truncation", json!("disabled")));
    echo.insert("user".into(), get("user", Value::Null));
    echo
}

/// `input` as a list of items: a string is one user message.
fn input_items(input: &Value) -> Result<Vec<Value>, ApiError> {
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

/// The conversation's items as chat messages. A function call joins the assistant turn
/// before it (or starts one); a reasoning item is the reasoning of the assistant turn that
/// follows it.
fn chat_messages(items: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut messages: Vec<Value> = Vec::new();
    let mut reasoning: Option<String> = None;
    // Whether the last message is an assistant turn a call may still join.
    let mut open_turn = false;
    for item in items {
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).ok_or_else(|| bad_input("a message item needs a role"))?;
                if !matches!(role, "user" | "system" | "developer" | "assistant") {
                    return Err(bad_input(format!("unknown message role '{role}'")));
                }
                let mut m = json!({"role": role, "content": content_text(item.get("content"))?});
                if role == "assistant" {
                    if let Some(r) = reasoning.take() {
                        m["reasoning_content"] = json!(r);
                    }
                }
                open_turn = role == "assistant";
                messages.push(m);
            }
            "function_call" => {
                let call = function_call(item)?;
                match messages.last_mut() {
                    Some(m) if open_turn => {
                        let calls = m.as_object_mut().expect("messages are objects").entry("tool_calls").or_insert(json!([]));
                        calls.as_array_mut().expect("tool_calls is a list").push(call);
                    }
                    _ => {
                        let mut m = json!({"role": "assistant", "content": null, "tool_calls": [call]});
                        if let Some(r) = reasoning.take() {
                            m["reasoning_content"] = json!(r);
                        }
                        messages.push(m);
                        open_turn = true;
                    }
                }
            }
            "function_call_output" => {
                let id = item.get("call_id").and_then(Value::as_str).ok_or_else(|| bad_input("a function_call_output item needs call_id"))?;
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(parts @ Value::Array(_)) => content_text(Some(parts))?,
                    _ => return Err(bad_input("a function_call_output item needs output (a string)")),
                };
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
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

/// A message's content as text: a string, or its text parts (`input_text`, `output_text`,
/// `refusal`) joined. Images, files and audio are refused by name.
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

/// Function tools in the chat shape; any other tool type is refused by name.
fn chat_tools(tools: &Value) -> Result<Vec<Value>, ApiError> {
    let list = tools
        .as_array()
        .ok_or_else(|| ApiError::bad_request("tools must be a list").param("tools"))?;
    list.iter()
        .map(|t| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(ApiError::bad_request(format!(
                    "tools of type '{kind}' are not supported here (function tools only)"
                ))
                .param("tools"));
            }
            let mut function = Map::new();
            for k in ["name", "description", "parameters", "strict"] {
                if let Some(v) = t.get(k).filter(|v| !v.is_null()) {
                    function.insert(k.into(), v.clone());
                }
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// `tool_choice`: the same strings as chat, `{"type": "function", "name": …}` for one tool.
fn chat_tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) => Ok(c.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("name")
                .ok_or_else(|| ApiError::bad_request("tool_choice of type function needs a name").param("tool_choice"))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(ApiError::bad_request(
            "tool_choice must be 'none', 'auto', 'required' or {\"type\": \"function\", \"name\": …}",
        )
        .param("tool_choice")),
    }
}

/// `text.format` as a chat `response_format`.
fn response_format(f: &Value) -> Result<Value, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m.to_string()).param("text.format");
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "text"})),
        Some("json_object") => Ok(json!({"type": "json_object"})),
        Some("json_schema") => {
            let schema = f
                .get("schema")
                .ok_or_else(|| bad("text.format json_schema needs a schema"))?;
            let name = f.get("name").cloned().unwrap_or(json!("response"));
            Ok(
                json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": f.get("strict")}}),
            )
        }
        _ => Err(bad(
            "text.format type must be text, json_object or json_schema",
        )),
    }
}

/// `reasoning.effort` as one of the three levels templates know: `minimal` and `none` are
/// the least there is (`low`), `xhigh` the most (`high`).
fn reasoning_effort(e: &Value) -> Result<Option<&'static str>, ApiError> {
    match e {
        Value::Null => Ok(None),
        Value::String(s) => match s.as_str() {
            "none" | "minimal" | "low" => Ok(Some("low")),
            "medium" => Ok(Some("medium")),
            "high" | "xhigh" => Ok(Some("high")),
            _ => Err(ApiError::bad_request(format!(
                "reasoning.effort must be none, minimal, low, medium, high or xhigh, got '{s}'"
            ))
            .param("reasoning.effort")),
        },
        _ => {
            Err(ApiError::bad_request("reasoning.effort must be a string")
                .param("reasoning.effort"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::api;
    use super::*;

    /// Everything `translate` writes is a key the chat endpoint takes.
    fn chat_keys_cover(chat: &Value) -> bool {
        chat.as_object().unwrap().keys().all(|k| {
            api::CHAT_KEYS.contains(&k.as_str()) || api::SAMPLING_KEYS.contains(&k.as_str())
        })
    }

    fn chat_of(body: Value) -> Value {
        let t = translate(&body, Vec::new()).unwrap();
        assert!(chat_keys_cover(&t.chat), "{}", t.chat);
        t.chat
    }

    #[test]
    fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
        let chat = chat_of(
            json!({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 5, "store": false}),
        );
        assert_eq!(
            chat["messages"],
            json!([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
        );
        assert_eq!(chat["max_completion_tokens"], 5);
        assert_eq!(chat["stream"], false);
    }

    #[test]
    fn calls_and_their_outputs_become_an_assistant_turn_and_tool_messages() {
        let chat = chat_of(json!({"input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {"type": "function_call_output", "call_id": "c2", "output": "Rain"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Sunny and rain.", "annotations": []}]}
        ]}));
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m.len(), 5);
        assert_eq!(m[0]["content"], "Weather?");
        assert_eq!(m[1]["reasoning_content"], "Use the tool.");
        assert_eq!(m[1]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[1]["tool_calls"][1]["function"]["name"], "get_weather");
        assert_eq!(
            m[2],
            json!({"role": "tool", "tool_call_id": "c1", "content": "Sunny"})
        );
        assert_eq!(m[4]["content"], "Sunny and rain.");
    }

    #[test]
    fn the_previous_conversation_comes_first_and_is_kept() {
        let prev = vec![
            json!({"type": "message", "role": "user", "content": "One"}),
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two"}]}),
        ];
        let t = translate(&json!({"input": "Three", "instructions": "Count."}), prev).unwrap();
        let m = t.chat["messages"].as_array().unwrap();
        let texts: Vec<&str> = m.iter().map(|m| m["content"].as_str().unwrap()).collect();
        assert_eq!(texts, ["Count.", "One", "Two", "Three"]);
        assert_eq!(t.items.len(), 3);
    }

    #[test]
    fn tools_choice_format_and_effort_map_to_chat_fields() {
        let chat = chat_of(json!({
            "input": "x",
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true}],
            "tool_choice": {"type": "function", "name": "f"},
            "max_tool_calls": 1,
            "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}}, "verbosity": "low"},
            "reasoning": {"effort": "minimal", "summary": "auto"},
            "temperature": 0, "top_k": 3, "seed": 1,
        }));
        assert_eq!(
            chat["tools"][0],
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, "strict": true}})
        );
        assert_eq!(
            chat["tool_choice"],
            json!({"type": "function", "function": {"name": "f"}})
        );
        assert_eq!(chat["parallel_tool_calls"], false);
        assert_eq!(
            chat["response_format"]["json_schema"]["schema"],
            json!({"type": "object"})
        );
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["top_k"], 3);
    }

    #[test]
    fn what_this_server_does_not_do_is_refused_by_name() {
        let param = |body: Value| translate(&body, Vec::new()).err().unwrap().param.unwrap();
        assert_eq!(
            param(json!({"input": "x", "tools": [{"type": "web_search"}]})),
            "tools"
        );
        assert_eq!(
            param(json!({"input": "x", "background": true})),
            "background"
        );
        assert_eq!(
            param(json!({"input": "x", "conversation": "conv_1"})),
            "conversation"
        );
        assert_eq!(param(json!({"input": "x", "temprature": 1})), "temprature");
        assert_eq!(
            param(json!({"input": [{"type": "input_image", "image_url": "x"}]})),
            "input"
        );
        assert_eq!(
            param(json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})),
            "input"
        );
        assert_eq!(param(json!({"instructions": "x"})), "input");
        assert_eq!(
            param(json!({"input": "x", "reasoning": {"effort": "huge"}})),
            "reasoning.effort"
        );
        let e = translate(
            &json!({"input": "x", "tools": [{"type": "file_search"}]}),
            Vec::new(),
        )
        .err()
        .unwrap();
        assert!(e.message.contains("file_search"), "{}", e.message);
    }

    #[test]
    fn bookkeeping_fields_are_echoed_not_refused() {
        let t = translate(&json!({"input": "x", "metadata": {"k": "v"}, "store": false, "include": ["reasoning.encrypted_content"], "service_tier": "auto", "prompt_cache_key": "p", "safety_identifier": "s", "user": "u", "truncation": "auto"}), Vec::new()).unwrap();
        assert_eq!(t.echo["metadata"], json!({"k": "v"}));
        assert!(!t.store);
        assert_eq!(t.echo["tools"], json!([]));
    }
}
