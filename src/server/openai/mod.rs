//! OpenAI's API as edgelm speaks it: the request bodies (`request`) parsed once and checked
//! into one typed job (`parse`, `sampling`, `job`; a chat request's images in `images`), the errors (`error`), the answers' shapes
//! (`answer`; the Responses API in `responses`), embeddings (`embeddings`), the models
//! (`models`) and the LoRA adapters loaded at run time (`adapters`), `/tokenize`
//! (`tokenize`), and the Prometheus text of `/metrics` (`metrics`).
//! Nothing here runs a request: `generate` below does, writing in the shapes made here.

mod adapters;
mod answer;
mod base64;
mod embeddings;
mod error;
mod ids;
mod images;
mod job;
mod metrics;
mod models;
mod parse;
mod request;
mod responses;
mod sampling;
mod tokenize;

pub use adapters::{load as load_adapter, unload as unload_adapter};
pub use answer::format_for;
pub use embeddings::{
    answer as embeddings_answer, check as check_embeddings, EmbeddingsBody, Served,
};
pub use error::ApiError;
pub use job::Job;
pub use metrics::{render as render_metrics, resident_bytes};
pub use models::{list as list_models, one as one_model, select_adapted};
pub use parse::{fuzz_parse_request, Body, Parsing};
pub use responses::{Store, PREFIX as RESPONSES_PREFIX};
pub use tokenize::{detokenize, tokenize};
