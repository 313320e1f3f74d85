//! A response's output items, grown from the answer's deltas in the order they come:
//! reasoning, a message, function calls. Each change is also the typed stream event that
//! tells a client of it (`response.output_item.added`, `…output_text.delta`, `….done`, ...),
//! so a stream and the final object always agree on the items and their indexes.

use crate::chat::Delta;
use serde_json::{json, Value};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Reasoning,
    Message,
    Call,
}

struct Item {
    id: String,
    kind: Kind,
    /// The reasoning's or the message's text, or the call's arguments.
    text: String,
    /// Calls only.
    call_id: String,
    name: String,
    status: &'static str,
}

impl Item {
    fn json(&self) -> Value {
        match self.kind {
            Kind::Reasoning => json!({
                "id": self.id, "type": "reasoning", "summary": [], "status": self.status,
                "content": if self.status == "in_progress" { json!([]) } else { json!([part(Kind::Reasoning, &self.text)]) },
            }),
            Kind::Message => json!({
                "id": self.id, "type": "message", "role": "assistant", "status": self.status,
                "content": if self.status == "in_progress" { json!([]) } else { json!([part(Kind::Message, &self.text)]) },
            }),
            Kind::Call => json!({
                "id": self.id, "type": "function_call", "call_id": self.call_id, "name": self.name,
                "arguments": self.text, "status": self.status,
            }),
        }
    }
}

/// A text item's one content part.
fn part(kind: Kind, text: &str) -> Value {
    match kind {
        Kind::Reasoning => json!({"type": "reasoning_text", "text": text}),
        _ => json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []}),
    }
}

/// Every output item of one response; events are returned without their sequence numbers.
pub struct Items {
    /// Distinguishes this response's item ids.
    tag: String,
    list: Vec<Item>,
    /// The text item still growing.
    open: Option<usize>,
    /// The item of each call, by the call's index in the answer.
    calls: Vec<usize>,
    /// The answer was cut by its token limit: a call that ends now is incomplete.
    cut: bool,
}

impl Items {
    pub fn new(response_id: &str) -> Items {
        Items {
            tag: response_id.trim_start_matches("resp_").to_string(),
            list: Vec::new(),
            open: None,
            calls: Vec::new(),
            cut: false,
        }
    }

    /// The deltas still to come end an answer cut by its token limit (a call among them is
    /// the one the limit cut).
    pub fn cut_short(&mut self) {
        self.cut = true;
    }

    /// Takes one delta of the answer; `call_id` names call `index`. Returns its events.
    pub fn apply(&mut self, delta: &Delta, call_id: &dyn Fn(usize) -> String) -> Vec<Value> {
        let mut events = Vec::new();
        match delta {
            Delta::Reasoning(t) => self.text(Kind::Reasoning, t, &mut events),
            Delta::Content(t) => self.text(Kind::Message, t, &mut events),
            Delta::CallStart(index, name) => {
                self.close_open("completed", &mut events);
                let at = self.list.len();
                self.list.push(Item {
                    id: format!("fc_{}_{at}", self.tag),
                    kind: Kind::Call,
                    text: String::new(),
                    call_id: call_id(*index),
                    name: name.clone(),
                    status: "in_progress",
                });
                self.calls.push(at);
                events.push(json!({"type": "response.output_item.added", "output_index": at, "item": self.list[at].json()}));
            }
            Delta::CallArgs(index, args) => {
                if let Some(&at) = self.calls.get(*index) {
                    self.list[at].text.push_str(args);
                    events.push(json!({"type": "response.function_call_arguments.delta", "item_id": self.list[at].id, "output_index": at, "delta": args}));
                }
            }
            Delta::Call(index, call) => {
                if let Some(&at) = self.calls.get(*index) {
                    self.list[at].text = call.arguments.clone();
                    let status = if self.cut { "incomplete" } else { "completed" };
                    self.close(at, status, &mut events);
                }
            }
        }
        events
    }

    /// The answer is over: the items still open close with `status` (`incomplete` when it
    /// was cut). An answer with no item at all gets an empty message, as OpenAI's do.
    pub fn finish(&mut self, status: &'static str) -> Vec<Value> {
        let mut events = Vec::new();
        if self.list.is_empty() {
            self.text(Kind::Message, "", &mut events);
        }
        self.close_open(status, &mut events);
        for at in self.calls.clone() {
            if self.list[at].status == "in_progress" {
                self.close(at, status, &mut events);
            }
        }
        events
    }

    /// The items as a response's `output`.
    pub fn output(&self) -> Vec<Value> {
        self.list.iter().map(Item::json).collect()
    }

    /// The answer's reasoning (its tokens are the usage's reasoning tokens).
    pub fn reasoning(&self) -> String {
        self.list
            .iter()
            .filter(|i| i.kind == Kind::Reasoning)
            .map(|i| i.text.as_str())
            .collect()
    }

