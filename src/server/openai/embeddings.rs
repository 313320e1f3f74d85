//! `POST /v1/embeddings` in OpenAI's shape: a body checked into a job (each input a prompt
//! the engine prefills and pools), and the answer: the vectors L2-normalised, as floats or
//! base64, optionally truncated to `dimensions`.

use super::base64;
use super::error::ApiError;
use super::request::{parse, Extra, PromptInput};
use super::sampling::token_ids;
use crate::engine::pooled::l2_normalize;
use crate::server::generate::Ready;
use crate::tokenizer::Tokenizer;
use serde::Deserialize;
use serde_json::{json, Value};

/// Inputs one request may carry (OpenAI's bound).
pub const MAX_INPUTS: usize = 2048;

/// A `/v1/embeddings` body. Its fields stay JSON here so that each refusal can name the field
/// in its own words (`check`).
#[derive(Deserialize, Debug)]
pub struct EmbeddingsBody {
    pub input: Option<Value>,
    pub model: Option<Value>,
    pub encoding_format: Option<Value>,
    pub dimensions: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl EmbeddingsBody {
    pub fn parse(bytes: &[u8]) -> Result<EmbeddingsBody, ApiError> {
        parse(bytes, |b: &EmbeddingsBody| &b.extra, &["user"])
    }

    /// The model the request names.
    pub fn model(&self) -> Result<Option<&str>, ApiError> {
        match &self.model {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ApiError::bad_request("model must be a string").param("model")),
        }
    }
}

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
    pub fn of(ready: &Ready) -> Served<'_> {
        let l = &ready.engine.limits;
        Served {
            tokenizer: &ready.tokenizer,
            name: &ready.model_name,
            width: l.embedding_width,
            context: l.context,
        }
    }
}

/// Checks a body into a job for the served model; every refusal is a 400 naming its field.
pub fn check(m: &Served<'_>, body: &EmbeddingsBody) -> Result<EmbeddingJob, ApiError> {
    let model = body.model()?.unwrap_or(m.name).to_string();
    let Some(width) = m.width else {
        let e = format!(
            "model '{}' has no pooling type (pooling_type in its GGUF), so it serves no embeddings",
            m.name
        );
        return Err(ApiError::bad_request(e).param("model"));
    };
    let input = body
        .input
        .as_ref()
        .ok_or_else(|| ApiError::bad_request("input is required").param("input"))?;
    let inputs = inputs(m, input)?;
    let base64 = match &body.encoding_format {
        None => false,
        Some(Value::String(s)) if s == "float" => false,
        Some(Value::String(s)) if s == "base64" => true,
        Some(_) => {
            let e = ApiError::bad_request("encoding_format must be 'float' or 'base64'");
            return Err(e.param("encoding_format"));
        }
    };
    let dimensions = match &body.dimensions {
        None => None,
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
    let ids = |v: &[i64]| token_ids(v, vocab).map_err(|e| e.param("input"));
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
    fn checked(m: &Served<'_>, body: &str) -> Result<EmbeddingJob, String> {
        EmbeddingsBody::parse(body.as_bytes())
            .and_then(|b| check(m, &b))
            .map_err(|e| e.param.unwrap_or_default())
    }

    #[test]
    fn inputs_in_every_shape() {
        let tok = tokenizer();
        let m = served(&tok, Some(4));
        let one = checked(&m, r#"{"input":"hello"}"#).unwrap();
        assert_eq!(one.inputs.len(), 1);
        assert_eq!(
            (one.model.as_str(), one.base64, one.dimensions),
            ("m.gguf", false, None)
        );
        assert_eq!(
            checked(&m, r#"{"input":["a","b"]}"#).unwrap().inputs.len(),
            2
        );
        assert_eq!(
            checked(&m, r#"{"input":[1,2]}"#).unwrap().inputs,
            vec![vec![1, 2]]
        );
        let two = checked(
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
            assert_eq!(checked(&m, body).unwrap_err(), field, "{body}");
        }
        let many = format!(r#"{{"input":{}}}"#, json!(vec!["a"; MAX_INPUTS + 1]));
        assert_eq!(checked(&m, &many).unwrap_err(), "input");
        assert_eq!(
            checked(&served(&tok, None), r#"{"input":"a"}"#).unwrap_err(),
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
