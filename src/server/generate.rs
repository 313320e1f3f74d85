//! Driving generation requests for both endpoints: submit to the engine, turn events into
//! choices (text, logprobs, finish reasons, usage), and either stream them as SSE chunks or
//! answer once with the whole result. A failed write means the client left: its engine
//! requests are cancelled right away.

use super::chat_output::{ChatOutput, Delta};
use super::chat_request::OutputRules;
use super::error::ApiError;
use super::http::RawResponse;
use super::text::ChoiceText;
use super::Ready;
use crate::engine::{Event, GenParams, RequestId, TokenLogprob};
use serde_json::{json, Value};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

pub enum Flavor {
    Completion {
        echo: Vec<String>,
    },
    /// A chat answer, split into reasoning, content and tool calls by these rules.
    Chat(OutputRules),
}

pub struct Job {
    pub id: String,
    pub created: u64,
    pub prompts: Vec<Vec<u32>>,
    pub params: GenParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Top-N alternatives per generated token (Some(0): only the token's own logprob).
    pub logprobs: Option<usize>,
    pub flavor: Flavor,
}

/// What one event released for choice `ci`: its deltas, the token's logprob, and the finish
/// reason if it ended.
type Released = (
    usize,
    Vec<Delta>,
    Option<TokenLogprob>,
    Option<&'static str>,
);

#[derive(Default)]
struct Choice {
    text: ChoiceText,
    /// Chat only: the text split into reasoning, content and calls.
    chat: Option<ChatOutput>,
    tokens: Vec<u32>,
    logprobs: Vec<TokenLogprob>,
    finish: Option<&'static str>,
    prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
}

struct Usage {
    prompt: usize,
    completion: usize,
    cached: usize,
}

/// How a request ended, for its log line.
pub struct Outcome {
    /// The finish reasons ("stop", "length", several joined by '+'), or what cut it short.
    pub result: String,
    /// Tokens generated for the client, all choices together.
    pub completion_tokens: usize,
    pub first_token: Option<Instant>,
}

fn outcome(result: &str, choices: &[Choice], first_token: Option<Instant>) -> Outcome {
    let result = if result.is_empty() {
        let mut reasons: Vec<&str> = choices.iter().map(|c| c.finish.unwrap_or("none")).collect();
        reasons.sort_unstable();
        reasons.dedup();
        reasons.join("+")
    } else {
        result.to_string()
    };
    Outcome {
        result,
        completion_tokens: choices.iter().map(|c| c.tokens.len()).sum(),
        first_token,
    }
}

/// Runs a job and writes its answer; `on_first_token` is told when the first token came.
/// Errors before the response starts come back with the response, so they can be sent.
pub fn run(
    ready: &Ready,
    job: Job,
    resp: RawResponse,
    on_first_token: &mut dyn FnMut(Instant),
    shed: &dyn Fn(Duration) -> bool,
) -> Result<Outcome, (ApiError, RawResponse)> {
    let n = job.params.n;
    let mut ids: Vec<RequestId> = Vec::new();
    let (tx, rx) = mpsc::channel::<(usize, Event)>();
    for (pi, prompt) in job.prompts.iter().enumerate() {
        match ready.engine.submit(prompt.clone(), job.params.clone()) {
            Ok((id, events)) => {
                ids.push(id);
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for ev in events {
                        if tx.send((pi, ev)).is_err() {
                            break;
                        }
                    }
                });
            }
            Err(e) => {
                for id in ids {
                    ready.engine.cancel(id);
                }
                return Err((ApiError::bad_request(e.to_string()).param("prompt"), resp));
            }
        }
    }
    drop(tx);
    let cancel_all = |ids: &[RequestId]| ids.iter().for_each(|&id| ready.engine.cancel(id));
    let total = job.prompts.len() * n;
    let mut choices: Vec<Choice> = (0..total)
        .map(|_| Choice {
            chat: match &job.flavor {
                Flavor::Chat(rules) => Some(rules.output()),
                Flavor::Completion { .. } => None,
            },
            ..Default::default()
        })
        .collect();
    let mut usage = Usage {
        prompt: job.prompts.iter().map(|p| p.len() * n).sum(),
        completion: 0,
        cached: 0,
    };
    // A non-streaming answer sends nothing before its first event: until then it can still be
    // refused (429) when `shed` says so (a flood: its clients would take the slot it waits for
    // anyway, sooner), and a client gone is seen by polling the socket instead of writing.
    let mut early: Option<(usize, Event)> = None;
    if !job.stream {
        let since = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_millis(250)) {
                Ok(x) => {
                    early = Some(x);
                    break;
                }
                Err(RecvTimeoutError::Timeout) => {
                    if resp.peer_gone() {
                        cancel_all(&ids);
                        return Ok(outcome(GONE, &choices, None));
                    }
                    if shed(since.elapsed()) {
                        cancel_all(&ids);
                        return Err((ApiError::overloaded(1, false), resp));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }
    let Ok(mut body) = resp.start_chunked(
        200,
        if job.stream {
            "text/event-stream"
        } else {
            "application/json"
        },
    ) else {
        cancel_all(&ids);
        return Ok(outcome(GONE, &choices, None)); // the client went away before the first byte
    };
    let mut first_token: Option<Instant> = None;
    let mut cut_short = "";
    let mut done = 0;
    let mut first_chunk_sent = vec![false; total];
    let heartbeat = Duration::from_millis(if job.stream { 1000 } else { 250 });
    let mut last_write = std::time::Instant::now();
    while done < total {
        if !job.stream && last_write.elapsed() >= heartbeat {
            // Non-streaming answers are written at the end; until then a byte of whitespace
            // (valid before JSON) now and then is how a vanished client shows itself.
            if body.chunk(b" ").is_err() {
                cancel_all(&ids);
                return Ok(outcome(GONE, &choices, first_token));
            }
            last_write = std::time::Instant::now();
        }
        let received = match early.take() {
            Some(x) => Ok(x),
            None => rx.recv_timeout(heartbeat),
        };
        let (pi, ev) = match received {
            Ok(x) => x,
            Err(RecvTimeoutError::Timeout) => {
                // Writing is the only way to notice a vanished client: a comment line for SSE,
                // leading whitespace (valid before JSON) otherwise.
                let beat: &[u8] = if job.stream {
                    b": keep-alive\n\n"
                } else {
                    b" "
                };
                if body.chunk(beat).is_err() {
                    cancel_all(&ids);
                    return Ok(outcome(GONE, &choices, first_token));
                }
                last_write = std::time::Instant::now();
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                cut_short = "engine stopped";
                break;
            }
        };
        let mut out: Vec<Released> = Vec::new();
        match ev {
            Event::PromptLogprobs(lp) => {
                for c in choices[pi * n..(pi + 1) * n].iter_mut() {
                    c.prompt_logprobs = Some(lp.clone());
                }
            }
            Event::Token {
                index,
                token,
                logprob,
            } => {
                if first_token.is_none() {
                    let now = Instant::now();
                    first_token = Some(now);
                    on_first_token(now);
                }
                let ci = pi * n + index;
                let c = &mut choices[ci];
                if c.finish.is_some() {
                    continue;
                }
                let piece = c
                    .text
                    .push(ready.tokenizer.token_bytes(token, false), &job.stop);
                c.tokens.push(token);
                if let Some(lp) = &logprob {
                    c.logprobs.push(lp.clone());
                }
                let mut deltas = c.deltas(piece);
                if c.text.stopped {
                    deltas.extend(c.end());
                    c.finish = Some(c.finish_reason("stop"));
                    done += 1;
                }
                out.push((ci, deltas, logprob, c.finish));
            }
            Event::Finished {
                index,
                reason,
                completion_tokens,
                cached_tokens,
                ..
            } => {
                let ci = pi * n + index;
                usage.completion += completion_tokens;
                if index == 0 {
                    usage.cached += cached_tokens * n;
                }
                let c = &mut choices[ci];
                if c.finish.is_none() {
                    let tail = c.text.finish(&job.stop);
                    let mut deltas = c.deltas(tail);
                    deltas.extend(c.end());
                    c.finish = Some(c.finish_reason(
                        if reason == crate::engine::FinishReason::Length {
                            "length"
                        } else {
                            "stop"
                        },
                    ));
                    done += 1;
                    out.push((ci, deltas, None, c.finish));
                }
            }
            Event::Error(e) => {
                cancel_all(&ids);
                let failed = format!("failed ({e})");
                let err = ApiError::internal(e);
                let _ = if job.stream {
                    body.sse(&err.body())
                } else {
                    body.chunk(err.body().as_bytes())
                };
                let _ = body.finish();
                return Ok(outcome(&failed, &choices, first_token));
            }
        }
        if job.stream {
            for (ci, deltas, lp, finish) in out {
                let mut events = Vec::new();
                if !first_chunk_sent[ci] {
                    first_chunk_sent[ci] = true;
                    if let Some(first) = first_stream_chunk(ready, &job, ci, &choices[ci]) {
                        events.push(first);
                    }
                }
                events.extend(stream_chunks(ready, &job, ci, &deltas, lp.as_ref(), finish));
                for e in events {
                    if body.sse(&e.to_string()).is_err() {
                        cancel_all(&ids);
                        return Ok(outcome(GONE, &choices, first_token));
                    }
                }
            }
        }
    }
    // Stop strings can end every choice before the engine does: free its work now.
    cancel_all(&ids);
    let usage_json = json!({
        "prompt_tokens": usage.prompt,
        "completion_tokens": usage.completion,
        "total_tokens": usage.prompt + usage.completion,
        "prompt_tokens_details": {"cached_tokens": usage.cached},
    });
    let write = if job.stream {
        let mut r = Ok(());
        if job.include_usage {
            let obj = if matches!(job.flavor, Flavor::Chat(_)) {
                "chat.completion.chunk"
            } else {
                "text_completion"
            };
            let u = json!({"id": job.id, "object": obj, "created": job.created, "model": ready.model_name, "choices": [], "usage": usage_json});
            r = body.sse(&u.to_string());
        }
        r.and_then(|_| body.sse("[DONE]"))
    } else {
        let choices_json: Vec<Value> = choices
            .iter()
            .enumerate()
            .map(|(ci, c)| final_choice(ready, &job, ci, c))
            .collect();
        let obj = match job.flavor {
            Flavor::Chat(_) => "chat.completion",
            Flavor::Completion { .. } => "text_completion",
        };
        let v = json!({"id": job.id, "object": obj, "created": job.created, "model": ready.model_name, "choices": choices_json, "usage": usage_json});
        body.chunk(v.to_string().as_bytes())
    };
    if write.is_ok() && body.finish().is_ok() {
        Ok(outcome(cut_short, &choices, first_token))
    } else {
        Ok(outcome(GONE, &choices, first_token))
    }
}

/// The outcome of a request whose client went away before it was answered.
pub const GONE: &str = "cancelled (client gone)";

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
        Flavor::Chat(_) => {
            let logprobs = job.logprobs.map(|_| json!({"content": c.logprobs.iter().map(|l| chat_logprob_entry(ready, l)).collect::<Vec<_>>()}));
            let out = c.chat.as_ref().expect("chat choices have an output");
            let mut message = json!({"role": "assistant", "content": out.content});
            if !out.reasoning.is_empty() {
                message["reasoning_content"] = json!(out.reasoning);
            }
            if !out.calls.is_empty() {
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
            json!({"index": ci, "message": message, "logprobs": logprobs, "finish_reason": c.finish})
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
        Flavor::Chat(_) => Some(json!({
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

/// The SSE chunks for one event of choice `ci`: its text (content or reasoning), each call as
/// two `delta.tool_calls` fragments (id and name, then arguments), then the finish reason.
fn stream_chunks(
    ready: &Ready,
    job: &Job,
    ci: usize,
    deltas: &[Delta],
    lp: Option<&TokenLogprob>,
    finish: Option<&str>,
) -> Vec<Value> {
    let chunk = |delta: Value, lp: Option<&TokenLogprob>, finish: Option<&str>| match job.flavor {
        Flavor::Chat(_) => {
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
            Delta::Call(i, call) => calls.push((*i, call)),
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
    for (i, call) in calls {
        out.push(chunk(
            json!({"tool_calls": [{"index": i, "id": call_id(job, ci, i), "type": "function", "function": {"name": call.name, "arguments": ""}}]}),
            None,
            None,
        ));
        out.push(chunk(
            json!({"tool_calls": [{"index": i, "function": {"arguments": call.arguments}}]}),
            None,
            None,
        ));
    }
    if finish.is_some() {
        out.push(chunk(json!({}), None, finish));
    }
    out
}

/// A call's id: unique per request, choice and call.
fn call_id(job: &Job, ci: usize, i: usize) -> String {
    format!("call_{}_{ci}_{i}", job.id)
}

impl Choice {
    /// Text released by the stop-string filter, as deltas (chat: split; completions: as is).
    fn deltas(&mut self, text: String) -> Vec<Delta> {
        match &mut self.chat {
            Some(out) => out.push(&text),
            None if text.is_empty() => Vec::new(),
            None => vec![Delta::Content(text)],
        }
    }

    /// The text is complete: what the chat split still held back.
    fn end(&mut self) -> Vec<Delta> {
        self.chat.as_mut().map(|o| o.finish()).unwrap_or_default()
    }

    /// "tool_calls" when the answer called tools, else `reason`.
    fn finish_reason(&self, reason: &'static str) -> &'static str {
        match &self.chat {
            Some(o) if !o.calls.is_empty() => "tool_calls",
            _ => reason,
        }
    }
}
