//! A generation request's body to a [`Job`]: parsed once into its endpoint's type
//! ([`Body::parse`]), then checked against the model that serves it ([`Parsing`]): sampling
//! limits, the prompt's tokens (through the chat template for chat), and its constraint
//! compiled against the vocabulary. Everything a request goes through before admission.

use super::error::ApiError;
use super::ids;
use super::images::{prompt_with_images, ImageInput};
use super::job::{Flavor, Job};
use super::request::{parse, ChatBody, CompletionBody, PromptInput, BOOKKEEPING};
use super::responses::{self, ResponsesBody, Store, IGNORED};
use super::sampling::{self, Endpoint, Limits};
use crate::chat::{self, Tool};
use crate::grammar::{Constraint, ConstraintSpec, Grammars};
use crate::server::generate::{Models, Ready, Work};
use crate::tokenizer::{ChatTemplate, Tokenizer};
use crate::vision::{ImageSources, Projector};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// A generation body, in the type of the endpoint it came to (boxed: the bodies are large and
/// of very different sizes).
pub enum Body {
    Completion(Box<CompletionBody>),
    Chat(Box<ChatBody>),
    Responses(Box<ResponsesBody>),
}

impl Body {
    /// The body of a request to `path` (`/v1/completions`, `/v1/chat/completions` or
    /// `/v1/responses`), parsed once.
    pub fn parse(path: &str, bytes: &[u8]) -> Result<Body, ApiError> {
        Ok(match path {
            "/v1/completions" => Body::Completion(Box::new(parse(
                bytes,
                |b: &CompletionBody| &b.extra,
                BOOKKEEPING,
            )?)),
            "/v1/responses" => Body::Responses(Box::new(parse(
                bytes,
                |b: &ResponsesBody| &b.extra,
                IGNORED,
            )?)),
            _ => Body::Chat(Box::new(parse(
                bytes,
                |b: &ChatBody| &b.extra,
                BOOKKEEPING,
            )?)),
        })
    }

    /// The model the request names.
    pub fn model(&self) -> Option<&str> {
        match self {
            Body::Completion(b) => b.model.as_deref(),
            Body::Chat(b) => b.model.as_deref(),
            Body::Responses(b) => b.model.as_deref(),
        }
    }
}

/// What checking a request reads: the vocabulary, the chat template, the grammar compiler and
/// the server's limits; and the kept responses a Responses request may continue.
pub struct Parsing<'a> {
    tokenizer: &'a Tokenizer,
    chat: Option<&'a ChatTemplate>,
    grammars: &'a Grammars,
    limits: Limits,
    /// The model's projector, through which it reads images.
    projector: Option<&'a Projector>,
    /// Where images may come from besides `data:` URLs.
    sources: &'a ImageSources,
    /// The model's context length (an image passing it is refused by name).
    context: usize,
    responses: Option<&'a Arc<Store>>,
    /// Starts response ids: tells this run of the server from earlier ones.
    boot_tag: &'a str,
}

