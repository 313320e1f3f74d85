//! `POST /v1/embeddings`, in OpenAI's shape: each input is a prompt the engine prefills and
//! pools (`GenParams::embed`), batched with every other request's prompts; the vectors come
//! back L2-normalised, as floats or base64, optionally truncated to `dimensions`.

use super::api::{self, PromptInput};
use super::error::ApiError;
use super::http::RawResponse;
use super::{base64, triage, Ready, Server};
use crate::engine::pooled::l2_normalize;
use crate::engine::{EngineHandle, Event, GenParams, RequestId};
use crate::tokenizer::Tokenizer;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Instant;

/// Inputs one request may carry (OpenAI's bound).
pub const MAX_INPUTS: usize = 2048;

/// The body's keys (OpenAI's; `user` is accepted and ignored).
const KEYS: &[&str] = &["input", "model", "encoding_format", "dimensions", "user"];

/// A validated embeddings request.
#[derive(Debug, PartialEq)]
pub struct EmbeddingJob {
    pub inputs: Vec<Vec<u32>>,
    /// Echoed in the response: the request's, else the served model's name.
    pub model: String,
    pub base64: bool,
    pub dimensions: Option<usize>,
}

/// What validation needs of the served model.
pub struct Served<'a> {
    pub tokenizer: &'a Tokenizer,
    pub name: &'a str,
    /// `EngineLimits::embedding_width`.
    pub width: Option<usize>,
    pub context: usize,
}

impl Served<'_> {
    fn of(ready: &Ready) -> Served<'_> {
        let l = &ready.engine.limits;
        Served {
            tokenizer: &ready.tokenizer,
            name: &ready.model_name,
            width: l.embedding_width,
            context: l.context,
        }
    }
}

/// Parses and validates a body into a job; every refusal is a 400 naming its field.
pub fn parse(m: &Served<'_>, body: &[u8]) -> Result<EmbeddingJob, ApiError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let obj = value
        .as_object()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    if let Some(k) = obj.keys().find(|k| !KEYS.contains(&k.as_str())) {
        let e = ApiError::bad_request(format!("unrecognized request argument: {k}"));
        return Err(e.param(k));
    }
    let model = match obj.get("model") {
        None | Some(Value::Null) => m.name.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::bad_request("model must be a string").param("model")),
    };
    let Some(width) = m.width else {
        let e = format!(
            "model '{}' has no pooling type (pooling_type in its GGUF), so it serves no embeddings",
            m.name
        );
        return Err(ApiError::bad_request(e).param("model"));
    };
    let input = obj
        .get("input")
        .ok_or_else(|| ApiError::bad_request("input is required").param("input"))?;
    let inputs = inputs(m, input)?;
    let base64 = match obj.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(_) => {
            let e = ApiError::bad_request("encoding_format must be 'float' or 'base64'");
            return Err(e.param("encoding_format"));
        }
    };
    let dimensions = match obj.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(d) if d >= 1 && d <= width as u64 => Some(d as usize),
            _ => {
                let e = format!("dimensions must be an integer from 1 to {width} (the model's)");
                return Err(ApiError::bad_request(e).param("dimensions"));
            }
        },
    };
    Ok(EmbeddingJob {
        inputs,
        model,
        base64,
        dimensions,
    })
}

