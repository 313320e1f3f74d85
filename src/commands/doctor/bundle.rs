//! `--bundle OUT.tar.gz`: the report, the redacted profile, service logs, a /metrics snapshot
//! and the version, for a support ticket. No secret value may reach the archive: the API key
//! (from the variable the profile names) and any key-like profile value are scrubbed from
//! every file.

use super::system::run_with_timeout;
use super::{service, Context};
use anyhow::{Context as _, Result};
use std::path::Path;
use std::time::Duration;

const REDACTED: &str = "[REDACTED]";
/// Directory every bundle entry sits under.
const ROOT: &str = "edgelm-doctor";

fn key_like(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "credential",
        "auth",
    ]
    .iter()
    .any(|w| n.contains(w))
}

/// `name = value` of a TOML line (value unquoted), if the line is a plain assignment.
fn assignment(line: &str) -> Option<(&str, &str)> {
    let t = line.trim_start();
    if t.starts_with('#') || t.starts_with('[') {
        return None;
    }
    let (k, v) = t.split_once('=')?;
    let k = k.trim().trim_matches('"').trim_matches('\'');
    let v = v.trim();
    // Drop a trailing comment after a quoted value.
    let v = if let Some(rest) = v.strip_prefix('"') {
        rest.split('"').next().unwrap_or("")
    } else if let Some(rest) = v.strip_prefix('\'') {
        rest.split('\'').next().unwrap_or("")
    } else {
        v.split('#').next().unwrap_or("").trim()
    };
    Some((k, v))
}

/// Values that must never appear in the bundle or the report: the API key from the environment
/// (the variable the profile names, and the default one) and literal key-like profile values.
pub fn secrets(ctx: &Context) -> Vec<String> {
    let mut vars = vec![
        ctx.profile.server.api_key_env.clone(),
        "EDGELM_API_KEY".to_owned(),
    ];
    let mut out = Vec::new();
    let raw = ctx
        .profile_path
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .unwrap_or_default();
    for (k, v) in raw.lines().filter_map(assignment) {
        if !key_like(k) || v.is_empty() {
            continue;
        }
        if k.ends_with("_env") {
            vars.push(v.to_owned());
        } else {
            out.push(v.to_owned());
        }
    }
    for var in vars.iter().filter(|v| !v.is_empty()) {
        if let Some(val) = std::env::var_os(var) {
            out.push(val.to_string_lossy().into_owned());
        }
    }
    // Very short values would scrub ordinary text; nothing that short is a real key.
    out.retain(|s| s.len() >= 4);
    out.sort_by_key(|s| std::cmp::Reverse(s.len()));
    out.dedup();
    out
}

/// Replaces every secret and every `Bearer <token>` in `text`.
pub fn scrub(text: &str, secrets: &[String]) -> String {
    let mut s = text.to_owned();
    for secret in secrets {
        s = s.replace(secret.as_str(), REDACTED);
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s.as_str();
    while let Some(i) = rest.to_ascii_lowercase().find("bearer ") {
        let after = i + "bearer ".len();
        out.push_str(&rest[..after]);
        let tail = &rest[after..];
        let end = tail
            .find(|c: char| c.is_whitespace() || c == '"' || c == '\'')
            .unwrap_or(tail.len());
        if end > 0 {
            out.push_str(REDACTED);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// The profile with key-like values replaced (the `*_env` names of variables stay: they are
/// not secrets), then scrubbed.
pub fn redact_profile(text: &str, secrets: &[String]) -> String {
    let lines: Vec<String> = text
        .lines()
        .map(|line| match assignment(line) {
            Some((k, _)) if key_like(k) && !k.ends_with("_env") => {
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}{k} = \"{REDACTED}\"")
            }
            _ => line.to_owned(),
        })
        .collect();
    scrub(&(lines.join("\n") + "\n"), secrets)
}

fn service_logs() -> String {
    run_with_timeout(
        "journalctl",
        &["-u", "edgelm", "-n", "1000", "--no-pager"],
        Duration::from_secs(20),
    )
    .unwrap_or_else(|| {
        "journalctl is not available here (or failed): no service logs collected.\n".to_owned()
    })
}

fn metrics(ctx: &Context) -> String {
    let s = &ctx.profile.server;
    let Some(addr) = service::connect_addr(&s.host, s.port) else {
        return format!("cannot resolve {}:{}\n", s.host, s.port);
    };
    let key = (!s.api_key_env.is_empty())
        .then(|| std::env::var(&s.api_key_env).ok())
        .flatten()
        .filter(|k| !k.is_empty());
    match service::http_get(addr, "/metrics", key.as_deref()) {
        Ok((200, body)) => body,
        Ok((code, body)) => format!("GET http://{addr}/metrics answered {code}:\n{body}\n"),
        Err(e) => format!("no service answered http://{addr}/metrics: {e}\n"),
    }
}

fn version() -> String {
    format!(
        "edgelm {}\ntarget {}-{}\nkernels {} (gemm {})\ncuda feature {}\n",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::ARCH,
        std::env::consts::OS,
        edgelm::quant::simd_level(),
        edgelm::quant::gemm_level(),
        cfg!(feature = "cuda"),
    )
}

pub fn write(out: &Path, ctx: &Context, text: &str, json: &str, secrets: &[String]) -> Result<()> {
    let profile = match &ctx.profile_path {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => (
                "profile.toml",
                format!(
                    "# {} (secrets redacted)\n{}",
                    p.display(),
                    redact_profile(&t, secrets)
                ),
            ),
            Err(e) => ("profile.txt", format!("cannot read {}: {e}\n", p.display())),
        },
        None => ("profile.txt", "no profile; defaults were used\n".to_owned()),
    };
    let files: Vec<(&str, String)> = vec![
        ("doctor.txt", text.to_owned()),
        ("doctor.json", json.to_owned() + "\n"),
        profile,
        ("service.log", service_logs()),
        ("metrics.txt", metrics(ctx)),
        ("version.txt", version()),
    ];
    let file =
        std::fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let mtime = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    for (name, content) in files {
        let content = scrub(&content, secrets);
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(mtime);
        header.set_cksum();
        tar.append_data(&mut header, format!("{ROOT}/{name}"), content.as_bytes())
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    tar.into_inner()?
        .finish()
        .with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_redaction_keeps_env_names_and_hides_values() {
        let text = "[server]\napi_key_env = \"EDGELM_API_KEY\"\n  api_key = \"hunter22\" # x\nport = 8080\n";
        let r = redact_profile(text, &[]);
        assert!(r.contains("api_key_env = \"EDGELM_API_KEY\""), "{r}");
        assert!(!r.contains("hunter22"), "{r}");
        assert!(r.contains("  api_key = \"[REDACTED]\""), "{r}");
        assert!(r.contains("port = 8080"), "{r}");
    }

    #[test]
    fn scrub_hides_secrets_and_bearer_tokens() {
        let s = scrub(
            "key=s3cret-value; Authorization: Bearer abc.def\nbearer  x",
            &["s3cret-value".to_owned()],
        );
        assert_eq!(
            s,
            "key=[REDACTED]; Authorization: Bearer [REDACTED]\nbearer  x"
        );
    }
}
