//! Writing a Responses answer: the response object (once, whole) or its typed SSE events
//! (`response.created`, the items' events, `response.completed` or `response.incomplete`),
//! each with its sequence number. The finished response goes to the store.

use super::super::error::ApiError;
use super::super::ids;
use super::items::Items;
use super::request::ResponseMeta;
use super::store::Kept;
use crate::server::generate::{Choices, Failure, Format, Ready, Released};
use serde_json::{json, Value};

pub struct Writer<'a> {
    ready: &'a Ready,
    /// What its `model` says (an adapter's name, or the model's).
    model: &'a str,
    id: &'a str,
    created: u64,
    meta: &'a ResponseMeta,
    items: Items,
    stream: bool,
    /// The next event's sequence number; 0 until `response.created` is out.
    seq: u64,
}

impl<'a> Writer<'a> {
    pub fn new(
        ready: &'a Ready,
        model: &'a str,
        id: &'a str,
        created: u64,
        meta: &'a ResponseMeta,
        stream: bool,
    ) -> Writer<'a> {
        Writer {
            ready,
            model,
            id,
            created,
            meta,
            items: Items::new(id),
            stream,
            seq: 0,
        }
    }

    /// `response.created` and `response.in_progress`, once, before any other event.
    fn start(&mut self, choices: &Choices) -> Vec<String> {
        if self.seq > 0 {
            return Vec::new();
        }
        let response = self.object(choices, "in_progress");
        vec![
            self.event(json!({"type": "response.created", "response": response})),
            self.event(json!({"type": "response.in_progress", "response": response})),
        ]
    }

    /// One event, framed, with its sequence number.
    fn event(&mut self, mut event: Value) -> String {
        event["sequence_number"] = json!(self.seq);
        self.seq += 1;
        let kind = event["type"].as_str().unwrap_or("message").to_string();
        format!("event: {kind}\ndata: {event}\n\n")
    }

    /// The response object as it stands, with `status`.
    fn object(&self, choices: &Choices, status: &str) -> Value {
        let finished = matches!(status, "completed" | "incomplete");
        let mut o = json!({
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": null,
            "incomplete_details": if status == "incomplete" { json!({"reason": outcome(choices).1}) } else { Value::Null },
            "model": self.model,
            "output": if finished { json!(self.items.output()) } else { json!([]) },
            "usage": if finished { self.usage(choices) } else { Value::Null },
            // The one way edgelm serves a request, whatever tier the request asked for.
            "service_tier": "default",
        });
        let obj = o.as_object_mut().expect("an object");
        for (k, v) in &self.meta.echo {
            obj.insert(k.clone(), v.clone());
        }
        o
    }

    fn keep(&self, response: &Value) {
        if let Some(store) = &self.meta.store {
            store.keep(
                self.id,
                Kept {
                    response: response.clone(),
                    input: self.meta.input.clone(),
                },
            );
        }
    }

    fn usage(&self, choices: &Choices) -> Value {
        let u = &choices.usage;
        let reasoning = self.items.reasoning();
        let reasoning_tokens = if reasoning.is_empty() {
            0
        } else {
            self.ready
                .tokenizer
                .encode(&reasoning, false)
                .map_or(0, |t| t.len())
                .min(u.completion)
        };
        let written = u.cache_written(self.ready.engine.plan.block_size);
        json!({
            "input_tokens": u.prompt,
            "input_tokens_details": {"cached_tokens": u.cached, "cache_write_tokens": written},
            "output_tokens": u.completion,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": u.prompt + u.completion,
        })
    }
}

impl Format for Writer<'_> {
    fn streams(&self) -> bool {
        self.stream
    }

    /// Takes an event's deltas; a stream sends their events (after `response.created`).
    fn released(&mut self, choices: &Choices, r: &Released) -> Vec<String> {
        if r.finish == Some("length") {
            self.items.cut_short();
        }
        let id = self.id;
        let call_id = |i: usize| ids::call(id, 0, i);
        let events: Vec<Value> = r
            .deltas
            .iter()
            .flat_map(|d| self.items.apply(d, &call_id))
            .collect();
        if !self.stream {
            return Vec::new();
        }
        let mut out = self.start(choices);
        out.extend(events.into_iter().map(|e| self.event(e)));
        out
    }

    /// A stream's closing events and `response.completed` (or `.incomplete`); the response
    /// is kept.
    fn stream_end(&mut self, choices: &Choices) -> Vec<String> {
        let mut out = self.start(choices);
        let (status, _) = outcome(choices);
        for e in self.items.finish(status) {
            out.push(self.event(e));
        }
        let response = self.object(choices, status);
        self.keep(&response);
        let kind = format!("response.{status}");
        out.push(self.event(json!({"type": kind, "response": response})));
        out
    }

    /// The whole response object, once every choice is done; it is kept.
    fn whole(&mut self, choices: &Choices) -> String {
        let (status, _) = outcome(choices);
        self.items.finish(status);
        let response = self.object(choices, status);
        self.keep(&response);
        response.to_string()
    }

    /// An `error` event and `response.failed` (a stream), or the error object.
    fn failed(&mut self, choices: &Choices, failure: &Failure) -> Vec<String> {
        let err = ApiError::from(failure);
        if !self.stream {
            return vec![err.body()];
        }
        let mut out = self.start(choices);
        out.push(self.event(
            json!({"type": "error", "code": err.code, "message": err.message, "param": err.param}),
        ));
        let mut response = self.object(choices, "failed");
        response["error"] =
            json!({"code": err.code.unwrap_or("server_error"), "message": err.message});
        out.push(self.event(json!({"type": "response.failed", "response": response})));
        out
    }
}

/// `completed`, or `incomplete` (with why) when the answer was cut by its token limit.
fn outcome(choices: &Choices) -> (&'static str, &'static str) {
    match choices.list.first().and_then(|c| c.finish) {
        Some("length") => ("incomplete", "max_output_tokens"),
        _ => ("completed", ""),
    }
}
