//! Firmware profiles: one TOML file per device class. Every key is optional (defaults below);
//! unknown keys and out-of-range values are errors that name the key and its line.

mod lora;
mod prefix_cache;

pub use lora::LoraSection;
pub use prefix_cache::PrefixCacheSection;

use crate::kv::KvType;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    /// The model served (the first, when `models` names more).
    pub model: ModelSection,
    /// Further models served from the same process, beside `model` (`[[models]]` tables).
    pub models: Vec<ModelSection>,
    pub server: ServerSection,
    pub engine: EngineSection,
    pub images: ImagesSection,
    /// The prefix cache kept on disk across restarts.
    pub prefix_cache: PrefixCacheSection,
    pub log: LogSection,
}

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    pub path: PathBuf,
    /// The name requests select it by (`model` in a request); "": the file's name.
    pub id: String,
    /// What it answers: "generate", "embed", or "auto" (embed when the GGUF has a pooling
    /// type, else generate).
    pub kind: ModelKind,
    /// Beside other models: its share of `engine.kv_memory_mib` (0 < share ≤ 1), or 0 for
    /// the default (see `kv::shares`).
    pub kv_share: f64,
    /// Beside other models: its KV budget in MiB instead of a share; 0: the default.
    pub kv_memory_mib: usize,
    /// Its projector file (llama.cpp's mmproj GGUF), through which it reads images.
    pub mmproj: Option<PathBuf>,
    /// A chat template (Jinja) to use instead of the one the GGUF holds (or for a GGUF that
    /// holds none).
    pub chat_template_file: Option<PathBuf>,
    /// LoRA adapters loaded with it (`[[model.lora]]`), each selected by its name.
    pub lora: Vec<LoraSection>,
}

/// What a served model answers.
#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Embeddings if the GGUF has a pooling type, generation otherwise.
    #[default]
    Auto,
    Generate,
    Embed,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    pub host: String,
    pub port: u16,
    /// Name of the environment variable holding the API key ("" for none).
    pub api_key_env: String,
    pub max_queue: usize,
    pub body_limit_kib: usize,
    pub drain_seconds: u64,
    /// A new request that would wait longer than this many seconds before its prompt starts
    /// (the requests not yet started, at the recent time between first tokens) gets 429; 0:
    /// only max_queue bounds the queue.
    pub max_queue_wait_s: f64,
    /// Seconds from accepting a connection (or from the first byte of a further request on a
    /// kept-alive one) to the end of its request head; then it is closed.
    pub header_timeout_s: f64,
    /// Seconds from the end of a request head to the end of its body.
    pub body_timeout_s: f64,
    /// Seconds a kept-alive connection may wait for its next request, and a response may wait
    /// for the client to read it.
    pub idle_timeout_s: f64,
    /// Connections held open at once (reading a request, kept alive or refused); a connection
    /// beyond is closed at once (a minimal 503).
    pub max_connections: usize,
    /// Generation requests a second one client address may send (token bucket); 0: off.
    pub client_rate_per_s: f64,
    /// The bucket's size: requests a client may send at once after a pause.
    pub client_burst: f64,
    /// Refusals (429, 401, 404, ...) the server answers a second at most; the rest wait their
    /// turn, so that a flood of them takes a bounded share of the CPU; 0: no bound.
    pub max_rejections_per_s: f64,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}` (in memory,
    /// least recently used first out); 0: none are kept.
    pub response_store_count: usize,
    /// The most memory those kept responses take, in MiB.
    pub response_store_mib: usize,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    pub backend: String,
    /// 0: all available cores.
    pub threads: usize,
    pub kv_type: KvType,
    pub kv_memory_mib: usize,
    pub block_size: usize,
    pub max_seqs: usize,
    pub max_batched_tokens: usize,
    /// MiB of RAM to leave free for the OS (and the GPU on unified-memory boards); 0: no check.
    pub reserve_mib: usize,
    /// CUDA: MiB of device memory the KV pool leaves free (the pool takes all the rest, in one
    /// allocation at start-up; `kv_memory_mib` sizes the CPU's pool only).
    pub gpu_reserve_mib: usize,
    /// While streams decode, a step that also prefills may take at most this many times a
    /// decode-only step (bounds their inter-token latency during long prompts); 0: off.
    pub prefill_pacing: f64,
    /// Prompt lookup: draft tokens a decode step may verify for requests that ask for it
    /// (`"prompt_lookup": true`); 0: off.
    pub prompt_lookup: usize,
    /// A hybrid model's prefix cache: MiB of recurrent-state snapshots kept beside the pool
    /// (what lets a cached prompt resume); 0: no prefix caching for hybrids.
    pub state_snapshot_mib: usize,
}

/// Where a request's images may come from besides `data:` URLs. By default nowhere: an
/// appliance does not reach out on a client's behalf.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct ImagesSection {
    /// Hosts (`name` or `name:port`, as the URL writes them) whose `http://` image URLs a
    /// request may name; empty: remote URLs are refused.
    pub fetch_hosts: Vec<String>,
    /// The largest image a fetch may bring, in KiB.
    pub fetch_max_kib: usize,
    /// Seconds a fetch may take, connecting included.
    pub fetch_timeout_s: f64,
    /// A folder whose files (and its subfolders') a request may name as `file://` URLs; empty:
    /// none.
    pub folder: PathBuf,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    pub level: String,
}

