//! Firmware profiles: one TOML file per device class. Every key is optional (defaults below);
//! unknown keys and out-of-range values are errors that name the key and its line.

use crate::kv::KvType;
use serde::Deserialize;
use std::path::{Path, PathBuf};

#[derive(Deserialize, Debug, Clone, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    pub model: ModelSection,
    pub server: ServerSection,
    pub engine: EngineSection,
    pub log: LogSection,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    pub path: PathBuf,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct ServerSection {
    pub host: String,
    pub port: u16,
    /// Name of the environment variable holding the API key ("" for none).
    pub api_key_env: String,
    pub max_queue: usize,
    pub body_limit_kib: usize,
    pub drain_seconds: u64,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct EngineSection {
    pub backend: String,
    /// 0: all available cores.
    pub threads: usize,
    pub kv_type: KvType,
    pub kv_memory_mib: usize,
    pub block_size: usize,
    pub max_seqs: usize,
    pub max_batched_tokens: usize,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    pub level: String,
}

impl Default for ModelSection {
    fn default() -> Self {
        ModelSection {
            path: PathBuf::from("models/SmolLM2-135M-Instruct.Q4_1.gguf"),
        }
    }
}

impl Default for ServerSection {
    fn default() -> Self {
        ServerSection {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key_env: "EDGELM_API_KEY".into(),
            max_queue: 64,
            body_limit_kib: 1024,
            drain_seconds: 30,
        }
    }
}

impl Default for EngineSection {
    fn default() -> Self {
        EngineSection {
            backend: "cpu".into(),
            threads: 0,
            kv_type: KvType::F16,
            kv_memory_mib: 256,
            block_size: 16,
            max_seqs: 16,
            max_batched_tokens: 512,
        }
    }
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: "info".into(),
        }
    }
}

impl Profile {
    pub fn load(path: &Path) -> anyhow::Result<Profile> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read profile {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
    }

    /// Parses and validates; errors name the key and the line.
    pub fn parse(text: &str) -> Result<Profile, String> {
        let profile: Profile = toml::from_str(text).map_err(|e| one_line(&e.to_string()))?;
        let line_of = |key: &str| {
            text.lines()
                .position(|l| {
                    l.trim_start().starts_with(key)
                        && l.trim_start()[key.len()..].trim_start().starts_with('=')
                })
                .map(|i| format!(" (line {})", i + 1))
                .unwrap_or_default()
        };
        let bad = |key: &str, why: &str| {
            Err(format!(
                "{key}{}: {why}",
                line_of(key.rsplit('.').next().unwrap_or(key))
            ))
        };
        let e = &profile.engine;
        let s = &profile.server;
        if !matches!(e.backend.as_str(), "cpu" | "cuda" | "auto") {
            return bad("engine.backend", "must be \"cpu\", \"cuda\" or \"auto\"");
        }
        if e.threads > 1024 {
            return bad("engine.threads", "must be 0 (all cores) to 1024");
        }
        if e.kv_memory_mib == 0 || e.kv_memory_mib > 1 << 20 {
            return bad("engine.kv_memory_mib", "must be 1 to 1048576");
        }
        if !(1..=256).contains(&e.block_size) {
            return bad("engine.block_size", "must be 1 to 256 tokens");
        }
        if !(1..=1024).contains(&e.max_seqs) {
            return bad("engine.max_seqs", "must be 1 to 1024");
        }
        if !(1..=65_536).contains(&e.max_batched_tokens) {
            return bad("engine.max_batched_tokens", "must be 1 to 65536");
        }
        if s.port == 0 {
            return bad("server.port", "must be 1 to 65535");
        }
        if s.host.is_empty() {
            return bad("server.host", "must not be empty");
        }
        if s.max_queue > 100_000 {
            return bad("server.max_queue", "must be at most 100000");
        }
        if !(1..=1 << 20).contains(&s.body_limit_kib) {
            return bad("server.body_limit_kib", "must be 1 to 1048576");
        }
        if s.drain_seconds > 3600 {
            return bad("server.drain_seconds", "must be at most 3600");
        }
        if !matches!(
            profile.log.level.as_str(),
            "error" | "warn" | "info" | "debug" | "trace"
        ) {
            return bad("log.level", "must be error, warn, info, debug or trace");
        }
        if profile.model.path.as_os_str().is_empty() {
            return bad("model.path", "must not be empty");
        }
        Ok(profile)
    }
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "|")
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_errors_name_the_key() {
        let p = Profile::parse("").unwrap();
        assert_eq!(p.server.port, 8080);
        let err = Profile::parse("[engine]\nmax_seqs = 0\n").unwrap_err();
        assert!(
            err.contains("engine.max_seqs") && err.contains("line 2"),
            "{err}"
        );
        let err = Profile::parse("[engine]\nkv_typo = 1\n").unwrap_err();
        assert!(err.contains("kv_typo") && err.contains("line 2"), "{err}");
        let err = Profile::parse("[engine]\nkv_type = \"q3\"\n").unwrap_err();
        assert!(err.contains("q3"), "{err}");
    }
}
