//! Writing a Responses answer: the response object (once, whole) or its typed SSE events
//! (`response.created`, the items' events, `response.completed` or `response.incomplete`),
//! each with its sequence number. The finished response goes to the store.

use super::super::answer::Answering;
use super::super::chat_output::Delta;
use super::super::choices::Choices;
use super::super::error::ApiError;
use super::super::generate::{Flavor, Job};
use super::super::http::ChunkedBody;
use super::super::Ready;
use super::items::Items;
use super::{Kept, ResponseMeta};
use serde_json::{json, Value};
use std::io;

pub struct Writer {
    items: Items,
    stream: bool,
    /// The next event's sequence number; 0 until `response.created` is out.
    seq: u64,
}

impl Writer {
    pub fn new(job: &Job) -> Writer {
        Writer {
            items: Items::new(&job.id),
            stream: job.stream,
            seq: 0,
        }
    }

    pub fn streams(&self) -> bool {
        self.stream
    }

    /// Takes an event's deltas; a stream sends their events (after `response.created`).
    pub fn released(
        &mut self,
        body: Option<&mut ChunkedBody>,
        a: Answering,
        deltas: &[Delta],
        finish: Option<&str>,
    ) -> io::Result<bool> {
        if finish == Some("length") {
            self.items.cut_short();
        }
        let call_id = |i: usize| super::super::answer::call_id(a.job, 0, i);
        let events: Vec<Value> = deltas
            .iter()
            .flat_map(|d| self.items.apply(d, &call_id))
            .collect();
        match body {
            Some(body) if self.stream => {
                self.start(body, a)?;
                for e in events {
                    self.send(body, e)?;
                }
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// The answer is complete: a stream's closing events and `response.completed` (or
    /// `.incomplete`); the response is kept.
    pub fn finish(&mut self, mut body: ChunkedBody, a: Answering) -> io::Result<()> {
        if !self.stream {
            body.chunk(self.whole(a).to_string().as_bytes())?;
            return body.finish();
        }
        self.start(&mut body, a)?;
        let (status, _) = outcome(a.choices);
        for e in self.items.finish(status) {
            self.send(&mut body, e)?;
        }
        let response = self.object(a, status);
        self.keep(a.job, &response);
        let kind = format!("response.{status}");
        self.send(&mut body, json!({"type": kind, "response": response}))?;
        body.finish()
    }

    /// The whole response object, once every choice is done; it is kept.
    pub fn whole(&mut self, a: Answering) -> Value {
        let (status, _) = outcome(a.choices);
        self.items.finish(status);
        let response = self.object(a, status);
        self.keep(a.job, &response);
        response
    }

    /// The answer fails after its head went out: an `error` event and `response.failed` (a
    /// stream), or the error object.
    pub fn error(&mut self, mut body: ChunkedBody, a: Answering, err: &ApiError) {
        if self.stream {
            let _ = self.start(&mut body, a);
            let _ = self.send(&mut body, json!({"type": "error", "code": err.code, "message": err.message, "param": err.param}));
            let mut response = self.object(a, "failed");
            response["error"] =
                json!({"code": err.code.unwrap_or("server_error"), "message": err.message});
            let _ = self.send(
                &mut body,
                json!({"type": "response.failed", "response": response}),
            );
        } else {
            let _ = body.chunk(err.body().as_bytes());
        }
        let _ = body.finish();
    }

    /// `response.created` and `response.in_progress`, once, before any other event.
    fn start(&mut self, body: &mut ChunkedBody, a: Answering) -> io::Result<()> {
        if self.seq > 0 {
            return Ok(());
        }
        let response = self.object(a, "in_progress");
        self.send(
            body,
            json!({"type": "response.created", "response": response}),
        )?;
        self.send(
            body,
            json!({"type": "response.in_progress", "response": response}),
        )
    }

    fn send(&mut self, body: &mut ChunkedBody, mut event: Value) -> io::Result<()> {
        event["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let kind = event["type"].as_str().unwrap_or("message").to_string();
        body.chunk(format!("event: {kind}\ndata: {event}\n\n").as_bytes())
    }

    /// The response object as it stands, with `status`.
    fn object(&self, a: Answering, status: &str) -> Value {
        let Answering {
            ready,
            job,
            choices,
        } = a;
        let finished = matches!(status, "completed" | "incomplete");
        let mut o = json!({
            "id": job.id,
            "object": "response",
            "created_at": job.created,
            "status": status,
            "error": null,
            "incomplete_details": if status == "incomplete" { json!({"reason": outcome(choices).1}) } else { Value::Null },
            "model": ready.model_name,
            "output": if finished { json!(self.items.output()) } else { json!([]) },
            "usage": if finished { usage(ready, choices, &self.items) } else { Value::Null },
        });
        let obj = o.as_object_mut().expect("an object");
        for (k, v) in &meta(job).echo {
            obj.insert(k.clone(), v.clone());
        }
        o
    }

    fn keep(&self, job: &Job, response: &Value) {
        let meta = meta(job);
        if let Some(store) = &meta.store {
            store.keep(
                &job.id,
                Kept {
                    response: response.clone(),
                    input: meta.input.clone(),
                },
            );
        }
    }
}

/// The Responses part of the job this writer answers.
fn meta(job: &Job) -> &ResponseMeta {
    match &job.flavor {
        Flavor::Response(_, meta) => meta,
        _ => unreachable!("a Responses writer answers a Responses job"),
    }
}

/// `completed`, or `incomplete` (with why) when the answer was cut by its token limit.
fn outcome(choices: &Choices) -> (&'static str, &'static str) {
    match choices.list.first().and_then(|c| c.finish) {
        Some("length") => ("incomplete", "max_output_tokens"),
        _ => ("completed", ""),
    }
}

fn usage(ready: &Ready, choices: &Choices, items: &Items) -> Value {
    let u = &choices.usage;
    let reasoning = items.reasoning();
    let reasoning_tokens = if reasoning.is_empty() {
        0
    } else {
        ready
            .tokenizer
            .encode(&reasoning, false)
            .map_or(0, |t| t.len())
            .min(u.completion)
    };
    json!({
        "input_tokens": u.prompt,
        "input_tokens_details": {"cached_tokens": u.cached},
        "output_tokens": u.completion,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": u.prompt + u.completion,
    })
}
