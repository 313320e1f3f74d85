//! A Responses request as the chat request it means: `instructions` and `input` (a string, or
//! items: messages, function calls and their outputs, reasoning) become chat messages, after
//! the conversation of `previous_response_id`; function tools, `tool_choice`, `text.format`,
//! `reasoning.effort` and `max_output_tokens` become their chat fields. What a response object
//! echoes back is kept beside it (`ResponseMeta`).

use super::super::error::ApiError;
use super::super::request::{ChatBody, Extra, Sampling, StopInput};
use super::input::{as_listed, chat_messages, input_items};
use super::store::Store;
use crate::chat::{Conversation, Function, Message, Tool};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// A `/v1/responses` body. Fields whose refusal names them in the Responses API's own terms
/// are kept as JSON and checked here; sampling extensions the chat endpoint takes (`top_k`,
/// `seed`, `stop`, ...) pass through as they are.
#[derive(Deserialize, Debug)]
pub struct ResponsesBody {
    pub model: Option<String>,
    pub input: Option<Value>,
    pub instructions: Option<Value>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    pub max_tool_calls: Option<Value>,
    pub text: Option<Value>,
    pub reasoning: Option<Value>,
    pub max_output_tokens: Option<i64>,
    pub previous_response_id: Option<Value>,
    pub stream: Option<bool>,
    pub store: Option<Value>,
    pub metadata: Option<Value>,
    pub user: Option<Value>,
    pub truncation: Option<Value>,
    pub background: Option<Value>,
    pub top_logprobs: Option<Value>,
    pub conversation: Option<Value>,
    pub prompt: Option<Value>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopInput>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub logit_bias: Option<Map<String, Value>>,
    pub ignore_eos: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Keys of a Responses request accepted and ignored: OpenAI's bookkeeping and options that
/// change nothing here (`include`: edgelm returns no encrypted reasoning; `stream_options`).
pub const IGNORED: &[&str] = &[
    "stream_options",
    "include",
    "service_tier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "safety_identifier",
];

/// Everything a Responses job carries beside its chat request.
#[derive(Clone)]
pub struct ResponseMeta {
    /// Request fields the response object repeats.
    pub echo: Map<String, Value>,
    /// The conversation up to this turn, kept with the response.
    pub input: Vec<Value>,
    /// Where the finished response goes (unless the request said `store: false`).
    pub store: Option<Arc<Store>>,
}

/// What a Responses request becomes: the chat request, and what the response object repeats.
pub struct Translated {
    pub chat: ChatBody,
    /// The conversation so far as items (the previous response's, then this input): kept
    /// with the response, so that a later turn can continue it.
    pub items: Vec<Value>,
    /// Request fields a response object echoes (`instructions`, `tools`, `text`, ...).
    pub echo: Map<String, Value>,
    pub store: bool,
}

impl Translated {
    /// What the answer's writer needs beside the chat job: the echo, the items (listed as a
    /// kept response lists them, under the answer's `id`) and the store, unless the request
    /// said `store: false`.
    pub fn meta(self, id: &str, store: Option<&Arc<Store>>) -> (ChatBody, ResponseMeta) {
        let meta = ResponseMeta {
            echo: self.echo,
            input: as_listed(self.items, id),
            store: store.filter(|_| self.store).cloned(),
        };
        (self.chat, meta)
    }
}

/// Translates a Responses request; `previous` is the stored conversation its
/// `previous_response_id` names (the caller looks it up: unknown ids are its 404).
pub fn translate(body: ResponsesBody, previous: Vec<Value>) -> Result<Translated, ApiError> {
    refuse_unsupported(&body)?;
    let input = body
        .input
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("input is required").param("input"))?;
    let mut items = previous;
    items.extend(input_items(input)?);
    let mut messages = Vec::new();
    if let Some(i) = &body.instructions {
        let text = i.as_str().ok_or_else(|| {
            ApiError::bad_request("instructions must be a string").param("instructions")
        })?;
        messages.push(Message::text_of("system", text));
    }
    messages.extend(chat_messages(&items)?);
    let conversation = Conversation {
        messages,
        tools: chat_tools(body.tools.as_ref())?,
        tool_choice: body
            .tool_choice
            .as_ref()
            .map(chat_tool_choice)
            .transpose()?,
        parallel_tool_calls: parallel_tool_calls(&body),
        reasoning_effort: reasoning_effort(&body)?.map(|e| json!(e)),
    };
    let response_format = match body.text.as_ref().and_then(|t| t.get("format")) {
        Some(f) => Some(response_format(f)?),
        None => None,
    };
    let echo = echo_fields(&body);
    let store = body.store.as_ref().and_then(Value::as_bool).unwrap_or(true);
    let chat = ChatBody {
        model: body.model,
        conversation,
        logprobs: None,
        top_logprobs: None,
        max_completion_tokens: body.max_output_tokens,
        functions: None,
        function_call: None,
        sampling: Sampling {
            temperature: body.temperature,
            top_p: body.top_p,
            top_k: body.top_k,
            min_p: body.min_p,
            seed: body.seed,
            stop: body.stop,
            presence_penalty: body.presence_penalty,
            frequency_penalty: body.frequency_penalty,
            repetition_penalty: body.repetition_penalty,
            logit_bias: body.logit_bias,
            ignore_eos: body.ignore_eos,
            stream: Some(body.stream.unwrap_or(false)),
            response_format,
            ..Sampling::default()
        },
        extra: Extra::default(),
    };
    Ok(Translated {
        chat,
        items,
        echo,
        store,
    })
}

