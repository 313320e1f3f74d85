//! Shared helpers for the end-to-end tests: where the model and the reference data live.
#![allow(dead_code)]

mod bert_model;
pub mod embed;
mod gemma_embedding_model;
mod lora_adapters;
mod mmproj_model;
mod nomic_bert_model;
mod server;
mod test_models;

// Each test crate uses a part of these.
#[allow(unused_imports)]
pub use bert_model::{bert_test_model, BERT_CONTEXT};
#[allow(unused_imports)]
pub use gemma_embedding_model::{gemma_embedding_test_model, GEMMA_EMBEDDING_TEST_WINDOW};
#[allow(unused_imports)]
pub use lora_adapters::{test_adapter, AdapterSpec, TEST_ADAPTERS};
#[allow(unused_imports)]
pub use mmproj_model::{test_mmproj, test_vlm_text, MMPROJ_IMAGE_SIZE};
#[allow(unused_imports)]
pub use nomic_bert_model::{nomic_bert_test_model, NOMIC_CONTEXT};
#[allow(unused_imports)]
pub use server::Server;
#[allow(unused_imports)]
pub use test_models::{
    test_model, test_model_cut, GEMMA3_TEST_WINDOW, TEST_ARCHS, TEST_EXPERTS, TEST_EXPERTS_USED,
};

use std::path::{Path, PathBuf};
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

/// Gemma 3 270M (`packaging/fetch-model.sh gemma3`); a missing file fails the test.
pub fn gemma3_path() -> PathBuf {
    let p = repo_root().join("models/gemma-3-270m-Q4_K_M.gguf");
    assert!(
        p.exists(),
        "model {} is missing: run packaging/fetch-model.sh gemma3 first",
        p.display()
    );
    p
}

/// Whether file `a` is at least as new as file `b` (both there).
pub fn is_newer(a: &Path, b: &Path) -> bool {
    let t = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((t(a), t(b)), (Some(x), Some(y)) if x >= y)
}

/// The file at `path`, made by `make` unless it is there and at least as new as each of
/// `sources`, what it is made from: the test models, and the peer's results, which do not
/// change while their inputs do not and would otherwise be made again on every run. Written
/// beside and renamed, so that a test running at the same time never reads half a file and an
/// interrupted run leaves none.
pub fn kept(path: &Path, sources: &[&Path], make: impl FnOnce() -> Vec<u8>) -> PathBuf {
    if !path.exists() || !sources.iter().all(|s| is_newer(path, s)) {
        let dir = path.parent().expect("a file in a folder");
        std::fs::create_dir_all(dir).unwrap();
        let name = path.file_name().unwrap().to_string_lossy();
        // One name per thread: tests of one binary may make the same file at once.
        let thread = format!("{:?}", std::thread::current().id());
        let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
        let tmp = dir.join(format!(".{name}.{}-{thread}.tmp", std::process::id()));
        std::fs::write(&tmp, make()).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }
    path.to_path_buf()
}

/// The peer's reference outputs, kept in the repository (`tests/data`).
pub fn reference_dir() -> PathBuf {
    let p = repo_root().join("tests/data");
    assert!(
        p.join("smollm2-llamacpp.json").exists(),
        "reference data missing at {}",
        p.display()
    );
    p
}

/// A tool of the peer, llama.cpp (scripts/build-peer.sh builds them into target/peer); a
/// missing one fails the test.
pub fn peer_tool(tool: &str) -> PathBuf {
    let p = repo_root().join("target/peer/build/bin").join(tool);
    assert!(
        p.exists(),
        "{} is missing: run scripts/build-peer.sh first",
        p.display()
    );
    p
}

