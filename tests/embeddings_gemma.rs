//! `gemma-embedding` against llama.cpp's `llama-embedding` on the same GGUF (the test model
//! made from Gemma 3 270M, mean-pooled, with dense projections): 50+ texts, short and long
//! (up to the 512 tokens one step computes: most cross the test model's symmetric window of
//! 64 positions either side, several even Gemma 3's 256), several languages and scripts,
//! code, control characters, special tokens written out. Every text's tokens must be the
//! peer's exactly; its embedding as close to the peer's as the peer's own variants are
//! (`common::embed`).

mod common;

use common::embed::{
    assert_matches_peer, assert_paraphrases_closer, cosine, edgelm_embeddings, texts,
};
use common::{gemma_embedding_test_model, GEMMA_EMBEDDING_TEST_WINDOW};
use edgelm::engine::{Engine, EngineConfig, GenParams};
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::sync::Arc;

/// The longest input: what one step of the default engine computes (an input is computed
/// whole).
const MAX_TOKENS: usize = 512;
/// Half of Gemma 3 270M's window (512): texts longer than this cross it even at its real
/// width. (The test model's is narrower: `GEMMA_EMBEDDING_TEST_WINDOW`.)
const HALF_WINDOW: usize = 256;

/// Gemma's own special tokens written out, beside the shared texts.
const GEMMA_TEXTS: &[&str] = &[
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos>twice<eos> and <pad> and <unk> written out",
    "search_query: how do embeddings work",
    "title: none | text: Embeddings map text to vectors of numbers.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "El rápido zorro marrón salta sobre el perro perezoso.",
    "गति से भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다.",
];

/// The multilingual sentences of [`GEMMA_TEXTS`], each repeated (numbered) past the half
/// window: inputs whose far ends the symmetric window keeps apart.
fn long_texts(tok: &Tokenizer) -> Vec<String> {
    GEMMA_TEXTS[4..]
        .iter()
        .map(|s| {
            let mut t = String::new();
            for i in 1.. {
                t.push_str(&format!("{i}. {s}\n"));
                if tok.encode(&t, true).unwrap().len() > HALF_WINDOW + 40 {
                    break;
                }
            }
            t
        })
        .collect()
}

#[test]
fn gemma_embedding_matches_llama_embedding() {
    let model = gemma_embedding_test_model(true);
    let tok = Tokenizer::from_gguf(&edgelm::gguf::GgufFile::open(&model).unwrap()).unwrap();
    let mut texts = texts(&tok, MAX_TOKENS);
    texts.extend(GEMMA_TEXTS.iter().map(|t| t.to_string()));
    texts.extend(long_texts(&tok));
    assert!(texts.len() >= 50, "only {} texts", texts.len());
    let lens: Vec<usize> = texts
        .iter()
        .map(|t| tok.encode(t, true).unwrap().len())
        .collect();
    let half = GEMMA_EMBEDDING_TEST_WINDOW as usize / 2;
    let crossing = lens.iter().filter(|&&n| n > half + 1).count();
    let past = lens.iter().filter(|&&n| n > HALF_WINDOW + 1).count();
    eprintln!(
        "gemma-embedding: {} texts, the longest {:?} tokens, {crossing} past the test \
         model's half window, {past} past Gemma 3's",
        texts.len(),
        lens.iter().max()
    );
    assert!(
        crossing >= 20 && past >= 6,
        "{crossing} and {past} texts cross the window"
    );
    assert_matches_peer("gemma-embedding", &model, &texts, MAX_TOKENS, true);
}

/// Not chaotic: two paraphrases are closer to each other than to unrelated text, with the
/// dense projections and without them.
#[test]
fn similar_texts_embed_closer_than_unrelated_ones() {
    for dense in [true, false] {
        let name = format!("gemma-embedding, dense projections {dense}");
        assert_paraphrases_closer(&name, &gemma_embedding_test_model(dense));
    }
}

/// The symmetric window binds the test's long inputs and no short one: the same model with a
/// window wider than any input embeds a long text differently and a short one alike.
#[test]
fn the_symmetric_window_binds_long_inputs_only() {
    let model = gemma_embedding_test_model(false);
    let wide = common::edited_copy(&model, "gemb-wide-window.gguf", |kvs, _| {
        let k = kvs
            .iter_mut()
            .find(|(k, _)| k == "gemma-embedding.attention.sliding_window");
        k.unwrap().1 = edgelm::gguf::Value::U32(4096);
    });
    let tok = Tokenizer::from_gguf(&edgelm::gguf::GgufFile::open(&model).unwrap()).unwrap();
    let mut texts = long_texts(&tok);
    texts.truncate(2);
    texts.push(GEMMA_TEXTS[4].to_string());
    let (_, windowed) = edgelm_embeddings(&model, &texts);
    let (_, whole) = edgelm_embeddings(&wide, &texts);
    std::fs::remove_file(&wide).ok();
    let cos: Vec<f64> = windowed
        .iter()
        .zip(&whole)
        .map(|(a, b)| cosine(a, b))
        .collect();
    eprintln!("windowed against unwindowed: {cos:?}");
    assert!(cos[0] < 0.995 && cos[1] < 0.995, "{cos:?}");
    assert!(cos[2] > 0.999_999, "{cos:?}");
}

/// The dense projections change the vector (they are applied), and the model only embeds.
#[test]
fn the_dense_projections_apply_and_generation_is_refused() {
    let texts = vec!["A short text to embed.".to_string()];
    let (_, with) = edgelm_embeddings(&gemma_embedding_test_model(true), &texts);
    let (_, without) = edgelm_embeddings(&gemma_embedding_test_model(false), &texts);
    let c = cosine(&with[0], &without[0]);
    assert!(c < 0.9, "the projections changed little: cosine {c}");
    let model = Arc::new(Model::load(&gemma_embedding_test_model(false)).unwrap());
    assert!(!model.generates());
    let (handle, thread) = Engine::start(model, Vec::new(), EngineConfig::default()).unwrap();
    let err = handle.submit(vec![2, 300, 3], GenParams::default()).err();
    let err = err.expect("generation is refused").to_string();
    assert!(err.contains("only computes embeddings"), "{err}");
    handle.shutdown();
    thread.join().unwrap();
}
