//! `nomic-bert` against llama.cpp's `llama-embedding` on the same GGUF (the nomic-bert test
//! model, mean-pooled): 50+ texts, short and long (up to the 512 tokens one step computes),
//! several languages and scripts, code, accents, control characters, special tokens written
//! out. Every text's tokens must be the peer's exactly; its embedding as close to the peer's
//! as the peer's own variants are (`common::embed`).

mod common;

use common::embed::{assert_matches_peer, assert_paraphrases_closer, texts};
use common::nomic_bert_test_model;
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;

/// The longest input: what one step of the default engine computes (an input is computed
/// whole).
const MAX_TOKENS: usize = 512;

#[test]
fn nomic_bert_matches_llama_embedding() {
    let model = nomic_bert_test_model();
    let tok = Tokenizer::from_gguf(&edgelm::gguf::GgufFile::open(&model).unwrap()).unwrap();
    let texts = texts(&tok, MAX_TOKENS);
    assert_matches_peer("nomic-bert", &model, &texts, MAX_TOKENS, true);
}

/// Not chaotic: two paraphrases are closer to each other than to unrelated text; and it
/// only embeds.
#[test]
fn similar_texts_embed_closer_than_unrelated_ones() {
    let model = nomic_bert_test_model();
    assert!(!Model::load(&model).unwrap().generates());
    assert_paraphrases_closer("nomic-bert", &model);
}