/// Where `packaging/fetch-model.sh` puts the reference model, relative to the checkout.
pub const DEFAULT_MODEL_PATH: &str = "models/SmolLM2-135M-Instruct.Q4_1.gguf";

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: PathBuf::from(DEFAULT_MODEL_PATH),
            id: String::new(),
            kind: ModelKind::Auto,
            kv_share: 0.0,
            kv_memory_mib: 0,
            mmproj: None,
            chat_template_file: None,
            lora: Vec::new(),
        }
    }
}

/// The one message for a model file that is not there: where a relative path was looked up,
/// and how to get the reference model.
pub fn missing_model(path: &Path) -> String {
    let from = if path.is_relative() {
        std::env::current_dir()
            .map(|d| format!(" (looked up from {})", d.display()))
            .unwrap_or_default()
    } else {
        String::new()
    };
    format!(
        "model {} does not exist{from}: run packaging/fetch-model.sh in the edgelm checkout \
         (it downloads the reference model to {DEFAULT_MODEL_PATH}), or pass --model FILE",
        path.display()
    )
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key_env: "EDGELM_API_KEY".into(),
            max_queue: 64,
            body_limit_kib: 1024,
            drain_seconds: 30,
            max_queue_wait_s: 5.0,
            header_timeout_s: 10.0,
            body_timeout_s: 30.0,
            idle_timeout_s: 60.0,
            max_connections: 3072,
            client_rate_per_s: 0.0,
            client_burst: 20.0,
            max_rejections_per_s: 150.0,
            response_store_count: 1024,
            response_store_mib: 64,
        }
    }
}

impl Default for EngineSection {
    fn default() -> Self {
        EngineSection {
            backend: "cpu".into(),
            threads: 0,
            kv_type: KvType::F16,
            kv_memory_mib: 256,
            block_size: 16,
            max_seqs: 16,
            max_batched_tokens: 512,
            reserve_mib: 0,
            gpu_reserve_mib: crate::engine::DEFAULT_GPU_RESERVE_MIB,
            prefill_pacing: crate::engine::DEFAULT_PREFILL_PACING,
            prompt_lookup: 0,
            state_snapshot_mib: crate::engine::DEFAULT_STATE_SNAPSHOT_MIB,
        }
    }
}

impl Default for ImagesSection {
    fn default() -> Self {
        ImagesSection {
            fetch_hosts: Vec::new(),
            fetch_max_kib: 20 * 1024,
            fetch_timeout_s: 5.0,
            folder: PathBuf::new(),
        }
    }
}

impl ImagesSection {
    /// Hosts that name a host, a fetch size and time that bound something.
    fn check(&self) -> Check {
        let host_ok = |h: &String| {
            !h.is_empty()
                && h.parse::<http::uri::Authority>()
                    .is_ok_and(|a| a.as_str() == h && !h.contains('@'))
        };
        if let Some(h) = self.fetch_hosts.iter().find(|h| !host_ok(h)) {
            return bad(
                "images.fetch_hosts",
                format!("{h:?} is not a host (name or name:port, no scheme, path or user)"),
            );
        }
        if !(1..=MAX_IMAGE_FETCH_KIB).contains(&self.fetch_max_kib) {
            return bad(
                "images.fetch_max_kib",
                format!("must be 1 to {MAX_IMAGE_FETCH_KIB}"),
            );
        }
        if !(0.1..=600.0).contains(&self.fetch_timeout_s) {
            return bad("images.fetch_timeout_s", "must be 0.1 to 600");
        }
        Ok(())
    }
}

