//! Figures the engine publishes after every step for the server's /metrics, /health and
//! status page. A copy behind a mutex, written by the engine thread only: readers never wait
//! on a forward pass.

use std::sync::{Arc, Mutex};

/// Prometheus-style cumulative histogram with fixed bucket bounds (seconds).
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    pub bounds: &'static [f64],
    /// `counts[i]`: observations ≤ `bounds[i]` (cumulative at export, per-bucket here).
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

pub const TTFT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
pub const TPOT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5,
];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Cumulative counts per bound, as Prometheus wants them.
    pub fn cumulative(&self) -> Vec<u64> {
        self.counts
            .iter()
            .scan(0u64, |acc, &c| {
                *acc += c;
                Some(*acc)
            })
            .collect()
    }
}

#[derive(Clone, Debug)]
pub struct EngineStats {
    /// Bytes of the preallocated KV pool and of the weight matrices (fixed at start).
    pub kv_pool_bytes: usize,
    pub weight_bytes: usize,
    /// LoRA adapters loaded for the model and the bytes their updates take (the server's,
    /// which holds them; 0 from the engine).
    pub adapters: usize,
    pub adapter_bytes: usize,
    /// The prefix cache on disk: blocks read back at start, and blocks the last save wrote
    /// (`EngineConfig::disk_cache`).
    pub restored_blocks: usize,
    pub saved_blocks: usize,
    /// The backend that runs ("cpu" or "cuda", after any fallback; fixed at start).
    pub backend: &'static str,
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_total: usize,
    /// Tokens per KV block (fixed at start).
    pub block_size: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_cached: usize,
    /// A hybrid model's recurrent-state slots: all of them (fixed at start) and those held.
    pub state_slots_total: usize,
    pub state_slots_used: usize,
    /// Bytes of those slots and the snapshots' (part of `kv_pool_bytes`).
    pub state_pool_bytes: usize,
    /// Its prefix cache's state snapshots: how many the budget holds, and how many are kept.
    pub state_snapshots_total: usize,
    pub state_snapshots_kept: usize,
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub preemptions: u64,
    pub prompt_tokens: u64,
    pub generation_tokens: u64,
    pub requests_finished: u64,
    pub steps: u64,
    /// Requests with a response format, grammar or forced tool call.
    pub constrained_requests: u64,
    /// Time spent computing grammar masks.
    pub grammar_mask_seconds: f64,
    /// Prompt-lookup draft tokens verified, and how many of them the model agreed with.
    pub draft_tokens: u64,
    pub accepted_draft_tokens: u64,
    /// Steps' slices of images that went through the model a few layers at a time beside
    /// streams (`scheduler::layer_pass`).
    pub layer_pass_slices: u64,
    pub ttft: Histogram,
    pub tpot: Histogram,
    /// Recent (unix seconds, TTFT seconds) samples for the status page's chart.
    pub recent_ttft: Vec<(f64, f64)>,
    /// Generated tokens per wall-clock second, for the last few minutes: (unix second, tokens).
    pub recent_tokens: Vec<(u64, u64)>,
}

impl Default for EngineStats {
    fn default() -> Self {
        EngineStats {
            kv_pool_bytes: 0,
            weight_bytes: 0,
            adapters: 0,
            adapter_bytes: 0,
            restored_blocks: 0,
            saved_blocks: 0,
            backend: "",
            running: 0,
            waiting: 0,
            kv_blocks_total: 0,
            block_size: 0,
            kv_blocks_used: 0,
            kv_blocks_cached: 0,
            state_slots_total: 0,
            state_slots_used: 0,
            state_pool_bytes: 0,
            state_snapshots_total: 0,
            state_snapshots_kept: 0,
            prefix_queried_tokens: 0,
            prefix_hit_tokens: 0,
            preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            requests_finished: 0,
            steps: 0,
            constrained_requests: 0,
            grammar_mask_seconds: 0.0,
            draft_tokens: 0,
            accepted_draft_tokens: 0,
            layer_pass_slices: 0,
            ttft: Histogram::new(TTFT_BUCKETS),
            tpot: Histogram::new(TPOT_BUCKETS),
            recent_ttft: Vec::new(),
            recent_tokens: Vec::new(),
        }
    }
}

const RECENT_SECONDS: u64 = 600;

impl EngineStats {
    pub fn record_ttft(&mut self, now_unix: f64, secs: f64) {
        self.ttft.observe(secs);
        self.recent_ttft.push((now_unix, secs));
        let cutoff = now_unix - RECENT_SECONDS as f64;
        self.recent_ttft.retain(|&(t, _)| t >= cutoff);
    }

    pub fn record_tokens(&mut self, now_unix: u64, n: u64) {
        self.generation_tokens += n;
        match self.recent_tokens.last_mut() {
            Some((t, c)) if *t == now_unix => *c += n,
            _ => self.recent_tokens.push((now_unix, n)),
        }
        let cutoff = now_unix.saturating_sub(RECENT_SECONDS);
        self.recent_tokens.retain(|&(t, _)| t >= cutoff);
    }
}

/// The shared, read-mostly copy.
pub type SharedStats = Arc<Mutex<EngineStats>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let mut h = Histogram::new(TTFT_BUCKETS);
        for v in [0.005, 0.02, 0.02, 100.0] {
            h.observe(v);
        }
        let c = h.cumulative();
        assert_eq!(c[0], 1);
        assert_eq!(c[1], 3);
        assert_eq!(
            *c.last().unwrap(),
            3,
            "100 s is beyond the last bound (only in +Inf)"
        );
        assert_eq!(h.count, 4);
    }
}