/// The inputs as token ids: 1 to [`MAX_INPUTS`] of them, none empty, each within the
/// context.
fn inputs(m: &Served<'_>, input: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |msg: String| ApiError::bad_request(msg).param("input");
    let parsed: PromptInput = serde_json::from_value(input.clone()).map_err(|_| {
        bad("input must be a string, a list of strings, a list of token ids or a list of token-id lists".into())
    })?;
    let vocab = m.tokenizer.vocab_size();
    let ids = |v: &[i64]| api::token_ids(v, vocab).map_err(|e| e.param("input"));
    let encode = |t: &String| m.tokenizer.encode(t, true).map_err(|e| bad(e.to_string()));
    let inputs: Vec<Vec<u32>> = match &parsed {
        PromptInput::Text(t) => vec![encode(t)?],
        PromptInput::TextBatch(ts) => ts.iter().map(encode).collect::<Result<_, _>>()?,
        PromptInput::Tokens(v) if v.is_empty() => Vec::new(),
        PromptInput::Tokens(v) => vec![ids(v)?],
        PromptInput::TokenBatch(b) => b.iter().map(|v| ids(v)).collect::<Result<_, _>>()?,
    };
    if inputs.is_empty() || inputs.len() > MAX_INPUTS {
        return Err(bad(format!("input must hold 1 to {MAX_INPUTS} inputs")));
    }
    for (i, p) in inputs.iter().enumerate() {
        if p.is_empty() {
            return Err(bad(format!("input {i} is empty")));
        }
        if p.len() > m.context {
            return Err(bad(format!(
                "input {i} is {} tokens, more than the context length of {} tokens",
                p.len(),
                m.context
            )));
        }
    }
    Ok(inputs)
}

