//! Prometheus text exposition of the engine's published stats and the server's counters.

use crate::engine::metrics::{EngineStats, Histogram};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One model's series: its stats, and the label that tells it apart from other models'
/// (empty when the server holds one model, so that single-model series stay unlabelled).
struct Labelled<'a> {
    label: String,
    stats: &'a EngineStats,
}

/// `{model="id"}` per model, or nothing for the only one.
fn labelled<'a>(models: &'a [(&str, EngineStats)]) -> Vec<Labelled<'a>> {
    models
        .iter()
        .map(|(id, stats)| Labelled {
            label: match models.len() {
                1 => String::new(),
                _ => format!(
                    "model=\"{}\"",
                    id.replace('\\', "\\\\").replace('"', "\\\"")
                ),
            },
            stats,
        })
        .collect()
}

/// `{a,b}` of the non-empty labels, or nothing.
fn braces(labels: &[&str]) -> String {
    let set: Vec<&str> = labels.iter().copied().filter(|l| !l.is_empty()).collect();
    match set.is_empty() {
        true => String::new(),
        false => format!("{{{}}}", set.join(",")),
    }
}

fn histogram(
    out: &mut String,
    name: &str,
    help: &str,
    models: &[Labelled<'_>],
    h: fn(&EngineStats) -> &Histogram,
) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for m in models {
        let h = h(m.stats);
        for (b, c) in h.bounds.iter().zip(h.cumulative()) {
            let le = format!("le=\"{b}\"");
            let _ = writeln!(out, "{name}_bucket{} {c}", braces(&[&m.label, &le]));
        }
        let inf = braces(&[&m.label, "le=\"+Inf\""]);
        let _ = writeln!(out, "{name}_bucket{inf} {}", h.count);
        let _ = writeln!(out, "{name}_sum{} {}", braces(&[&m.label]), h.sum);
        let _ = writeln!(out, "{name}_count{} {}", braces(&[&m.label]), h.count);
    }
}

/// One unlabelled sample under its `# HELP` and `# TYPE` lines.
fn metric(out: &mut String, name: &str, kind: &str, help: &str, v: f64) {
    let _ = writeln!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
    );
}

/// A series read from the engine's stats: (name, kind, help, value).
type Series = (
    &'static str,
    &'static str,
    &'static str,
    fn(&EngineStats) -> f64,
);

/// The memory the server holds by design: the KV pool, the mapped model and its adapters.
const MEMORY: [Series; 4] = [
    (
        "edgelm_kv_pool_bytes",
        "gauge",
        "Bytes of the KV pool, allocated once at start.",
        |s| s.kv_pool_bytes as f64,
    ),
    (
        "edgelm_model_file_bytes",
        "gauge",
        "Bytes of the memory-mapped model file.",
        |s| s.weight_bytes as f64,
    ),
    (
        "edgelm_lora_adapters",
        "gauge",
        "LoRA adapters loaded for the model.",
        |s| s.adapters as f64,
    ),
    (
        "edgelm_lora_adapter_bytes",
        "gauge",
        "Bytes the loaded LoRA adapters' updates take in memory.",
        |s| s.adapter_bytes as f64,
    ),
];

/// The batch and the KV pool as they stand.
const GAUGES: [Series; 13] = [
    (
        "edgelm_requests_running",
        "gauge",
        "Sequences in the running batch.",
        |s| s.running as f64,
    ),
    (
        "edgelm_requests_waiting",
        "gauge",
        "Sequences waiting for admission.",
        |s| s.waiting as f64,
    ),
    (
        "edgelm_kv_pool_blocks",
        "gauge",
        "KV blocks in the pool.",
        |s| s.kv_blocks_total as f64,
    ),
    // What a router's endpoint picker reads (the inference extension's model-server
    // protocol): one unlabelled gauge for KV use, and the cache geometry as an info series.
    (
        "edgelm_kv_cache_usage_ratio",
        "gauge",
        "Fraction of the KV blocks in use by running sequences (0 to 1).",
        kv_usage_ratio,
    ),
    (
        "edgelm_kv_blocks_used",
        "gauge",
        "KV blocks referenced by sequences.",
        |s| s.kv_blocks_used as f64,
    ),
    (
        "edgelm_kv_blocks_cached",
        "gauge",
        "KV blocks registered in the prefix cache.",
        |s| s.kv_blocks_cached as f64,
    ),
    (
        "edgelm_prefix_cache_restored_blocks",
        "gauge",
        "Prefix-cache blocks read back from disk at start.",
        |s| s.restored_blocks as f64,
    ),
    (
        "edgelm_prefix_cache_saved_blocks",
        "gauge",
        "Prefix-cache blocks the last save to disk wrote.",
        |s| s.saved_blocks as f64,
    ),
    (
        "edgelm_state_slots",
        "gauge",
        "Recurrent-state slots in the pool (a hybrid model's; 0 otherwise).",
        |s| s.state_slots_total as f64,
    ),
    (
        "edgelm_state_slots_used",
        "gauge",
        "Recurrent-state slots held by running sequences.",
        |s| s.state_slots_used as f64,
    ),
    (
        "edgelm_state_pool_bytes",
        "gauge",
        "Bytes of the recurrent-state slots and snapshots (part of edgelm_kv_pool_bytes).",
        |s| s.state_pool_bytes as f64,
    ),
    (
        "edgelm_state_snapshots",
        "gauge",
        "Prefix-cache state snapshots the budget holds (a hybrid model's; 0 otherwise).",
        |s| s.state_snapshots_total as f64,
    ),
    (
        "edgelm_state_snapshots_kept",
        "gauge",
        "Prefix-cache state snapshots kept (cached prompts a hybrid can resume after).",
        |s| s.state_snapshots_kept as f64,
    ),
];

