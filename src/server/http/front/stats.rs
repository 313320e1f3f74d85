//! The front's counters, exported in /metrics beside the engine's.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters the front thread bumps and /metrics reads (relaxed: each is independent).
#[derive(Default)]
pub struct FrontStats {
    pub accepted: AtomicU64,
    /// Connections the front holds now (every open connection: reading a request, answering
    /// it, kept alive, or waiting on the rejection pacer).
    pub open: AtomicU64,
    /// Closed at accept: over `max_connections`.
    pub rejected_cap: AtomicU64,
    /// Closed at accept: the process was out of descriptors.
    pub rejected_fds: AtomicU64,
    pub timeout_header: AtomicU64,
    pub timeout_body: AtomicU64,
    pub timeout_idle: AtomicU64,
    /// 429: admission would refuse (answered from the head, body unread).
    pub rejected_overloaded: AtomicU64,
    /// 429: the client's token bucket was empty.
    pub rejected_client_rate: AtomicU64,
    /// 503: every handler busy and its queue full.
    pub rejected_busy: AtomicU64,
    /// 429: admitted, queued without a first token, shed under a flood.
    pub shed: AtomicU64,
    /// Refusals that waited for the rejection pacer.
    pub deferred: AtomicU64,
}

pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl FrontStats {
    /// Prometheus text, in the format of `metrics::render`.
    pub fn render(&self, out: &mut String) {
        let v = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let mut family = |name: &str, kind: &str, help: &str, rows: &[(&str, u64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, n) in rows {
                let _ = writeln!(out, "{name}{labels} {n}");
            }
        };
        family(
            "edgelm_http_connections_accepted_total",
            "counter",
            "TCP connections accepted.",
            &[("", v(&self.accepted))],
        );
        family(
            "edgelm_http_connections_open",
            "gauge",
            "Open connections (reading a request, answering it, kept alive, or waiting for a refusal).",
            &[("", v(&self.open))],
        );
        family(
            "edgelm_http_connections_rejected_total",
            "counter",
            "Connections closed as soon as accepted: over server.max_connections (cap), or no descriptor left (fds).",
            &[
                ("{reason=\"cap\"}", v(&self.rejected_cap)),
                ("{reason=\"fds\"}", v(&self.rejected_fds)),
            ],
        );
        family(
            "edgelm_http_timeouts_total",
            "counter",
            "Connections closed for a timeout: request head (header), request body (body), kept-alive or unread response (idle).",
            &[
                ("{phase=\"header\"}", v(&self.timeout_header)),
                ("{phase=\"body\"}", v(&self.timeout_body)),
                ("{phase=\"idle\"}", v(&self.timeout_idle)),
            ],
        );
        family(
            "edgelm_http_rejected_total",
            "counter",
            "Requests refused from their head, before the body was read: admission would refuse (overloaded, 429), the client's token bucket was empty (client_rate, 429), every handler busy (busy, 503); and admitted requests shed from the queue under a flood before their first token (shed, 429).",
            &[
                ("{reason=\"overloaded\"}", v(&self.rejected_overloaded)),
                ("{reason=\"client_rate\"}", v(&self.rejected_client_rate)),
                ("{reason=\"busy\"}", v(&self.rejected_busy)),
                ("{reason=\"shed\"}", v(&self.shed)),
            ],
        );
        family(
            "edgelm_http_rejections_deferred_total",
            "counter",
            "Refusals held back by server.max_rejections_per_s before they were answered.",
            &[("", v(&self.deferred))],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_help_and_type() {
        let s = FrontStats::default();
        bump(&s.timeout_header);
        bump(&s.rejected_cap);
        let mut out = String::new();
        s.render(&mut out);
        assert!(out.contains("# TYPE edgelm_http_timeouts_total counter\n"));
        assert!(out.contains("edgelm_http_timeouts_total{phase=\"header\"} 1\n"));
        assert!(out.contains("edgelm_http_connections_rejected_total{reason=\"cap\"} 1\n"));
        assert!(out.contains("edgelm_http_rejected_total{reason=\"client_rate\"} 0\n"));
        for line in out.lines().filter(|l| l.starts_with("# TYPE")) {
            let name = line.split(' ').nth(2).unwrap();
            assert!(
                name.ends_with("_total") == line.ends_with("counter"),
                "{line}"
            );
        }
    }
}