    /// Text of `kind`: joins the open item of that kind, or opens a new one.
    fn text(&mut self, kind: Kind, t: &str, events: &mut Vec<Value>) {
        let at = match self.open {
            Some(at) if self.list[at].kind == kind => at,
            _ => {
                self.close_open("completed", events);
                let at = self.list.len();
                let prefix = if kind == Kind::Reasoning { "rs" } else { "msg" };
                self.list.push(Item {
                    id: format!("{prefix}_{}_{at}", self.tag),
                    kind,
                    text: String::new(),
                    call_id: String::new(),
                    name: String::new(),
                    status: "in_progress",
                });
                self.open = Some(at);
                let item = &self.list[at];
                events.push(json!({"type": "response.output_item.added", "output_index": at, "item": item.json()}));
                events.push(json!({"type": "response.content_part.added", "item_id": item.id, "output_index": at, "content_index": 0, "part": part(kind, "")}));
                at
            }
        };
        if t.is_empty() {
            return;
        }
        let item = &mut self.list[at];
        item.text.push_str(t);
        events.push(match kind {
            Kind::Reasoning => json!({"type": "response.reasoning_text.delta", "item_id": item.id, "output_index": at, "content_index": 0, "delta": t}),
            _ => json!({"type": "response.output_text.delta", "item_id": item.id, "output_index": at, "content_index": 0, "delta": t, "logprobs": []}),
        });
    }

    fn close_open(&mut self, status: &'static str, events: &mut Vec<Value>) {
        if let Some(at) = self.open.take() {
            self.close(at, status, events);
        }
    }

    /// Item `at` is complete (or cut, with `status` incomplete): its `.done` events.
    fn close(&mut self, at: usize, status: &'static str, events: &mut Vec<Value>) {
        let item = &mut self.list[at];
        item.status = status;
        let (id, text) = (item.id.clone(), item.text.clone());
        match item.kind {
            Kind::Reasoning => {
                events.push(json!({"type": "response.reasoning_text.done", "item_id": id, "output_index": at, "content_index": 0, "text": text}));
                events.push(json!({"type": "response.content_part.done", "item_id": id, "output_index": at, "content_index": 0, "part": part(Kind::Reasoning, &text)}));
            }
            Kind::Message => {
                events.push(json!({"type": "response.output_text.done", "item_id": id, "output_index": at, "content_index": 0, "text": text, "logprobs": []}));
                events.push(json!({"type": "response.content_part.done", "item_id": id, "output_index": at, "content_index": 0, "part": part(Kind::Message, &text)}));
            }
            Kind::Call => {
                events.push(json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": at, "name": item.name, "arguments": text}));
            }
        }
        events.push(json!({"type": "response.output_item.done", "output_index": at, "item": self.list[at].json()}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::Call;

    fn types(events: &[Value]) -> Vec<&str> {
        events.iter().map(|e| e["type"].as_str().unwrap()).collect()
    }

    #[test]
    fn reasoning_then_text_are_two_items_with_their_events() {
        let mut items = Items::new("resp_7");
        let id = |i: usize| format!("call_{i}");
        let mut ev = items.apply(&Delta::Reasoning("Think.".into()), &id);
        ev.extend(items.apply(&Delta::Content("Hel".into()), &id));
        ev.extend(items.apply(&Delta::Content("lo".into()), &id));
        ev.extend(items.finish("completed"));
        assert_eq!(
            types(&ev),
            [
                "response.output_item.added",
                "response.content_part.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
            ]
        );
        let out = items.output();
        assert_eq!(out[0]["content"][0]["text"], "Think.");
        assert_eq!(out[1]["content"][0]["text"], "Hello");
        assert_eq!(out[1]["id"], "msg_7_1");
        assert_eq!(items.reasoning(), "Think.");
    }

    #[test]
    fn a_call_streams_its_arguments_and_a_cut_one_is_incomplete() {
        let mut items = Items::new("resp_1");
        let id = |i: usize| format!("call_{i}");
        let call = Call {
            name: "f".into(),
            arguments: "{\"a\":1}".into(),
        };
        let mut ev = items.apply(&Delta::CallStart(0, "f".into()), &id);
        ev.extend(items.apply(&Delta::CallArgs(0, "{\"a\":".into()), &id));
        ev.extend(items.apply(&Delta::CallArgs(0, "1}".into()), &id));
        ev.extend(items.apply(&Delta::Call(0, call), &id));
        ev.extend(items.apply(&Delta::CallStart(1, "f".into()), &id));
        ev.extend(items.apply(&Delta::CallArgs(1, "{\"a\"".into()), &id));
        ev.extend(items.finish("incomplete"));
        assert_eq!(
            types(&ev)[..5],
            [
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done"
            ]
        );
        let out = items.output();
        assert_eq!(out.len(), 2, "no empty message beside calls");
        assert_eq!(out[0]["arguments"], "{\"a\":1}");
        assert_eq!(out[0]["call_id"], "call_0");
        assert_eq!(out[1]["status"], "incomplete");
        assert_eq!(out[1]["arguments"], "{\"a\"");
    }

    #[test]
    fn a_call_that_ends_with_a_cut_answer_is_incomplete() {
        let mut items = Items::new("resp_3");
        let id = |i: usize| format!("call_{i}");
        items.apply(&Delta::CallStart(0, "f".into()), &id);
        items.cut_short();
        let partial = Call {
            name: "f".into(),
            arguments: "{\"a\": ".into(),
        };
        let ev = items.apply(&Delta::Call(0, partial), &id);
        assert_eq!(ev.last().unwrap()["item"]["status"], "incomplete");
        items.finish("incomplete");
        assert_eq!(items.output()[0]["arguments"], "{\"a\": ");
    }

    #[test]
    fn an_empty_answer_is_an_empty_message() {
        let mut items = Items::new("resp_2");
        items.finish("completed");
        let out = items.output();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["content"][0]["text"], "");
    }
}
