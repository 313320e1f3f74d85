//! Writing a job's answer: as SSE chunks while its choices grow (`stream`), or as one JSON
//! object at the end (with whitespace before it now and then, if its head had to go out
//! first: `generate::WHOLE_HEAD_AFTER`).
//! The OpenAI shapes of both endpoints' choices, chunks, logprobs and usage live here.

use super::chat_output::Delta;
use super::choices::{Choice, Choices, Released};
use super::error::ApiError;
use super::generate::{Flavor, Job};
use super::http::ChunkedBody;
use super::responses;
use super::Ready;
use crate::engine::TokenLogprob;
use serde_json::{json, Value};
use std::io;
use std::time::Duration;

/// What writing an answer reads: the loaded model, the job, and its choices so far.
#[derive(Clone, Copy)]
pub struct Answering<'a> {
    pub ready: &'a Ready,
    pub job: &'a Job,
    pub choices: &'a Choices,
}

impl<'a> Answering<'a> {
    pub fn new(ready: &'a Ready, job: &'a Job, choices: &'a Choices) -> Self {
        Answering {
            ready,
            job,
            choices,
        }
    }
}

/// Where the answer goes.
pub enum Writer {
    /// SSE: each choice's first chunk (role, or the echoed prompt) is sent once.
    Stream { first_chunk_sent: Vec<bool> },
    /// One JSON object when every choice is done.
    Whole,
    /// A Responses answer: its object or its typed events.
    Response(Box<responses::Writer>),
}

impl Writer {
    pub fn new(job: &Job, choices: &Choices) -> Writer {
        if let Flavor::Response(..) = &job.flavor {
            Writer::Response(Box::new(responses::Writer::new(job)))
        } else if job.stream {
            Writer::Stream {
                first_chunk_sent: vec![false; choices.list.len()],
            }
        } else {
            Writer::Whole
        }
    }

    pub fn content_type(&self) -> &'static str {
        if self.streams() {
            "text/event-stream"
        } else {
            "application/json"
        }
    }

    fn streams(&self) -> bool {
        match self {
            Writer::Stream { .. } => true,
            Writer::Whole => false,
            Writer::Response(w) => w.streams(),
        }
    }

    /// How long a started answer may go without a write: proxies and clients take a long
    /// silence for a dead connection.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// A write that changes nothing for the client: an SSE comment line, or whitespace (valid
    /// before JSON).
    pub fn beat(&self, body: &mut ChunkedBody) -> io::Result<()> {
        body.chunk(if self.streams() {
            b": keep-alive\n\n"
        } else {
            b" "
        })
    }

    /// Takes what an event released, and sends it if the answer streams (`body`: the answer
    /// has its head out); whether anything was written.
    pub fn released(
        &mut self,
        body: Option<&mut ChunkedBody>,
        a: Answering,
        r: Released,
    ) -> io::Result<bool> {
        let Answering {
            ready,
            job,
            choices,
        } = a;
        let first_chunk_sent = match self {
            Writer::Response(w) => return w.released(body, a, &r.deltas, r.finish),
            Writer::Stream { first_chunk_sent } => first_chunk_sent,
            Writer::Whole => return Ok(false),
        };
        let Some(body) = body else { return Ok(false) };
        let mut events = Vec::new();
        if !first_chunk_sent[r.ci] {
            first_chunk_sent[r.ci] = true;
            events.extend(first_stream_chunk(ready, job, r.ci, &choices.list[r.ci]));
        }
        events.extend(stream_chunks(
            ready,
            job,
            r.ci,
            &r.deltas,
            r.logprob.as_ref(),
            r.finish,
        ));
        for e in &events {
            body.sse(&e.to_string())?;
        }
        Ok(!events.is_empty())
    }

    /// The answer fails after its head went out (the engine failed, or the server stops):
    /// the error in the answer's own form (a stream's error event and `[DONE]`, or a whole
    /// error object), then the end.
    pub fn error(&mut self, mut body: ChunkedBody, a: Answering, err: &ApiError) {
        let _ = match self {
            Writer::Response(w) => return w.error(body, a, err),
            Writer::Stream { .. } => body.sse(&err.body()).and_then(|_| body.sse("[DONE]")),
            Writer::Whole => body.chunk(err.body().as_bytes()),
        };
        let _ = body.finish();
    }

    /// Every choice is done: a stream's usage chunk (when asked for) and `[DONE]`, or the
    /// whole answer; then the end of the body.
    pub fn finish(&mut self, mut body: ChunkedBody, a: Answering) -> io::Result<()> {
        let Answering {
            ready,
            job,
            choices,
        } = a;
        match self {
            Writer::Response(w) => return w.finish(body, a),
            Writer::Stream { .. } => {
                if job.include_usage {
                    let obj = match job.flavor {
                        Flavor::Completion { .. } => "text_completion",
                        _ => "chat.completion.chunk",
                    };
                    let u = json!({"id": job.id, "object": obj, "created": job.created, "model": ready.model_name, "choices": [], "usage": usage(choices)});
                    body.sse(&u.to_string())?;
                }
                body.sse("[DONE]")?;
            }
            Writer::Whole => body.chunk(self.whole(a).to_string().as_bytes())?,
        }
        body.finish()
    }

    /// The whole answer's JSON object.
    pub fn whole(&mut self, a: Answering) -> Value {
        let Answering {
            ready,
            job,
            choices,
        } = a;
        if let Writer::Response(w) = self {
            return w.whole(a);
        }
        let list: Vec<Value> = choices
            .list
            .iter()
            .enumerate()
            .map(|(ci, c)| final_choice(ready, job, ci, c))
            .collect();
        let obj = match job.flavor {
            Flavor::Completion { .. } => "text_completion",
            _ => "chat.completion",
        };
        json!({"id": job.id, "object": obj, "created": job.created, "model": ready.model_name, "choices": list, "usage": usage(choices)})
    }
}

