//! One module per subcommand; each turns validated flags into work and output.

pub mod bench;
mod bench_embeddings;
mod bench_images;
pub mod doctor;
pub mod generate;
pub mod inspect;
pub mod kv_plan;
pub mod loadgen;
pub mod perplexity;
mod prompt;
pub mod serve;
pub mod tokenize;

use crate::cli::ComputeArgs;
use anyhow::Result;
use edgelm::backend::adapter::Adapter;
use edgelm::config::LoraSection;
use edgelm::engine::EngineConfig;
use edgelm::model::Model;
pub use prompt::{chat_template, open_projector, prompt_with_images, with_image_markers};
use std::sync::Arc;

/// KV pool bytes that hold one sequence of `tokens` tokens (in whole blocks, prefilled in
/// steps of `--max-batched-tokens`) for this model and page format; 0 when the format does not
/// fit the model (the engine then says why).
pub fn kv_bytes_for(model: &Model, c: &ComputeArgs, tokens: usize) -> usize {
    let cfg = &model.config;
    if c.block_size == 0 || c.kv_type.row_bytes(cfg.head_dim).is_none() {
        return 0;
    }
    let geom = cfg.page_geometry(c.kv_type, c.block_size);
    geom.block_bytes()
        * model
            .layout
            .peak_blocks(tokens, c.max_batched_tokens, c.block_size)
}

/// The adapters `lora` names, each read and checked against `model`.
pub fn load_adapters(model: &Model, lora: &[LoraSection]) -> Result<Vec<Arc<Adapter>>> {
    let load = |l: &LoraSection| model.load_adapter(&l.path, &l.served_name(), l.scale);
    lora.iter().map(|l| load(l).map(Arc::new)).collect()
}

/// A `-m [ID=]PATH` flag as a model section: a file that exists is a path, whatever it is
/// called; otherwise an `ID=` prefix (with no `/` in the id) names the model.
pub fn model_section(arg: &str) -> edgelm::config::ModelSection {
    let (id, path) = match arg.split_once('=') {
        Some((id, path))
            if !id.is_empty() && !id.contains('/') && !std::path::Path::new(arg).exists() =>
        {
            (id.to_string(), path)
        }
        _ => (String::new(), arg),
    };
    edgelm::config::ModelSection {
        path: path.into(),
        id,
        ..Default::default()
    }
}

/// Engine settings from the shared compute flags.
pub fn engine_config(c: &ComputeArgs) -> EngineConfig {
    EngineConfig {
        kv_type: c.kv_type,
        block_size: c.block_size,
        kv_memory_bytes: c.kv_memory_mib.unwrap_or(256) << 20,
        max_seqs: c.max_seqs,
        max_batched_tokens: c.max_batched_tokens,
        max_context: 0,
        prefill_pacing: c.prefill_pacing,
        // The command has resolved (and logged) the backend already; this is the same answer.
        backend: c.backend.resolve_quietly(),
        gpu_reserve_bytes: c.gpu_reserve_mib << 20,
        prompt_lookup: c.prompt_lookup,
        state_snapshot_bytes: c.state_snapshot_mib << 20,
        turns: None,
        disk_cache: None,
    }
}

/// Fails with the fetch-model hint when the model file is not there (a command checks before
/// it sizes anything from the model).
pub fn require_model(path: &std::path::Path) -> Result<()> {
    if !path.exists() {
        anyhow::bail!("{}", edgelm::config::missing_model(path));
    }
    Ok(())
}

/// Sizes the global worker pool once, before any compute runs.
pub fn init_threads(compute: &ComputeArgs) -> Result<usize> {
    let n = compute.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    if n == 0 {
        anyhow::bail!("--threads must be at least 1");
    }
    edgelm::backend::cpu::pool::init(n, edgelm::backend::cpu::pool::lower_thread_priority);
    Ok(n)
}