/// The largest image a fetch may bring (256 MiB): far above any photograph's file.
const MAX_IMAGE_FETCH_KIB: usize = 256 * 1024;

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: "info".into(),
        }
    }
}

/// A profile check's answer: the first out-of-range value, as (`section.key`, why).
type Check = Result<(), (&'static str, String)>;

fn bad(key: &'static str, why: impl Into<String>) -> Check {
    Err((key, why.into()))
}

impl ServerSection {
    /// Where the server listens and who may call it.
    fn check_address(&self) -> Check {
        if self.host.trim().is_empty() {
            return bad("server.host", "must not be empty");
        }
        if self.host.parse::<std::net::IpAddr>().is_err() && !is_hostname(&self.host) {
            return bad(
                "server.host",
                format!("{:?} is neither an IP address nor a host name", self.host),
            );
        }
        if self.port == 0 {
            return bad("server.port", "must be 1 to 65535");
        }
        if !self.api_key_env.is_empty() && !is_env_name(&self.api_key_env) {
            return bad(
                "server.api_key_env",
                format!(
                    "{:?} is not an environment variable name (letters, digits and _, not \
                     starting with a digit; \"\" for no API key)",
                    self.api_key_env
                ),
            );
        }
        Ok(())
    }

    /// The queue, body, drain, timeout, connection and rate bounds.
    fn check_limits(&self) -> Check {
        if !(0.0..=3600.0).contains(&self.max_queue_wait_s) {
            return bad("server.max_queue_wait_s", "must be 0 (off) to 3600 seconds");
        }
        if self.max_queue > MAX_QUEUE {
            return bad("server.max_queue", format!("must be 0 to {MAX_QUEUE}"));
        }
        if !(1..=MAX_BODY_KIB).contains(&self.body_limit_kib) {
            return bad(
                "server.body_limit_kib",
                format!("must be 1 to {MAX_BODY_KIB}"),
            );
        }
        if self.drain_seconds > MAX_DRAIN_SECONDS {
            return bad(
                "server.drain_seconds",
                format!(
                    "must be 0 to {MAX_DRAIN_SECONDS} (edgelm.service stops the server after \
                     TimeoutStopSec=45s; raise both together)"
                ),
            );
        }
        for (key, v) in [
            ("server.header_timeout_s", self.header_timeout_s),
            ("server.body_timeout_s", self.body_timeout_s),
            ("server.idle_timeout_s", self.idle_timeout_s),
        ] {
            if !(0.1..=3600.0).contains(&v) {
                return bad(key, "must be 0.1 to 3600 seconds");
            }
        }
        if !(1..=MAX_CONNECTIONS).contains(&self.max_connections) {
            return bad(
                "server.max_connections",
                format!("must be 1 to {MAX_CONNECTIONS}"),
            );
        }
        if !(0.0..=1e6).contains(&self.client_rate_per_s) {
            return bad("server.client_rate_per_s", "must be 0 (off) to 1000000");
        }
        if !(1.0..=1e6).contains(&self.client_burst) {
            return bad("server.client_burst", "must be 1 to 1000000");
        }
        if !(0.0..=1e7).contains(&self.max_rejections_per_s) {
            return bad(
                "server.max_rejections_per_s",
                "must be 0 (no bound) to 10000000",
            );
        }
        if self.response_store_count > MAX_STORED_RESPONSES {
            return bad(
                "server.response_store_count",
                format!("must be 0 (keep none) to {MAX_STORED_RESPONSES}"),
            );
        }
        if !(1..=MAX_RESPONSE_STORE_MIB).contains(&self.response_store_mib) {
            return bad(
                "server.response_store_mib",
                format!("must be 1 to {MAX_RESPONSE_STORE_MIB}"),
            );
        }
        Ok(())
    }
}

impl EngineSection {
    /// The backend, threads, memory, KV, batch, pacing and prompt-lookup bounds.
    fn check(&self) -> Check {
        if !matches!(self.backend.as_str(), "cpu" | "cuda" | "auto") {
            return bad("engine.backend", "must be \"cpu\", \"cuda\" or \"auto\"");
        }
        if self.threads > MAX_THREADS {
            return bad(
                "engine.threads",
                format!("must be 0 (all cores) to {MAX_THREADS}"),
            );
        }
        if !(1..=MAX_MIB).contains(&self.kv_memory_mib) {
            return bad("engine.kv_memory_mib", format!("must be 1 to {MAX_MIB}"));
        }
        if self.state_snapshot_mib > MAX_MIB {
            return bad(
                "engine.state_snapshot_mib",
                format!("must be 0 to {MAX_MIB}"),
            );
        }
        if self.reserve_mib > MAX_MIB {
            return bad("engine.reserve_mib", format!("must be 0 to {MAX_MIB}"));
        }
        if self.gpu_reserve_mib > MAX_MIB {
            return bad("engine.gpu_reserve_mib", format!("must be 0 to {MAX_MIB}"));
        }
        if !self.block_size.is_power_of_two() || self.block_size > MAX_BLOCK_SIZE {
            return bad(
                "engine.block_size",
                format!("must be a power of two from 1 to {MAX_BLOCK_SIZE} tokens"),
            );
        }
        if !(1..=MAX_SEQS).contains(&self.max_seqs) {
            return bad("engine.max_seqs", format!("must be 1 to {MAX_SEQS}"));
        }
        if !(1..=MAX_BATCHED_TOKENS).contains(&self.max_batched_tokens) {
            return bad(
                "engine.max_batched_tokens",
                format!("must be 1 to {MAX_BATCHED_TOKENS}"),
            );
        }
        if !(self.prefill_pacing == 0.0 || (1.0..=100.0).contains(&self.prefill_pacing)) {
            return bad("engine.prefill_pacing", "must be 0 (off) or 1 to 100");
        }
        if self.prompt_lookup > MAX_PROMPT_LOOKUP {
            return bad(
                "engine.prompt_lookup",
                format!("must be 0 (off) to {MAX_PROMPT_LOOKUP}"),
            );
        }
        if self.max_batched_tokens < self.max_seqs {
            return bad(
                "engine.max_batched_tokens",
                format!(
                    "must be at least engine.max_seqs ({}): every running sequence decodes one \
                     token per step",
                    self.max_seqs
                ),
            );
        }
        Ok(())
    }
}

impl ModelSection {
    /// A model section's values; `table` is `model` or `models` (for the key names).
    fn check(&self, table: &'static str) -> Check {
        let key = |k: [&'static str; 2]| if table == "model" { k[0] } else { k[1] };
        if self.path.as_os_str().is_empty() {
            return bad(key(["model.path", "models.path"]), "must not be empty");
        }
        if !(self.kv_share >= 0.0 && self.kv_share <= 1.0) {
            return bad(
                key(["model.kv_share", "models.kv_share"]),
                "must be 0 (the default) to 1",
            );
        }
        if self.kv_share > 0.0 && self.kv_memory_mib > 0 {
            let why = "give kv_share or kv_memory_mib, not both";
            return bad(key(["model.kv_memory_mib", "models.kv_memory_mib"]), why);
        }
        if self.kv_memory_mib > MAX_MIB {
            let why = format!("must be 0 (the default) to {MAX_MIB}");
            return bad(key(["model.kv_memory_mib", "models.kv_memory_mib"]), why);
        }
        Ok(())
    }

    /// Whether the model serves embeddings only (else generation), given whether its GGUF
    /// has a pooling type; an embedding kind without one is an error.
    pub fn embeds(&self, has_pooling: bool) -> anyhow::Result<bool> {
        match self.kind {
            ModelKind::Auto => Ok(has_pooling),
            ModelKind::Generate => Ok(false),
            ModelKind::Embed if has_pooling => Ok(true),
            ModelKind::Embed => anyhow::bail!(
                "model {}: kind is embed, but its GGUF has no pooling type (pooling_type)",
                self.served_id()
            ),
        }
    }

    /// The id requests select the model by: `id`, else the file's name.
    pub fn served_id(&self) -> String {
        if !self.id.is_empty() {
            return self.id.clone();
        }
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    }
}

impl Profile {
    /// Every model the profile serves, the first one first.
    /// The served model `id` (or, with none, the only one), for a flag that gives one model
    /// a file (`--mmproj [ID=]PATH`): `flag` names it in errors.
    pub fn served_section(
        &mut self,
        flag: &str,
        id: Option<&str>,
    ) -> anyhow::Result<&mut ModelSection> {
        let several = !self.models.is_empty();
        let mut sections = std::iter::once(&mut self.model).chain(&mut self.models);
        match id {
            Some(id) => sections
                .find(|m| m.served_id() == id)
                .ok_or_else(|| anyhow::anyhow!("{flag}: no served model is called {id}")),
            None if several => anyhow::bail!(
                "{flag}: several models are served; write ID=PATH to name the one it belongs to"
            ),
            None => Ok(sections.next().expect("one model")),
        }
    }

    pub fn served_models(&self) -> Vec<ModelSection> {
        std::iter::once(&self.model)
            .chain(&self.models)
            .cloned()
            .collect()
    }

    pub fn load(path: &Path) -> anyhow::Result<Profile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read profile {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and validates; errors name the key (`section.key`) and the line.
    pub fn parse(text: &str) -> Result<Profile, String> {
        let profile: Profile = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        profile
            .check()
            .map_err(|(key, why)| format!("{key}{}: {why}", line_suffix(text, key)))?;
        Ok(profile)
    }

    /// Validates values set after parsing (command-line overrides); errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        self.check().map_err(|(key, why)| format!("{key}: {why}"))
    }

    /// The first out-of-range value, as (`section.key`, why).
    fn check(&self) -> Check {
        self.model.check("model")?;
        let mut ids = vec![self.model.served_id()];
        for m in &self.models {
            m.check("models")?;
            let id = m.served_id();
            if ids.contains(&id) {
                let why = format!("two models have the id {id:?}: give each its own `id`");
                return bad("models.id", why);
            }
            ids.push(id);
        }
        self.check_adapters(ids)?;
        self.server.check_address()?;
        self.server.check_limits()?;
        self.engine.check()?;
        self.images.check()?;
        self.prefix_cache.check()?;
        if !matches!(
            self.log.level.as_str(),
            "error" | "warn" | "info" | "debug" | "trace"
        ) {
            return bad("log.level", "must be error, warn, info, debug or trace");
        }
        Ok(())
    }

    /// Each adapter's values, and a name no model or other adapter has (a request's `model`
    /// selects among them all); `ids` are the models'.
    fn check_adapters(&self, mut ids: Vec<String>) -> Check {
        let sections = std::iter::once((&self.model, "model.lora"))
            .chain(self.models.iter().map(|m| (m, "models.lora")));
        for (m, key) in sections {
            for l in &m.lora {
                l.check().or_else(|why| bad(key, why))?;
                let name = l.served_name();
                if ids.contains(&name) {
                    let why =
                        format!("the name {name:?} is taken: give the adapter its own `name`");
                    return bad(key, why);
                }
                ids.push(name);
            }
        }
        Ok(())
    }

    /// Start-up memory check: the model file, the KV pool and `engine.reserve_mib` (left free
    /// for the OS and, on unified-memory boards, the GPU) must fit in `total_bytes` of RAM.
    /// A `reserve_mib` of 0 turns the check off.
    pub fn check_memory(&self, model_bytes: u64, total_bytes: u64) -> Result<(), String> {
        let e = &self.engine;
        if e.reserve_mib == 0 {
            return Ok(());
        }
        let mib = |b: u64| b.div_ceil(1 << 20);
        let need = mib(model_bytes) + e.kv_memory_mib as u64 + e.reserve_mib as u64;
        if need > mib(total_bytes) {
            return Err(format!(
                "engine.reserve_mib: model ({} MiB) + engine.kv_memory_mib ({}) + \
                 engine.reserve_mib ({}) = {need} MiB exceeds this machine's {} MiB of RAM; \
                 lower kv_memory_mib or use a smaller model",
                mib(model_bytes),
                e.kv_memory_mib,
                e.reserve_mib,
                mib(total_bytes)
            ));
        }
        Ok(())
    }
}

const MAX_THREADS: usize = 1024;
const MAX_MIB: usize = 1 << 20;
const MAX_BLOCK_SIZE: usize = 256;
const MAX_SEQS: usize = 1024;
const MAX_BATCHED_TOKENS: usize = 65_536;
/// Beyond a few dozen draft tokens a wrong guess only wastes the step.
const MAX_PROMPT_LOOKUP: usize = 32;
const MAX_QUEUE: usize = 100_000;
const MAX_BODY_KIB: usize = 1 << 20;
const MAX_DRAIN_SECONDS: u64 = 600;
const MAX_CONNECTIONS: usize = 1_000_000;
const MAX_STORED_RESPONSES: usize = 1_000_000;
const MAX_RESPONSE_STORE_MIB: usize = 1 << 16;

fn is_env_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn is_hostname(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// Strips a `# comment` (outside quotes is good enough for keys and headers).
fn code(line: &str) -> &str {
    line.split('#').next().unwrap_or("").trim()
}

/// `[section]` on this line, if it is a table header.
fn header(line: &str) -> Option<&str> {
    let l = code(line);
    l.strip_prefix('[')?.strip_suffix(']').map(str::trim)
}

/// The bare key this line assigns (`key = ...`), if any.
fn assigned_key(line: &str) -> Option<&str> {
    let (k, _) = code(line).split_once('=')?;
    let k = k.trim().trim_matches('"');
    (!k.is_empty()).then_some(k)
}

/// " (line N)" for `section.key`: the line that sets it under `[section]` (or as a dotted
/// key at the top level); empty if the text does not show where.
fn line_suffix(text: &str, dotted: &str) -> String {
    let (section, key) = dotted.split_once('.').unwrap_or(("", dotted));
    let mut current = "";
    for (i, line) in text.lines().enumerate() {
        if let Some(h) = header(line) {
            current = h;
            continue;
        }
        let Some(k) = assigned_key(line) else {
            continue;
        };
        if (current == section && k == key) || (current.is_empty() && k == dotted) {
            return format!(" (line {})", i + 1);
        }
    }
    String::new()
}

/// A TOML parse or type error as one line, led by the `section.key` it is about when the
/// error's position is on a `key = value` line or a `[section]` header.
fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = one_line(e.message());
    let Some(span) = e.span() else {
        return one_line(&e.to_string());
    };
    let start = span.start.min(text.len());
    let line_no = text[..start].matches('\n').count() + 1;
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let column = text[line_start..start].chars().count() + 1;
    let line = text[line_start..].lines().next().unwrap_or("");
    let section = text[..line_start]
        .lines()
        .rev()
        .find_map(header)
        .unwrap_or("");
    let key = match (header(line), assigned_key(line)) {
        (Some(h), _) => Some(h.to_string()),
        (None, Some(k)) if section.is_empty() => Some(k.to_string()),
        (None, Some(k)) => Some(format!("{section}.{k}")),
        (None, None) => None,
    };
    match key {
        Some(k) => format!("{k} (line {line_no}, column {column}): {msg}"),
        None => format!("line {line_no}, column {column}: {msg}: {:?}", line.trim()),
    }
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "|")
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors_name_the_key() {
        let p = Profile::parse("").unwrap();
        assert_eq!(p.server.port, 8080);
        let err = Profile::parse("[engine]\nmax_seqs = 0\n").unwrap_err();
        assert!(
            err.contains("engine.max_seqs") && err.contains("line 2"),
            "{err}"
        );
        let err = Profile::parse("[engine]\nkv_typo = 1\n").unwrap_err();
        assert!(err.contains("kv_typo") && err.contains("line 2"), "{err}");
        let err = Profile::parse("[engine]\nkv_type = \"q3\"\n").unwrap_err();
        assert!(err.contains("q3"), "{err}");
    }

    #[test]
    fn image_hosts_are_hosts_and_fetches_are_bounded() {
        let p = Profile::parse("[images]\nfetch_hosts = [\"camera.local\", \"10.0.0.7:8080\"]\n");
        assert_eq!(p.unwrap().images.fetch_hosts.len(), 2);
        for host in ["http://camera.local", "camera.local/x", "user@camera", ""] {
            let text = format!("[images]\nfetch_hosts = [{host:?}]\n");
            let err = Profile::parse(&text).unwrap_err();
            assert!(
                err.starts_with("images.fetch_hosts (line 2)"),
                "{host}: {err}"
            );
        }
        let err = Profile::parse("[images]\nfetch_timeout_s = 0\n").unwrap_err();
        assert!(err.starts_with("images.fetch_timeout_s"), "{err}");
    }

    #[test]
    fn lines_are_found_in_the_right_section() {
        // The key is looked up under its own section header.
        let text = "[model]\npath = \"m.gguf\"\n\n[engine]\nthreads = 5000\n";
        let err = Profile::parse(text).unwrap_err();
        assert!(err.starts_with("engine.threads (line 5)"), "{err}");
        let err =
            Profile::parse("[engine]\nblock_size = 16\n\n[server]\nport = \"x\"\n").unwrap_err();
        assert!(err.starts_with("server.port (line 5, column 8)"), "{err}");
        let err = Profile::parse("[engine]\nthreads = 1\nthreads = 2\n").unwrap_err();
        assert!(err.starts_with("engine.threads (line 3"), "{err}");
        let err = Profile::parse("[engine\n").unwrap_err();
        assert!(err.starts_with("line 1, column"), "{err}");
        let err = Profile::parse("engine.max_seqs = 0\n").unwrap_err();
        assert!(err.starts_with("engine.max_seqs (line 1)"), "{err}");
    }

    #[test]
    fn several_models_with_ids_kinds_and_shares() {
        let text = "[model]\npath = \"chat.gguf\"\n\n[[models]]\npath = \"dir/minilm.gguf\"\n\
                    kind = \"embed\"\nkv_memory_mib = 16\n\n[[models]]\npath = \"other.gguf\"\n\
                    id = \"small\"\nkv_share = 0.25\n";
        let p = Profile::parse(text).unwrap();
        let served = p.served_models();
        let ids: Vec<String> = served.iter().map(|m| m.served_id()).collect();
        assert_eq!(ids, ["chat.gguf", "minilm.gguf", "small"]);
        assert_eq!(served[1].kind, ModelKind::Embed);
        assert_eq!((served[1].kv_memory_mib, served[2].kv_share), (16, 0.25));
        assert!(served[1].embeds(true).unwrap());
        assert!(
            served[1].embeds(false).is_err(),
            "embed needs a pooling type"
        );
        assert!(!served[0].embeds(false).unwrap() && served[0].embeds(true).unwrap());
        let e = Profile::parse("[[models]]\npath = \"x.gguf\"\nkind = \"rerank\"\n").unwrap_err();
        assert!(e.contains("kind") || e.contains("rerank"), "{e}");
    }

    #[test]
    fn value_checks() {
        for (text, key) in [
            ("[engine]\nblock_size = 24\n", "engine.block_size"),
            ("[engine]\nblock_size = 512\n", "engine.block_size"),
            (
                "[engine]\nmax_seqs = 64\nmax_batched_tokens = 32\n",
                "engine.max_batched_tokens",
            ),
            ("[server]\napi_key_env = \"MY-KEY\"\n", "server.api_key_env"),
            ("[server]\nhost = \"my host\"\n", "server.host"),
            ("[server]\ndrain_seconds = 601\n", "server.drain_seconds"),
            ("[model]\npath = \"\"\n", "model.path"),
            ("[model]\nkv_share = 1.5\n", "model.kv_share"),
            (
                "[[models]]\npath = \"e.gguf\"\nkv_share = 0.2\nkv_memory_mib = 8\n",
                "models.kv_memory_mib",
            ),
            (
                "[model]\npath = \"a/m.gguf\"\n[[models]]\npath = \"b/m.gguf\"\n",
                "models.id",
            ),
            (
                "[server]\nheader_timeout_s = 0\n",
                "server.header_timeout_s",
            ),
            ("[server]\nidle_timeout_s = 5000\n", "server.idle_timeout_s"),
            ("[server]\nmax_connections = 0\n", "server.max_connections"),
            (
                "[server]\nclient_rate_per_s = -1\n",
                "server.client_rate_per_s",
            ),
            ("[server]\nclient_burst = 0.5\n", "server.client_burst"),
            (
                "[server]\nmax_rejections_per_s = -2\n",
                "server.max_rejections_per_s",
            ),
        ] {
            let err = Profile::parse(text).unwrap_err();
            assert!(err.starts_with(key), "{text}: {err}");
        }
        for host in ["0.0.0.0", "::", "localhost", "edge-box.lan"] {
            let text = format!("[server]\nhost = \"{host}\"\n");
            assert!(Profile::parse(&text).is_ok(), "{host}");
        }
        let mut p = Profile::default();
        p.server.port = 0;
        assert_eq!(p.validate().unwrap_err(), "server.port: must be 1 to 65535");
    }

    #[test]
    fn memory_reserve() {
        let mut p = Profile::default();
        let gib = 1u64 << 30;
        assert!(
            p.check_memory(100 * gib, gib).is_ok(),
            "0 disables the check"
        );
        p.engine.reserve_mib = 1024;
        p.engine.kv_memory_mib = 1024;
        assert!(p.check_memory(gib, 4 * gib).is_ok());
        let err = p.check_memory(3 * gib, 4 * gib).unwrap_err();
        assert!(err.starts_with("engine.reserve_mib"), "{err}");
    }
}
