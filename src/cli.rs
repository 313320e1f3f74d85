//! Command-line flags (clap) for every subcommand.

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand};
use edgelm::backend::select::Requested;
use edgelm::config::LoraSection;
use edgelm::kv::KvType;
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "edgelm",
    version,
    about = "LLM inference appliance for edge boxes"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Print a GGUF model's architecture, hyper-parameters, tokenizer and tensor summary.
    Inspect(InspectArgs),
    /// Print the token ids of TEXT as a JSON array.
    Tokenize(TokenizeArgs),
    /// Generate text from a prompt; only the generated text goes to stdout.
    Run(RunArgs),
    /// Perplexity of a text file, computed the way llama-perplexity does.
    Perplexity(PerplexityArgs),
    /// KV sizing for a model: bytes per token, blocks, and how many sequences fit.
    KvPlan(KvPlanArgs),
    /// Throughput benchmark: prefill, decode, and aggregate decode at several concurrencies.
    Bench(BenchArgs),
    /// Drive a running OpenAI-compatible server (edgelm or another) with a seeded workload and
    /// report throughput, TTFT, inter-token latency and errors.
    Loadgen(crate::commands::loadgen::LoadgenArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(ServeArgs),
    /// Firmware profiles: `edgelm config check FILE...`.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Validate firmware profiles (same as `config check`).
    #[command(name = "config-check", alias = "check-config")]
    ConfigCheck(ConfigCheckArgs),
    /// Field diagnostics: CPU, memory, disk, GPU, Jetson, model, profile, KV plan, port and a
    /// short generation; exit 1 when any check fails.
    Doctor(DoctorArgs),
}

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// Firmware profile (TOML) [default: /etc/edgelm/profile.toml when present].
    #[arg(short = 'c', long)]
    pub config: Option<PathBuf>,
    /// GGUF model to check [default: the profile's model.path].
    #[arg(short = 'm', long = "model")]
    pub model: Option<PathBuf>,
    /// Print one JSON object instead of the text report.
    #[arg(long)]
    pub json: bool,
    /// Also write a support bundle (report, redacted profile, logs, metrics, version).
    #[arg(long, value_name = "OUT.tar.gz")]
    pub bundle: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub enum ConfigCommand {
    /// Validate firmware profiles: every error names the key and its line; exit 1 on any.
    Check(ConfigCheckArgs),
}

