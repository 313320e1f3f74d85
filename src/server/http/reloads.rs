//! How the reloads (`reload`) went since start: counted by result, the last failure kept while
//! no reload has succeeded since, and their Prometheus series.

/// How the reloads went since start.
#[derive(Default, Debug, Clone)]
pub struct Reloads {
    pub done: u64,
    pub unchanged: u64,
    pub failed: u64,
    /// Why the last reload failed, while no reload has succeeded since.
    pub last_error: Option<String>,
}

impl Reloads {
    /// Their Prometheus series.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write;
        out.push_str(
            "# HELP edgelm_reloads_total Reloads asked for (SIGHUP, POST /admin/reload), by \
             result.\n# TYPE edgelm_reloads_total counter\n",
        );
        for (result, n) in [
            ("reloaded", self.done),
            ("unchanged", self.unchanged),
            ("failed", self.failed),
        ] {
            let _ = writeln!(out, "edgelm_reloads_total{{result=\"{result}\"}} {n}");
        }
        let _ = write!(
            out,
            "# HELP edgelm_reload_failed 1 while the last reload failed (the models loaded \
             before it serve).\n# TYPE edgelm_reload_failed gauge\nedgelm_reload_failed {}\n",
            u8::from(self.last_error.is_some())
        );
    }
}
