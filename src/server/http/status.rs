//! The status page's figures (`GET /api/status`, read by the page at `GET /`): the process's
//! memory, the first model's engine figures at the top level, and a line per model.

use super::server::{unix_now, Server};
use crate::server::generate::{Models, Ready};
use crate::server::openai;
use serde_json::{json, Value};

/// The status page's figures: the process's memory, the first model's engine figures at the
/// top level (as with one model), and a line per model under `models`.
pub fn status_json(server: &Server, models: &Models) -> Value {
    let ready = models.first();
    let s = ready.engine.stats();
    let now = unix_now();
    let hit_rate = if s.prefix_queried_tokens > 0 {
        s.prefix_hit_tokens as f64 / s.prefix_queried_tokens as f64
    } else {
        0.0
    };
    let mut errors = server.errors.lock().map(|e| e.clone()).unwrap_or_default();
    // A client that leaves before its answer is not the server's error.
    let cancelled = errors.remove("cancelled").unwrap_or(0);
    let reloads = server.reloads();
    json!({
        "state": if server.is_ready() { "ready" } else { "draining" },
        "version": env!("CARGO_PKG_VERSION"),
        "backend": s.backend,
        "model": ready.model_name,
        "models": models.list.iter().map(model_status).collect::<Vec<_>>(),
        "profile": server.config.profile,
        "kv_type": server.config.engine.kv_type.name(),
        "resident_bytes": openai::resident_bytes(),
        // The process's memory: every model's weights and pool.
        "weight_bytes": models.list.iter().map(|m| m.engine.stats().weight_bytes).sum::<usize>(),
        "kv_pool_bytes": models.list.iter().map(|m| m.engine.stats().kv_pool_bytes).sum::<usize>(),
        "errors": errors.values().sum::<u64>(),
        "errors_by_reason": errors,
        "cancelled": cancelled,
        "uptime_s": server.started.elapsed().as_secs_f64(),
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
        "draft_tokens": s.draft_tokens,
        "accepted_draft_tokens": s.accepted_draft_tokens,
        "tokens_per_second": s.recent_tokens.iter().map(|&(t, n)| (t, n)).collect::<Vec<_>>(),
        "ttft": s.recent_ttft,
        "reloads": {
            "reloaded": reloads.done, "unchanged": reloads.unchanged, "failed": reloads.failed,
            "last_error": reloads.last_error,
        },
    })
}

/// One model's line on the status page.
fn model_status(m: &Ready) -> Value {
    let s = m.engine.stats();
    json!({
        "id": m.model_name, "kind": m.kind.as_str(), "running": s.running, "waiting": s.waiting,
        "kv_pool_bytes": s.kv_pool_bytes, "kv_total": s.kv_blocks_total, "kv_used": s.kv_blocks_used,
        "weight_bytes": s.weight_bytes, "prompt_tokens": s.prompt_tokens,
        "generation_tokens": s.generation_tokens,
    })
}