/// A chat request's error about a field, named as the Responses request calls it (the
/// client never sent `messages` or `max_completion_tokens`).
pub fn in_request_terms(mut e: ApiError) -> ApiError {
    let renamed = match e.param.as_deref() {
        Some("messages") | Some("prompt") => "input",
        Some("max_tokens") | Some("max_completion_tokens") => "max_output_tokens",
        Some("response_format") | Some("json_schema") => "text.format",
        Some("reasoning_effort") => "reasoning.effort",
        _ => return e,
    };
    if let Some(old) = e.param.as_deref() {
        e.message = e.message.replace(old, renamed);
    }
    e.param = Some(renamed.to_string());
    e
}

/// `parallel_tool_calls`, off where `max_tool_calls` allows one call.
fn parallel_tool_calls(body: &ResponsesBody) -> Option<bool> {
    let single_call = body.max_tool_calls.as_ref().and_then(Value::as_u64) == Some(1);
    match &body.parallel_tool_calls {
        Some(Value::Bool(p)) => Some(*p && !single_call),
        _ if single_call => Some(false),
        _ => None,
    }
}

/// Fields that ask for what this server does not do: refused by name rather than ignored.
fn refuse_unsupported(body: &ResponsesBody) -> Result<(), ApiError> {
    let refuse = |k: &str, why: &str| Err(ApiError::bad_request(why.to_string()).param(k));
    if body.background.as_ref().and_then(Value::as_bool) == Some(true) {
        return refuse(
            "background",
            "background responses are not supported: leave background out or false",
        );
    }
    if body.conversation.is_some() {
        return refuse(
            "conversation",
            "conversations are not stored here: use previous_response_id",
        );
    }
    if body.prompt.is_some() {
        return refuse(
            "prompt",
            "prompt templates are not supported: send input (and instructions)",
        );
    }
    if body
        .top_logprobs
        .as_ref()
        .and_then(Value::as_u64)
        .is_some_and(|n| n > 0)
    {
        return refuse(
            "top_logprobs",
            "top_logprobs is not supported on /v1/responses (use /v1/chat/completions)",
        );
    }
    if let Some(t) = body.truncation.as_ref().and_then(Value::as_str) {
        if !matches!(t, "disabled" | "auto") {
            return refuse("truncation", "truncation must be 'disabled' or 'auto'");
        }
    }
    Ok(())
}