#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Firmware profile (TOML); flags given here override its values.
    #[arg(short = 'c', long)]
    pub config: Option<PathBuf>,
    /// Path to the GGUF model [profile: model.path, default
    /// models/SmolLM2-135M-Instruct.Q4_1.gguf, which packaging/fetch-model.sh downloads].
    /// Repeat it to serve several models from one process (`[[models]]` in a profile); write
    /// ID=PATH to give a model the id requests select it by (default: the file's name).
    #[arg(short = 'm', long = "model", value_name = "[ID=]PATH")]
    pub model: Vec<String>,
    /// A projector file (llama.cpp's mmproj GGUF) through which the model reads images
    /// [profile: model.mmproj]. With several models, write ID=PATH for the one it belongs to.
    #[arg(long = "mmproj", value_name = "[ID=]PATH")]
    pub mmproj: Vec<String>,
    /// A chat template (Jinja) for the model, instead of the one its GGUF holds or for one
    /// that holds none [profile: model.chat_template_file]. With several models, ID=PATH.
    #[arg(long = "chat-template-file", value_name = "[ID=]PATH")]
    pub chat_template_file: Vec<String>,
    /// A LoRA adapter (llama.cpp's GGUF format) for the model, selected by requests whose
    /// `model` is NAME (default: the file's stem); SCALE multiplies its updates (default 1).
    /// Repeat it for several [profile: [[model.lora]]].
    #[arg(long = "lora", value_name = "[NAME=]PATH[:SCALE]", value_parser = LoraSection::parse)]
    pub lora: Vec<LoraSection>,
    /// Where each model's prefix cache is kept across restarts (default: under systemd's
    /// $STATE_DIRECTORY, else not kept) [profile: prefix_cache.dir].
    #[arg(long = "prefix-cache-dir", value_name = "DIR")]
    pub prefix_cache_dir: Option<std::path::PathBuf>,
    /// [profile: server.host, default 127.0.0.1]
    #[arg(long)]
    pub host: Option<String>,
    /// [profile: server.port, default 8080]
    #[arg(long)]
    pub port: Option<u16>,
    /// Require `Authorization: Bearer <key>` (default: the variable server.api_key_env names).
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Worker threads [profile: engine.threads; default all cores].
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// KV page format [profile: engine.kv_type].
    #[arg(long = "kv-type")]
    pub kv_type: Option<KvType>,
    /// KV pool size in MiB [profile: engine.kv_memory_mib].
    #[arg(long = "kv-memory-mib")]
    pub kv_memory_mib: Option<usize>,
    /// Running sequences at most [profile: engine.max_seqs].
    #[arg(long = "max-seqs")]
    pub max_seqs: Option<usize>,
    /// While streams decode, a step carrying prefill may take at most this many times a
    /// decode-only step; 0: off [profile: engine.prefill_pacing].
    #[arg(long = "prefill-pacing")]
    pub prefill_pacing: Option<f64>,
    /// Prompt lookup: draft tokens a decode step may verify for requests with
    /// `"prompt_lookup": true`; 0: off [profile: engine.prompt_lookup].
    #[arg(long = "prompt-lookup")]
    pub prompt_lookup: Option<usize>,
    /// A hybrid model's prefix cache: MiB of recurrent-state snapshots; 0: off
    /// [profile: engine.state_snapshot_mib].
    #[arg(long = "state-snapshot-mib")]
    pub state_snapshot_mib: Option<usize>,
    /// Seconds a new request may expect to wait before its prompt starts (behind the requests
    /// not yet started) before it gets 429 instead; 0: no bound [profile: server.max_queue_wait_s].
    #[arg(long = "max-queue-wait")]
    pub max_queue_wait: Option<f64>,
    /// Requests that may wait beyond the running batch before new ones get 429 [profile: server.max_queue].
    #[arg(long = "max-queue")]
    pub max_queue: Option<usize>,
    /// Seconds a connection has to send its request head [profile: server.header_timeout_s].
    #[arg(long = "header-timeout")]
    pub header_timeout: Option<f64>,
    /// Connections held open at once; beyond, closed at accept [profile: server.max_connections].
    #[arg(long = "max-connections")]
    pub max_connections: Option<usize>,
    /// Generation requests a second per client address; 0: off [profile: server.client_rate_per_s].
    #[arg(long = "client-rate")]
    pub client_rate: Option<f64>,
    /// Requests a client may send at once [profile: server.client_burst].
    #[arg(long = "client-burst")]
    pub client_burst: Option<f64>,
    /// Seconds to let in-flight requests finish after SIGTERM [profile: server.drain_seconds].
    #[arg(long = "drain-seconds")]
    pub drain_seconds: Option<u64>,
}

#[derive(Args, Debug)]
pub struct ConfigCheckArgs {
    /// Profile files to validate.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
}