/// The engine's totals since start.
const COUNTERS: [Series; 12] = [
    (
        "edgelm_prefix_cache_queries_total",
        "counter",
        "Prompt tokens looked up in the prefix cache.",
        |s| s.prefix_queried_tokens as f64,
    ),
    (
        "edgelm_prefix_cache_hits_total",
        "counter",
        "Prompt tokens served from the prefix cache.",
        |s| s.prefix_hit_tokens as f64,
    ),
    (
        "edgelm_preemptions_total",
        "counter",
        "Sequences preempted for KV space.",
        |s| s.preemptions as f64,
    ),
    (
        "edgelm_constrained_requests_total",
        "counter",
        "Requests whose output a JSON schema, grammar, regex or forced tool call constrained.",
        |s| s.constrained_requests as f64,
    ),
    (
        "edgelm_grammar_mask_seconds_total",
        "counter",
        "Seconds spent computing the token masks of constrained requests.",
        |s| s.grammar_mask_seconds,
    ),
    (
        "edgelm_layer_pass_slices_total",
        "counter",
        "Steps that ran an image a few layers at a time (its positions see each other) beside \
         decoding streams.",
        |s| s.layer_pass_slices as f64,
    ),
    (
        "edgelm_spec_decode_num_draft_tokens_total",
        "counter",
        "Prompt-lookup draft tokens verified.",
        |s| s.draft_tokens as f64,
    ),
    (
        "edgelm_spec_decode_num_accepted_tokens_total",
        "counter",
        "Prompt-lookup draft tokens the model agreed with (each saved a decode step).",
        |s| s.accepted_draft_tokens as f64,
    ),
    (
        "edgelm_prompt_tokens_total",
        "counter",
        "Prompt tokens received.",
        |s| s.prompt_tokens as f64,
    ),
    (
        "edgelm_generation_tokens_total",
        "counter",
        "Tokens generated.",
        |s| s.generation_tokens as f64,
    ),
    (
        "edgelm_requests_finished_total",
        "counter",
        "Requests completed.",
        |s| s.requests_finished as f64,
    ),
    (
        "edgelm_engine_steps_total",
        "counter",
        "Engine steps run.",
        |s| s.steps as f64,
    ),
];

