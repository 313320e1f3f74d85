//! The fields every generation request shares, checked and turned into the engine's
//! parameters: length, sampling, stop strings, streaming, logit bias, the one constraint, and
//! the server's limits on them. Every refusal is a 400 naming its field.

use super::error::ApiError;
use super::request::{Sampling, StopInput};
use crate::engine::{GenParams, SamplingParams};
use crate::grammar::ConstraintSpec;

/// Which endpoint a generation request came to: each has its own default length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    /// Chat completions, and the Responses API (run as a chat request).
    Chat,
}

impl Endpoint {
    /// The most tokens a request may generate when it names no limit, decided here alone: a
    /// completion stops after 16, OpenAI's documented default for `/v1/completions`; a chat
    /// answer runs until the model stops or the context is full (`None`), as OpenAI's do.
    pub fn default_max_tokens(self) -> Option<usize> {
        match self {
            Endpoint::Completions => Some(16),
            Endpoint::Chat => None,
        }
    }
}

/// Server-side limits requests are checked against.
pub struct Limits {
    pub max_n: usize,
    pub max_stop: usize,
    pub max_stop_len: usize,
    pub max_logprobs: usize,
}

impl Limits {
    /// The limits for an engine that runs `max_seqs` sequences at once: a request may ask
    /// for no more completions than that, and never more than 16.
    pub fn for_engine(max_seqs: usize) -> Limits {
        Limits {
            max_n: max_seqs.min(16),
            max_stop: 16,
            max_stop_len: 256,
            max_logprobs: 20,
        }
    }
}

pub struct Validated {
    pub params: GenParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
}

/// Turns the shared fields into engine parameters. `max_tokens` is the request's limit in
/// whichever field its endpoint names it (`max_tokens`, or chat's `max_completion_tokens`).
pub fn validate_sampling(
    s: &Sampling,
    max_tokens: Option<i64>,
    endpoint: Endpoint,
    limits: &Limits,
) -> Result<Validated, ApiError> {
    let max_tokens = match max_tokens {
        None => endpoint.default_max_tokens(),
        Some(m) => Some(token_limit(m)?),
    };
    let n = completions(s.n, limits)?;
    let stop = stop_strings(s.stop.as_ref(), limits)?;
    let sampling = sampling_params(s)?;
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

/// A request's own `max_tokens`: any count from 0.
fn token_limit(m: i64) -> Result<usize, ApiError> {
    if m < 0 {
        return Err(
            ApiError::bad_request(format!("max_tokens must be ≥ 0, got {m}")).param("max_tokens"),
        );
    }
    usize::try_from(m)
        .map_err(|_| ApiError::bad_request("max_tokens is too large").param("max_tokens"))
}

/// `n`: completions per prompt, 1 by default.
fn completions(n: Option<i64>, limits: &Limits) -> Result<usize, ApiError> {
    match n {
        None => Ok(1),
        Some(n) if n < 1 || n as u64 > limits.max_n as u64 => Err(ApiError::bad_request(format!(
            "n must be between 1 and {}, got {n}",
            limits.max_n
        ))
        .param("n")),
        Some(n) => Ok(n as usize),
    }
}

/// The stop strings: at most `max_stop`, each 1 to `max_stop_len` bytes.
fn stop_strings(stop: Option<&StopInput>, limits: &Limits) -> Result<Vec<String>, ApiError> {
    let stop = match stop {
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
    Ok(stop)
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

/// The sampler's settings, each within its range (logit bias aside: `logit_bias`).
fn sampling_params(s: &Sampling) -> Result<SamplingParams, ApiError> {
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
    let sampling = SamplingParams {
        temperature: in_range(s.temperature, "temperature", 0.0, 2.0, 1.0)?,
        top_k,
        top_p: in_range(s.top_p, "top_p", 0.0, 1.0, 1.0)?,
        min_p: in_range(s.min_p, "min_p", 0.0, 1.0, 0.0)?,
        presence_penalty: in_range(s.presence_penalty, "presence_penalty", -2.0, 2.0, 0.0)?,
        frequency_penalty: in_range(s.frequency_penalty, "frequency_penalty", -2.0, 2.0, 0.0)?,
        repetition_penalty: in_range(s.repetition_penalty, "repetition_penalty", 0.01, 10.0, 1.0)?,
        // Any 64-bit seed is fine; negative ones are reinterpreted.
        seed: s.seed.map(|v| v as u64),
        // Checked against the vocabulary where it is known (`logit_bias`).
        logit_bias: Vec::new(),
    };
    if sampling.top_p == 0.0 {
        return Err(ApiError::bad_request("top_p must be greater than 0").param("top_p"));
    }
    Ok(sampling)
}

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
