//! Firmware profiles through the real binary: every shipped profile passes `edgelm config check`,
//! and each one-edit mutation of a valid profile fails with exit 1 naming the key and its line.

mod common;

use common::*;
use std::path::{Path, PathBuf};

/// Every key of the schema; the device profiles set them all.
const KEYS: [&str; 28] = [
    "model.path",
    "server.host",
    "server.port",
    "server.api_key_env",
    "server.max_queue",
    "server.max_queue_wait_s",
    "server.body_limit_kib",
    "server.drain_seconds",
    "server.header_timeout_s",
    "server.body_timeout_s",
    "server.idle_timeout_s",
    "server.max_connections",
    "server.client_rate_per_s",
    "server.client_burst",
    "server.max_rejections_per_s",
    "engine.backend",
    "engine.threads",
    "engine.kv_type",
    "engine.kv_memory_mib",
    "engine.reserve_mib",
    "engine.gpu_reserve_mib",
    "engine.block_size",
    "engine.max_seqs",
    "engine.max_batched_tokens",
    "engine.prefill_pacing",
    "engine.prompt_lookup",
    "engine.state_snapshot_mib",
    "log.level",
];

fn shipped() -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(repo_root().join("firmware-configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    v
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("edgelm-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// (`section.key`, 1-based line) of every assignment in a profile.
fn assignments(text: &str) -> Vec<(String, usize)> {
    let mut section = String::new();
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if let Some(h) = l.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = h.to_string();
        } else if !l.starts_with('#') {
            if let Some((k, _)) = l.split_once('=') {
                out.push((format!("{section}.{}", k.trim()), i + 1));
            }
        }
    }
    out
}

#[test]
fn every_shipped_profile_passes() {
    let profiles = shipped();
    for name in [
        "x86-cpu.toml",
        "orin-nano-8gb.toml",
        "orin-nx-16gb.toml",
        "agx-orin-64gb.toml",
        "discrete-gpu.toml",
    ] {
        assert!(
            profiles.iter().any(|p| p.ends_with(name)),
            "{name} is shipped"
        );
    }
    for p in &profiles {
        let out = run_ok(edgelm().args(["config", "check"]).arg(p));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains(": ok"), "{}: {stdout}", p.display());
    }
    // Several files at once, and the config-check alias.
    let out = run_ok(edgelm().arg("config-check").args(&profiles));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        profiles.len()
    );
}

#[test]
fn shipped_profiles_document_every_key() {
    for p in shipped() {
        let text = std::fs::read_to_string(&p).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let set = assignments(&text);
        for (key, line) in &set {
            assert!(KEYS.contains(&key.as_str()), "{}: {key}", p.display());
            assert!(
                lines[line - 2].trim_start().starts_with('#'),
                "{}: {key} (line {line}) has no comment above it",
                p.display()
            );
        }
        if p.ends_with("x86-cpu.toml") {
            continue;
        }
        // Device profiles: every key set, the model where the package installs it.
        for key in KEYS {
            assert!(
                set.iter().any(|(k, _)| k == key),
                "{}: {key} missing",
                p.display()
            );
        }
        assert!(
            text.contains("path = \"/var/lib/edgelm/models/model.gguf\""),
            "{}",
            p.display()
        );
    }
}

/// One broken profile: `base` with the line assigning `key` replaced by `with` (`None`: `with`
/// appended at the end), expected to fail naming `expect` and the line.
struct Mutation {
    key: &'static str,
    with: &'static str,
    /// What the message must name (usually `key`).
    expect: &'static str,
    /// Lines after the edited one where the error is (a duplicate key: 1).
    line_offset: usize,
    /// Whether the message must carry the line number.
    has_line: bool,
}

const fn m(key: &'static str, with: &'static str) -> Mutation {
    Mutation {
        key,
        with,
        expect: key,
        line_offset: 0,
        has_line: true,
    }
}

