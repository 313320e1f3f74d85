//! The OpenAI-compatible HTTP server, in three layers by what happens to a request, each
//! importing only the ones below it (scripts/check-layers.py checks this):
//! - `http`: connections, framing policy, deadlines, buckets, admission, triage, and routing
//!   a complete request to its handler (a fixed pool of threads);
//! - `openai`: the API's shapes: a body parsed once into one typed job, errors, models,
//!   embeddings, the Responses API, metrics;
//! - `generate`: running a job on the models' engines and writing its answer, whole or
//!   streamed, down the channel to the connection.
//!
//! Chat itself (templates, tool and reasoning syntaxes) is `crate::chat`, below the server.
//! Nothing of the engine sits behind a lock here (its published stats are a read-only copy).

mod generate;
mod http;
mod openai;

pub use generate::Kind;
pub use http::{compute_nice, fuzz_http, serve, FrontConfig, Reread, ServeConfig};
pub use openai::fuzz_parse_request;
