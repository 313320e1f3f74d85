//! The OpenAI-compatible HTTP server. The front (`front`) owns every connection until its
//! request is complete, on one epoll thread, and answers what the head alone decides; fixed
//! pools of handler threads (`handlers`) parse and validate complete requests, then hand work
//! to the single engine thread through its channels; nothing of the engine sits behind a lock
//! here (its published stats are a read-only copy). docs/http-front.md says why it is built
//! this way.

mod admission;
mod api;
mod chat_output;
mod chat_request;
mod error;
mod fd_limit;
mod front;
mod generate;
mod handlers;
mod http;
mod metrics;
mod priority;
mod text;
mod tools;
mod triage;

pub use front::FrontConfig;
pub use priority::compute_nice;

use crate::engine::{Engine, EngineConfig, EngineHandle};
use crate::grammar::{Constraint, ConstraintSpec, Grammars};
use crate::model::Model;
use crate::systemd;
use crate::tokenizer::{ChatTemplate, Tokenizer};
use admission::Admission;
use api::{
    ChatRequest, CompletionRequest, DetokenizeRequest, Limits, PromptInput, TokenizeRequest,
};
use error::ApiError;
use generate::{Flavor, Job};
use http::RawResponse;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Clone, Debug)]
pub struct ServeConfig {
    pub model: PathBuf,
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
}

/// Everything that exists once the model is loaded.
pub struct Ready {
    pub engine: EngineHandle,
    pub tokenizer: Tokenizer,
    pub chat: Option<ChatTemplate>,
    /// Compiles response formats, grammars and tool-call grammars over the vocabulary.
    pub grammars: Grammars,
    pub model_name: String,
    pub limits: Limits,
}

pub struct Server {
    config: ServeConfig,
    ready: OnceLock<Ready>,
    load_error: OnceLock<String>,
    draining: AtomicBool,
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
}

/// A complete request, as the front hands it to a handler.
pub struct Request {
    pub method: String,
    pub path: String,
    pub auth: Option<String>,
    pub body: Vec<u8>,
    /// The connection, blocking again; every response ends it (`Connection: close`).
    pub stream: TcpStream,
    /// Set for generation requests: counted until admission has decided.
    pending: Option<triage::Pending>,
}

/// The listening socket. SO_REUSEADDR: a restart right after a crash binds despite
/// connections in TIME_WAIT. No SO_REUSEPORT: any socket already on the port, another
/// edgelm's included, makes the bind fail, where a second edgelm started by mistake would
/// otherwise silently take a share of the first one's connections. The backlog is the most
/// the kernel allows (it caps it at net.core.somaxconn): a connect storm waits there for the
/// front rather than being refused by the kernel.
fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(libc::c_int::MAX)?;
    Ok(socket.into())
}

