//! The OpenAI-compatible HTTP server. The front (`front`) owns every connection, on one
//! thread (hyper's HTTP/1.1 on a single-threaded runtime), and answers what the head alone
//! decides; fixed pools of handler threads (`handlers`) parse and validate complete requests,
//! hand work to the single engine thread through its channels, and send their answers back to
//! the front over channels (`http`); nothing of the engine sits behind a lock
//! here (its published stats are a read-only copy). docs/http-front.md says why it is built
//! this way.

mod admission;
mod answer;
mod api;
mod base64;
mod call_scan;
mod call_stream;
mod chat_output;
mod chat_request;
mod choices;
mod embeddings;
mod error;
mod fd_limit;
mod front;
mod generate;
mod handlers;
mod harmony;
mod harmony_grammar;
mod http;
mod listener;
mod metrics;
mod models;
mod parse;
mod priority;
mod responses;
mod routes;
mod text;
mod tools;
mod triage;

pub use front::fuzz_http;
pub use front::FrontConfig;
pub use listener::serve;
pub use parse::fuzz_parse_request;
pub use priority::compute_nice;

use crate::config::ModelSection;
use crate::engine::{EngineConfig, EngineHandle};
use crate::grammar::Grammars;
use crate::tokenizer::{ChatTemplate, Tokenizer};
use admission::Admission;
use api::Limits;
use error::ApiError;
pub use models::{Kind, Models};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The models served, the first one first (each with its id, kind and KV share).
    pub models: Vec<ModelSection>,
    pub addr: SocketAddr,
    pub engine: EngineConfig,
    pub api_key: Option<String>,
    /// Requests waiting beyond the running batch before new ones get 429.
    pub max_queue: usize,
    /// A new request that would wait longer than this in the queue (at the recent rate of
    /// finishing requests) gets 429; zero: only `max_queue` bounds the queue.
    pub max_queue_wait: std::time::Duration,
    pub body_limit: usize,
    pub profile: String,
    /// Timeouts, the connection cap, the per-client buckets and the refusal pacing.
    pub front: FrontConfig,
    /// Responses kept for `previous_response_id`: at most this many, in at most this many
    /// bytes.
    pub response_store: (usize, usize),
}

impl ServeConfig {
    /// Sequences the engines run at once: every model's engine runs `engine.max_seqs`.
    pub fn running_slots(&self) -> usize {
        self.engine.max_seqs * self.models.len().max(1)
    }
}

/// One model, loaded, with its engine running.
pub struct Ready {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub chat: Option<ChatTemplate>,
    /// Compiles response formats, grammars and tool-call grammars over the vocabulary.
    pub grammars: Grammars,
    /// The id requests select it by (`ModelSection::served_id`).
    pub model_name: String,
    /// The model file's modification time (seconds since the epoch): `created` in the API.
    pub model_created: u64,
    pub limits: Limits,
    pub kind: Kind,
}

pub struct Server {
    config: ServeConfig,
    ready: OnceLock<Models>,
    load_error: OnceLock<String>,
    draining: AtomicBool,
    /// The drain time is over: every answer under way ends now, with an error its client can
    /// parse.
    cut: AtomicBool,
    started: Instant,
    in_flight: AtomicUsize,
    admission: Admission,
    next_id: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Generation requests handed to handlers, not yet through admission (`triage::Pending`).
    pending: AtomicUsize,
    /// Overload refusals of the last second (`triage`): a flood shows as a high rate.
    refusals: Mutex<triage::RefusalRate>,
    front_stats: front::stats::FrontStats,
    /// Finished Responses answers, for `previous_response_id` and `/v1/responses/{id}`.
    responses: Arc<responses::Store>,
    /// Starts every response id, so that an id from before a restart names nothing.
    boot_tag: String,
}

/// A complete request, as the front hands it to a handler.
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    /// Where the answer goes (the front writes it on the connection).
    pub response: http::RawResponse,
    /// Set for generation requests: counted until admission has decided.
    pending: Option<triage::Pending>,
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Server {
    pub fn new(config: ServeConfig) -> Arc<Server> {
        Arc::new(Server {
            admission: Admission::new(
                config.running_slots(),
                config.max_queue,
                config.max_queue_wait,
                // Prompts the scheduler serves in its long lane, beside the others.
                crate::engine::scheduler::LONG_PROMPT_STEPS * config.engine.max_batched_tokens,
            ),
            responses: Arc::new(responses::Store::new(
                config.response_store.0,
                config.response_store.1,
            )),
            boot_tag: format!("{:x}", unix_nanos() & 0xffff_ffff_ffff),
            config,
            ready: OnceLock::new(),
            load_error: OnceLock::new(),
            draining: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            errors: Mutex::new(BTreeMap::new()),
            pending: AtomicUsize::new(0),
            refusals: Mutex::new(Default::default()),
            front_stats: Default::default(),
        })
    }

    /// Loads the models and starts their engines (the server answers 503 until this is done).
    pub fn load(&self) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
        let (models, threads) = Models::load(&self.config)?;
        let _ = self.ready.set(models);
        Ok(threads)
    }

    pub fn set_load_error(&self, e: String) {
        let _ = self.load_error.set(e);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.get().is_some() && !self.draining.load(Ordering::Relaxed)
    }

    pub fn ready(&self) -> Option<&Models> {
        self.ready.get()
    }

    /// Stops accepting generation work; /health turns 503.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Ends every answer under way (the drain time is over).
    pub fn cut_short(&self) {
        self.cut.store(true, Ordering::Relaxed);
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    fn count_error(&self, e: &ApiError) {
        self.count(e.reason());
    }

    /// One more request under `edgelm_request_errors_total{reason}`.
    fn count(&self, reason: &'static str) {
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(reason).or_default() += 1;
        }
    }
}
