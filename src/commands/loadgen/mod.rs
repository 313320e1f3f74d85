//! `edgelm loadgen`: drives any OpenAI-compatible server over HTTP with a seeded workload and
//! reports throughput, TTFT, inter-token latency and errors by kind; optionally watches the
//! server's memory, descriptors and threads (soak), how fast latency recovers once an
//! overload stops, and head-of-line blocking (`--scenario hol`).

mod client;
mod hol;
mod monitor;
mod stats;
mod workload;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use client::{Outcome, Record, Target};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workload::{Endpoint, Planned, Workload, WorkloadConfig};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// The mixed workload, open loop (--rate) or closed loop (--concurrency).
    Load,
    /// Streams decode while a burst of long prompts arrives; compares their inter-token latency.
    Hol,
}

#[derive(Args, Debug)]
pub struct LoadgenArgs {
    /// Server base URL (edgelm, llama-server or any OpenAI-compatible server).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Model name to send (default: the first one /v1/models lists).
    #[arg(long)]
    pub model: Option<String>,
    /// Bearer token, if the server wants one.
    #[arg(long, env = "EDGELM_API_KEY")]
    pub api_key: Option<String>,
    #[arg(long, value_enum, default_value = "load")]
    pub scenario: Scenario,
    /// Workload seed: the same seed sends the same requests.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Poisson arrivals per second (open loop).
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Closed loop instead: this many clients, each sending its next request when one ends.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Seconds during which requests are sent.
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Send at most this many requests.
    #[arg(long)]
    pub requests: Option<usize>,
    /// Share of requests with a very long prompt.
    #[arg(long, default_value_t = 0.01)]
    pub long_share: f64,
    /// Words (≈ tokens) in a long prompt.
    #[arg(long, default_value_t = 4000)]
    pub long_tokens: usize,
    #[arg(long, default_value_t = 8)]
    pub min_prompt_words: usize,
    #[arg(long, default_value_t = 512)]
    pub max_prompt_words: usize,
    /// Share of requests that start with a shared system prompt.
    #[arg(long, default_value_t = 0.5)]
    pub shared_share: f64,
    #[arg(long, default_value_t = 4)]
    pub system_prompts: usize,
    #[arg(long, default_value_t = 300)]
    pub system_words: usize,
    #[arg(long, default_value_t = 0.7)]
    pub stream_share: f64,
    /// Share sent to /v1/chat/completions (the rest to /v1/completions).
    #[arg(long, default_value_t = 0.5)]
    pub chat_share: f64,
    /// Share of streaming clients that hang up mid-stream.
    #[arg(long, default_value_t = 0.1)]
    pub disconnect_share: f64,
    #[arg(long, default_value_t = 16)]
    pub min_max_tokens: usize,
    #[arg(long, default_value_t = 128)]
    pub max_max_tokens: usize,
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f64,
    /// Ask the server to ignore end-of-sequence (fixed output lengths across servers).
    #[arg(long)]
    pub ignore_eos: bool,
    /// Seconds a request may take in all before it counts as a timeout.
    #[arg(long, default_value_t = 300.0)]
    pub timeout: f64,
    /// Open-loop requests in flight at most; past that the client itself is overrun.
    #[arg(long, default_value_t = 1024)]
    pub max_inflight: usize,
    /// Watch this server process (/proc/PID) for RSS, descriptors and threads; without it,
    /// edgelm's /metrics are used when the server has them.
    #[arg(long)]
    pub pid: Option<u32>,
    /// Seconds before RSS growth is measured from.
    #[arg(long, default_value_t = 30.0)]
    pub warmup: f64,
    /// After the load stops, probe until latency is back to the idle baseline.
    #[arg(long)]
    pub recovery: bool,
    /// Probe TTFT (seconds) that counts as recovered, e.g. the p50 TTFT at the sustainable rate
    /// (default: twice the idle server's, or 50 ms more).
    #[arg(long)]
    pub normal_ttft: Option<f64>,
    /// Head-of-line scenario: decoding streams.
    #[arg(long, default_value_t = 8)]
    pub hol_streams: usize,
    /// Head-of-line scenario: long prompts in the burst.
    #[arg(long, default_value_t = 4)]
    pub hol_burst: usize,
    /// Head-of-line scenario: seconds of undisturbed decoding measured before the burst.
    #[arg(long, default_value_t = 10.0)]
    pub hol_baseline: f64,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Exit non-zero if any request failed or the server did not end idle.
    #[arg(long)]
    pub fail_on_error: bool,
}

