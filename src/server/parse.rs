//! A generation request's body to a [`Job`]: JSON, the endpoint's keys, sampling limits,
//! the prompt's tokens (through the chat template for chat), and its constraint compiled
//! against the vocabulary. Everything a request goes through before admission.

use super::api::{self, ChatRequest, CompletionRequest, Limits, PromptInput};
use super::error::ApiError;
use super::generate::{Flavor, Job};
use super::responses::{self, ResponseMeta, Store};
use super::{chat_request, unix_now, Ready, Server};
use crate::grammar::{Constraint, ConstraintSpec, Grammars};
use crate::tokenizer::{ChatTemplate, Tokenizer};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What parsing a request reads: the vocabulary, the chat template, the grammar compiler and
/// the server's limits; and the kept responses a Responses request may continue.
struct Parsing<'a> {
    tokenizer: &'a Tokenizer,
    chat: Option<&'a ChatTemplate>,
    grammars: &'a Grammars,
    limits: &'a Limits,
    responses: Option<&'a Arc<Store>>,
    /// Starts response ids (`Server::boot_tag`).
    id_tag: &'a str,
}

impl Server {
    pub(super) fn parse_job(
        &self,
        ready: &Ready,
        path: &str,
        body: &[u8],
    ) -> Result<Job, ApiError> {
        let id_num = self.next_id.fetch_add(1, Ordering::Relaxed);
        let p = Parsing {
            tokenizer: &ready.tokenizer,
            chat: ready.chat.as_ref(),
            grammars: &ready.grammars,
            limits: &ready.limits,
            responses: Some(&self.responses),
            id_tag: &self.boot_tag,
        };
        parse_request(&p, path, body, id_num)
    }
}

/// Parses and validates a /v1/completions, /v1/chat/completions or /v1/responses (`path`)
/// body into a job: everything a generation request goes through before it reaches the
/// engine.
fn parse_request(p: &Parsing, path: &str, body: &[u8], id_num: u64) -> Result<Job, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not valid UTF-8"))?;
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    match path {
        "/v1/completions" => parse_completion(p, value, id_num),
        "/v1/responses" => parse_response(p, value, id_num),
        _ => parse_chat(p, value, id_num),
    }
}

/// A /v1/completions body: one prompt or a batch of them, as text or token ids.
fn parse_completion(p: &Parsing, value: Value, id_num: u64) -> Result<Job, ApiError> {
    let (tokenizer, grammars, limits) = (p.tokenizer, p.grammars, p.limits);
    api::check_keys(&value, api::COMPLETION_KEYS)?;
    let req: CompletionRequest = serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let mut v = api::validate_sampling(&req.sampling, None, limits)?;
    v.params.sampling.logit_bias = api::logit_bias(&req.sampling, tokenizer.vocab_size())?;
    v.params.constraint = compile(grammars, api::constraint_spec(&req.sampling)?)?;
    let logprobs = api::check_logprobs(req.logprobs, limits, "logprobs")?;
    let prompts = completion_prompts(tokenizer, &req.prompt)?;
    if prompts.len() * v.params.n > limits.max_n {
        return Err(
            ApiError::bad_request(format!("prompts × n exceeds {}", limits.max_n)).param("n"),
        );
    }
    let echo = req.echo.unwrap_or(false);
    if echo && logprobs.is_some() {
        v.params.prompt_logprobs = logprobs;
    }
    v.params.logprobs = logprobs;
    let echo_text = if echo {
        prompts.iter().map(|p| tokenizer.decode(p, true)).collect()
    } else {
        Vec::new()
    };
    Ok(Job {
        id: format!("cmpl-{id_num}"),
        created: unix_now(),
        prompts,
        params: v.params,
        stop: v.stop,
        stream: v.stream,
        include_usage: v.include_usage,
        logprobs,
        flavor: Flavor::Completion { echo: echo_text },
        legacy_functions: false,
    })
}

/// A completion request's prompts as tokens: 1 to 16 of them, none empty.
fn completion_prompts(
    tokenizer: &Tokenizer,
    prompt: &PromptInput,
) -> Result<Vec<Vec<u32>>, ApiError> {
    let vocab = tokenizer.vocab_size();
    let prompts: Vec<Vec<u32>> = match prompt {
        PromptInput::Text(t) => vec![encode(tokenizer, t)?],
        PromptInput::TextBatch(ts) => ts
            .iter()
            .map(|t| encode(tokenizer, t))
            .collect::<Result<_, _>>()?,
        PromptInput::Tokens(ids) => vec![api::token_ids(ids, vocab)?],
        PromptInput::TokenBatch(b) => b
            .iter()
            .map(|ids| api::token_ids(ids, vocab))
            .collect::<Result<_, _>>()?,
    };
    if prompts.is_empty() || prompts.len() > 16 {
        return Err(ApiError::bad_request("prompt must hold 1 to 16 prompts").param("prompt"));
    }
    if prompts.iter().any(|p| p.is_empty()) {
        return Err(ApiError::bad_request("the prompt is empty").param("prompt"));
    }
    Ok(prompts)
}

