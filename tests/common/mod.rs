//! Shared helpers for the end-to-end tests: where the model and the reference data live.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The reference model; a missing file fails the test (never a silent pass).
pub fn model_path() -> PathBuf {
    let p = std::env::var_os("EDGELM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"));
    assert!(
        p.exists(),
        "model {} is missing: run packaging/fetch-model.sh first",
        p.display()
    );
    p
}

/// `../shared/reference/` beside the checkout (or `EDGELM_REFERENCE_DIR`).
pub fn reference_dir() -> PathBuf {
    let p = std::env::var_os("EDGELM_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("../shared/reference"));
    assert!(
        p.join("smollm2-llamacpp.json").exists(),
        "reference data missing at {}",
        p.display()
    );
    p
}

pub fn reference() -> serde_json::Value {
    let text = std::fs::read_to_string(reference_dir().join("smollm2-llamacpp.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

pub fn edgelm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_edgelm"))
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("edgelm runs");
    assert!(
        out.status.success(),
        "edgelm failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn ids_of(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}
