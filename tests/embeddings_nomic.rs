//! `nomic-bert` against llama.cpp's `llama-embedding` on the same GGUF (the nomic-bert test
//! model, mean-pooled): 50+ texts, short and long (up to the 512 tokens one step computes),
//! several languages and scripts, code, accents, control characters, special tokens written
//! out. Every text's tokens must be the peer's exactly; its embedding within a cosine of
//! 0.999 of the peer's; every text's nearest neighbour the peer's.

mod common;

use common::embed::{assert_close, cosine, edgelm_embeddings, peer_embedding, texts};
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
    assert!(texts.len() >= 50, "only {} texts", texts.len());
    let longest = texts
        .iter()
        .map(|t| tok.encode(t, true).unwrap().len())
        .max();
    eprintln!("nomic-bert: the longest text is {longest:?} tokens");
    let peer: Vec<_> = texts
        .iter()
        .map(|t| peer_embedding(&model, t, MAX_TOKENS))
        .collect();
    let (ids, ours) = edgelm_embeddings(&model, &texts);
    for (i, (p, o)) in peer.iter().zip(&ids).enumerate() {
        assert_eq!(&p.tokens, o, "text {i} ({:?}): tokens differ", texts[i]);
    }
    eprintln!(
        "nomic-bert: tokens identical to the peer's for all {} texts",
        texts.len()
    );
    let peer: Vec<Vec<f64>> = peer.into_iter().map(|p| p.vector).collect();
    assert_close("nomic-bert", &texts, &ours, &peer);
}

/// Not chaotic: two paraphrases are closer to each other than to unrelated text; and it
/// only embeds.
#[test]
fn similar_texts_embed_closer_than_unrelated_ones() {
    let model = nomic_bert_test_model();
    assert!(!Model::load(&model).unwrap().generates());
    let texts: Vec<String> = [
        "The cat sat on the mat.",
        "A cat was sitting on the mat.",
        "Quarterly revenue rose by four percent in Europe.",
    ]
    .map(String::from)
    .to_vec();
    let (_, v) = edgelm_embeddings(&model, &texts);
    let (close, far) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
    eprintln!("paraphrase {close:.4}, unrelated {far:.4}");
    assert!(close > far, "paraphrase {close}, unrelated {far}");
}