/// A /v1/chat/completions body: the messages rendered through the model's chat template, with
/// the output rules of its tools and reasoning.
fn parse_chat(p: &Parsing, mut value: Value, id_num: u64) -> Result<Job, ApiError> {
    let (tokenizer, chat, grammars, limits) = (p.tokenizer, p.chat, p.grammars, p.limits);
    let legacy_functions = legacy_functions(&mut value)?;
    api::check_keys(&value, api::CHAT_KEYS)?;
    let req: ChatRequest = serde_json::from_value(value)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let Some(tmpl) = chat else {
        return Err(ApiError::bad_request(
            "this model has no chat template; use /v1/completions",
        ));
    };
    if req.messages.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty").param("messages"));
    }
    let mut v = api::validate_sampling(&req.sampling, req.max_completion_tokens, limits)?;
    v.params.sampling.logit_bias = api::logit_bias(&req.sampling, tokenizer.vocab_size())?;
    if req
        .sampling
        .max_tokens
        .or(req.max_completion_tokens)
        .is_none()
    {
        // A chat answer runs until the model stops or the context is full (the engine
        // bounds every sequence by the context).
        v.params.max_tokens = crate::engine::UNTIL_CONTEXT_END;
    }
    let setup = chat_request::prepare(tmpl, tokenizer, &req, api::constraint_spec(&req.sampling)?)?;
    v.params.constraint = compile(grammars, setup.constraint)?;
    v.stop.extend(setup.stop);
    v.params.stop_tokens.extend(setup.stop_tokens);
    let prompt = encode(tokenizer, &setup.prompt)?;
    let logprobs = chat_logprobs(&req, limits)?;
    v.params.logprobs = logprobs;
    Ok(Job {
        id: format!("chatcmpl-{id_num}"),
        created: unix_now(),
        prompts: vec![prompt],
        params: v.params,
        stop: v.stop,
        stream: v.stream,
        include_usage: v.include_usage,
        logprobs,
        flavor: Flavor::Chat(setup.rules),
        legacy_functions,
    })
}

/// The legacy `functions` and `function_call` fields as the `tools` and `tool_choice` they
/// mean (one call at most); whether the request used them.
fn legacy_functions(value: &mut Value) -> Result<bool, ApiError> {
    let Some(obj) = value.as_object_mut() else {
        return Ok(false);
    };
    let functions = obj.remove("functions");
    let choice = obj.remove("function_call");
    let Some(functions) = functions else {
        return match choice {
            Some(_) => {
                Err(ApiError::bad_request("function_call needs functions").param("function_call"))
            }
            None => Ok(false),
        };
    };
    if obj.contains_key("tools") || obj.contains_key("tool_choice") {
        return Err(ApiError::bad_request("give tools or functions, not both").param("functions"));
    }
    let Value::Array(list) = functions else {
        return Err(ApiError::bad_request("functions must be a list").param("functions"));
    };
    let tools: Vec<Value> = list
        .into_iter()
        .map(|f| serde_json::json!({"type": "function", "function": f}))
        .collect();
    obj.insert("tools".into(), Value::Array(tools));
    match choice {
        None => {}
        Some(Value::Object(named)) => {
            let name = named.get("name").cloned().unwrap_or(Value::Null);
            obj.insert(
                "tool_choice".into(),
                serde_json::json!({"type": "function", "function": {"name": name}}),
            );
        }
        Some(mode) => {
            obj.insert("tool_choice".into(), mode);
        }
    }
    obj.insert("parallel_tool_calls".into(), Value::Bool(false));
    Ok(true)
}

/// A /v1/responses body: translated into the chat request it means, after the conversation
/// its `previous_response_id` names, and run as that chat request.
fn parse_response(p: &Parsing, value: Value, id_num: u64) -> Result<Job, ApiError> {
    let previous = match value.get("previous_response_id") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(id)) => p
            .responses
            .and_then(|s| s.get(id))
            .ok_or_else(|| ApiError::response_not_found(id).param("previous_response_id"))?
            .conversation(),
        Some(_) => {
            return Err(
                ApiError::bad_request("previous_response_id must be a string")
                    .param("previous_response_id"),
            )
        }
    };
    let t = responses::translate(&value, previous)?;
    let mut job = parse_chat(p, t.chat, id_num).map_err(responses::in_request_terms)?;
    let Flavor::Chat(rules) = job.flavor else {
        unreachable!("a chat request has chat rules");
    };
    job.id = format!("resp_{}{id_num:06}", p.id_tag);
    let meta = ResponseMeta {
        echo: t.echo,
        input: responses::with_ids(t.items, &job.id),
        store: p.responses.filter(|_| t.store).cloned(),
    };
    job.flavor = Flavor::Response(rules, Box::new(meta));
    Ok(job)
}