#[derive(Args, Debug)]
pub struct KvPlanArgs {
    /// Path to the GGUF model; repeat it (`[ID=]PATH`) for the models one `serve` holds
    /// together, which share the pool as `serve` divides it.
    #[arg(short = 'm', long = "model", value_name = "[ID=]PATH", required = true)]
    pub model: Vec<String>,
    /// A model's projector file (llama.cpp's mmproj GGUF): what its images take. With several
    /// models, write ID=PATH for the one it belongs to.
    #[arg(long = "mmproj", value_name = "[ID=]PATH")]
    pub mmproj: Vec<String>,
    /// A LoRA adapter of the (first) model: the memory it takes beside the pool. Repeat it
    /// for several.
    #[arg(long = "lora", value_name = "[NAME=]PATH[:SCALE]", value_parser = LoraSection::parse)]
    pub lora: Vec<LoraSection>,
    /// The folder `serve` keeps prefix caches in (`--prefix-cache-dir`): what a start would
    /// restore from it for each model.
    #[arg(long = "prefix-cache-dir", value_name = "DIR")]
    pub prefix_cache_dir: Option<std::path::PathBuf>,
    /// Context length each sequence could reach.
    #[arg(long, default_value_t = 8192)]
    pub ctx: usize,
    /// Average tokens a sequence actually holds.
    #[arg(long = "avg-tokens", default_value_t = 512)]
    pub avg_tokens: usize,
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
    /// KV memory budget in MiB.
    #[arg(long = "memory-mib", default_value_t = 1024)]
    pub memory_mib: usize,
    #[arg(long = "block-size", default_value_t = 16)]
    pub block_size: usize,
    /// A hybrid model's prefix cache: MiB of recurrent-state snapshots.
    #[arg(long = "state-snapshot-mib", default_value_t = edgelm::engine::DEFAULT_STATE_SNAPSHOT_MIB)]
    pub state_snapshot_mib: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// LoRA adapters: the concurrency tests spread their streams over the base model and
    /// these in turn (the first stream the base, the next the first adapter, ...).
    #[arg(long = "lora", value_name = "[NAME=]PATH[:SCALE]", value_parser = LoraSection::parse)]
    pub lora: Vec<LoraSection>,
    /// Prompt tokens for the prefill test.
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens per sequence for the decode tests.
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Concurrency levels for aggregate decode (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub concurrency: Vec<usize>,
    /// Prompt tokens per sequence in the concurrency tests.
    #[arg(long = "concurrency-prompt", default_value_t = 128)]
    pub concurrency_prompt: usize,
    /// Shared system-prompt tokens for the prefix-cache test (0 skips it).
    #[arg(long = "shared-prefix", default_value_t = 1000)]
    pub shared_prefix: usize,
    /// Repeats per test (the median is reported).
    #[arg(short = 'r', long, default_value_t = 3)]
    pub repeats: usize,
    /// Also time decode constrained by this JSON schema (a file), beside unconstrained decode
    /// on the same prompts, at each concurrency level.
    #[arg(long = "json-schema")]
    pub json_schema: Option<PathBuf>,
    /// Also time greedy decode of this task (a text file, sent as one chat message) with and
    /// without prompt-lookup drafts (needs --prompt-lookup), and report the acceptance rate.
    #[arg(long = "lookup-task")]
    pub lookup_task: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    /// Time embeddings instead (a model with a pooling type): batches of --embed-texts
    /// texts of --embed-tokens tokens each, texts per second.
    #[arg(long)]
    pub embeddings: bool,
    /// Texts per embedding batch.
    #[arg(long = "embed-texts", default_value_t = 32)]
    pub embed_texts: usize,
    /// Tokens per text in the embedding batches.
    #[arg(long = "embed-tokens", default_value_t = 128)]
    pub embed_tokens: usize,
    /// Bench images instead: the projector's encode time over --repeats rounds, then the time
    /// to first token of a request with --image, the same request again (the prefix cache and
    /// the recent images' rows), and with the image mirrored (another image).
    #[arg(long)]
    pub mmproj: Option<PathBuf>,
    /// The image for the image bench (with --mmproj).
    #[arg(long = "image", value_name = "PATH")]
    pub image: Option<PathBuf>,
    #[command(flatten)]
    pub compute: ComputeArgs,
}

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Path to the GGUF model.
    pub model: PathBuf,
}

#[derive(Args, Debug)]
pub struct ModelArg {
    /// Path to the GGUF model.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
}

#[derive(Args, Debug)]
pub struct TokenizeArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Text to tokenize (special tokens such as <|im_start|> are recognised).
    pub text: String,
    /// Prepend BOS when the model's vocabulary asks for it.
    #[arg(long)]
    pub add_bos: bool,
}

#[derive(Args, Debug, Clone)]
pub struct ComputeArgs {
    /// Worker threads (default: the cores available).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// KV page format.
    #[arg(long = "kv-type", default_value = "f16")]
    pub kv_type: KvType,
    /// Tokens per KV block.
    #[arg(long = "block-size", default_value_t = 16)]
    pub block_size: usize,
    /// KV pool size in MiB (allocated once at start).
    #[arg(long = "kv-memory-mib")]
    pub kv_memory_mib: Option<usize>,
    /// Running sequences at most.
    #[arg(long = "max-seqs", default_value_t = 16)]
    pub max_seqs: usize,
    /// Tokens one engine step processes at most (decodes first, then prefill chunks).
    #[arg(long = "max-batched-tokens", default_value_t = 512)]
    pub max_batched_tokens: usize,
    /// While sequences decode, a step carrying prefill may take at most this many times a
    /// decode-only step (0: off).
    #[arg(long = "prefill-pacing", default_value_t = edgelm::engine::DEFAULT_PREFILL_PACING)]
    pub prefill_pacing: f64,
    /// Prompt lookup: draft tokens a decode step may verify (for requests that ask); 0: off.
    #[arg(long = "prompt-lookup", default_value_t = 0)]
    pub prompt_lookup: usize,
    /// A hybrid model's prefix cache: MiB of recurrent-state snapshots (0: off).
    #[arg(long = "state-snapshot-mib", default_value_t = edgelm::engine::DEFAULT_STATE_SNAPSHOT_MIB)]
    pub state_snapshot_mib: usize,
    /// Compute backend: cpu, cuda or auto (cuda and auto fall back to the CPU, saying why).
    #[arg(long, default_value = "cpu", value_parser = backend_parser())]
    pub backend: Requested,
    /// CUDA: MiB of device memory the KV pool leaves free (it takes all the rest).
    #[arg(long = "gpu-reserve-mib", default_value_t = edgelm::engine::DEFAULT_GPU_RESERVE_MIB)]
    pub gpu_reserve_mib: usize,
}

