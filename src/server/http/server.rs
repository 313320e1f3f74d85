//! The server's state, shared by the front, the handlers and the listener: its configuration,
//! the models once loaded, admission, the counters, and whether it is draining.

use super::admission::Admission;
use super::front::config::FrontConfig;
use super::front::stats::FrontStats;
use super::refusals::RefusalRate;
use super::reloads::Reloads;
use crate::config::ModelSection;
use crate::engine::EngineConfig;
use crate::server::generate::{Models, RawResponse};
use crate::server::openai::{ApiError, Store};
use crate::vision::ImageSources;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
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
    /// Where requests' images may come from besides `data:` URLs.
    pub images: crate::config::ImagesSection,
    /// Where each model's prefix cache is kept across restarts.
    pub prefix_cache: crate::config::PrefixCacheSection,
    /// Reads the profile again for a reload (`SIGHUP`, `POST /admin/reload`): the models it
    /// serves now, its memory check passed with the running models still held. `None`: the
    /// models above, as they are.
    pub reread: Option<Reread>,
}

/// See [`ServeConfig::reread`].
#[derive(Clone)]
pub struct Reread(pub Arc<dyn Fn() -> anyhow::Result<Vec<ModelSection>> + Send + Sync>);

impl std::fmt::Debug for Reread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reread")
    }
}

impl ServeConfig {
    /// Sequences the engines run at once: every model's engine runs `engine.max_seqs`.
    pub fn running_slots(&self) -> usize {
        self.engine.max_seqs * self.models.len().max(1)
    }
}

pub struct Server {
    pub(super) config: ServeConfig,
    /// The models serving now: a reload puts new ones in their place, and the old ones go
    /// when the last request holding them ends.
    pub(super) ready: RwLock<Option<Arc<Models>>>,
    pub(super) load_error: OnceLock<String>,
    /// Held while a reload runs: one at a time.
    pub(super) reloading: Mutex<()>,
    /// How the reloads went.
    pub(super) reloads: Mutex<Reloads>,
    /// The engines' threads of models loaded since start (`reload`), joined at shutdown.
    pub(super) reloaded_threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    pub(super) draining: AtomicBool,
    /// The drain time is over: every answer under way ends now, with an error its client can
    /// parse.
    pub(super) cut: AtomicBool,
    pub(super) started: Instant,
    pub(super) in_flight: AtomicUsize,
    pub(super) admission: Admission,
    pub(super) next_id: AtomicU64,
    pub(super) errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Generation requests handed to handlers, not yet through admission (`Pending`).
    pub(super) pending: Arc<AtomicUsize>,
    /// Overload refusals of the last second (`triage`): a flood shows as a high rate.
    pub(super) refusals: Mutex<RefusalRate>,
    pub(super) front_stats: FrontStats,
    /// Finished Responses answers, for `previous_response_id` and `/v1/responses/{id}`.
    pub(super) responses: Arc<Store>,
    /// Starts every response id, so that an id from before a restart names nothing.
    pub(super) boot_tag: String,
}

/// A complete request, as the front hands it to a handler.
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
    /// Where the answer goes (the front writes it on the connection).
    pub response: RawResponse,
    /// Set for generation requests: counted until admission has decided.
    pub(super) pending: Option<Pending>,
}

fn unix_nanos() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// A generation request handed to a handler and not yet through admission: counted as in
/// flight by [`Server::admission_check`] until dropped, so that when one slot frees, the
/// front lets one request through, not every one that arrives before the first is admitted.
pub struct Pending(Arc<AtomicUsize>);

impl Pending {
    pub fn new(server: &Server) -> Pending {
        server.pending.fetch_add(1, Ordering::SeqCst);
        Pending(server.pending.clone())
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Compares the key in time independent of where it differs.
pub(super) fn unix_now() -> u64 {
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
            responses: Arc::new(Store::new(config.response_store.0, config.response_store.1)),
            boot_tag: format!("{:x}", unix_nanos() & 0xffff_ffff_ffff),
            config,
            ready: RwLock::new(None),
            load_error: OnceLock::new(),
            reloading: Mutex::default(),
            reloads: Mutex::default(),
            reloaded_threads: Mutex::default(),
            draining: AtomicBool::new(false),
            cut: AtomicBool::new(false),
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            errors: Mutex::new(BTreeMap::new()),
            pending: Arc::default(),
            refusals: Mutex::new(Default::default()),
            front_stats: Default::default(),
        })
    }

    /// Loads the models and starts their engines (the server answers 503 until this is done).
    pub fn load(&self) -> anyhow::Result<Vec<std::thread::JoinHandle<()>>> {
        let (models, threads) = self.load_models(&self.config.models)?;
        *self.ready.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(models));
        Ok(threads)
    }

    /// `specs` loaded, their engines started (as many models as the server holds).
    pub(super) fn load_models(
        &self,
        specs: &[ModelSection],
    ) -> anyhow::Result<(Models, Vec<std::thread::JoinHandle<()>>)> {
        let c = &self.config.images;
        let timeout = std::time::Duration::from_secs_f64(c.fetch_timeout_s);
        let images = ImageSources::new(&c.fetch_hosts, c.fetch_max_kib, timeout, &c.folder)?;
        Models::load(
            specs,
            &self.config.engine,
            images,
            &self.config.prefix_cache,
        )
    }

    pub fn set_load_error(&self, e: String) {
        let _ = self.load_error.set(e);
    }

    pub fn is_ready(&self) -> bool {
        self.ready().is_some() && !self.draining.load(Ordering::Relaxed)
    }

    /// The models serving now; a request holds them to its end, whatever a reload does.
    pub fn ready(&self) -> Option<Arc<Models>> {
        self.ready.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Tells systemd the service is up (`READY=1`), and what it serves.
    pub fn notify_serving(&self) {
        let ids: Vec<String> = self.ready().map_or(Vec::new(), |m| {
            m.list.iter().map(|r| r.model_name.clone()).collect()
        });
        let status = format!("STATUS=serving {} on {}", ids.join(", "), self.config.addr);
        crate::systemd::notify(&["READY=1", &status]);
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

    pub(super) fn count_error(&self, e: &ApiError) {
        self.count(e.reason());
    }

    /// One more request under `edgelm_request_errors_total{reason}`.
    pub(super) fn count(&self, reason: &'static str) {
        if let Ok(mut m) = self.errors.lock() {
            *m.entry(reason).or_default() += 1;
        }
    }
}
