//! HTTP: the front (`front`: hyper's HTTP/1.1 on one thread for every connection, the gate's
//! stricter head rules, timeouts, caps, per-client buckets, and the refusals decided from the
//! head alone, `triage`), fixed pools of handler threads (`pool`), admission
//! (`admission`), routing a complete request to its answer (`routes`, `handlers`, `status`),
//! the server's life (`listener`: bind, load, serve, drain), reloads without downtime
//! (`reload`, how they went in `reloads`) and shared state (`server`).
//! docs/http-front.md says why it is built this way.

mod admission;
mod fd_limit;
mod front;
mod handlers;
mod listener;
mod pool;
mod priority;
mod refusals;
mod reload;
mod reloads;
mod routes;
mod server;
mod status;
mod triage;

pub use front::{fuzz_http, FrontConfig};
pub use listener::serve;
pub use priority::compute_nice;
pub use server::{Reread, ServeConfig};