impl LoadgenArgs {
    fn workload(&self, rate: f64) -> WorkloadConfig {
        WorkloadConfig {
            seed: self.seed,
            rate,
            long_share: self.long_share,
            long_tokens: self.long_tokens,
            min_prompt_words: self.min_prompt_words,
            max_prompt_words: self.max_prompt_words,
            shared_share: self.shared_share,
            system_prompts: self.system_prompts,
            system_words: self.system_words,
            stream_share: self.stream_share,
            chat_share: self.chat_share,
            disconnect_share: self.disconnect_share,
            min_max_tokens: self.min_max_tokens,
            max_max_tokens: self.max_max_tokens,
        }
    }

    fn validate(&self) -> Result<()> {
        let shares = [
            ("--long-share", self.long_share),
            ("--shared-share", self.shared_share),
            ("--stream-share", self.stream_share),
            ("--chat-share", self.chat_share),
            ("--disconnect-share", self.disconnect_share),
        ];
        for (name, v) in shares {
            if !(0.0..=1.0).contains(&v) {
                bail!("{name} must be between 0 and 1, not {v}");
            }
        }
        if self.scenario == Scenario::Load && self.rate.is_none() && self.concurrency.is_none() {
            bail!("give --rate (requests per second) or --concurrency (clients)");
        }
        if self.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
            bail!("--rate must be a positive number");
        }
        if self.concurrency == Some(0) || self.max_inflight == 0 {
            bail!("--concurrency and --max-inflight must be at least 1");
        }
        if !(self.duration > 0.0 && self.timeout > 0.0) {
            bail!("--duration and --timeout must be positive");
        }
        if self.min_prompt_words > self.max_prompt_words
            || self.min_max_tokens > self.max_max_tokens
        {
            bail!("a --min-* bound is above its --max-* bound");
        }
        Ok(())
    }
}

pub fn run(args: LoadgenArgs) -> Result<()> {
    args.validate()?;
    let mut target = Target::new(
        &args.url,
        String::new(),
        args.api_key.clone(),
        Duration::from_secs_f64(args.timeout),
    );
    target.model = match &args.model {
        Some(m) => m.clone(),
        None => model_when_ready(&target)
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.url))
            .context("cannot reach the server")?,
    };
    target.temperature = args.temperature;
    target.ignore_eos = args.ignore_eos;
    let source = match args.pid {
        Some(pid) => Some(monitor::Source::Pid(pid)),
        None => monitor::server_metrics(&target).map(|_| monitor::Source::Metrics(target.clone())),
    };
    let mut out = json!({"url": args.url, "model": target.model, "seed": args.seed, "scenario": format!("{:?}", args.scenario).to_lowercase()});
    let failed = match args.scenario {
        Scenario::Load => run_load(&args, &target, source, &mut out)?,
        Scenario::Hol => {
            let r = hol::run(&target, &Workload::new(args.workload(1.0)), &args)?;
            r.print();
            out["hol"] = serde_json::to_value(&r)?;
            r.failed
        }
    };
    let idle = wait_idle(&target);
    if let Some(i) = &idle {
        println!(
            "server after the run: {} KV blocks used, {} running, {} waiting",
            i.0, i.1, i.2
        );
        out["after"] = json!({"kv_blocks_used": i.0, "running": i.1, "waiting": i.2});
    }
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&out)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    if args.fail_on_error {
        if failed > 0 {
            bail!("{failed} requests failed");
        }
        if idle.is_some_and(|i| i != (0.0, 0.0, 0.0)) {
            bail!("the server did not come back to idle (KV blocks or requests left)");
        }
    }
    Ok(())
}