/// The response body for `vectors` (one per input, in order, unit length).
pub fn answer(job: &EmbeddingJob, vectors: Vec<Vec<f32>>) -> Value {
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, mut v)| {
            if let Some(d) = job.dimensions {
                // A truncated vector is scaled back to unit length, as OpenAI's are.
                v.truncate(d);
                l2_normalize(&mut v);
            }
            let embedding = match job.base64 {
                true => json!(base64::encode_f32(&v)),
                false => json!(v),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens: usize = job.inputs.iter().map(Vec::len).sum();
    json!({
        "object": "list",
        "data": data,
        "model": job.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

/// Submits every input and waits for its vector; on any failure the rest are cancelled.
fn run(engine: &EngineHandle, job: &EmbeddingJob) -> Result<Vec<Vec<f32>>, ApiError> {
    let mut submitted: Vec<(RequestId, _)> = Vec::with_capacity(job.inputs.len());
    let cancel_all = |ids: &[(RequestId, _)]| ids.iter().for_each(|(id, _)| engine.cancel(*id));
    for p in &job.inputs {
        let params = GenParams {
            max_tokens: 0,
            embed: true,
            ..GenParams::default()
        };
        match engine.submit(p.clone(), params) {
            Ok(s) => submitted.push(s),
            Err(e) => {
                cancel_all(&submitted);
                return Err(ApiError::bad_request(e.to_string()).param("input"));
            }
        }
    }
    let mut vectors = Vec::with_capacity(submitted.len());
    for (i, (_, rx)) in submitted.iter().enumerate() {
        let failed = loop {
            match rx.recv() {
                Ok(Event::Embedding { vector, .. }) => {
                    vectors.push(vector);
                    break None;
                }
                Ok(Event::Error(e)) => break Some(e),
                Ok(_) => continue,
                Err(_) => break Some("the engine stopped".to_string()),
            }
        };
        if let Some(e) = failed {
            cancel_all(&submitted[i..]);
            return Err(ApiError::internal(format!("embedding failed: {e}")));
        }
    }
    Ok(vectors)
}

impl Server {
    /// `POST /v1/embeddings`: parsed, admitted as a generation request is (its prompt tokens
    /// count), run, answered.
    pub(super) fn embeddings(
        self: &Arc<Self>,
        ready: &Ready,
        body: &[u8],
        resp: RawResponse,
        pending: Option<triage::Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        let job = match self
            .refuse_if_draining()
            .and_then(|_| parse(&Served::of(ready), body))
        {
            Ok(j) => j,
            Err(e) => return Err((e, resp)),
        };
        let n_prompt: usize = job.inputs.iter().map(Vec::len).sum();
        let (mut ticket, _in_flight) = match self.admit_request(n_prompt, pending) {
            Ok(admitted) => admitted,
            Err(e) => return Err((e, resp)),
        };
        let started = Instant::now();
        let vectors = match run(&ready.engine, &job) {
            Ok(v) => v,
            Err(e) => return Err((e, resp)),
        };
        ticket.first_token(Instant::now());
        let body = answer(&job, vectors).to_string();
        let _ = resp.send(200, "application/json", &[], body.as_bytes());
        log::info!(
            "embeddings: {} inputs, prompt_tokens={n_prompt} duration={:.3}s",
            job.inputs.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        Tokenizer::from_gguf(&file).unwrap()
    }

    fn served(tok: &Tokenizer, width: Option<usize>) -> Served<'_> {
        Served {
            tokenizer: tok,
            name: "m.gguf",
            width,
            context: 8,
        }
    }

    /// The refused field of `body`, or the job.
    fn check(m: &Served<'_>, body: &str) -> Result<EmbeddingJob, String> {
        parse(m, body.as_bytes()).map_err(|e| e.param.unwrap_or_default())
    }

    #[test]
    fn inputs_in_every_shape() {
        let tok = tokenizer();
        let m = served(&tok, Some(4));
        let one = check(&m, r#"{"input":"hello"}"#).unwrap();
        assert_eq!(one.inputs.len(), 1);
        assert_eq!(
            (one.model.as_str(), one.base64, one.dimensions),
            ("m.gguf", false, None)
        );
        assert_eq!(check(&m, r#"{"input":["a","b"]}"#).unwrap().inputs.len(), 2);
        assert_eq!(
            check(&m, r#"{"input":[1,2]}"#).unwrap().inputs,
            vec![vec![1, 2]]
        );
        let two = check(
            &m,
            r#"{"input":[[1],[2,3]],"model":"x","encoding_format":"base64","dimensions":2}"#,
        );
        let two = two.unwrap();
        assert_eq!(two.inputs, vec![vec![1], vec![2, 3]]);
        assert_eq!(
            (two.model.as_str(), two.base64, two.dimensions),
            ("x", true, Some(2))
        );
    }

    #[test]
    fn bad_input_names_its_field() {
        let tok = tokenizer();
        let m = served(&tok, Some(4));
        for (body, field) in [
            (r#"{"input":[]}"#, "input"),
            (r#"{"input":""}"#, "input"),
            (r#"{"input":["a",""]}"#, "input"),
            (r#"{"input":[[]]}"#, "input"),
            (r#"{"input":[-1]}"#, "input"),
            (r#"{"input":[1,2,3,4,5,6,7,8,9]}"#, "input"),
            (r#"{"input":{"a":1}}"#, "input"),
            (r#"{}"#, "input"),
            (r#"{"input":"a","dimensions":5}"#, "dimensions"),
            (r#"{"input":"a","dimensions":0}"#, "dimensions"),
            (
                r#"{"input":"a","encoding_format":"int8"}"#,
                "encoding_format",
            ),
            (r#"{"input":"a","temperature":1}"#, "temperature"),
        ] {
            assert_eq!(check(&m, body).unwrap_err(), field, "{body}");
        }
        let many = format!(r#"{{"input":{}}}"#, json!(vec!["a"; MAX_INPUTS + 1]));
        assert_eq!(check(&m, &many).unwrap_err(), "input");
        assert_eq!(
            check(&served(&tok, None), r#"{"input":"a"}"#).unwrap_err(),
            "model"
        );
    }

    #[test]
    fn the_answer_truncates_renormalises_and_encodes() {
        let job = EmbeddingJob {
            inputs: vec![vec![1, 2], vec![3]],
            model: "m".into(),
            base64: false,
            dimensions: Some(2),
        };
        let v = answer(&job, vec![vec![0.6, 0.0, 0.8], vec![0.0, 0.6, 0.8]]);
        assert_eq!(v["data"][0]["embedding"], json!([1.0, 0.0]));
        assert_eq!(v["data"][1]["embedding"], json!([0.0, 1.0]));
        assert_eq!(v["data"][1]["index"], 1);
        assert_eq!(v["usage"], json!({"prompt_tokens": 3, "total_tokens": 3}));
        let b64 = EmbeddingJob {
            base64: true,
            dimensions: None,
            ..job
        };
        let v = answer(&b64, vec![vec![1.0], vec![1.0]]);
        assert_eq!(v["data"][0]["embedding"], "AACAPw==");
    }
}
