//! The Responses API (`/v1/responses`), OpenAI's newer shape of a chat turn, served by the
//! chat path: a request becomes a chat request (`request`, its items through `input`) and
//! runs as one; its answer is written as a response object or as typed stream events
//! (`writer`, over the output items of `items`). Finished responses are kept for
//! `previous_response_id` and for `GET`/`DELETE /v1/responses/{id}` in a bounded store
//! (`store`).

mod input;
mod items;
mod request;
mod store;
mod writer;

pub use request::{in_request_terms, translate, ResponseMeta, ResponsesBody, IGNORED};
pub use store::Store;
pub use writer::Writer;

/// `/v1/responses/{id}` and `/v1/responses/{id}/input_items`.
pub const PREFIX: &str = "/v1/responses/";
