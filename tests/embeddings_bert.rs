//! The `bert` encoder against llama.cpp's `llama-embedding` on the same GGUF (the bert test
//! model, pooled by mean and by cls): 50+ texts, short and long (up to its 512 positions, one
//! step each), several languages and scripts, code, accents, control characters, special
//! tokens written out. Every text's tokens must be the peer's exactly; its embedding as close
//! to the peer's as the peer's own variants are (`common::embed`).

mod common;

use common::embed::{assert_matches_peer, assert_paraphrases_closer, texts};
use common::{bert_test_model, BERT_CONTEXT};
use edgelm::engine::{Engine, EngineConfig, Event, GenParams};
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::sync::Arc;

/// The comparisons run one at a time: each keeps every core busy.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn matches_the_peer(pooling: u32, name: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = bert_test_model(pooling);
    let tok = Tokenizer::from_gguf(&edgelm::gguf::GgufFile::open(&model).unwrap()).unwrap();
    let texts = texts(&tok, BERT_CONTEXT);
    assert_matches_peer(name, &model, &texts, BERT_CONTEXT, true);
}

#[test]
fn bert_mean_pooling_matches_llama_embedding() {
    matches_the_peer(1, "bert mean");
}

#[test]
fn bert_cls_pooling_matches_llama_embedding() {
    matches_the_peer(2, "bert cls");
}

/// Not chaotic: two paraphrases are closer to each other than to unrelated text.
#[test]
fn similar_texts_embed_closer_than_unrelated_ones() {
    assert_paraphrases_closer("bert", &bert_test_model(1));
}

/// An encoder generates nothing, and an input longer than one step is refused up front.
#[test]
fn an_encoder_refuses_generation_and_inputs_past_one_step() {
    let model = Arc::new(Model::load(&bert_test_model(1)).unwrap());
    assert!(!model.generates());
    let config = EngineConfig {
        max_batched_tokens: 256,
        ..EngineConfig::default()
    };
    let (handle, thread) = Engine::start(model, Vec::new(), config).unwrap();
    assert_eq!(handle.limits.context, 256);
    let err = handle.submit(vec![2, 300, 3], GenParams::default()).err();
    let err = err.expect("generation is refused").to_string();
    assert!(err.contains("only computes embeddings"), "{err}");
    let embed = GenParams {
        max_tokens: Some(0),
        embed: true,
        ..GenParams::default()
    };
    let err = handle.submit(vec![300; 257], embed.clone()).err();
    assert!(err.expect("too long").to_string().contains("256"));
    let (_, rx) = handle.submit(vec![300; 256], embed).unwrap();
    assert!(matches!(rx.recv().unwrap(), Event::Embedding { .. }));
    handle.shutdown();
    thread.join().unwrap();
}

/// Beside another model's engine that streams (the two taking turns, `engine::turns`), a
/// whole input still gets a step: the paced budget grows to hold it rather than leave it
/// waiting for as long as the other model decodes.
#[test]
fn a_whole_input_runs_while_another_model_streams() {
    let turns = Arc::new(edgelm::engine::turns::StepTurns::default());
    let shared = |kv_memory_bytes| EngineConfig {
        kv_memory_bytes,
        turns: Some(turns.clone()),
        ..EngineConfig::default()
    };
    let chat = Arc::new(Model::load(&common::model_path()).unwrap());
    let (chat, chat_thread) = Engine::start(chat, Vec::new(), shared(64 << 20)).unwrap();
    let bert = Arc::new(Model::load(&bert_test_model(1)).unwrap());
    let (bert, bert_thread) = Engine::start(bert, Vec::new(), shared(16 << 20)).unwrap();
    let stream = GenParams {
        max_tokens: Some(400),
        ignore_eos: true,
        ..GenParams::default()
    };
    let (_, tokens) = chat.submit(vec![1, 2, 3, 4], stream).unwrap();
    // The stream is under way (its engine's decode steps publish their time) before the input
    // of 200 tokens arrives, far more than a paced step carries beside it.
    let first = tokens.recv().unwrap();
    assert!(matches!(first, Event::Token { .. }), "{first:?}");
    let embed = GenParams {
        max_tokens: Some(0),
        embed: true,
        ..GenParams::default()
    };
    let (_, vector) = bert.submit(vec![300; 200], embed).unwrap();
    let embedded = vector.recv().unwrap();
    assert!(matches!(embedded, Event::Embedding { .. }), "{embedded:?}");
    // The stream's events so far are buffered: none may be its end.
    let ended = tokens
        .try_iter()
        .any(|e| matches!(e, Event::Finished { .. }));
    assert!(!ended, "the embedding waited for the whole stream to end");
    for (h, t) in [(chat, chat_thread), (bert, bert_thread)] {
        h.shutdown();
        t.join().unwrap();
    }
}
