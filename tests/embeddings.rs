//! `/v1/embeddings`' numbers against llama.cpp's `llama-embedding` on the same GGUF: the
//! reference model with `llama.pooling_type` set (mean, last; last with EOS added to every
//! input, as Qwen3-Embedding's GGUFs ask), 50+ texts (short and long, several languages and
//! scripts, code; the long ones take two prefill chunks: `common::embed::texts`), each
//! embedded by edgelm's engine (all submitted at once, so they share steps) and by the peer.
//! Bar: as close as the peer's own variants (its q8_0 cache, its plain attention path) are to
//! it, in cosine per text and on average, and in nearest neighbours (`common::embed`).

mod common;

use common::embed::{assert_matches_peer, texts};
use common::{edited_model, model_path};
use edgelm::gguf::Value;
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
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

/// The longest texts: about two of the engine's 512-token prefill chunks, so that a long
/// input's pooling spans steps.
const LONGEST: usize = 1000;

/// The peer's context (and batch): room for the longest text. A power of two: with a context
/// of 2000, its mean pooling fails an assertion (`ggml_can_mul_mat`).
const PEER_CONTEXT: usize = 2048;

/// The comparisons run one at a time: each keeps every core busy (the peer's threads, then
/// the engine's), and two at once on a small machine take several times as long.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Compares edgelm with the peer on `model` (one peer run per text: given several,
/// `llama-embedding` packs them into one batch, and its own vectors then move with the batch,
/// a text's last-token vector by a cosine of 0.992 from the one it gets alone, while edgelm's
/// do not): the same tokens, and vectors within the bar (with `neighbours`, also the same
/// nearest neighbours).
fn matches_the_peer(model: &Path, name: &str, neighbours: bool, longest: usize) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let tok = Tokenizer::from_gguf(&edgelm::gguf::GgufFile::open(model).unwrap()).unwrap();
    let texts = texts(&tok, longest);
    assert_matches_peer(name, model, &texts, PEER_CONTEXT, neighbours);
}

#[test]
fn mean_pooling_matches_llama_embedding() {
    matches_the_peer(
        &pooled_model(1, "smollm2-pooling-mean.gguf"),
        "mean",
        true,
        LONGEST,
    );
}

#[test]
fn last_token_pooling_matches_llama_embedding() {
    matches_the_peer(
        &pooled_model(3, "smollm2-pooling-last.gguf"),
        "last",
        true,
        LONGEST,
    );
}

#[test]
fn last_token_pooling_after_an_added_eos_matches_llama_embedding() {
    let model = last_token_model("smollm2-pooling-last-eos.gguf");
    let tokenizer = Tokenizer::from_gguf(&edgelm::gguf::GgufFile::open(&model).unwrap()).unwrap();
    let ids = tokenizer.encode("hello", true).unwrap();
    assert_eq!(
        ids.last().copied(),
        tokenizer.eos,
        "every input ends with EOS"
    );
    // Every text's vector is the state at the same token (EOS) of a model not trained to
    // embed: the vectors crowd together, their nearest neighbours are ties within the bar's
    // noise, and only tokens and cosines are compared (the other two tests hold neighbours).
    // Texts of 128 tokens at most: after a long text, that state moves by more than
    // the bar with the order of the sums alone (the peer's, given the text in a batch with
    // others, by a cosine of 0.992; edgelm's, with how its steps happen to split the inputs,
    // by up to 0.9989).
    matches_the_peer(&model, "last after EOS", false, 128);
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