/// Each of `all`, one sample per model.
fn series(out: &mut String, models: &[Labelled<'_>], all: &[Series]) {
    for (name, kind, help, value) in all {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for m in models {
            let _ = writeln!(out, "{name}{} {}", braces(&[&m.label]), value(m.stats));
        }
    }
}

/// The exposition: every model's engine series (labelled `model=` when there are several),
/// the process's, and the server's error counts.
pub fn render(
    models: &[(&str, EngineStats)],
    errors: &BTreeMap<&'static str, u64>,
    uptime_s: f64,
) -> String {
    let mut out = String::new();
    let models = labelled(models);
    series(&mut out, &models, &MEMORY);
    process(&mut out);
    series(&mut out, &models, &GAUGES);
    series(&mut out, &models, &COUNTERS);
    metric(
        &mut out,
        "edgelm_uptime_seconds",
        "gauge",
        "Seconds since start.",
        uptime_s,
    );
    let _ = writeln!(
        out,
        "# HELP edgelm_cache_config_info The KV cache's geometry (value always 1).\n\
         # TYPE edgelm_cache_config_info gauge"
    );
    for m in &models {
        let geometry = format!(
            "block_size=\"{}\",num_gpu_blocks=\"{}\"",
            m.stats.block_size, m.stats.kv_blocks_total
        );
        let _ = writeln!(
            out,
            "edgelm_cache_config_info{} 1",
            braces(&[&m.label, &geometry])
        );
    }
    histogram(
        &mut out,
        "edgelm_time_to_first_token_seconds",
        "Time from arrival to first token.",
        &models,
        |s| &s.ttft,
    );
    histogram(
        &mut out,
        "edgelm_time_per_output_token_seconds",
        "Time between generated tokens.",
        &models,
        |s| &s.tpot,
    );
    request_errors(&mut out, errors);
    out
}

/// The process's resident memory, descriptors and threads, where /proc tells them.
fn process(out: &mut String) {
    if let Some(rss) = resident_bytes() {
        metric(
            out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory of this process (weights mapped, KV pool touched, the rest).",
            rss as f64,
        );
    }
    if let Some(fds) = open_fds() {
        metric(
            out,
            "process_open_fds",
            "gauge",
            "Open file descriptors (sockets included): flat while serving, or something leaks.",
            fds as f64,
        );
    }
    if let Some(threads) = thread_count() {
        metric(
            out,
            "process_threads",
            "gauge",
            "OS threads of this process.",
            threads as f64,
        );
    }
}

/// Requests answered with an error, one series per reason (a zero series when none yet, so
/// the metric exists from the start).
fn request_errors(out: &mut String, errors: &BTreeMap<&'static str, u64>) {
    let _ = writeln!(out, "# HELP edgelm_request_errors_total Requests answered with an error, by reason.\n# TYPE edgelm_request_errors_total counter");
    if errors.is_empty() {
        let _ = writeln!(out, "edgelm_request_errors_total{{reason=\"none\"}} 0");
    }
    for (reason, n) in errors {
        let _ = writeln!(
            out,
            "edgelm_request_errors_total{{reason=\"{reason}\"}} {n}"
        );
    }
}

/// Open descriptors from /proc (Linux); None elsewhere.
fn open_fds() -> Option<usize> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count())
}

/// Threads from /proc (Linux); None elsewhere.
fn thread_count() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:")?.trim().parse().ok())
}

/// Resident set size from /proc (Linux); None elsewhere.
pub fn resident_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no memory-safety preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * page.max(1) as u64)
}

/// The share of the KV pool's blocks in use (0 before the pool exists).
fn kv_usage_ratio(s: &EngineStats) -> f64 {
    if s.kv_blocks_total == 0 {
        return 0.0;
    }
    (s.kv_blocks_used as f64 / s.kv_blocks_total as f64).clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The series an endpoint picker reads: one unlabelled gauge per value, and the info series.
    #[test]
    fn the_router_metrics_are_single_gauges() {
        let s = EngineStats {
            kv_blocks_total: 200,
            kv_blocks_used: 50,
            block_size: 16,
            running: 3,
            waiting: 2,
            ..Default::default()
        };
        let text = render(&[("m.gguf", s)], &BTreeMap::new(), 1.0);
        for (name, value) in [
            ("edgelm_kv_cache_usage_ratio", "0.25"),
            ("edgelm_requests_running", "3"),
            ("edgelm_requests_waiting", "2"),
        ] {
            assert!(
                text.contains(&format!("# TYPE {name} gauge\n{name} {value}\n")),
                "{name}"
            );
        }
        assert!(text.contains(
            "# TYPE edgelm_cache_config_info gauge\n\
             edgelm_cache_config_info{block_size=\"16\",num_gpu_blocks=\"200\"} 1\n"
        ));
        // No gauge is named like a counter.
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let (name, kind) = line[7..].split_once(' ').unwrap();
            assert_eq!(name.ends_with("_total"), kind == "counter", "{line}");
        }
    }

    #[test]
    fn usage_is_a_ratio_even_before_the_pool_exists() {
        let mut s = EngineStats::default();
        assert_eq!(kv_usage_ratio(&s), 0.0);
        s.kv_blocks_total = 4;
        s.kv_blocks_used = 4;
        assert_eq!(kv_usage_ratio(&s), 1.0);
    }

    #[test]
    fn several_models_label_their_series_and_keep_one_help_line() {
        let a = EngineStats {
            running: 2,
            ..Default::default()
        };
        let b = EngineStats {
            running: 5,
            ..Default::default()
        };
        let text = render(&[("chat", a), ("emb\"ed", b)], &BTreeMap::new(), 1.0);
        assert!(text.contains("edgelm_requests_running{model=\"chat\"} 2\n"));
        assert!(text.contains("edgelm_requests_running{model=\"emb\\\"ed\"} 5\n"));
        assert_eq!(
            text.matches("# TYPE edgelm_requests_running gauge").count(),
            1
        );
        assert!(text.contains("edgelm_time_to_first_token_seconds_count{model=\"chat\"} 0\n"));
        assert!(text
            .contains("edgelm_time_to_first_token_seconds_bucket{model=\"chat\",le=\"+Inf\"} 0\n"));
        assert!(text.contains("edgelm_cache_config_info{model=\"chat\",block_size="));
    }
}
