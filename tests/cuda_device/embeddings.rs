//! Embeddings on the device: the reference model with a pooling type (mean and last), its
//! inputs embedded by an engine on the CUDA backend and by one on the CPU, all submitted at
//! once (so they share steps, prefill chunks and a one-token input among them). Each vector
//! is the CPU's to a cosine of 0.999, the bar `tests/embeddings.rs` holds edgelm to against
//! llama.cpp.

use super::cosine;
use crate::common::edited_model;
use edgelm::backend::select::Backend;
use edgelm::engine::{Engine, EngineConfig, Event, GenParams};
use edgelm::gguf::Value;
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::sync::Arc;

const TEXTS: [&str; 4] = [
    "The pump overheated at noon and the controller shut it down.",
    "La pompe a surchauffé à midi.",
    "x",
    "Quarterly revenue rose four percent, driven by the northern region's new contracts.",
];

/// Each text's vector from an engine on `backend`.
fn embed(model: &Arc<Model>, backend: Backend, inputs: &[Vec<u32>]) -> Vec<Vec<f32>> {
    let config = EngineConfig {
        backend,
        kv_memory_bytes: 16 << 20,
        max_batched_tokens: 64,
        prefill_pacing: 0.0,
        ..EngineConfig::default()
    };
    let (engine, thread) = Engine::start(model.clone(), Vec::new(), config).unwrap();
    // The CUDA backend falls back to the CPU when it cannot start: that must not pass here.
    let ran_on = if backend == Backend::Cuda {
        "cuda"
    } else {
        "cpu"
    };
    assert_eq!(engine.stats().backend, ran_on);
    let params = GenParams {
        embed: true,
        ..Default::default()
    };
    let pending: Vec<_> = inputs
        .iter()
        .map(|p| engine.submit(p.clone(), params.clone()).unwrap().1)
        .collect();
    let vectors = pending
        .into_iter()
        .map(|rx| match rx.recv().unwrap() {
            Event::Embedding { vector, .. } => vector,
            other => panic!("{backend:?}: {other:?}"),
        })
        .collect();
    engine.shutdown();
    thread.join().unwrap();
    vectors
}

#[test]
#[ignore = "needs a CUDA device"]
fn cuda_embeddings_match_the_cpu() {
    for (pooling, name) in [(1u32, "mean"), (3, "last")] {
        let path = edited_model(&format!("cuda-embeddings-{name}.gguf"), |kvs, _| {
            kvs.push(("llama.pooling_type".into(), Value::U32(pooling)));
        });
        let model = Arc::new(Model::load(&path).unwrap());
        let tok = Tokenizer::from_gguf(&model.file).unwrap();
        let inputs: Vec<Vec<u32>> = TEXTS.iter().map(|t| tok.encode(t, true).unwrap()).collect();
        assert!(inputs.iter().any(|i| i.len() == 1) && inputs.iter().any(|i| i.len() > 16));
        let device = embed(&model, Backend::Cuda, &inputs);
        let cpu = embed(&model, Backend::Cpu, &inputs);
        for (i, (d, c)) in device.iter().zip(&cpu).enumerate() {
            let cos = cosine(d, c);
            eprintln!(
                "{name} pooling, text {i} ({} tokens): cosine {cos:.6}",
                inputs[i].len()
            );
            assert!(cos >= 0.999, "{name} pooling, text {i}: cosine {cos}");
        }
    }
}