fn mutations() -> Vec<Mutation> {
    vec![
        m("server.port", "port = 0"),
        m("server.port", "port = 70000"),
        m("server.port", "port = \"8080\""),
        m("engine.threads", "threads = 5000"),
        m("engine.threads", "threads = -1"),
        m("engine.threads", "threads = \"6\""),
        m("engine.kv_type", "kv_type = \"q3_k\""),
        m("engine.kv_memory_mib", "kv_memory_mib = 0"),
        m("engine.kv_memory_mib", "kv_memory_mib = 1.5"),
        m("engine.reserve_mib", "reserve_mib = -5"),
        m("engine.gpu_reserve_mib", "gpu_reserve_mib = 99999999"),
        m("engine.block_size", "block_size = 0"),
        m("engine.block_size", "block_size = 24"),
        m("engine.block_size", "block_size = 1024"),
        m("engine.max_seqs", "max_seqs = 0"),
        m("engine.max_batched_tokens", "max_batched_tokens = 0"),
        // Below max_seqs (8 in the base profile).
        m("engine.max_batched_tokens", "max_batched_tokens = 4"),
        m("server.max_queue", "max_queue = 1000000"),
        m("server.body_limit_kib", "body_limit_kib = 0"),
        m("server.drain_seconds", "drain_seconds = 100000"),
        m("server.max_queue_wait_s", "max_queue_wait_s = -1.0"),
        m("server.max_queue_wait_s", "max_queue_wait_s = \"5\""),
        m("engine.prefill_pacing", "prefill_pacing = 0.5"),
        m("engine.prefill_pacing", "prefill_pacing = 1000.0"),
        m("engine.prompt_lookup", "prompt_lookup = 33"),
        m("engine.state_snapshot_mib", "state_snapshot_mib = -1"),
        m("engine.backend", "backend = \"tpu\""),
        m("log.level", "level = \"loud\""),
        m("server.host", "host = \"\""),
        m("server.host", "host = \"bad host!\""),
        m("server.api_key_env", "api_key_env = \"EDGELM-API-KEY\""),
        m("model.path", "path = \"\""),
        // A misspelt key.
        Mutation {
            expect: "engine.blocksize",
            ..m("engine.block_size", "blocksize = 16")
        },
        // A key in the wrong section.
        Mutation {
            expect: "engine.port",
            ..m("engine.threads", "port = 8080")
        },
        // A duplicate key: the error is on the second one.
        Mutation {
            line_offset: 1,
            ..m("engine.max_seqs", "max_seqs = 8\nmax_seqs = 9")
        },
        // An unknown section, appended.
        Mutation {
            key: "",
            with: "[extra]\nx = 1",
            expect: "extra",
            line_offset: 0,
            has_line: true,
        },
        // A duplicate section, appended.
        Mutation {
            key: "",
            with: "[engine]\nthreads = 2",
            expect: "engine",
            line_offset: 0,
            has_line: true,
        },
        // Bad TOML syntax: an unterminated string.
        Mutation {
            expect: "line",
            ..m("log.level", "level = \"info")
        },
    ]
}

#[test]
fn broken_profiles_fail_naming_key_and_line() {
    let base_path = repo_root().join("firmware-configs/orin-nano-8gb.toml");
    let base = std::fs::read_to_string(&base_path).unwrap();
    let lines: Vec<&str> = base.lines().collect();
    let set = assignments(&base);
    let dir = temp_dir("profiles");
    let cases = mutations();
    assert!(cases.len() >= 20);
    for (i, c) in cases.iter().enumerate() {
        let (text, line) = if c.key.is_empty() {
            (format!("{base}\n{}\n", c.with), lines.len() + 2)
        } else {
            let line = set
                .iter()
                .find(|(k, _)| k == c.key)
                .unwrap_or_else(|| panic!("{} not in the base profile", c.key))
                .1;
            let mut l: Vec<&str> = lines.clone();
            l[line - 1] = c.with;
            (l.join("\n") + "\n", line + c.line_offset)
        };
        let f = dir.join(format!("broken-{i}.toml"));
        std::fs::write(&f, &text).unwrap();
        let out = edgelm().args(["config", "check"]).arg(&f).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        let what = format!("case {i} ({:?}): {err}", c.with);
        assert_eq!(out.status.code(), Some(1), "{what}");
        assert!(out.stdout.is_empty(), "{what}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {what}");
        assert!(
            err.contains(&*f.to_string_lossy()),
            "names the file: {what}"
        );
        assert!(err.contains(c.expect), "names {}: {what}", c.expect);
        if c.has_line {
            assert!(
                err.contains(&format!("line {line}")),
                "names line {line}: {what}"
            );
        }
        if c.expect.contains('.') {
            assert!(
                err.contains(&format!("{} (line {line}", c.expect)),
                "key then line: {what}"
            );
        }
    }
    // Several files: the good one is reported ok, the run still fails.
    let good = base_path.clone();
    let bad = dir.join("broken-0.toml");
    let out = edgelm()
        .args(["config", "check"])
        .args([&good, &bad])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("orin-nano-8gb.toml: ok"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn missing_file_fails_cleanly() {
    let out = edgelm()
        .args(["config", "check"])
        .arg(Path::new("/nonexistent/profile.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/profile.toml"));
}

#[test]
fn serve_rejects_a_bad_profile_and_bad_overrides() {
    // The same checks run at start-up, before the model is touched.
    let dir = temp_dir("serve");
    let f = dir.join("bad.toml");
    std::fs::write(&f, "[engine]\nblock_size = 12\n").unwrap();
    let out = edgelm()
        .args(["serve", "--config"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("engine.block_size (line 2)"), "{err}");
    // A flag that overrides a valid profile is checked too.
    let out = edgelm()
        .args(["serve", "--max-seqs", "0", "--config"])
        .arg(repo_root().join("firmware-configs/x86-cpu.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("engine.max_seqs"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