fn run_load(
    args: &LoadgenArgs,
    target: &Target,
    source: Option<monitor::Source>,
    out: &mut serde_json::Value,
) -> Result<usize> {
    let probe_base = if args.recovery {
        Some(baseline_ttft(target).context("the server does not answer the idle probes")?)
    } else {
        None
    };
    let mon = source.map(|s| monitor::Monitor::start(s, Duration::from_secs(1)));
    let workload = Arc::new(Workload::new(args.workload(args.rate.unwrap_or(1.0))));
    let start = Instant::now();
    let (records, in_flight) = match (args.rate, args.concurrency) {
        (Some(_), _) => open_loop(target, &workload, args, start),
        (None, Some(c)) => (closed_loop(target, &workload, args, c, start), Vec::new()),
        (None, None) => unreachable!("validated"),
    };
    let load_end = Instant::now();
    let normal = probe_base.map(|base| args.normal_ttft.unwrap_or((2.0 * base).max(base + 0.05)));
    let recovery = normal.map(|n| recovery_after(target, n, load_end));
    let mut records = records;
    for h in in_flight {
        records.extend(h.join().ok());
    }
    // Throughput over the time requests were sent or served, not the recovery probes after.
    let wall = records
        .iter()
        .map(|r| r.sent_s + r.latency)
        .fold(load_end.duration_since(start).as_secs_f64(), f64::max);
    let report = stats::Report::from_records(&records, wall);
    report.print();
    out["report"] = serde_json::to_value(&report)?;
    if let (Some(base), Some(normal), Some(rec)) = (probe_base, normal, recovery) {
        let what = format!(
            "probe TTFT <= {:.0} ms (idle: {:.0} ms)",
            normal * 1e3,
            base * 1e3
        );
        match rec {
            Some(s) => println!("recovery: {what} again {s:.1} s after the load stopped"),
            None => println!("recovery: NOT back to {what} within 60 s"),
        }
        out["recovery"] =
            json!({"idle_ttft_s": base, "normal_ttft_s": normal, "recovered_after_s": rec});
    }
    if let Some(m) = mon {
        let samples = m.finish();
        if let Some(g) = monitor::growth(&samples, args.warmup) {
            g.print();
            out["server"] = serde_json::to_value(&g)?;
        }
    }
    Ok(report.failed)
}

type InFlight = Vec<std::thread::JoinHandle<Record>>;

/// Poisson arrivals: one thread per request so that a slow server never slows the arrivals.
/// Returns the finished records and the requests still in flight when the last one was sent.
fn open_loop(
    target: &Target,
    w: &Arc<Workload>,
    args: &LoadgenArgs,
    start: Instant,
) -> (Vec<Record>, InFlight) {
    let plan = w.arrivals(args.duration, args.requests);
    let inflight = Arc::new(AtomicUsize::new(0));
    let mut handles: InFlight = Vec::new();
    let mut records = Vec::new();
    for p in plan {
        let due = start + Duration::from_secs_f64(p.at_s);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        // Reap what finished so the handle list stays short over a long soak.
        let (done, running): (InFlight, InFlight) =
            handles.into_iter().partition(|h| h.is_finished());
        handles = running;
        records.extend(done.into_iter().filter_map(|h| h.join().ok()));
        if inflight.load(Ordering::Relaxed) >= args.max_inflight {
            records.push(overrun(&p, start));
            continue;
        }
        inflight.fetch_add(1, Ordering::Relaxed);
        let (t, wl, n) = (target.clone(), w.clone(), inflight.clone());
        let planned = p.clone();
        let spawned = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let rec = send_planned(&t, &wl, &planned, start);
                n.fetch_sub(1, Ordering::Relaxed);
                rec
            });
        match spawned {
            Ok(h) => handles.push(h),
            Err(_) => {
                inflight.fetch_sub(1, Ordering::Relaxed);
                records.push(overrun(&p, start));
            }
        }
    }
    (records, handles)
}