fn usage(choices: &Choices) -> Value {
    let u = &choices.usage;
    json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached},
    })
}

fn piece(ready: &Ready, t: u32) -> String {
    ready.tokenizer.token_piece(t)
}

fn chat_logprob_entry(ready: &Ready, lp: &TokenLogprob) -> Value {
    let tok = piece(ready, lp.token);
    json!({
        "token": tok,
        "logprob": lp.logprob,
        "bytes": tok.as_bytes(),
        "top_logprobs": lp.top.iter().map(|&(t, l)| {
            let s = piece(ready, t);
            json!({"token": s, "logprob": l, "bytes": s.as_bytes()})
        }).collect::<Vec<_>>(),
    })
}

/// OpenAI completions logprobs: parallel arrays.
fn completion_logprobs(
    ready: &Ready,
    entries: &[Option<&TokenLogprob>],
    tokens: &[u32],
    offset0: usize,
) -> Value {
    let mut text_offset = Vec::new();
    let mut off = offset0;
    let mut toks = Vec::new();
    for &t in tokens {
        let s = piece(ready, t);
        text_offset.push(off);
        off += s.len();
        toks.push(s);
    }
    json!({
        "tokens": toks,
        "token_logprobs": entries.iter().map(|e| e.map(|l| l.logprob)).collect::<Vec<_>>(),
        "top_logprobs": entries.iter().map(|e| e.map(|l| {
            l.top.iter().map(|&(t, p)| (piece(ready, t), json!(p))).collect::<serde_json::Map<String, Value>>()
        })).collect::<Vec<_>>(),
        "text_offset": text_offset,
    })
}

fn final_choice(ready: &Ready, job: &Job, ci: usize, c: &Choice) -> Value {
    match &job.flavor {
        Flavor::Chat(_) | Flavor::Response(..) => {
            let logprobs = job.logprobs.map(|_| json!({"content": c.logprobs.iter().map(|l| chat_logprob_entry(ready, l)).collect::<Vec<_>>()}));
            let out = c.chat.as_ref().expect("chat choices have an output");
            let mut message = json!({"role": "assistant", "content": out.content});
            let forced = job.flavor.rules().is_some_and(|r| r.forced());
            if forced && out.content.is_empty() {
                message["content"] = Value::Null; // cut before its call had a name
            }
            if !out.reasoning.is_empty() {
                message["reasoning_content"] = json!(out.reasoning);
            }
            if let (true, Some(call)) = (job.legacy_functions, out.calls.first()) {
                message["content"] = Value::Null;
                message["function_call"] = json!({"name": call.name, "arguments": call.arguments});
            } else if !out.calls.is_empty() {
                if out.content.is_empty() {
                    message["content"] = Value::Null;
                }
                message["tool_calls"] = out
                    .calls
                    .iter()
                    .enumerate()
                    .map(|(i, call)| json!({"id": call_id(job, ci, i), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}))
                    .collect();
            }
            let finish = finish_reason(job, c.finish);
            json!({"index": ci, "message": message, "logprobs": logprobs, "finish_reason": finish})
        }
        Flavor::Completion { echo } => {
            let pi = ci / job.params.n;
            let mut text = String::new();
            let mut entries: Vec<Option<&TokenLogprob>> = Vec::new();
            let mut toks: Vec<u32> = Vec::new();
            if let Some(e) = echo.get(pi) {
                text.push_str(e);
                if let Some(plp) = &c.prompt_logprobs {
                    entries.extend(plp.iter().map(|x| x.as_ref()));
                    toks.extend(&job.prompts[pi]);
                }
            }
            text.push_str(&c.text.text);
            entries.extend(c.logprobs.iter().map(Some));
            toks.extend(c.tokens.iter().take(c.logprobs.len()));
            let logprobs = job
                .logprobs
                .map(|_| completion_logprobs(ready, &entries, &toks, 0));
            json!({"index": ci, "text": text, "logprobs": logprobs, "finish_reason": c.finish})
        }
    }
}

