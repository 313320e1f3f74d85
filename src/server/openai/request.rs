//! The request bodies as OpenAI's clients send them, each parsed once from the body's bytes
//! into its type (`parse`). Unknown fields are refused by name, since a typo should not
//! silently change behaviour; the fields of OpenAI's bookkeeping are accepted and ignored,
//! since none changes what one model on one box generates (`Bookkeeping`).

use super::error::ApiError;
use crate::chat::{Conversation, Function};
use serde::de::{DeserializeOwned, IgnoredAny};
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

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

/// Sampling, length and constraint fields both generation endpoints take.
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
    pub response_format: Option<Value>,
    /// llama.cpp's field: a JSON schema the output must match.
    pub json_schema: Option<Value>,
    /// A grammar in llguidance's Lark syntax.
    pub grammar: Option<String>,
    /// A regular expression the whole output must match.
    pub regex: Option<String>,
    /// Token id (as a string) → a bias in [-100, 100] added to its logit.
    pub logit_bias: Option<Map<String, Value>>,
}

/// Fields OpenAI's API takes for its own bookkeeping (storage, billing, caching, routing,
/// safety reporting, output modality): accepted so that clients which always send them work,
/// and ignored, since none changes what one model on one box generates. (Answers name the one
/// processing tier edgelm has, `"default"`, whatever `service_tier` asked for.)
pub const BOOKKEEPING: &[&str] = &[
    "store",
    "metadata",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
    "modalities",
    "prediction",
    "user",
];

/// Whatever keys a body has beyond its type's fields: each is refused by name, unless the
/// endpoint accepts and ignores it.
#[derive(Deserialize, Debug, Default)]
pub struct Extra {
    #[serde(flatten)]
    keys: BTreeMap<String, IgnoredAny>,
}

impl Extra {
    fn refuse(&self, ignored: &[&str]) -> Result<(), ApiError> {
        match self.keys.keys().find(|k| !ignored.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => {
                Err(ApiError::bad_request(format!("unrecognized request argument: {k}")).param(k))
            }
        }
    }
}

/// A `/v1/completions` body.
#[derive(Deserialize, Debug)]
pub struct CompletionBody {
    pub model: Option<String>,
    pub prompt: PromptInput,
    pub logprobs: Option<i64>,
    pub echo: Option<bool>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A `/v1/chat/completions` body.
#[derive(Deserialize, Debug)]
pub struct ChatBody {
    pub model: Option<String>,
    /// The messages, tools, tool choice and reasoning effort: what makes the prompt.
    #[serde(flatten)]
    pub conversation: Conversation,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    /// The legacy form of `tools`: functions only, at most one call (`function_call`).
    pub functions: Option<Vec<Function>>,
    /// The legacy form of `tool_choice`.
    pub function_call: Option<Value>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A `/tokenize` body: a prompt, or messages rendered as a chat request renders them.
#[derive(Deserialize, Debug)]
pub struct TokenizeBody {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<crate::chat::Message>>,
    /// Tools the chat template is to show (with `messages`), offered as a chat request's
    /// `tools`, `tool_choice` and `parallel_tool_calls` offer them.
    pub tools: Option<Vec<crate::chat::Tool>>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// As in a chat request, so that the prompt counted is the one a chat request renders.
    pub reasoning_effort: Option<Value>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A `/detokenize` body.
#[derive(Deserialize, Debug)]
pub struct DetokenizeBody {
    pub model: Option<String>,
    pub tokens: Vec<i64>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A body's bytes as `T`, in one pass: not UTF-8, not JSON, not an object, or a field of the
/// wrong type is a 400, and so is a field `T` does not know (its `extra`) unless `ignored`
/// names it.
pub fn parse<T: DeserializeOwned>(
    body: &[u8],
    extra: impl Fn(&T) -> &Extra,
    ignored: &[&str],
) -> Result<T, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not valid UTF-8"))?;
    let first = text.trim_start().chars().next();
    if first.is_some() && first != Some('{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let parsed: T = serde_json::from_str(text).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::bad_request(format!("invalid request: {e}")),
        _ => ApiError::bad_request(format!("invalid JSON: {e}")),
    })?;
    extra(&parsed).refuse(ignored)?;
    Ok(parsed)
}