fn overrun(p: &Planned, start: Instant) -> Record {
    Record {
        outcome: Outcome::Failed("client_overrun".into()),
        ..Record::new(p, start.elapsed().as_secs_f64())
    }
}

fn send_planned(t: &Target, w: &Workload, p: &Planned, start: Instant) -> Record {
    let (system, text) = w.prompt(p);
    let body = client::body(t, p, system, &text);
    client::send(t, p, &body, start, |_| true)
}

fn closed_loop(
    target: &Target,
    w: &Arc<Workload>,
    args: &LoadgenArgs,
    clients: usize,
    start: Instant,
) -> Vec<Record> {
    let next = Arc::new(AtomicUsize::new(0));
    let records = Arc::new(Mutex::new(Vec::new()));
    let deadline = start + Duration::from_secs_f64(args.duration);
    let limit = args.requests.unwrap_or(usize::MAX);
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (t, w, next, records) = (target.clone(), w.clone(), next.clone(), records.clone());
            std::thread::spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= limit || Instant::now() >= deadline {
                    break;
                }
                let rec = send_planned(&t, &w, &w.planned(i), start);
                // A client told to come back later does, as OpenAI's clients do, rather
                // than hammering the server with refused requests.
                let pause = rec.retry_after_s.map(Duration::from_secs);
                records.lock().expect("records lock").push(rec);
                if let Some(p) = pause {
                    std::thread::sleep(p.min(deadline.saturating_duration_since(Instant::now())));
                }
            })
        })
        .collect();
    for h in workers {
        let _ = h.join();
    }
    let mut v = std::mem::take(&mut *records.lock().expect("records lock"));
    v.sort_by_key(|r| r.index);
    v
}

/// The served model's name, waiting up to 60 s for a server that is still loading (503).
fn model_when_ready(t: &Target) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match t.first_model() {
            Err(e) if e.contains("answered 503") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

/// A short greedy stream's time to first token, or None if it failed.
fn probe(t: &Target) -> Option<f64> {
    let p = Planned {
        index: usize::MAX / 2,
        at_s: 0.0,
        endpoint: Endpoint::Completions,
        stream: true,
        system: None,
        words: 16,
        long: false,
        max_tokens: 4,
        disconnect_after: None,
    };
    let mut body = client::body(
        t,
        &p,
        None,
        "Write one short sentence about rivers and mountains.",
    );
    body["temperature"] = json!(0.0);
    body["ignore_eos"] = json!(true); // a probe that ends at once has no first token to time
    let rec = client::send(t, &p, &body, Instant::now(), |_| true);
    (rec.outcome == Outcome::Ok).then_some(rec.ttft).flatten()
}

/// The idle server's probe TTFT (median of five, after one warm-up).
fn baseline_ttft(t: &Target) -> Option<f64> {
    probe(t)?;
    let mut v: Vec<f64> = (0..5).filter_map(|_| probe(t)).collect();
    if v.len() < 3 {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// Seconds from `since` until three probes in a row see a TTFT of at most `normal` again;
/// None if that takes over a minute.
fn recovery_after(t: &Target, normal: f64, since: Instant) -> Option<f64> {
    let mut streak: Option<f64> = None;
    let mut good = 0;
    while since.elapsed() < Duration::from_secs(60) {
        let sent = since.elapsed().as_secs_f64();
        match probe(t) {
            Some(ttft) if ttft <= normal => {
                streak.get_or_insert(sent + ttft);
                good += 1;
                if good == 3 {
                    return streak;
                }
            }
            _ => (streak, good) = (None, 0),
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    None
}

/// (KV blocks used, running, waiting) once an edgelm server settles; None for other servers.
fn wait_idle(t: &Target) -> Option<(f64, f64, f64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = monitor::server_metrics(t)?;
        let get = |k: &str| m.iter().find(|(n, _)| n == k).map_or(f64::NAN, |(_, v)| *v);
        let now = (
            get("edgelm_kv_blocks_used"),
            get("edgelm_requests_running"),
            get("edgelm_requests_waiting"),
        );
        if now == (0.0, 0.0, 0.0) || Instant::now() >= deadline {
            return Some(now);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
