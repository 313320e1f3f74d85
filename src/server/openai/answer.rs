//! OpenAI's shapes of a chat or completion answer: whole (`chat.completion`,
//! `text_completion`) or as SSE chunks (`chat.completion.chunk`), with choices, logprobs and
//! usage; and the format each job's answer is written in (`format_for`).

use super::error::ApiError;
use super::ids;
use super::job::{Flavor, Job};
use super::responses;
use crate::chat::Delta;
use crate::engine::TokenLogprob;
use crate::server::generate::{Choice, Choices, Failure, Format, Ready, Released};
use serde_json::{json, Value};

/// The format a job's answer is written in: the Responses API's, or this file's.
pub fn format_for<'a>(ready: &'a Ready, job: &'a Job) -> Box<dyn Format + 'a> {
    match &job.flavor {
        Flavor::Response(meta) => Box::new(responses::Writer::new(
            ready,
            job.model_name(ready),
            &job.id,
            job.created,
            meta,
            job.stream,
        )),
        _ => Box::new(Answer {
            ready,
            job,
            first_chunk_sent: Vec::new(),
        }),
    }
}

/// A chat or completion answer: SSE chunks while its choices grow (each choice's first chunk,
/// its role or the echoed prompt, sent once), or one JSON object at the end.
struct Answer<'a> {
    ready: &'a Ready,
    job: &'a Job,
    first_chunk_sent: Vec<usize>,
}

fn sse(payload: &str) -> String {
    format!("data: {payload}\n\n")
}

impl Format for Answer<'_> {
    fn streams(&self) -> bool {
        self.job.stream
    }

    fn released(&mut self, choices: &Choices, r: &Released) -> Vec<String> {
        if !self.job.stream {
            return Vec::new();
        }
        let (ready, job) = (self.ready, self.job);
        let mut events = Vec::new();
        if !self.first_chunk_sent.contains(&r.ci) {
            self.first_chunk_sent.push(r.ci);
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
        events.iter().map(|e| sse(&e.to_string())).collect()
    }

    /// A stream's usage chunk (when asked for) and `[DONE]`.
    fn stream_end(&mut self, choices: &Choices) -> Vec<String> {
        let (ready, job) = (self.ready, self.job);
        let mut out = Vec::new();
        if job.include_usage {
            let obj = match job.flavor {
                Flavor::Completion { .. } => "text_completion",
                _ => "chat.completion.chunk",
            };
            let mut u = json!({"id": job.id, "object": obj, "created": job.created, "model": job.model_name(ready), "choices": [], "usage": usage(ready, choices)});
            if job.is_chat() {
                u["service_tier"] = json!(SERVICE_TIER);
            }
            out.push(sse(&u.to_string()));
        }
        out.push(sse("[DONE]"));
        out
    }

    fn whole(&mut self, choices: &Choices) -> String {
        let (ready, job) = (self.ready, self.job);
        let list: Vec<Value> = choices
            .list
            .iter()
            .enumerate()
            .map(|(ci, c)| final_choice(ready, job, ci, c))
            .collect();
        let mut whole = json!({"id": job.id, "object": "text_completion", "created": job.created, "model": job.model_name(ready), "choices": list, "usage": usage(ready, choices)});
        if job.is_chat() {
            whole["object"] = json!("chat.completion");
            whole["service_tier"] = json!(SERVICE_TIER);
        }
        whole.to_string()
    }

    /// A stream's error event and `[DONE]`, or a whole answer's error object.
    fn failed(&mut self, _: &Choices, failure: &Failure) -> Vec<String> {
        let err = ApiError::from(failure);
        match self.job.stream {
            true => vec![sse(&err.body()), sse("[DONE]")],
            false => vec![err.body()],
        }
    }
}

/// The processing tier a chat answer names: the one way edgelm serves a request, whatever
/// tier the request asked for (OpenAI's answers name the tier actually used).
const SERVICE_TIER: &str = "default";

fn usage(ready: &Ready, choices: &Choices) -> Value {
    let u = &choices.usage;
    let written = u.cache_written(ready.engine.plan.block_size);
    json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt + u.completion,
        "prompt_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": written},
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
        Flavor::Chat | Flavor::Response(..) => {
            let logprobs = job.logprobs.map(|_| json!({"content": c.logprobs.iter().map(|l| chat_logprob_entry(ready, l)).collect::<Vec<_>>()}));
            let out = c.chat.as_ref().expect("chat choices have an output");
            let mut message = json!({"role": "assistant", "content": out.content});
            if job.forces_a_call() && out.content.is_empty() {
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
                    .map(|(i, call)| json!({"id": ids::call(&job.id, ci, i), "type": "function", "function": {"name": call.name, "arguments": call.arguments}}))
                    .collect();
            }
            let finish = finish_reason(job, c.finish);
            json!({"index": ci, "message": message, "logprobs": logprobs, "finish_reason": finish})
        }
        Flavor::Completion { echo } => {
            let pi = ci / job.work.params.n;
            let mut text = String::new();
            let mut entries: Vec<Option<&TokenLogprob>> = Vec::new();
            let mut toks: Vec<u32> = Vec::new();
            if let Some(e) = echo.get(pi) {
                text.push_str(e);
                if let Some(plp) = &c.prompt_logprobs {
                    entries.extend(plp.iter().map(|x| x.as_ref()));
                    toks.extend(&job.work.prompts[pi]);
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
        Flavor::Chat | Flavor::Response(..) => Some(json!({
            "id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": job.model_name(ready), "service_tier": SERVICE_TIER,
            "choices": [{"index": ci, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}],
        })),
        Flavor::Completion { echo } => {
            let e = echo.get(ci / job.work.params.n)?;
            let logprobs = match (&c.prompt_logprobs, job.logprobs) {
                (Some(plp), Some(_)) => {
                    let entries: Vec<Option<&TokenLogprob>> =
                        plp.iter().map(|x| x.as_ref()).collect();
                    completion_logprobs(
                        ready,
                        &entries,
                        &job.work.prompts[ci / job.work.params.n],
                        0,
                    )
                }
                _ => Value::Null,
            };
            Some(
                json!({"id": job.id, "object": "text_completion", "created": job.created, "model": job.model_name(ready),
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
        Flavor::Chat | Flavor::Response(..) => {
            let logprobs = lp.map(|l| json!({"content": [chat_logprob_entry(ready, l)]}));
            json!({"id": job.id, "object": "chat.completion.chunk", "created": job.created, "model": job.model_name(ready), "service_tier": SERVICE_TIER,
                "choices": [{"index": ci, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
        }
        Flavor::Completion { .. } => {
            let logprobs = lp.map(|l| completion_logprobs(ready, &[Some(l)], &[l.token], 0));
            json!({"id": job.id, "object": "text_completion", "created": job.created, "model": job.model_name(ready),
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
            Delta::CallStart(i, name) => calls.push(json!({"tool_calls": [{"index": i, "id": ids::call(&job.id, ci, *i), "type": "function", "function": {"name": name, "arguments": ""}}]})),
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