/// The request fields a response object repeats, with OpenAI's defaults where absent.
fn echo_fields(body: &ResponsesBody) -> Map<String, Value> {
    let or = |v: &Option<Value>, default: Value| v.clone().unwrap_or(default);
    let number = |v: Option<f64>, default: f64| json!(v.unwrap_or(default));
    let mut echo = Map::new();
    echo.insert("instructions".into(), or(&body.instructions, Value::Null));
    echo.insert("max_output_tokens".into(), json!(body.max_output_tokens));
    echo.insert(
        "max_tool_calls".into(),
        or(&body.max_tool_calls, Value::Null),
    );
    echo.insert("metadata".into(), or(&body.metadata, json!({})));
    echo.insert(
        "parallel_tool_calls".into(),
        or(&body.parallel_tool_calls, json!(true)),
    );
    echo.insert(
        "previous_response_id".into(),
        or(&body.previous_response_id, Value::Null),
    );
    echo.insert(
        "reasoning".into(),
        or(&body.reasoning, json!({"effort": null, "summary": null})),
    );
    echo.insert("store".into(), or(&body.store, json!(true)));
    echo.insert("temperature".into(), number(body.temperature, 1.0));
    echo.insert(
        "text".into(),
        or(&body.text, json!({"format": {"type": "text"}})),
    );
    echo.insert("tool_choice".into(), or(&body.tool_choice, json!("auto")));
    echo.insert("tools".into(), or(&body.tools, json!([])));
    echo.insert("top_p".into(), number(body.top_p, 1.0));
    echo.insert("truncation".into(), or(&body.truncation, json!("disabled")));
    echo.insert("user".into(), or(&body.user, Value::Null));
    echo
}

/// Function tools as chat tools (none: `None`); any other tool type is refused by name.
fn chat_tools(tools: Option<&Value>) -> Result<Option<Vec<Tool>>, ApiError> {
    let Some(tools) = tools else {
        return Ok(None);
    };
    let bad = |m: String| ApiError::bad_request(m).param("tools");
    let list = tools
        .as_array()
        .ok_or_else(|| bad("tools must be a list".into()))?;
    let tools: Vec<Tool> = list
        .iter()
        .map(|t| {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "function" {
                return Err(bad(format!(
                    "tools of type '{kind}' are not supported here (function tools only)"
                )));
            }
            let text = |k: &str| t.get(k).and_then(Value::as_str).map(str::to_string);
            let name = text("name").ok_or_else(|| bad("a function tool needs a name".into()))?;
            Ok(Tool {
                kind: kind.to_string(),
                function: Function {
                    name,
                    description: text("description"),
                    parameters: t.get("parameters").filter(|v| !v.is_null()).cloned(),
                    _strict: t.get("strict").and_then(Value::as_bool),
                },
            })
        })
        .collect::<Result<_, _>>()?;
    Ok((!tools.is_empty()).then_some(tools))
}

