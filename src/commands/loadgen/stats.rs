//! Percentiles and the run's report.

use super::client::{Outcome, Record};
use serde::Serialize;
use std::collections::BTreeMap;

/// p50/p95/p99 (nearest rank) of a set of seconds.
#[derive(Clone, Copy, Debug, Default, Serialize, PartialEq)]
pub struct Percentiles {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
}

impl Percentiles {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Percentiles {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return Percentiles::default();
        }
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Percentiles {
            count: v.len(),
            p50: rank(0.50),
            p95: rank(0.95),
            p99: rank(0.99),
            max: v[v.len() - 1],
        }
    }

    pub fn line(&self, name: &str) -> String {
        if self.count == 0 {
            return format!("{name:<22} (none)");
        }
        format!(
            "{name:<22} p50 {:>8.1} ms  p95 {:>8.1} ms  p99 {:>8.1} ms  max {:>8.1} ms  (n={})",
            self.p50 * 1e3,
            self.p95 * 1e3,
            self.p99 * 1e3,
            self.max * 1e3,
            self.count
        )
    }
}

/// What a load run measured.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub duration_s: f64,
    pub sent: usize,
    pub ok: usize,
    /// Hang-ups the workload planned (not failures).
    pub disconnected: usize,
    /// Everything else, by kind.
    pub failed: usize,
    pub errors: BTreeMap<String, usize>,
    pub requests_per_s: f64,
    pub output_tokens_per_s: f64,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub ttft: Percentiles,
    pub ttft_long_prompts: Percentiles,
    pub itl: Percentiles,
    pub latency_non_stream: Percentiles,
}

impl Report {
    pub fn from_records(records: &[Record], duration_s: f64) -> Report {
        let mut r = Report {
            duration_s,
            sent: records.len(),
            ..Report::default()
        };
        for rec in records {
            match &rec.outcome {
                Outcome::Ok => r.ok += 1,
                Outcome::Disconnected => r.disconnected += 1,
                Outcome::Failed(kind) => {
                    r.failed += 1;
                    *r.errors.entry(kind.clone()).or_default() += 1;
                }
            }
            r.prompt_tokens += rec.prompt_tokens.unwrap_or(0);
            r.completion_tokens += rec.completion_tokens;
        }
        r.ttft = Percentiles::of(records.iter().filter(|x| !x.long).filter_map(|x| x.ttft));
        r.ttft_long_prompts =
            Percentiles::of(records.iter().filter(|x| x.long).filter_map(|x| x.ttft));
        r.itl = Percentiles::of(records.iter().flat_map(|x| x.itl.iter().copied()));
        r.latency_non_stream = Percentiles::of(
            records
                .iter()
                .filter(|x| !x.stream && x.outcome == Outcome::Ok)
                .map(|x| x.latency),
        );
        r.requests_per_s = r.ok as f64 / duration_s.max(1e-9);
        r.output_tokens_per_s = r.completion_tokens as f64 / duration_s.max(1e-9);
        r
    }

    pub fn print(&self) {
        println!(
            "requests: {} sent, {} ok, {} disconnected by design, {} failed   ({:.1} s)",
            self.sent, self.ok, self.disconnected, self.failed, self.duration_s
        );
        for (kind, n) in &self.errors {
            println!("  error {kind}: {n}");
        }
        println!(
            "throughput: {:.2} req/s, {:.1} output tok/s ({} prompt + {} completion tokens)",
            self.requests_per_s,
            self.output_tokens_per_s,
            self.prompt_tokens,
            self.completion_tokens
        );
        println!("{}", self.ttft.line("TTFT (streams)"));
        println!("{}", self.ttft_long_prompts.line("TTFT (long prompts)"));
        println!("{}", self.itl.line("inter-token latency"));
        println!("{}", self.latency_non_stream.line("latency (non-stream)"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let p = Percentiles::of((1..=100).map(|x| x as f64));
        assert_eq!(
            (p.p50, p.p95, p.p99, p.max, p.count),
            (50.0, 95.0, 99.0, 100.0, 100)
        );
        let one = Percentiles::of([3.0]);
        assert_eq!((one.p50, one.p99), (3.0, 3.0));
        assert_eq!(Percentiles::of([]).count, 0);
    }

    #[test]
    fn report_counts_by_kind() {
        let rec = |outcome: Outcome, tokens: usize| Record {
            index: 0,
            sent_s: 0.0,
            outcome,
            stream: true,
            long: false,
            ttft: Some(0.1),
            itl: vec![0.01, 0.02],
            latency: 0.5,
            prompt_tokens: Some(10),
            completion_tokens: tokens,
            retry_after_s: None,
        };
        let records = vec![
            rec(Outcome::Ok, 4),
            rec(Outcome::Disconnected, 2),
            rec(Outcome::Failed("http_429".into()), 0),
            rec(Outcome::Failed("http_429".into()), 0),
        ];
        let r = Report::from_records(&records, 2.0);
        assert_eq!((r.sent, r.ok, r.disconnected, r.failed), (4, 1, 1, 2));
        assert_eq!(r.errors["http_429"], 2);
        assert_eq!(r.completion_tokens, 6);
        assert_eq!(r.requests_per_s, 0.5);
    }
}