/// Closes a connection whose response is complete without resetting it: says so (FIN), then
/// reads and drops whatever the client still sends until it closes too. A client that ignores
/// `Connection: close` and has already written its next request (load tools do) would
/// otherwise get a reset, which can also destroy the end of the response it has not read yet.
/// Bounded: a client that neither sends nor closes is let go after a moment.
fn lingering_close(s: TcpStream) {
    use std::io::Read;
    const LINGER: std::time::Duration = std::time::Duration::from_millis(200);
    if s.shutdown(std::net::Shutdown::Write).is_err() || s.set_read_timeout(Some(LINGER)).is_err() {
        return;
    }
    let t0 = Instant::now();
    let mut scratch = [0u8; 4096];
    while t0.elapsed() < LINGER {
        match (&s).read(&mut scratch) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    }
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
                config.engine.max_seqs,
                config.max_queue,
                config.max_queue_wait,
                // Prompts the scheduler serves in its long lane, beside the others.
                crate::engine::scheduler::LONG_PROMPT_STEPS * config.engine.max_batched_tokens,
            ),
            config,
            ready: OnceLock::new(),
            load_error: OnceLock::new(),
            draining: AtomicBool::new(false),
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            errors: Mutex::new(BTreeMap::new()),
            pending: AtomicUsize::new(0),
            refusals: Mutex::new(Default::default()),
            front_stats: Default::default(),
        })
    }

    /// Loads the model and starts the engine (the server answers 503 until this is done).
    pub fn load(&self) -> anyhow::Result<std::thread::JoinHandle<()>> {
        let model = Arc::new(Model::load(&self.config.model)?);
        let tokenizer = Tokenizer::from_gguf(&model.file)?;
        let chat = match tokenizer.chat_template() {
            Some(src) => match ChatTemplate::new(
                src,
                tokenizer.special_text(tokenizer.bos),
                tokenizer.special_text(tokenizer.eos),
            ) {
                Ok(t) => Some(t),
                Err(e) => {
                    log::warn!("the model's chat template does not compile ({e}); /v1/chat/completions is disabled");
                    None
                }
            },
            None => None,
        };
        let model_name = self
            .config
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let grammars = Grammars::new(&tokenizer)?;
        let (engine, thread) = Engine::start(
            model,
            tokenizer.eog_tokens().to_vec(),
            self.config.engine.clone(),
        )?;
        let limits = Limits {
            max_n: self.config.engine.max_seqs.min(16),
            max_stop: 16,
            max_stop_len: 256,
            max_logprobs: 20,
            default_max_tokens: 16,
        };
        let _ = self.ready.set(Ready {
            engine,
            tokenizer,
            chat,
            grammars,
            model_name,
            limits,
        });
        Ok(thread)
    }

    pub fn set_load_error(&self, e: String) {
        let _ = self.load_error.set(e);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.get().is_some() && !self.draining.load(Ordering::Relaxed)
    }

    pub fn ready(&self) -> Option<&Ready> {
        self.ready.get()
    }

    /// Stops accepting generation work; /health turns 503.
    pub fn drain(&self) {
        self.draining.store(true, Ordering::Relaxed);
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

    /// Handles one complete request to the end of its response (on a handler thread).
    pub fn handle(self: &Arc<Self>, req: Request) {
        let Request {
            method: _,
            path,
            auth: _,
            body,
            stream,
            pending,
        } = req;
        let linger = stream.try_clone().ok();
        // Buffered: a response goes out in one write per flush (the head, then each chunk).
        let resp = RawResponse::new(Box::new(std::io::BufWriter::new(stream)));
        if let Err((e, resp)) = self.route(&path, &body, resp, pending) {
            self.count_error(&e);
            let retry = match e.retry_after {
                Some(s) => vec![("Retry-After", s.to_string())],
                None => Vec::new(),
            };
            let _ = resp.send(e.status, "application/json", &retry, e.body().as_bytes());
        }
        if let Some(s) = linger {
            lingering_close(s);
        }
    }

    fn authorized(&self, auth: Option<&str>) -> bool {
        match &self.config.api_key {
            None => true,
            Some(key) => auth
                .and_then(|a| a.strip_prefix("Bearer "))
                .is_some_and(|k| constant_time_eq(k.trim().as_bytes(), key.as_bytes())),
        }
    }

    /// The response to a request the front has already checked (route, method, key, size).
    fn route(
        self: &Arc<Self>,
        path: &str,
        body: &[u8],
        resp: RawResponse,
        pending: Option<triage::Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        if path == "/" {
            let _ = resp.send(
                200,
                "text/html; charset=utf-8",
                &[],
                include_str!("status.html").as_bytes(),
            );
            return Ok(());
        }
        let Some(ready) = self.ready.get() else {
            return Err((ApiError::unavailable("the model is still loading"), resp));
        };
        let result = match path {
            "/metrics" => {
                let errors = self.errors.lock().map(|e| e.clone()).unwrap_or_default();
                let mut text = metrics::render(
                    &ready.engine.stats(),
                    &errors,
                    self.started.elapsed().as_secs_f64(),
                );
                self.front_stats.render(&mut text);
                let _ = resp.send(200, "text/plain; version=0.0.4", &[], text.as_bytes());
                return Ok(());
            }
            "/api/status" => Ok(self.status_json(ready)),
            "/v1/models" => Ok(json!({"object": "list", "data": [{
                "id": ready.model_name, "object": "model", "created": 0, "owned_by": "edgelm",
                "max_model_len": ready.engine.limits.context,
            }]})),
            "/tokenize" => tokenize(ready, body),
            "/detokenize" => detokenize(ready, body),
            "/v1/completions" | "/v1/chat/completions" => {
                return self.generate(ready, path, body, resp, pending);
            }
            _ => Err(ApiError::not_found(path)),
        };
        match result {
            Ok(v) => {
                let _ = resp.send(200, "application/json", &[], v.to_string().as_bytes());
                Ok(())
            }
            Err(e) => Err((e, resp)),
        }
    }

    fn generate(
        self: &Arc<Self>,
        ready: &Ready,
        path: &str,
        body: &[u8],
        resp: RawResponse,
        pending: Option<triage::Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        if self.draining.load(Ordering::Relaxed) {
            return Err((ApiError::unavailable("the server is shutting down"), resp));
        }
        let job = match self.parse_job(ready, path, body) {
            Ok(j) => j,
            Err(e) => return Err((e, resp)),
        };
        // Back-pressure: the running batch plus a queue bounded in requests, and a backlog of
        // unstarted requests bounded in expected wait; past that, 429.
        let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
        let n_prompt: usize = job.prompts.iter().map(|p| p.len()).sum();
        let admitted = self.admission.admit(before, n_prompt, Instant::now());
        // Admission has decided (and `in_flight` counts it if admitted): no longer pending.
        drop(pending);
        let mut ticket = match admitted {
            Ok(t) => t,
            Err(r) => {
                self.in_flight.fetch_sub(1, Ordering::SeqCst);
                return Err((ApiError::overloaded(r.retry_after_s, r.queue_full), resp));
            }
        };
        struct Guard<'a>(&'a Server);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let _guard = Guard(self);
        let started = Instant::now();
        let id = job.id.clone();
        let mut on_first_token = |at: Instant| ticket.first_token(at);
        let shed = |waited: std::time::Duration| {
            // Only while there is a queue at all (more in flight than running slots): a
            // request in a running slot is never shed, however slow its first token.
            let shed = waited >= triage::SHED_AFTER
                && self.in_flight() > self.config.engine.max_seqs
                && self.flooded(Instant::now());
            if shed {
                front::stats::bump(&self.front_stats.shed);
            }
            shed
        };
        let out =
            generate::run(ready, job, resp, &mut on_first_token, &shed).inspect_err(|(e, _)| {
                log::info!(
                    "{id}: rejected ({} {}), prompt_tokens={n_prompt}",
                    e.status,
                    e.reason()
                );
            })?;
        let ttft = out
            .first_token
            .map(|t| format!("{:.3}s", t.duration_since(started).as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        if out.result == generate::GONE {
            // The client left (queued, prefilling or decoding): its work was cancelled.
            self.count("cancelled");
        }
        log::info!(
            "{id}: {}, prompt_tokens={n_prompt} completion_tokens={} ttft={ttft} duration={:.3}s",
            out.result,
            out.completion_tokens,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    fn parse_job(&self, ready: &Ready, path: &str, body: &[u8]) -> Result<Job, ApiError> {
        let id_num = self.next_id.fetch_add(1, Ordering::Relaxed);
        parse_request(
            &ready.tokenizer,
            ready.chat.as_ref(),
            &ready.grammars,
            &ready.limits,
            path,
            body,
            id_num,
        )
    }

    fn status_json(&self, ready: &Ready) -> serde_json::Value {
        let s = ready.engine.stats();
        let now = unix_now();
        let hit_rate = if s.prefix_queried_tokens > 0 {
            s.prefix_hit_tokens as f64 / s.prefix_queried_tokens as f64
        } else {
            0.0
        };
        json!({
            "state": if self.is_ready() { "ready" } else { "draining" },
            "model": ready.model_name,
            "profile": self.config.profile,
            "kv_type": self.config.engine.kv_type.name(),
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "now": now,
            "running": s.running,
            "waiting": s.waiting,
            "kv_total": s.kv_blocks_total,
            "kv_used": s.kv_blocks_used,
            "kv_cached": s.kv_blocks_cached,
            "prefix_hit_rate": hit_rate,
            "generation_tokens": s.generation_tokens,
            "constrained_requests": s.constrained_requests,
            "grammar_mask_seconds": s.grammar_mask_seconds,
            "tokens_per_second": s.recent_tokens.iter().map(|&(t, n)| (t, n)).collect::<Vec<_>>(),
            "ttft": s.recent_ttft,
        })
    }
}

/// Parses and validates a /v1/completions (`path`) or /v1/chat/completions body into a job:
/// everything a generation request goes through before it reaches the engine.
fn parse_request(
    tokenizer: &Tokenizer,
    chat: Option<&ChatTemplate>,
    grammars: &Grammars,
    limits: &Limits,
    path: &str,
    body: &[u8],
    id_num: u64,
) -> Result<Job, ApiError> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the request body is not valid UTF-8"))?;
    let value: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let vocab = tokenizer.vocab_size();
    if path == "/v1/completions" {
        api::check_keys(&value, api::COMPLETION_KEYS)?;
        let req: CompletionRequest = serde_json::from_value(value)
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
        let mut v = api::validate_sampling(&req.sampling, None, limits)?;
        v.params.constraint = compile(grammars, api::constraint_spec(&req.sampling)?)?;
        let logprobs = api::check_logprobs(req.logprobs, limits, "logprobs")?;
        let prompts: Vec<Vec<u32>> = match &req.prompt {
            PromptInput::Text(t) => vec![encode(tokenizer, t)?],
            PromptInput::TextBatch(ts) => ts
                .iter()
                .map(|t| encode(tokenizer, t))
                .collect::<Result<_, _>>()?,
            PromptInput::Tokens(ids) => vec![api::token_ids(ids, vocab)?],
            PromptInput::TokenBatch(b) => b
                .iter()
                .map(|ids| api::token_ids(ids, vocab))
                .collect::<Result<_, _>>()?,
        };
        if prompts.is_empty() || prompts.len() > 16 {
            return Err(ApiError::bad_request("prompt must hold 1 to 16 prompts").param("prompt"));
        }
        if prompts.iter().any(|p| p.is_empty()) {
            return Err(ApiError::bad_request("the prompt is empty").param("prompt"));
        }
        if prompts.len() * v.params.n > limits.max_n {
            return Err(
                ApiError::bad_request(format!("prompts × n exceeds {}", limits.max_n)).param("n"),
            );
        }
        let echo = req.echo.unwrap_or(false);
        if echo && logprobs.is_some() {
            v.params.prompt_logprobs = logprobs;
        }
        v.params.logprobs = logprobs;
        let echo_text = if echo {
            prompts.iter().map(|p| tokenizer.decode(p, true)).collect()
        } else {
            Vec::new()
        };
        Ok(Job {
            id: format!("cmpl-{id_num}"),
            created: unix_now(),
            prompts,
            params: v.params,
            stop: v.stop,
            stream: v.stream,
            include_usage: v.include_usage,
            logprobs,
            flavor: Flavor::Completion { echo: echo_text },
        })
    } else {
        api::check_keys(&value, api::CHAT_KEYS)?;
        let req: ChatRequest = serde_json::from_value(value)
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
        let Some(tmpl) = chat else {
            return Err(ApiError::bad_request(
                "this model has no chat template; use /v1/completions",
            ));
        };
        if req.messages.is_empty() {
            return Err(ApiError::bad_request("messages must not be empty").param("messages"));
        }
        let mut v = api::validate_sampling(&req.sampling, req.max_completion_tokens, limits)?;
        if req
            .sampling
            .max_tokens
            .or(req.max_completion_tokens)
            .is_none()
        {
            // A chat answer runs until the model stops or the context is full (the engine
            // bounds every sequence by the context).
            v.params.max_tokens = crate::engine::UNTIL_CONTEXT_END;
        }
        let setup = chat_request::prepare(tmpl, &req, api::constraint_spec(&req.sampling)?)?;
        v.params.constraint = compile(grammars, setup.constraint)?;
        let prompt = encode(tokenizer, &setup.prompt)?;
        let logprobs = if req.logprobs.unwrap_or(false) {
            Some(
                api::check_logprobs(req.top_logprobs.or(Some(0)), limits, "top_logprobs")?
                    .unwrap_or(0),
            )
        } else if req.top_logprobs.is_some() {
            return Err(
                ApiError::bad_request("top_logprobs needs logprobs: true").param("top_logprobs")
            );
        } else {
            None
        };
        v.params.logprobs = logprobs;
        Ok(Job {
            id: format!("chatcmpl-{id_num}"),
            created: unix_now(),
            prompts: vec![prompt],
            params: v.params,
            stop: v.stop,
            stream: v.stream,
            include_usage: v.include_usage,
            logprobs,
            flavor: Flavor::Chat(setup.rules),
        })
    }
}

/// The request's constraint compiled against the vocabulary (400 when it does not compile or
/// exceeds the grammar limits).
fn compile(
    grammars: &Grammars,
    spec: Option<ConstraintSpec>,
) -> Result<Option<Constraint>, ApiError> {
    let Some(spec) = spec else { return Ok(None) };
    grammars
        .compile(&spec)
        .map(Some)
        .map_err(|e| ApiError::bad_request(e).param(spec.kind()))
}

/// Fuzzing entry (not an API): [`parse_request`] with the server's default limits, as the
/// `request_json` fuzz target drives it. `Err` carries the HTTP status of the rejection.
#[doc(hidden)]
pub fn fuzz_parse_request(
    tokenizer: &Tokenizer,
    chat: Option<&ChatTemplate>,
    grammars: &Grammars,
    path: &str,
    body: &[u8],
) -> Result<(), u16> {
    let limits = Limits {
        max_n: 16,
        max_stop: 16,
        max_stop_len: 256,
        max_logprobs: 20,
        default_max_tokens: 16,
    };
    parse_request(tokenizer, chat, grammars, &limits, path, body, 0)
        .map(|_| ())
        .map_err(|e| e.status)
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .encode(text, true)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("prompt"))
}

fn tokenize(ready: &Ready, body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let req: TokenizeRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let text = match (&req.prompt, &req.messages) {
        (Some(p), None) => p.clone(),
        (None, Some(msgs)) => {
            let tmpl = ready
                .chat
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("this model has no chat template"))?;
            let syntax = tools::Syntax::of_template(tmpl.source());
            let tools_json = req.tools.as_deref().map(tools::template_tools);
            tmpl.render_with_tools(
                &chat_request::chat_messages(msgs, syntax)?,
                tools_json.as_ref(),
                req.add_generation_prompt.unwrap_or(true),
            )
            .map_err(|e| ApiError::bad_request(e.to_string()))?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of prompt or messages",
            ))
        }
    };
    let ids = ready
        .tokenizer
        .encode(&text, req.add_special_tokens.unwrap_or(true))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(json!({"count": ids.len(), "max_model_len": ready.engine.limits.context, "tokens": ids}))
}

