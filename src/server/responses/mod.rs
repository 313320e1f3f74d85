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

use super::error::ApiError;
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

/// A chat request's error about a field, named as the Responses request calls it (the
/// client never sent `messages` or `max_completion_tokens`).
pub fn in_request_terms(mut e: ApiError) -> ApiError {
    let renamed = match e.param.as_deref() {
        Some("messages") | Some("prompt") => "input",
        Some("max_tokens") | Some("max_completion_tokens") => "max_output_tokens",
        Some("response_format") | Some("json_schema") => "text.format",
        Some("reasoning_effort") => "reasoning.effort",
        _ => return e,
    };
    if let Some(old) = e.param.as_deref() {
        e.message = e.message.replace(old, renamed);
    }
    e.param = Some(renamed.to_string());
    e
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_field_errors_are_named_as_the_request_names_them() {
        let e = in_request_terms(
            ApiError::bad_request("max_tokens must be ≥ 0, got -1").param("max_tokens"),
        );
        assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
        assert_eq!(e.message, "max_output_tokens must be ≥ 0, got -1");
        let e =
            in_request_terms(ApiError::bad_request("messages must not be empty").param("messages"));
        assert_eq!(
            (e.param.as_deref(), e.message.as_str()),
            (Some("input"), "input must not be empty")
        );
        let e = in_request_terms(ApiError::bad_request("top_k is bad").param("top_k"));
        assert_eq!(e.param.as_deref(), Some("top_k"));
    }
}
