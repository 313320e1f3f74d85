//! `edgelm doctor`: field diagnostics a technician runs on a box. Every check prints
//! `pass|warn|fail  name: reason` (plus a hint for warn/fail); `--json` prints one object;
//! `--bundle` writes a support tarball. The exit code is non-zero when any check fails.

mod bundle;
mod model;
mod projector;
mod service;
mod system;

use crate::cli::DoctorArgs;
use anyhow::Result;
use edgelm::config::Profile;
use serde_json::{json, Map, Value};
use std::path::PathBuf;

/// Where the service looks for its profile when none is given.
const DEFAULT_PROFILE: &str = "/etc/edgelm/profile.toml";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Pass,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub status: Status,
    pub reason: String,
    pub hint: String,
    pub details: Map<String, Value>,
}

impl Check {
    pub fn new(name: impl Into<String>) -> Check {
        Check {
            name: name.into(),
            status: Status::Pass,
            reason: String::new(),
            hint: String::new(),
            details: Map::new(),
        }
    }
    pub fn pass(mut self, reason: impl Into<String>) -> Check {
        self.status = Status::Pass;
        self.reason = reason.into();
        self
    }
    pub fn warn(mut self, reason: impl Into<String>, hint: impl Into<String>) -> Check {
        self.status = Status::Warn;
        self.reason = reason.into();
        self.hint = hint.into();
        self
    }
    pub fn fail(mut self, reason: impl Into<String>, hint: impl Into<String>) -> Check {
        self.status = Status::Fail;
        self.reason = reason.into();
        self.hint = hint.into();
        self
    }
    pub fn detail(&mut self, key: &str, value: impl Into<Value>) {
        self.details.insert(key.to_owned(), value.into());
    }
}

/// What the checks share: the profile (or defaults), where it came from, and the model path.
pub struct Context {
    pub profile: Profile,
    /// The profile file used, if any (None: defaults).
    pub profile_path: Option<PathBuf>,
    /// Why the profile could not be used (None when it loaded or there was none).
    pub profile_error: Option<String>,
    pub model_path: PathBuf,
    /// MemTotal / MemAvailable in bytes, when /proc/meminfo was readable.
    pub mem: Option<system::MemInfo>,
}

pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    pub fn to_json(&self) -> Value {
        let checks: Vec<Value> = self
            .checks
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "status": c.status.as_str(),
                    "reason": c.reason,
                    "hint": c.hint,
                    "details": Value::Object(c.details.clone()),
                })
            })
            .collect();
        json!({"ok": self.ok(), "checks": checks})
    }

    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!(
                "{}  {}: {}\n",
                c.status.as_str(),
                c.name,
                c.reason
            ));
            if c.status != Status::Pass && !c.hint.is_empty() {
                out.push_str(&format!("      hint: {}\n", c.hint));
            }
        }
        let count = |s: Status| self.checks.iter().filter(|c| c.status == s).count();
        out.push_str(&format!(
            "doctor: {} pass, {} warn, {} fail\n",
            count(Status::Pass),
            count(Status::Warn),
            count(Status::Fail)
        ));
        out
    }
}

/// Loads the profile the way the service would: --config, else the default path, else defaults.
fn context(args: &DoctorArgs) -> Context {
    let candidate = args.config.clone().or_else(|| {
        let p = PathBuf::from(DEFAULT_PROFILE);
        p.exists().then_some(p)
    });
    let (profile, profile_error) = match &candidate {
        Some(p) => match Profile::load(p) {
            Ok(profile) => (profile, None),
            Err(e) => (
                Profile::default(),
                Some(format!("{e:#}").replace('\n', " ")),
            ),
        },
        None => (Profile::default(), None),
    };
    let model_path = args
        .model
        .clone()
        .unwrap_or_else(|| profile.model.path.clone());
    Context {
        profile,
        profile_path: candidate,
        profile_error,
        model_path,
        mem: system::read_meminfo(),
    }
}

/// Runs every check in a fixed order.
pub fn diagnose(args: &DoctorArgs) -> (Context, Report) {
    let ctx = context(args);
    let mut checks = vec![
        system::cpu(),
        system::memory(&ctx),
        system::disk(&ctx),
        system::gpu(&ctx),
        system::jetson(),
    ];
    let (model_check, parsed) = model::model(&ctx);
    checks.push(model_check);
    // The profile's further models (`[[models]]`), unless --model named the one to check.
    if ctx.model_path == ctx.profile.model.path {
        let further = ctx
            .profile
            .models
            .iter()
            .map(|m| model::further_model(&ctx, m));
        checks.extend(further.collect::<Vec<_>>());
    }
    checks.push(service::profile(&ctx));
    checks.push(model::kv_plan(&ctx, parsed.as_ref()));
    checks.push(service::port(&ctx));
    checks.push(model::self_test(&ctx, parsed.is_some()));
    checks.extend(projector::projectors(&ctx));
    (ctx, Report { checks })
}

/// Returns whether every check passed or warned (main exits 1 otherwise).
pub fn run(args: DoctorArgs) -> Result<bool> {
    let (ctx, report) = diagnose(&args);
    let secrets = bundle::secrets(&ctx);
    let text = bundle::scrub(&report.to_text(), &secrets);
    let json = bundle::scrub(&serde_json::to_string_pretty(&report.to_json())?, &secrets);
    if args.json {
        println!("{json}");
    } else {
        print!("{text}");
    }
    std::io::Write::flush(&mut std::io::stdout())?;
    if let Some(out) = &args.bundle {
        bundle::write(out, &ctx, &text, &json, &secrets)?;
        eprintln!("support bundle written to {}", out.display());
    }
    Ok(report.ok())
}

/// Bytes as MiB/GiB for reasons.
pub fn human(bytes: u64) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    const MIB: f64 = (1u64 << 20) as f64;
    let b = bytes as f64;
    if b >= GIB {
        format!("{:.1} GiB", b / GIB)
    } else {
        format!("{:.0} MiB", b / MIB)
    }
}