fn detokenize(ready: &Ready, body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let req: DetokenizeRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let ids = api::token_ids(&req.tokens, ready.tokenizer.vocab_size())?;
    Ok(json!({"prompt": ready.tokenizer.decode(&ids, true)}))
}

/// Binds, loads the model in the background (503 meanwhile), serves until `stop` is set,
/// then drains in-flight requests (bounded by `drain_timeout`).
pub fn serve(
    mut config: ServeConfig,
    stop: Arc<AtomicBool>,
    drain_timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let listener = listener(config.addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.addr))?;
    config.front.max_connections = fd_limit::raise_for(config.front.max_connections);
    log::info!("listening on http://{}", config.addr);
    let addr = config.addr;
    let server = Server::new(config);
    systemd::notify(&["STATUS=loading the model"]);
    let loader = {
        let server = server.clone();
        std::thread::spawn(move || match server.load() {
            Ok(engine_thread) => {
                log::info!("model loaded; ready");
                // Listening since before the load, engine running, /health answers 200 now:
                // only at this point is the service up for systemd (Type=notify).
                if server.is_ready() {
                    let model = server.ready().map(|r| r.model_name.as_str()).unwrap_or("");
                    systemd::notify(&["READY=1", &format!("STATUS=serving {model} on {addr}")]);
                }
                Some(engine_thread)
            }
            Err(e) => {
                log::error!("cannot load the model: {e:#}");
                server.set_load_error(format!("{e:#}"));
                systemd::notify(&[&format!("STATUS=cannot load the model: {e:#}")]);
                None
            }
        })
    };
    let accepting = Arc::new(AtomicBool::new(true));
    let front = front::Front::start(
        listener,
        server.clone(),
        server.config.front.clone(),
        accepting.clone(),
    )
    .map_err(|e| anyhow::anyhow!("cannot start serving: {e}"))?;
    while !stop.load(Ordering::Relaxed) && server.load_error.get().is_none() {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // Draining: /health says 503 and new work is refused while in-flight requests finish.
    server.drain();
    if stop.load(Ordering::Relaxed) {
        log::info!(
            "stopping: draining {} in-flight requests (at most {} s)",
            server.in_flight(),
            drain_timeout.as_secs()
        );
        systemd::notify(&[
            "STOPPING=1",
            &format!("STATUS=draining {} in-flight requests", server.in_flight()),
        ]);
    }
    let t0 = Instant::now();
    while server.in_flight() > 0 && t0.elapsed() < drain_timeout {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let cut_short = server.in_flight();
    accepting.store(false, Ordering::Relaxed);
    front.join();
    // A stop that came while the model was loading waits for the load to end (it cannot be
    // interrupted), then stops the engine it started: only after the join is that certain.
    let engine_thread = loader.join().ok().flatten();
    if let Some(err) = server.load_error.get() {
        anyhow::bail!("cannot load the model: {err}");
    }
    if let Some(ready) = server.ready() {
        ready.engine.shutdown();
    }
    if cut_short > 0 {
        // The drain time is over. The engine would finish every running request before it
        // stops, however long they are: returning instead ends the process now, closing the
        // connections of the requests still in flight.
        log::warn!(
            "drain time ({} s) over: {cut_short} in-flight requests cut short",
            drain_timeout.as_secs()
        );
    } else if let Some(engine_thread) = engine_thread {
        let _ = engine_thread.join();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> (Tokenizer, ChatTemplate, Grammars) {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let chat = ChatTemplate::new(
            tok.chat_template().unwrap(),
            tok.special_text(tok.bos),
            tok.special_text(tok.eos),
        )
        .unwrap();
        let g = Grammars::new(&tok).unwrap();
        (tok, chat, g)
    }

    #[test]
    fn parse_request_accepts_and_rejects() {
        let (tok, chat, g) = reference();
        let p = |path: &str, body: &str| {
            fuzz_parse_request(&tok, Some(&chat), &g, path, body.as_bytes())
        };
        assert_eq!(
            p("/v1/completions", r#"{"prompt":"Hi","max_tokens":3}"#),
            Ok(())
        );
        assert_eq!(
            p(
                "/v1/completions",
                r#"{"prompt":[1,2],"echo":true,"logprobs":2}"#
            ),
            Ok(())
        );
        assert_eq!(
            p(
                "/v1/chat/completions",
                r#"{"messages":[{"role":"user","content":"Hi"}]}"#
            ),
            Ok(())
        );
        assert_eq!(
            p("/v1/completions", r#"{"prompt":"Hi","bogus":1}"#),
            Err(400)
        );
        assert_eq!(p("/v1/completions", r#"{"prompt":[49152]}"#), Err(400));
        assert_eq!(p("/v1/completions", "\u{0}"), Err(400));
        assert_eq!(
            p(
                "/v1/chat/completions",
                r#"{"messages":[{"role":"wizard","content":"x"}]}"#
            ),
            Err(400)
        );
        assert_eq!(p("/v1/chat/completions", r#"{"messages":[]}"#), Err(400));
        let chat = |extra: &str| {
            p(
                "/v1/chat/completions",
                &format!(r#"{{"messages":[{{"role":"user","content":"Hi"}}]{extra}}}"#),
            )
        };
        let lamp = r#""tools":[{"type":"function","function":{"name":"lamp","parameters":{"type":"object","properties":{"on":{"type":"boolean"}}}}}]"#;
        assert_eq!(chat(r#","response_format":{"type":"json_object"}"#), Ok(()));
        assert_eq!(
            chat(&format!(",{lamp},\"tool_choice\":\"required\"")),
            Ok(())
        );
        assert_eq!(
            chat(r#","regex":"[0-9]+","grammar":"start: \"a\"""#),
            Err(400)
        );
        assert_eq!(
            chat(
                r#","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"bogus"}}}"#
            ),
            Err(400)
        );
        assert_eq!(
            chat(&format!(",{lamp},\"tool_choice\":\"sometimes\"")),
            Err(400)
        );
        assert_eq!(
            fuzz_parse_request(
                &tok,
                None,
                &g,
                "/v1/chat/completions",
                br#"{"messages":[{"role":"user","content":"Hi"}]}"#
            ),
            Err(400)
        );
    }
}
