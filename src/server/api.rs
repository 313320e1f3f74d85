//! OpenAI request shapes and their validation into engine parameters. Unknown fields are
//! rejected (a typo should not silently change behaviour); fields OpenAI defines that have
//! no effect here are accepted and ignored only where ignoring them is harmless.

use super::error::ApiError;
use crate::engine::{GenParams, SamplingParams};
use crate::grammar::ConstraintSpec;
use serde::Deserialize;

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum PromptInput {
    Text(String),
    Tokens(Vec<i64>),
    TextBatch(Vec<String>),
    TokenBatch(Vec<Vec<i64>>),
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// Sampling and length fields shared by both endpoints.
#[derive(Deserialize, Debug, Default)]
pub struct Sampling {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Option<StopInput>,
    pub n: Option<i64>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub ignore_eos: Option<bool>,
    /// Speculate with prompt-lookup drafts (greedy requests, where the server enables it
    /// with `--prompt-lookup`): the same output, faster when it copies from the prompt.
    pub prompt_lookup: Option<bool>,
    /// OpenAI's `{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`.
    pub response_format: Option<serde_json::Value>,
    /// llama.cpp's field: a JSON schema the output must match.
    pub json_schema: Option<serde_json::Value>,
    /// A grammar in llguidance's Lark syntax.
    pub grammar: Option<String>,
    /// A regular expression the whole output must match.
    pub regex: Option<String>,
    /// Token id (as a string) → a bias in [-100, 100] added to its logit.
    pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
}

/// Keys the sampling block accepts, on both endpoints.
pub const SAMPLING_KEYS: &[&str] = &[
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "stop",
    "n",
    "stream",
    "stream_options",
    "ignore_eos",
    "prompt_lookup",
    "response_format",
    "json_schema",
    "grammar",
    "regex",
    "logit_bias",
];

/// Fields OpenAI's API takes for its own bookkeeping (storage, billing, caching, routing,
/// safety reporting, output modality): accepted so that clients which always send them work,
/// and ignored, since none changes what one model on one box generates.
pub const BOOKKEEPING_KEYS: &[&str] = &[
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "modalities",
    "prediction",
];
pub const COMPLETION_KEYS: &[&str] = &["model", "prompt", "logprobs", "echo", "user"];
pub const CHAT_KEYS: &[&str] = &[
    "model",
    "messages",
    "logprobs",
    "top_logprobs",
    "max_completion_tokens",
    "user",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
];

/// `logit_bias` as (token, bias) pairs: ids below `vocab`, biases in [-100, 100].
pub fn logit_bias(s: &Sampling, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    let bad = |m: String| ApiError::bad_request(m).param("logit_bias");
    let Some(map) = &s.logit_bias else {
        return Ok(Vec::new());
    };
    map.iter()
        .map(|(k, v)| {
            let id: u32 = k
                .parse()
                .map_err(|_| bad(format!("logit_bias key {k:?} is not a token id")))?;
            if id as usize >= vocab {
                return Err(bad(format!(
                    "logit_bias token {id} is not in the vocabulary ({vocab} tokens)"
                )));
            }
            match v.as_f64() {
                Some(b) if (-100.0..=100.0).contains(&b) => Ok((id, b as f32)),
                _ => Err(bad(format!(
                    "logit_bias values must be numbers between -100 and 100, got {v} for {id}"
                ))),
            }
        })
        .collect()
}

/// Rejects keys neither list names (serde cannot deny unknown fields next to `flatten`).
pub fn check_keys(body: &serde_json::Value, own: &[&str]) -> Result<(), ApiError> {
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    for k in obj.keys() {
        let k = k.as_str();
        if !own.contains(&k) && !SAMPLING_KEYS.contains(&k) && !BOOKKEEPING_KEYS.contains(&k) {
            return Err(
                ApiError::bad_request(format!("unrecognized request argument: {k}")).param(k),
            );
        }
    }
    Ok(())
}

#[derive(Deserialize, Debug)]
pub struct CompletionRequest {
    /// Accepted for compatibility: one model is served, whatever the name.
    #[allow(dead_code)]
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    #[allow(dead_code)]
    pub user: Option<String>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    /// An assistant turn's calls, as OpenAI sends them back.
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A tool result's call.
    pub tool_call_id: Option<String>,
    /// The legacy form of an assistant's one call (`{"name", "arguments"}`), answered by a
    /// `role: function` message with the same `name`.
    pub function_call: Option<serde_json::Value>,
    /// Sent back by some clients with an assistant turn; not part of the prompt.
    #[allow(dead_code)]
    pub refusal: Option<serde_json::Value>,
    /// Clients may send the reasoning back: templates see it as `thinking` (gpt-oss keeps the
    /// reasoning behind a call), others drop it.
    pub reasoning_content: Option<String>,
}

#[derive(Deserialize, Debug)]
pub struct ChatRequest {
    /// Accepted for compatibility: one model is served, whatever the name.
    #[allow(dead_code)]
    pub model: Option<String>,
    pub messages: Vec<Message>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    #[allow(dead_code)]
    pub user: Option<String>,
    pub tools: Option<Vec<super::tools::Tool>>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    /// `low`, `medium` or `high`: for templates that set a reasoning budget (gpt-oss).
    pub reasoning_effort: Option<serde_json::Value>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    /// Accepted for compatibility: one model is served, whatever the name.
    #[allow(dead_code)]
    pub model: Option<String>,
    /// Tools the chat template is to show (with `messages`), offered as a chat request's
    /// `tools`, `tool_choice` and `parallel_tool_calls` offer them.
    pub tools: Option<Vec<super::tools::Tool>>,
    pub tool_choice: Option<serde_json::Value>,
    pub parallel_tool_calls: Option<bool>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<Message>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    /// As in a chat request, so that the prompt counted is the one a chat request renders.
    pub reasoning_effort: Option<serde_json::Value>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
pub struct DetokenizeRequest {
    /// Accepted for compatibility: one model is served, whatever the name.
    #[allow(dead_code)]
    pub model: Option<String>,
    pub tokens: Vec<i64>,
}

/// Server-side limits requests are checked against.
pub struct Limits {
    pub max_n: usize,
    pub max_stop: usize,
    pub max_stop_len: usize,
    pub max_logprobs: usize,
    pub default_max_tokens: usize,
}

impl Limits {
    /// The server's limits for an engine running `max_seqs` sequences at most: a request may
    /// ask for no more completions than run at once, and never more than 16.
    pub fn for_engine(max_seqs: usize) -> Limits {
        Limits {
            max_n: max_seqs.min(16),
            max_stop: 16,
            max_stop_len: 256,
            max_logprobs: 20,
            default_max_tokens: 16,
        }
    }
}

pub struct Validated {
    pub params: GenParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

fn in_range(v: Option<f64>, name: &str, lo: f64, hi: f64, default: f64) -> Result<f32, ApiError> {
    let v = v.unwrap_or(default);
    if !v.is_finite() || v < lo || v > hi {
        return Err(ApiError::bad_request(format!(
            "{name} must be between {lo} and {hi}, got {v}"
        ))
        .param(name));
    }
    Ok(v as f32)
}

/// Turns the shared fields into engine parameters.
pub fn validate_sampling(
    s: &Sampling,
    max_tokens_override: Option<i64>,
    limits: &Limits,
) -> Result<Validated, ApiError> {
    let max_tokens = match max_tokens_override.or(s.max_tokens) {
        None => limits.default_max_tokens,
        Some(m) if m < 0 => {
            return Err(
                ApiError::bad_request(format!("max_tokens must be ≥ 0, got {m}"))
                    .param("max_tokens"),
            )
        }
        Some(m) => usize::try_from(m)
            .map_err(|_| ApiError::bad_request("max_tokens is too large").param("max_tokens"))?,
    };
    let n = match s.n {
        None => 1,
        Some(n) if n < 1 || n as u64 > limits.max_n as u64 => {
            return Err(ApiError::bad_request(format!(
                "n must be between 1 and {}, got {n}",
                limits.max_n
            ))
            .param("n"))
        }
        Some(n) => n as usize,
    };
    let top_k = match s.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if !(0..=1_000_000).contains(&k) => {
            return Err(
                ApiError::bad_request(format!("top_k must be -1, 0 or positive, got {k}"))
                    .param("top_k"),
            )
        }
        Some(k) => k as usize,
    };
    // Any 64-bit seed is fine; negative ones are reinterpreted.
    let seed = s.seed.map(|v| v as u64);
    let stop = match &s.stop {
        None => Vec::new(),
        Some(StopInput::One(x)) => vec![x.clone()],
        Some(StopInput::Many(v)) => v.clone(),
    };
    if stop.len() > limits.max_stop {
        return Err(ApiError::bad_request(format!(
            "at most {} stop sequences are allowed",
            limits.max_stop
        ))
        .param("stop"));
    }
    if stop
        .iter()
        .any(|x| x.is_empty() || x.len() > limits.max_stop_len)
    {
        return Err(ApiError::bad_request(format!(
            "stop sequences must be 1 to {} bytes",
            limits.max_stop_len
        ))
        .param("stop"));
    }
    let sampling = SamplingParams {
        temperature: in_range(s.temperature, "temperature", 0.0, 2.0, 1.0)?,
        top_k,
        top_p: in_range(s.top_p, "top_p", 0.0, 1.0, 1.0)?,
        min_p: in_range(s.min_p, "min_p", 0.0, 1.0, 0.0)?,
        presence_penalty: in_range(s.presence_penalty, "presence_penalty", -2.0, 2.0, 0.0)?,
        frequency_penalty: in_range(s.frequency_penalty, "frequency_penalty", -2.0, 2.0, 0.0)?,
        repetition_penalty: in_range(s.repetition_penalty, "repetition_penalty", 0.01, 10.0, 1.0)?,
        seed,
        // Checked against the vocabulary where it is known (`logit_bias`).
        logit_bias: Vec::new(),
    };
    if sampling.top_p == 0.0 {
        return Err(ApiError::bad_request("top_p must be greater than 0").param("top_p"));
    }
    let stream = s.stream.unwrap_or(false);
    if s.stream_options.is_some() && !stream {
        return Err(
            ApiError::bad_request("stream_options is only allowed with stream: true")
                .param("stream_options"),
        );
    }
    Ok(Validated {
        params: GenParams {
            max_tokens,
            sampling,
            n,
            ignore_eos: s.ignore_eos.unwrap_or(false),
            prompt_lookup: s.prompt_lookup.unwrap_or(false),
            ..Default::default()
        },
        stop,
        stream,
        include_usage: s.stream_options.as_ref().is_some_and(|o| o.include_usage),
    })
}

/// The constraint the request names, if any (at most one of `response_format` with JSON,
/// `json_schema`, `grammar` and `regex`).
pub fn constraint_spec(s: &Sampling) -> Result<Option<ConstraintSpec>, ApiError> {
    let mut specs: Vec<(&str, ConstraintSpec)> = Vec::new();
    if let Some(rf) = &s.response_format {
        let bad = |m: &str| ApiError::bad_request(m.to_string()).param("response_format");
        match rf.get("type").and_then(|t| t.as_str()) {
            Some("text") => {}
            Some("json_object") => specs.push((
                "response_format",
                match rf.get("schema") {
                    Some(schema) => ConstraintSpec::JsonSchema(schema.clone()),
                    None => ConstraintSpec::JsonObject,
                },
            )),
            Some("json_schema") => {
                let schema = rf
                    .pointer("/json_schema/schema")
                    .or_else(|| rf.get("schema"))
                    .ok_or_else(|| bad("response_format json_schema needs json_schema.schema"))?;
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(bad("the schema must be a JSON object"));
                }
                specs.push((
                    "response_format",
                    ConstraintSpec::JsonSchema(schema.clone()),
                ));
            }
            _ => {
                return Err(bad(
                    "response_format type must be text, json_object or json_schema",
                ))
            }
        }
    }
    if let Some(schema) = &s.json_schema {
        if !(schema.is_object() || schema.is_boolean()) {
            return Err(
                ApiError::bad_request("json_schema must be a JSON schema object")
                    .param("json_schema"),
            );
        }
        specs.push(("json_schema", ConstraintSpec::JsonSchema(schema.clone())));
    }
    if let Some(g) = &s.grammar {
        specs.push(("grammar", ConstraintSpec::Lark(g.clone())));
    }
    if let Some(r) = &s.regex {
        specs.push(("regex", ConstraintSpec::Regex(r.clone())));
    }
    if specs.len() > 1 {
        let names: Vec<&str> = specs.iter().map(|(n, _)| *n).collect();
        return Err(
            ApiError::bad_request(format!("give at most one of {}", names.join(", ")))
                .param(names[1]),
        );
    }
    Ok(specs.pop().map(|(_, s)| s))
}

pub fn check_logprobs(
    v: Option<i64>,
    limits: &Limits,
    name: &str,
) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(k) if k < 0 || k as u64 > limits.max_logprobs as u64 => Err(ApiError::bad_request(
            format!("{name} must be between 0 and {}", limits.max_logprobs),
        )
        .param(name)),
        Some(k) => Ok(Some(k as usize)),
    }
}

/// Token ids from the request, checked to be valid ids.
pub fn token_ids(v: &[i64], vocab: usize) -> Result<Vec<u32>, ApiError> {
    v.iter()
        .map(|&t| {
            if t < 0 || t as u64 >= vocab as u64 {
                Err(ApiError::bad_request(format!(
                    "token id {t} is outside the vocabulary (0..{vocab})"
                ))
                .param("prompt"))
            } else {
                Ok(t as u32)
            }
        })
        .collect()
}

impl Message {
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(MessageContent::Text(t)) => Ok(t.clone()),
            Some(MessageContent::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return Err(ApiError::bad_request(format!(
                            "content part type '{}' is not supported (text only)",
                            p.kind
                        ))
                        .param("messages"));
                    }
                    s += p.text.as_deref().unwrap_or("");
                }
                Ok(s)
            }
        }
    }
}