/// The alternatives per token a chat request asks for: `top_logprobs` (0 when absent) with
/// `logprobs: true`, none without (and `top_logprobs` alone is an error).
fn chat_logprobs(req: &ChatRequest, limits: &Limits) -> Result<Option<usize>, ApiError> {
    if req.logprobs.unwrap_or(false) {
        Ok(Some(
            api::check_logprobs(req.top_logprobs.or(Some(0)), limits, "top_logprobs")?.unwrap_or(0),
        ))
    } else if req.top_logprobs.is_some() {
        Err(ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs"))
    } else {
        Ok(None)
    }
}

/// The request's constraint compiled against the vocabulary (400 when it does not compile or
/// exceeds the grammar limits).
fn compile(
    grammars: &Grammars,
    spec: Option<ConstraintSpec>,
) -> Result<Option<Constraint>, ApiError> {
    let Some(spec) = spec else { return Ok(None) };
    grammars
        .compile(&spec)
        .map(Some)
        .map_err(|e| ApiError::bad_request(e).param(spec.kind()))
}

/// Fuzzing entry (not an API): [`parse_request`] with the server's default limits, as the
/// `request_json` fuzz target drives it. `Err` carries the HTTP status of the rejection.
#[doc(hidden)]
pub fn fuzz_parse_request(
    tokenizer: &Tokenizer,
    chat: Option<&ChatTemplate>,
    grammars: &Grammars,
    path: &str,
    body: &[u8],
) -> Result<(), u16> {
    let limits = Limits::for_engine(16);
    let p = Parsing {
        tokenizer,
        chat,
        grammars,
        limits: &limits,
        responses: None,
        id_tag: "fuzz",
    };
    parse_request(&p, path, body, 0)
        .map(|_| ())
        .map_err(|e| e.status)
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .encode(text, true)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("prompt"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> (Tokenizer, ChatTemplate, Grammars) {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let chat = ChatTemplate::new(
            tok.chat_template().unwrap(),
            tok.special_text(tok.bos),
            tok.special_text(tok.eos),
        )
        .unwrap();
        let g = Grammars::new(&tok).unwrap();
        (tok, chat, g)
    }

    #[test]
    fn parse_request_accepts_and_rejects() {
        let (tok, chat, g) = reference();
        let p = |path: &str, body: &str| {
            fuzz_parse_request(&tok, Some(&chat), &g, path, body.as_bytes())
        };
        assert_eq!(
            p("/v1/completions", r#"{"prompt":"Hi","max_tokens":3}"#),
            Ok(())
        );
        assert_eq!(
            p(
                "/v1/completions",
                r#"{"prompt":[1,2],"echo":true,"logprobs":2}"#
            ),
            Ok(())
        );
        assert_eq!(
            p(
                "/v1/chat/completions",
                r#"{"messages":[{"role":"user","content":"Hi"}]}"#
            ),
            Ok(())
        );
        assert_eq!(
            p("/v1/completions", r#"{"prompt":"Hi","bogus":1}"#),
            Err(400)
        );
        assert_eq!(p("/v1/completions", r#"{"prompt":[49152]}"#), Err(400));
        assert_eq!(p("/v1/completions", "\u{0}"), Err(400));
        assert_eq!(
            p(
                "/v1/chat/completions",
                r#"{"messages":[{"role":"wizard","content":"x"}]}"#
            ),
            Err(400)
        );
        assert_eq!(p("/v1/chat/completions", r#"{"messages":[]}"#), Err(400));
        let chat = |extra: &str| {
            p(
                "/v1/chat/completions",
                &format!(r#"{{"messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#),
            )
        };
        let lamp = r#""tools":[{"type":"function","function":{"name":"lamp","parameters":{"type":"object","properties":{"on":{"type":"boolean"}}}}}]"#;
        assert_eq!(chat(r#","response_format":{"type":"json_object"}"#), Ok(()));
        assert_eq!(
            chat(&format!(",{lamp},\"tool_choice\":\"required\"")),
            Ok(())
        );
        assert_eq!(
            chat(r#","regex":"[0-9]+","grammar":"start: \"a\"""#),
            Err(400)
        );
        assert_eq!(
            chat(
                r#","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"bogus"}}}"#
            ),
            Err(400)
        );
        assert_eq!(
            chat(&format!(",{lamp},\"tool_choice\":\"sometimes\"")),
            Err(400)
        );
        assert_eq!(
            fuzz_parse_request(
                &tok,
                None,
                &g,
                "/v1/chat/completions",
                br#"{"messages":[{"role":"user","content":"Hi"}]}"#
            ),
            Err(400)
        );
    }
}
