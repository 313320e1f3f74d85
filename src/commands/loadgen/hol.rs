//! Head-of-line blocking: streams decode undisturbed for a while, then a burst of long prompts
//! arrives. A server that prefills in small chunks between decode steps keeps the streams'
//! inter-token latency close to what it was; one that prefills whole prompts stalls them.

use super::client::{self, Outcome, Record, Target};
use super::stats::Percentiles;
use super::workload::{Endpoint, Planned, Workload};
use super::LoadgenArgs;
use anyhow::{bail, Result};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct HolReport {
    pub streams: usize,
    pub burst: usize,
    pub long_prompt_tokens: Option<usize>,
    /// Inter-token latency of the streams before the burst, and while it was being served.
    pub itl_before: Percentiles,
    pub itl_during: Percentiles,
    /// p99 during / p99 before.
    pub p99_ratio: f64,
    pub burst_seconds: f64,
    pub burst_latency: Percentiles,
    pub failed: usize,
    pub errors: Vec<String>,
}

impl HolReport {
    pub fn print(&self) {
        println!(
            "head-of-line: {} decoding streams, burst of {} prompts of {} tokens, served in {:.1} s",
            self.streams,
            self.burst,
            self.long_prompt_tokens.map_or("?".into(), |n| n.to_string()),
            self.burst_seconds
        );
        println!("{}", self.itl_before.line("ITL before the burst"));
        println!("{}", self.itl_during.line("ITL during the burst"));
        println!(
            "p99 inter-token latency ratio (during / before): {:.2}",
            self.p99_ratio
        );
        println!("{}", self.burst_latency.line("long prompt latency"));
        for e in &self.errors {
            println!("  error: {e}");
        }
    }
}

/// Token arrival times, one list per request.
type Timelines = Arc<Mutex<Vec<Vec<Instant>>>>;

pub fn run(target: &Target, w: &Workload, args: &LoadgenArgs) -> Result<HolReport> {
    let run_start = Instant::now();
    let streams = Streams::start(target, w, args.hol_streams, run_start);

    // Warm up: every stream has produced tokens; then the undisturbed window.
    streams.wait_until_decoding(args.hol_streams)?;
    std::thread::sleep(Duration::from_secs(1));
    let before_start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(args.hol_baseline));
    let burst_start = Instant::now();
    let burst_records = send_burst(target, w, args, run_start);
    let burst_end = Instant::now();
    let (lines, mut errors) = streams.stop();

    // Gaps between consecutive tokens of one request, (previous, this) kept if `keep` says so.
    let gaps = |keep: &dyn Fn(Instant, Instant) -> bool| {
        Percentiles::of(lines.iter().flat_map(|tl| {
            tl.windows(2)
                .filter(move |g| keep(g[0], g[1]))
                .map(|g| (g[1] - g[0]).as_secs_f64())
        }))
    };
    let itl_before = gaps(&|prev, this| prev >= before_start && this <= burst_start);
    // Gaps that end inside the burst (a gap spanning its start counts: the stall it measures
    // began when the burst arrived).
    let itl_during = gaps(&|_, this| this > burst_start && this <= burst_end);
    for r in &burst_records {
        if let Outcome::Failed(kind) = &r.outcome {
            errors.push(format!("long prompt: {kind}"));
        }
    }
    Ok(HolReport {
        streams: args.hol_streams,
        burst: args.hol_burst,
        long_prompt_tokens: burst_records.iter().find_map(|r| r.prompt_tokens),
        p99_ratio: itl_during.p99 / itl_before.p99,
        itl_before,
        itl_during,
        burst_seconds: (burst_end - burst_start).as_secs_f64(),
        burst_latency: Percentiles::of(burst_records.iter().map(|r| r.latency)),
        failed: errors.len(),
        errors,
    })
}

/// The decoding streams, each a thread that restarts its request whenever it reaches
/// max_tokens, until told to stop.
struct Streams {
    timelines: Timelines,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    workers: Vec<std::thread::JoinHandle<()>>,
}