/// `--backend`: one of [`Requested::NAMES`] (listed in `--help`), parsed once into a
/// [`Requested`].
fn backend_parser() -> impl TypedValueParser<Value = Requested> {
    PossibleValuesParser::new(Requested::NAMES).map(|name| {
        name.parse()
            .expect("PossibleValuesParser admits only Requested::NAMES")
    })
}

impl ComputeArgs {
    /// The engine settings a firmware profile gives (`threads = 0`: every available core).
    pub fn from_profile(e: &edgelm::config::EngineSection) -> ComputeArgs {
        ComputeArgs {
            threads: (e.threads > 0).then_some(e.threads),
            kv_type: e.kv_type,
            block_size: e.block_size,
            kv_memory_mib: Some(e.kv_memory_mib),
            max_seqs: e.max_seqs,
            max_batched_tokens: e.max_batched_tokens,
            prefill_pacing: e.prefill_pacing,
            prompt_lookup: e.prompt_lookup,
            state_snapshot_mib: e.state_snapshot_mib,
            backend: e
                .backend
                .parse()
                .expect("the profile loader accepts only backends Requested parses"),
            gpu_reserve_mib: e.gpu_reserve_mib,
        }
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// The prompt, used raw unless --chat is given.
    #[arg(short = 'p', long)]
    pub prompt: String,
    /// Tokens to generate at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n_predict: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long = "temp", default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    /// 0 disables top-k.
    #[arg(long = "top-k", default_value_t = 40)]
    pub top_k: usize,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Apply the model's chat template to the prompt (as one user message).
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// A chat template (Jinja) for --chat instead of the GGUF's.
    #[arg(long = "chat-template-file", value_name = "PATH")]
    pub chat_template_file: Option<PathBuf>,
    /// A projector file (llama.cpp's mmproj GGUF) through which the model reads --image.
    #[arg(long)]
    pub mmproj: Option<PathBuf>,
    /// An image file (PNG, JPEG, WebP, GIF) for the prompt; repeat it for several. Each
    /// stands where the prompt says `<__media__>`, or before the prompt where it does not.
    #[arg(long = "image", value_name = "PATH")]
    pub image: Vec<PathBuf>,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// A LoRA adapter (llama.cpp's GGUF format) to run the model with; SCALE multiplies its
    /// updates (default 1).
    #[arg(long = "lora", value_name = "PATH[:SCALE]", value_parser = LoraSection::parse)]
    pub lora: Option<LoraSection>,
    #[command(flatten)]
    pub compute: ComputeArgs,
}

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArg,
    /// Text file to score.
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Context size of each chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many chunks (default: all).
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Base log-probabilities in llama-perplexity's format: written while scoring -f FILE, or,
    /// with --kl-divergence, read and compared against (its tokens and chunk size are used).
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare against --kl-divergence-base: prints mean KLD, same top token, PPL(Q) and the
    /// rest of llama-perplexity's statistics.
    #[arg(long = "kl-divergence")]
    pub kl_divergence: bool,
    /// A LoRA adapter (llama.cpp's GGUF format) to score the model with; SCALE multiplies its
    /// updates (default 1).
    #[arg(long = "lora", value_name = "PATH[:SCALE]", value_parser = LoraSection::parse)]
    pub lora: Option<LoraSection>,
    #[command(flatten)]
    pub compute: ComputeArgs,
}