/// The stdout and stderr of the peer tool `cmd` runs, which must succeed; run again (up to
/// four times in all) until `whole` accepts them. The peer prints through a logger whose
/// worker thread it leaves running at exit (llama.cpp's common/log.cpp leaks it on purpose),
/// so lines still queued then are never printed: an output cut short is that race, not a
/// result.
pub fn peer_output(cmd: &mut Command, whole: impl Fn(&str, &str) -> bool) -> (String, String) {
    const TRIES: usize = 4;
    for _ in 0..TRIES {
        let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{cmd:?} failed:\n{stdout}{stderr}");
        if whole(&stdout, &stderr) {
            return (stdout, stderr);
        }
        eprintln!("{cmd:?}: output cut short, run again");
    }
    panic!("{cmd:?}: output cut short {TRIES} times");
}

/// [`peer_output`]'s stdout and stderr as one text, whole once it holds `marker`.
pub fn peer_output_holding(cmd: &mut Command, marker: &str) -> String {
    let (out, err) = peer_output(cmd, |out, err| out.contains(marker) || err.contains(marker));
    out + &err
}

/// The perplexity `llama-perplexity`, run by `cmd`, prints as its final estimate (run again
/// while its output is cut short before that line).
pub fn peer_final_perplexity(cmd: &mut Command) -> f64 {
    const FINAL: &str = "Final estimate: PPL = ";
    let all = peer_output_holding(cmd, FINAL);
    all.lines()
        .find_map(|l| l.split(FINAL).nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no final estimate in:\n{all}"))
}

pub fn reference() -> serde_json::Value {
    let text = std::fs::read_to_string(reference_dir().join("smollm2-llamacpp.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The peer's greedy case with a top-2 margin of at least 0.5 nats at every token: greedy
/// text may leave the peer's only where it hesitated (docs/numerics.md), so on this one any
/// correct engine gives the peer's text exactly.
pub fn confident_case() -> serde_json::Value {
    let reference = reference();
    reference["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .find(|case| {
            case["top5"]
                .as_array()
                .unwrap()
                .iter()
                .all(|top| top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap() >= 0.5)
        })
        .expect("a reference case without a near-tie")
        .clone()
}

/// An empty folder of a test's own: target/test-artifacts/`name`.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = repo_root().join("target/test-artifacts").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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

/// The reference model re-written with `edit` applied to its metadata and tensors (each
/// given as (name, ggml dims, type, bytes)): for files a converter would not make.
pub fn edited_model(
    name: &str,
    edit: impl FnOnce(
        &mut Vec<(String, edgelm::gguf::Value)>,
        &mut Vec<(String, Vec<u64>, edgelm::quant::GgmlType, Vec<u8>)>,
    ),
) -> PathBuf {
    edited_copy(&model_path(), name, edit)
}

/// A tensor as the edit functions see it: name, ggml dims, type, bytes.
pub type TensorEntry = (String, Vec<u64>, edgelm::quant::GgmlType, Vec<u8>);

/// A copy of `source` with its metadata and tensors edited by `edit`, written as
/// target/test-artifacts/`name`.
pub fn edited_copy(
    source: &Path,
    name: &str,
    edit: impl FnOnce(
        &mut Vec<(String, edgelm::gguf::Value)>,
        &mut Vec<(String, Vec<u64>, edgelm::quant::GgmlType, Vec<u8>)>,
    ),
) -> PathBuf {
    let file = edgelm::gguf::GgufFile::open(source).unwrap();
    let mut kvs: Vec<(String, edgelm::gguf::Value)> = file.metadata().to_vec();
    let mut tensors: Vec<_> = file
        .tensors()
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                t.dims.clone(),
                t.ty,
                file.tensor_data(t).to_vec(),
            )
        })
        .collect();
    edit(&mut kvs, &mut tensors);
    let mut w = edgelm::gguf::GgufWriter::new();
    for (k, v) in kvs {
        w = w.kv(k, v);
    }
    for (n, dims, ty, bytes) in tensors {
        w = w.tensor(n, &dims, ty, bytes);
    }
    let dir = repo_root().join("target/test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, w.to_bytes()).unwrap();
    path
}