impl Streams {
    /// Starts `n` streams (greedy, EOS ignored so that they decode through the whole burst).
    fn start(target: &Target, w: &Workload, n: usize, run_start: Instant) -> Streams {
        let mut stream_target = target.clone();
        stream_target.temperature = 0.0;
        stream_target.ignore_eos = true; // streams must keep decoding through the whole burst
        let timelines: Timelines = Arc::default();
        let errors = Arc::new(Mutex::new(Vec::<String>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let workers = (0..n)
            .map(|k| {
                let (t, tl, errs, stop) = (
                    stream_target.clone(),
                    timelines.clone(),
                    errors.clone(),
                    stop.clone(),
                );
                let text = w.prompt(&short(k)).1;
                std::thread::spawn(move || stream(k, &t, &text, &tl, &errs, &stop, run_start))
            })
            .collect();
        Streams {
            timelines,
            errors,
            stop,
            workers,
        }
    }

    /// Waits until all `n` streams have produced tokens (120 s at most).
    fn wait_until_decoding(&self, n: usize) -> Result<()> {
        let warm_deadline = Instant::now() + Duration::from_secs(120);
        while count_streams_with_tokens(&self.timelines, 3) < n {
            if Instant::now() > warm_deadline {
                self.stop.store(true, Ordering::Relaxed);
                bail!("the {n} streams did not all start within 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops the streams; their token timelines and errors.
    fn stop(self) -> (Vec<Vec<Instant>>, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.workers {
            let _ = h.join();
        }
        let lines = std::mem::take(&mut *self.timelines.lock().expect("timelines"));
        let errors = std::mem::take(&mut *self.errors.lock().expect("errors"));
        (lines, errors)
    }
}

/// The k-th stream's thread: its request again and again until `stop`, every token's arrival
/// in a timeline of its own per request.
fn stream(
    k: usize,
    t: &Target,
    text: &str,
    tl: &Timelines,
    errs: &Mutex<Vec<String>>,
    stop: &AtomicBool,
    run_start: Instant,
) {
    while !stop.load(Ordering::Relaxed) {
        let slot = {
            let mut v = tl.lock().expect("timelines");
            v.push(Vec::new());
            v.len() - 1
        };
        let p = short(k);
        let body = client::body(t, &p, None, text);
        let rec = client::send(t, &p, &body, run_start, |at| {
            tl.lock().expect("timelines")[slot].push(at);
            !stop.load(Ordering::Relaxed)
        });
        if let Outcome::Failed(kind) = rec.outcome {
            errs.lock().expect("errors").push(format!("stream: {kind}"));
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The burst: `hol_burst` long prompts at once; their records when all have been answered.
fn send_burst(
    target: &Target,
    w: &Workload,
    args: &LoadgenArgs,
    run_start: Instant,
) -> Vec<Record> {
    let mut long_target = target.clone();
    long_target.temperature = 0.0;
    let burst: Vec<_> = (0..args.hol_burst)
        .map(|i| {
            let t = long_target.clone();
            let p = long(i, args.long_tokens);
            let text = w.prompt(&p).1;
            std::thread::spawn(move || {
                let body = client::body(&t, &p, None, &text);
                client::send(&t, &p, &body, run_start, |_| true)
            })
        })
        .collect();
    burst.into_iter().filter_map(|h| h.join().ok()).collect()
}

/// The i-th prompt of the burst: `words` words, a few tokens generated.
fn long(i: usize, words: usize) -> Planned {
    Planned {
        index: 2_000_000 + i,
        at_s: 0.0,
        endpoint: Endpoint::Completions,
        stream: false,
        system: None,
        words,
        long: true,
        max_tokens: 4,
        disconnect_after: None,
    }
}

/// The k-th decoding stream: a short prompt and a long generation.
fn short(k: usize) -> Planned {
    Planned {
        index: 1_000_000 + k,
        at_s: 0.0,
        endpoint: Endpoint::Completions,
        stream: true,
        system: None,
        words: 24,
        long: false,
        max_tokens: 512,
        disconnect_after: None,
    }
}

fn count_streams_with_tokens(tl: &Timelines, n: usize) -> usize {
    let v = tl.lock().expect("timelines");
    v.iter().filter(|t| t.len() >= n).count()
}