impl<'a> Parsing<'a> {
    pub fn new(
        models: &'a Models,
        ready: &'a Ready,
        responses: &'a Arc<Store>,
        boot_tag: &'a str,
    ) -> Parsing<'a> {
        Parsing {
            tokenizer: &ready.tokenizer,
            chat: ready.chat.as_ref(),
            grammars: &ready.grammars,
            limits: Limits::for_engine(ready.engine.limits.max_n),
            projector: ready.projector.as_deref(),
            sources: &models.images,
            context: ready.engine.limits.context,
            responses: Some(responses),
            boot_tag,
        }
    }

    /// The job `body` asks for; `n` makes its id unique.
    pub fn job(&self, body: Body, n: u64) -> Result<Job, ApiError> {
        match body {
            Body::Completion(b) => self.completion(*b, ids::completion(n)),
            Body::Chat(b) => self.chat(*b, ids::chat_completion(n)),
            Body::Responses(b) => self.response(*b, ids::response(self.boot_tag, n)),
        }
    }

    /// A /v1/completions body: one prompt or a batch of them, as text or token ids.
    fn completion(&self, req: CompletionBody, id: String) -> Result<Job, ApiError> {
        let (tokenizer, limits) = (self.tokenizer, &self.limits);
        let s = &req.sampling;
        let mut v = sampling::validate_sampling(s, s.max_tokens, Endpoint::Completions, limits)?;
        v.params.sampling.logit_bias = sampling::logit_bias(s, tokenizer.vocab_size())?;
        v.params.constraint = self.compile(sampling::constraint_spec(s)?)?;
        let logprobs = sampling::check_logprobs(req.logprobs, limits, "logprobs")?;
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
        let echo_text = match echo {
            true => prompts.iter().map(|p| tokenizer.decode(p, true)).collect(),
            false => Vec::new(),
        };
        Ok(Job {
            id,
            created: unix_now(),
            work: Work {
                prompts,
                images: Vec::new(),
                params: v.params,
                stop: v.stop,
                rules: None,
            },
            stream: v.stream,
            include_usage: v.include_usage,
            logprobs,
            flavor: Flavor::Completion { echo: echo_text },
            legacy_functions: false,
        })
    }

    /// A /v1/chat/completions body: the messages rendered through the model's chat template,
    /// with the output rules of its tools and reasoning.
    fn chat(&self, mut req: ChatBody, id: String) -> Result<Job, ApiError> {
        let (tokenizer, limits) = (self.tokenizer, &self.limits);
        let legacy_functions = legacy_functions(&mut req)?;
        let Some(tmpl) = self.chat else {
            return Err(ApiError::bad_request(
                "this model has no chat template; use /v1/completions",
            ));
        };
        if req.conversation.messages.is_empty() {
            return Err(ApiError::bad_request("messages must not be empty").param("messages"));
        }
        let s = &req.sampling;
        let max_tokens = req.max_completion_tokens.or(s.max_tokens);
        let mut v = sampling::validate_sampling(s, max_tokens, Endpoint::Chat, limits)?;
        v.params.sampling.logit_bias = sampling::logit_bias(s, tokenizer.vocab_size())?;
        let format = sampling::constraint_spec(s)?;
        let setup = chat::prepare(tmpl, tokenizer, &req.conversation, format)?;
        v.params.constraint = self.compile(setup.constraint)?;
        v.stop.extend(setup.stop);
        v.params.stop_tokens.extend(setup.stop_tokens);
        let parts = req.conversation.images();
        let (prompt, images) = match parts.is_empty() {
            true => (encode(tokenizer, &setup.prompt)?, Vec::new()),
            false => {
                let input = ImageInput {
                    projector: self.projector,
                    sources: self.sources,
                    context: self.context,
                };
                prompt_with_images(tokenizer, &input, &setup.prompt, &parts)?
            }
        };
        let logprobs = chat_logprobs(&req, limits)?;
        v.params.logprobs = logprobs;
        Ok(Job {
            id,
            created: unix_now(),
            work: Work {
                prompts: vec![prompt],
                images,
                params: v.params,
                stop: v.stop,
                rules: Some(setup.rules),
            },
            stream: v.stream,
            include_usage: v.include_usage,
            logprobs,
            flavor: Flavor::Chat,
            legacy_functions,
        })
    }

    /// A /v1/responses body: translated into the chat request it means, after the
    /// conversation its `previous_response_id` names, and run as that chat request.
    fn response(&self, req: ResponsesBody, id: String) -> Result<Job, ApiError> {
        let previous = match &req.previous_response_id {
            None => Vec::new(),
            Some(Value::String(prev)) => self
                .responses
                .and_then(|s| s.get(prev))
                .ok_or_else(|| ApiError::response_not_found(prev).param("previous_response_id"))?
                .conversation(),
            Some(_) => {
                return Err(
                    ApiError::bad_request("previous_response_id must be a string")
                        .param("previous_response_id"),
                )
            }
        };
        let (chat, meta) = responses::translate(req, previous)?.meta(&id, self.responses);
        let mut job = self.chat(chat, id).map_err(responses::in_request_terms)?;
        job.flavor = Flavor::Response(Box::new(meta));
        Ok(job)
    }

    /// The request's constraint compiled against the vocabulary (400 when it does not compile
    /// or exceeds the grammar limits).
    fn compile(&self, spec: Option<ConstraintSpec>) -> Result<Option<Constraint>, ApiError> {
        let Some(spec) = spec else { return Ok(None) };
        self.grammars
            .compile(&spec)
            .map(Some)
            .map_err(|e| ApiError::bad_request(e).param(spec.kind()))
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
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
        PromptInput::Tokens(ids) => vec![sampling::token_ids(ids, vocab)?],
        PromptInput::TokenBatch(b) => b
            .iter()
            .map(|ids| sampling::token_ids(ids, vocab))
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

/// The legacy `functions` and `function_call` fields as the `tools` and `tool_choice` they
/// mean (one call at most); whether the request used them.
fn legacy_functions(req: &mut ChatBody) -> Result<bool, ApiError> {
    let choice = req.function_call.take();
    let Some(functions) = req.functions.take() else {
        return match choice {
            Some(_) => {
                Err(ApiError::bad_request("function_call needs functions").param("function_call"))
            }
            None => Ok(false),
        };
    };
    let c = &mut req.conversation;
    if c.tools.is_some() || c.tool_choice.is_some() {
        return Err(ApiError::bad_request("give tools or functions, not both").param("functions"));
    }
    c.tools = Some(
        functions
            .into_iter()
            .map(|function| Tool {
                kind: "function".into(),
                function,
            })
            .collect(),
    );
    c.tool_choice = match choice {
        None => None,
        Some(Value::Object(named)) => {
            let name = named.get("name").cloned().unwrap_or(Value::Null);
            Some(json!({"type": "function", "function": {"name": name}}))
        }
        Some(mode) => Some(mode),
    };
    c.parallel_tool_calls = Some(false);
    Ok(true)
}

/// The alternatives per token a chat request asks for: `top_logprobs` (0 when absent) with
/// `logprobs: true`, none without (and `top_logprobs` alone is an error).
fn chat_logprobs(req: &ChatBody, limits: &Limits) -> Result<Option<usize>, ApiError> {
    if req.logprobs.unwrap_or(false) {
        let top = req.top_logprobs.or(Some(0));
        Ok(Some(
            sampling::check_logprobs(top, limits, "top_logprobs")?.unwrap_or(0),
        ))
    } else if req.top_logprobs.is_some() {
        Err(ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs"))
    } else {
        Ok(None)
    }
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .encode(text, true)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("prompt"))
}

/// Fuzzing entry (not an API): a body parsed and checked as the server does, with the
/// server's default limits, as the `request_json` fuzz target drives it. `Err` carries the
/// HTTP status of the rejection.
#[doc(hidden)]
pub fn fuzz_parse_request(
    tokenizer: &Tokenizer,
    chat: Option<&ChatTemplate>,
    grammars: &Grammars,
    path: &str,
    body: &[u8],
) -> Result<(), u16> {
    let p = Parsing {
        tokenizer,
        chat,
        grammars,
        limits: Limits::for_engine(16),
        projector: None,
        sources: &ImageSources::data_only(),
        context: usize::MAX,
        responses: None,
        boot_tag: "fuzz",
    };
    Body::parse(path, body)
        .and_then(|b| p.job(b, 0))
        .map(|_| ())
        .map_err(|e| e.status)
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
