//! `/v1/embeddings`' numbers against llama.cpp's `llama-embedding` on the same GGUF: the
//! reference model with `llama.pooling_type` set (mean, last; last with EOS added to every
//! input, as Qwen3-Embedding's GGUFs ask), 50+ texts (short and long,
//! several languages and scripts, code; the long ones take two prefill chunks), each
//! embedded by edgelm's engine (all submitted at once, so they share steps) and by the peer.
//! Bar: cosine similarity ≥ 0.999 per text, and the same nearest neighbour for every text.

mod common;

use common::embed::{assert_close, assert_cosines, edgelm_embeddings, peer_embedding, SEP};
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

/// The reference model as a last-token embedding model is shipped (Qwen3-Embedding's GGUFs):
/// pooled on its last token, with `tokenizer.ggml.add_eos_token` set, so that every input
/// ends with EOS and that is the token pooled.
fn last_token_model(name: &str) -> PathBuf {
    edited_model(name, |kvs, _| {
        kvs.retain(|(k, _)| k != "llama.pooling_type" && k != "tokenizer.ggml.add_eos_token");
        kvs.push(("llama.pooling_type".into(), Value::U32(3)));
        kvs.push(("tokenizer.ggml.add_eos_token".into(), Value::Bool(true)));
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

/// The peer's embeddings of `texts` (L2-normalised, its default) and its tokens, one run per
/// text: given several, `llama-embedding` packs them into one batch, and its own vectors then
/// move with the batch (a text's last-token vector by a cosine of 0.992 from the one it gets
/// alone), while edgelm's do not.
fn peer_embeddings(model: &Path, texts: &[String]) -> Vec<(Vec<u32>, Vec<f64>)> {
    texts
        .iter()
        .map(|t| {
            let p = peer_embedding(model, t, 2048);
            (p.tokens, p.vector)
        })
        .collect()
}

/// The comparisons run one at a time: each keeps every core busy (the peer's threads, then
/// the engine's), and two at once on a small machine take several times as long.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Compares edgelm with the peer on `model`: the same tokens, and vectors within the bar
/// (with `neighbours`, also the same nearest neighbours).
fn matches_the_peer(model: &Path, name: &str, neighbours: bool) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let texts = texts();
    assert!(texts.len() >= 50, "only {} texts", texts.len());
    let (peer_tokens, peer): (Vec<_>, Vec<_>) = peer_embeddings(model, &texts).into_iter().unzip();
    let (tokens, ours) = edgelm_embeddings(model, &texts);
    for (i, (p, o)) in peer_tokens.iter().zip(&tokens).enumerate() {
        assert_eq!(p, o, "{name}: text {i} ({:?}): tokens differ", texts[i]);
    }
    match neighbours {
        true => assert_close(name, &texts, &ours, &peer),
        false => assert_cosines(name, &texts, &ours, &peer),
    }
}

#[test]
fn mean_pooling_matches_llama_embedding() {
    matches_the_peer(&pooled_model(1, "smollm2-pooling-mean.gguf"), "mean", true);
}

#[test]
fn last_token_pooling_matches_llama_embedding() {
    matches_the_peer(&pooled_model(3, "smollm2-pooling-last.gguf"), "last", true);
}

#[test]
fn last_token_pooling_after_an_added_eos_matches_llama_embedding() {
    let model = last_token_model("smollm2-pooling-last-eos.gguf");
    let tokenizer =
        edgelm::tokenizer::Tokenizer::from_gguf(&edgelm::gguf::GgufFile::open(&model).unwrap())
            .unwrap();
    let ids = tokenizer.encode("hello", true).unwrap();
    assert_eq!(
        ids.last().copied(),
        tokenizer.eos,
        "every input ends with EOS"
    );
    // Every text's vector is the state at the same token (EOS) of a model not trained to
    // embed: the vectors crowd together, their nearest neighbours are ties within the bar's
    // noise, and only tokens and cosines are compared (the other two tests hold neighbours).
    matches_the_peer(&model, "last after EOS", false);
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