/// `tool_choice`: the same strings as chat, `{"type": "function", "name": …}` for one tool.
fn chat_tool_choice(c: &Value) -> Result<Value, ApiError> {
    match c {
        Value::String(_) => Ok(c.clone()),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o.get("name").ok_or_else(|| {
                ApiError::bad_request("tool_choice of type function needs a name")
                    .param("tool_choice")
            })?;
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
fn reasoning_effort(body: &ResponsesBody) -> Result<Option<&'static str>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).param("reasoning.effort");
    match body.reasoning.as_ref().and_then(|r| r.get("effort")) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "none" | "minimal" | "low" => Ok(Some("low")),
            "medium" => Ok(Some("medium")),
            "high" | "xhigh" => Ok(Some("high")),
            _ => Err(bad(format!(
                "reasoning.effort must be none, minimal, low, medium, high or xhigh, got '{s}'"
            ))),
        },
        _ => Err(bad("reasoning.effort must be a string".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::super::super::request::parse;
    use super::*;
    use crate::chat::MessageContent;

    fn translated(body: Value) -> Result<Translated, ApiError> {
        let body: ResponsesBody = parse(
            body.to_string().as_bytes(),
            |b: &ResponsesBody| &b.extra,
            IGNORED,
        )?;
        translate(body, Vec::new())
    }

    fn chat_of(body: Value) -> ChatBody {
        translated(body).unwrap().chat
    }

    fn text(m: &Message) -> &str {
        match &m.content {
            Some(MessageContent::Text(t)) => t,
            _ => "",
        }
    }

    #[test]
    fn a_string_input_with_instructions_is_a_system_and_a_user_message() {
        let chat = chat_of(
            json!({"model": "m", "input": "Hi", "instructions": "Be brief.", "max_output_tokens": 5, "store": false}),
        );
        let m = &chat.conversation.messages;
        let shown: Vec<(&str, &str)> = m.iter().map(|m| (m.role.as_str(), text(m))).collect();
        assert_eq!(shown, [("system", "Be brief."), ("user", "Hi")]);
        assert_eq!(chat.max_completion_tokens, Some(5));
        assert_eq!(chat.sampling.stream, Some(false));
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
        let m = &chat.conversation.messages;
        assert_eq!(m.len(), 5);
        assert_eq!(text(&m[0]), "Weather?");
        assert_eq!(m[1].reasoning_content.as_deref(), Some("Use the tool."));
        let calls = m[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1]["function"]["name"], "get_weather");
        assert_eq!(
            (
                m[2].role.as_str(),
                m[2].tool_call_id.as_deref(),
                text(&m[2])
            ),
            ("tool", Some("c1"), "Sunny")
        );
        assert_eq!(text(&m[4]), "Sunny and rain.");
    }

    #[test]
    fn the_previous_conversation_comes_first_and_is_kept() {
        let prev = vec![
            json!({"type": "message", "role": "user", "content": "One"}),
            json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two"}]}),
        ];
        let body = json!({"input": "Three", "instructions": "Count."});
        let t = translate(serde_json::from_value(body).unwrap(), prev).unwrap();
        let m = &t.chat.conversation.messages;
        let texts: Vec<&str> = m.iter().map(text).collect();
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
        let c = &chat.conversation;
        let tool = &c.tools.as_ref().unwrap()[0];
        assert_eq!(
            (tool.kind.as_str(), tool.function.name.as_str()),
            ("function", "f")
        );
        assert_eq!(tool.function.parameters, Some(json!({"type": "object"})));
        assert_eq!(tool.function._strict, Some(true));
        assert_eq!(
            c.tool_choice,
            Some(json!({"type": "function", "function": {"name": "f"}}))
        );
        assert_eq!(c.parallel_tool_calls, Some(false));
        assert_eq!(
            chat.sampling.response_format.unwrap()["json_schema"]["schema"],
            json!({"type": "object"})
        );
        assert_eq!(c.reasoning_effort, Some(json!("low")));
        assert_eq!(chat.sampling.top_k, Some(3));
    }

    #[test]
    fn what_this_server_does_not_do_is_refused_by_name() {
        let param = |body: Value| translated(body).err().unwrap().param.unwrap();
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
        let e = translated(json!({"input": "x", "tools": [{"type": "file_search"}]}))
            .err()
            .unwrap();
        assert!(e.message.contains("file_search"), "{}", e.message);
    }

    #[test]
    fn bookkeeping_fields_are_echoed_not_refused() {
        let t = translated(json!({"input": "x", "metadata": {"k": "v"}, "store": false, "include": ["reasoning.encrypted_content"], "service_tier": "auto", "prompt_cache_key": "p", "safety_identifier": "s", "user": "u", "truncation": "auto"})).unwrap();
        assert_eq!(t.echo["metadata"], json!({"k": "v"}));
        assert!(!t.store);
        assert_eq!(t.echo["tools"], json!([]));
    }

    #[test]
    fn chat_field_errors_are_named_as_the_request_names_them() {
        let e = in_request_terms(
            ApiError::bad_request("max_tokens must be ≥ 0, got -1").param("max_tokens"),
        );
        assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
        assert_eq!(e.message, "max_output_tokens must be ≥ 0, got -1");
        let e =
            in_request_terms(ApiError::bad_request("messages must not be empty").param("messages"));
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("input"), "input must not be empty")
        );
        let e = in_request_terms(ApiError::bad_request("top_k is bad").param("top_k"));
        assert_eq!(e.param.as_deref(), Some("top_k"));
    }

    #[test]
    fn kept_input_is_listed_in_the_sdk_shapes() {
        let items = input_items(&json!("Hi")).unwrap();
        let listed = as_listed(items, "resp_x1");
        assert_eq!(
            listed[0],
            json!({"type": "message", "role": "user", "id": "msg_x1_in0", "status": "completed",
                   "content": [{"type": "input_text", "text": "Hi"}]})
        );
        let said = as_listed(
            vec![json!({"role": "assistant", "content": "Yes"})],
            "resp_x2",
        );
        assert_eq!(
            said[0]["content"],
            json!([{"type": "output_text", "text": "Yes", "annotations": []}])
        );
    }
}
