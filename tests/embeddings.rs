//! `/v1/embeddings`' numbers against llama.cpp's `llama-embedding` on the same GGUF: the
//! reference model with `llama.pooling_type` set (mean, last), 50+ texts (short and long,
//! several languages and scripts, code; the long ones take two prefill chunks), each
//! embedded by edgelm's engine (all submitted at once, so they share steps) and by the peer.
//! Bar: cosine similarity ≥ 0.999 per text, and the same nearest neighbour for every text.

mod common;

use common::embed::{assert_close, edgelm_embeddings, peer_embedding, SEP};
use common::{edited_model, model_path, reference_dir};
use edgelm::gguf::Value;
use edgelm::model::Model;
use std::path::{Path, PathBuf};

/// The reference model with `llama.pooling_type` = `id` (llama.cpp's numbering).
fn pooled_model(id: u32, name: &str) -> PathBuf {
    edited_model(name, |kvs, _| {
        kvs.retain(|(k, _)| k != "llama.pooling_type");
        kvs.push(("llama.pooling_type".into(), Value::U32(id)));
    })
}

/// The texts: the tokenizer cases (many scripts, emoji, code, whitespace), then paragraphs of
/// the GPL, alone and joined into long texts (about 900 tokens: two 512-token prefill chunks).
fn texts() -> Vec<String> {
    let dir = reference_dir();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let cases: Vec<String> = serde_json::from_str(&read("tokenize-cases.json")).unwrap();
    let more: serde_json::Value = serde_json::from_str(&read("cases.json")).unwrap();
    let more = more["tokenize"].as_array().unwrap().iter();
    let paragraphs: Vec<String> = read("gpl-3.txt")
        .split("\n\n")
        .map(|p| p.trim().to_string())
        .filter(|p| p.len() > 300)
        .take(16)
        .collect();
    let long: Vec<String> = paragraphs.chunks(8).map(|c| c.join("\n\n")).collect();
    let mut all: Vec<String> = Vec::new();
    let candidates = cases
        .into_iter()
        .chain(more.map(|v| v.as_str().unwrap().to_string()))
        .chain(paragraphs)
        .chain(long);
    for t in candidates {
        // No text may be empty (a 400 on the API).
        if !t.trim().is_empty() && !all.contains(&t) && !t.contains(SEP) {
            all.push(t);
        }
    }
    all
}

/// The peer's embeddings of `texts` (L2-normalised, its default), one run per text: given
/// several, `llama-embedding` packs them into one batch, and its own vectors then move with
/// the batch (a text's last-token vector by a cosine of 0.992 from the one it gets alone),
/// while edgelm's do not.
fn peer_embeddings(model: &Path, texts: &[String]) -> Vec<Vec<f64>> {
    texts
        .iter()
        .map(|t| peer_embedding(model, t, 2048).vector)
        .collect()
}

/// The comparisons run one at a time: each keeps every core busy (the peer's threads, then
/// the engine's), and two at once on a small machine take several times as long.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Compares edgelm with the peer on the model pooled by `id`.
fn matches_the_peer(id: u32, name: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = pooled_model(id, name);
    let texts = texts();
    assert!(texts.len() >= 50, "only {} texts", texts.len());
    let peer = peer_embeddings(&model, &texts);
    let (_, ours) = edgelm_embeddings(&model, &texts);
    assert_close(name, &texts, &ours, &peer);
}

#[test]
fn mean_pooling_matches_llama_embedding() {
    matches_the_peer(1, "smollm2-pooling-mean.gguf");
}

#[test]
fn last_token_pooling_matches_llama_embedding() {
    matches_the_peer(3, "smollm2-pooling-last.gguf");
}

#[test]
fn unknown_pooling_types_are_refused_and_none_serves_no_embeddings() {
    let bad = pooled_model(9, "smollm2-pooling-9.gguf");
    let err = Model::load(&bad).err().expect("pooling_type 9 is refused");
    assert!(
        format!("{err:#}").contains("llama.pooling_type is 9"),
        "{err:#}"
    );
    let plain = Model::load(&model_path()).unwrap();
    assert_eq!(plain.config.pooling, edgelm::model::Pooling::None);
}
