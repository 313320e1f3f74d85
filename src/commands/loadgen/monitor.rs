//! Watches the server while load runs: resident memory, open file descriptors and threads
//! (from /proc/PID when the server is local, or edgelm's own /metrics), so a soak can show
//! that nothing grows.

use super::client::Target;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Sample {
    pub t_s: f64,
    pub rss_bytes: f64,
    pub open_fds: f64,
    pub threads: f64,
}

/// Where process figures come from.
#[derive(Clone)]
pub enum Source {
    Pid(u32),
    Metrics(Target),
}

/// One reading, or None when the source cannot be read (the process is gone, no /metrics).
pub fn sample(source: &Source) -> Option<Sample> {
    match source {
        Source::Pid(pid) => {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
            };
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
            Some(Sample {
                t_s: 0.0,
                rss_bytes: field("VmRSS:")? * 1024.0,
                open_fds: fds as f64,
                threads: field("Threads:")?,
            })
        }
        Source::Metrics(t) => {
            let m = server_metrics(t)?;
            let get = |k: &str| m.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
            Some(Sample {
                t_s: 0.0,
                rss_bytes: get("process_resident_memory_bytes")?,
                open_fds: get("process_open_fds").unwrap_or(f64::NAN),
                threads: get("process_threads").unwrap_or(f64::NAN),
            })
        }
    }
}

/// An edgelm server's /metrics as (name, value) pairs (unlabelled series only); None for
/// servers without them.
pub fn server_metrics(t: &Target) -> Option<Vec<(String, f64)>> {
    let (status, body) = t.get("/metrics").ok()?;
    if status != 200 {
        return None;
    }
    let pairs: Vec<(String, f64)> = body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.contains('{'))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect();
    pairs
        .iter()
        .any(|(k, _)| k.starts_with("edgelm_"))
        .then_some(pairs)
}

/// Samples every `every` until stopped.
pub struct Monitor {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

impl Monitor {
    pub fn start(source: Source, every: Duration) -> Monitor {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let start = Instant::now();
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                if let Some(mut s) = sample(&source) {
                    s.t_s = start.elapsed().as_secs_f64();
                    out.push(s);
                }
                let until = Instant::now() + every;
                while Instant::now() < until && !flag.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            out
        });
        Monitor { stop, handle }
    }

    pub fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// Growth from the end of warm-up to the end of the run.
#[derive(Debug, Default, Serialize)]
pub struct Growth {
    pub samples: usize,
    pub rss_at_warmup_mib: f64,
    pub rss_final_mib: f64,
    pub rss_max_mib: f64,
    /// (max after warm-up − at warm-up) / at warm-up, in percent.
    pub rss_growth_pct: f64,
    pub fds_at_warmup: f64,
    pub fds_final: f64,
    pub fds_max: f64,
    pub threads_at_warmup: f64,
    pub threads_final: f64,
    pub threads_max: f64,
}

pub fn growth(samples: &[Sample], warmup_s: f64) -> Option<Growth> {
    let after: Vec<&Sample> = samples.iter().filter(|s| s.t_s >= warmup_s).collect();
    let (first, last) = (*after.first()?, *after.last()?);
    let max = |f: fn(&Sample) -> f64| after.iter().map(|s| f(s)).fold(f64::MIN, f64::max);
    let mib = |b: f64| b / (1 << 20) as f64;
    Some(Growth {
        samples: after.len(),
        rss_at_warmup_mib: mib(first.rss_bytes),
        rss_final_mib: mib(last.rss_bytes),
        rss_max_mib: mib(max(|s| s.rss_bytes)),
        rss_growth_pct: (max(|s| s.rss_bytes) - first.rss_bytes) / first.rss_bytes * 100.0,
        fds_at_warmup: first.open_fds,
        fds_final: last.open_fds,
        fds_max: max(|s| s.open_fds),
        threads_at_warmup: first.threads,
        threads_final: last.threads,
        threads_max: max(|s| s.threads),
    })
}

impl Growth {
    pub fn print(&self) {
        println!(
            "server RSS: {:.1} MiB after warm-up, {:.1} MiB max, {:.1} MiB at the end: growth {:+.2}%",
            self.rss_at_warmup_mib, self.rss_max_mib, self.rss_final_mib, self.rss_growth_pct
        );
        println!(
            "server fds: {} after warm-up, {} max, {} at the end; threads: {} / {} / {}",
            self.fds_at_warmup,
            self.fds_max,
            self.fds_final,
            self.threads_at_warmup,
            self.threads_max,
            self.threads_final
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn growth_is_measured_from_the_end_of_warm_up() {
        let s = |t: f64, rss: f64| Sample {
            t_s: t,
            rss_bytes: rss,
            open_fds: 10.0,
            threads: 5.0,
        };
        let samples = [s(0.0, 50.0), s(10.0, 100.0), s(20.0, 101.0), s(30.0, 100.5)];
        let g = growth(&samples, 5.0).unwrap();
        assert_eq!(g.samples, 3);
        assert!((g.rss_growth_pct - 1.0).abs() < 1e-9);
        assert!(growth(&samples, 40.0).is_none());
    }

    #[test]
    fn reads_this_process() {
        let s = sample(&Source::Pid(std::process::id())).expect("own /proc entry");
        assert!(s.rss_bytes > 0.0 && s.open_fds >= 3.0 && s.threads >= 1.0);
    }
}