/// Chat streams open with the assistant role; echoed completion streams with the prompt.
fn first_stream_chunk(ready: &Ready, job: &Job, ci: usize, c: &Choice) -> Option<Value> {
    match &job.flavor {
        Flavor::Chat(_) | Flavor::Response(..) => Some(json!({
            "id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": ready.model_name,
            "choices": [{"index": ci, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}],
        })),
        Flavor::Completion { echo } => {
            let e = echo.get(ci / job.params.n)?;
            let logprobs = match (&c.prompt_logprobs, job.logprobs) {
                (Some(plp), Some(_)) => {
                    let entries: Vec<Option<&TokenLogprob>> =
                        plp.iter().map(|x| x.as_ref()).collect();
                    completion_logprobs(ready, &entries, &job.prompts[ci / job.params.n], 0)
                }
                _ => Value::Null,
            };
            Some(
                json!({"id": job.id, "object": "text_completion", "created": job.created, "model": ready.model_name,
                "choices": [{"index": ci, "text": e, "logprobs": logprobs, "finish_reason": null}]}),
            )
        }
    }
}

/// The SSE chunks for one event of choice `ci`: its text (content or reasoning), a call's id
/// and name when it starts, its arguments as they come (`delta.tool_calls`), then the finish
/// reason.
fn stream_chunks(
    ready: &Ready,
    job: &Job,
    ci: usize,
    deltas: &[Delta],
    lp: Option<&TokenLogprob>,
    finish: Option<&str>,
) -> Vec<Value> {
    let chunk = |delta: Value, lp: Option<&TokenLogprob>, finish: Option<&str>| match job.flavor {
        Flavor::Chat(_) | Flavor::Response(..) => {
            let logprobs = lp.map(|l| json!({"content": [chat_logprob_entry(ready, l)]}));
            json!({"id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": ready.model_name,
                "choices": [{"index": ci, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
        }
        Flavor::Completion { .. } => {
            let logprobs = lp.map(|l| completion_logprobs(ready, &[Some(l)], &[l.token], 0));
            json!({"id": job.id, "object": "text_completion", "created": job.created, "model": ready.model_name,
                "choices": [{"index": ci, "text": delta["content"].as_str().unwrap_or(""), "logprobs": logprobs, "finish_reason": finish}]})
        }
    };
    let mut content = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for d in deltas {
        match d {
            Delta::Content(t) => content.push_str(t),
            Delta::Reasoning(t) => reasoning.push_str(t),
            Delta::CallStart(_, name) if job.legacy_functions => {
                calls.push(json!({"function_call": {"name": name, "arguments": ""}}))
            }
            Delta::CallArgs(_, args) if job.legacy_functions => {
                calls.push(json!({"function_call": {"arguments": args}}))
            }
            Delta::CallStart(i, name) => calls.push(json!({"tool_calls": [{"index": i, "id": call_id(job, ci, *i), "type": "function", "function": {"name": name, "arguments": ""}}]})),
            Delta::CallArgs(i, args) => calls.push(json!({"tool_calls": [{"index": i, "function": {"arguments": args}}]})),
            Delta::Call(..) => {}
        }
    }
    let mut out = Vec::new();
    let mut lp = lp;
    if !content.is_empty() || !reasoning.is_empty() || lp.is_some() {
        let mut delta = json!({});
        if !reasoning.is_empty() {
            delta["reasoning_content"] = json!(reasoning);
        }
        if !content.is_empty() || reasoning.is_empty() {
            delta["content"] = json!(content);
        }
        out.push(chunk(delta, lp.take(), None));
    }
    for call in calls {
        out.push(chunk(call, None, None));
    }
    if finish.is_some() {
        out.push(chunk(json!({}), None, finish_reason(job, finish)));
    }
    out
}

/// A chat choice's finish reason as the request's form names it: a call in the legacy
/// `functions` form ends with `function_call`.
fn finish_reason<'a>(job: &Job, finish: Option<&'a str>) -> Option<&'a str> {
    match finish {
        Some("tool_calls") if job.legacy_functions => Some("function_call"),
        other => other,
    }
}

/// A call's id: unique per request, choice and call.
pub fn call_id(job: &Job, ci: usize, i: usize) -> String {
    format!("call_{}_{ci}_{i}", job.id)
}
