//! The Responses API (`/v1/responses`), OpenAI's newer shape of a chat turn, served by the
//! chat path: a request becomes a chat request (`request`) and runs as one; its answer is
//! written as a response object or as typed stream events (`writer`, over the output items of
//! `items`). Finished responses are kept for `previous_response_id` and for
//! `GET`/`DELETE /v1/responses/{id}` in a bounded store (`store`).

mod items;
mod request;
mod store;
mod writer;

pub use request::translate;
pub use store::{Kept, Store};
pub use writer::Writer;

use serde_json::{Map, Value};
use std::sync::Arc;

/// Everything a Responses job carries beside its chat rules.
#[derive(Clone)]
pub struct ResponseMeta {
    /// Request fields the response object repeats.
    pub echo: Map<String, Value>,
    /// The conversation up to this turn, kept with the response.
    pub input: Vec<Value>,
    /// Where the finished response goes (unless the request said `store: false`).
    pub store: Option<Arc<Store>>,
}

/// `/v1/responses/{id}` and `/v1/responses/{id}/input_items`.
pub const PREFIX: &str = "/v1/responses/";

/// Items as a kept conversation lists them: each with its type (a bare `{role, content}` is a
/// message) and an id (`{prefix}_{response}_in{n}` where the client gave none).
pub fn with_ids(items: Vec<Value>, response_id: &str) -> Vec<Value> {
    let tag = response_id.trim_start_matches("resp_");
    items
        .into_iter()
        .enumerate()
        .map(|(n, mut item)| {
            if let Some(o) = item.as_object_mut() {
                if !o.contains_key("type") {
                    o.insert("type".into(), "message".into());
                }
                if !o.contains_key("id") {
                    let prefix = match o["type"].as_str() {
                        Some("message") => "msg",
                        Some("function_call_output") => "fco",
                        Some("function_call") => "fc",
                        Some("reasoning") => "rs",
                        _ => "item",
                    };
                    o.insert("id".into(), format!("{prefix}_{tag}_in{n}").into());
                }
            }
            item
        })
        .collect()
}
