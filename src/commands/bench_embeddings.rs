//! `edgelm bench --embeddings`: embedding throughput, as an indexing job sees it. A batch of
//! texts of one length is submitted at once (as one `/v1/embeddings` request with a list of
//! inputs reaches the engine) and timed to its last vector; texts per second, the median of
//! `--repeats` batches after an untimed one. Random token ids: the cost of a text depends on
//! its length only.

use super::bench::{median, progress, RandomPrompts};
use super::{engine_config, init_threads, kv_bytes_for};
use crate::cli::BenchArgs;
use anyhow::{bail, Result};
use edgelm::engine::{Engine, EngineHandle, Event, GenParams};
use edgelm::model::Model;
use serde::Serialize;
use std::sync::Arc;
use std::time::Instant;

#[derive(Serialize)]
struct Report {
    threads: usize,
    texts: usize,
    tokens_per_text: usize,
    texts_per_s: f64,
    tokens_per_s: f64,
}

pub fn run(args: &BenchArgs) -> Result<()> {
    let threads = init_threads(&args.compute)?;
    args.compute.backend.resolve("benchmarking");
    let (texts, tokens) = (args.embed_texts, args.embed_tokens);
    if args.repeats == 0 || texts == 0 || tokens == 0 {
        bail!("--repeats, --embed-texts and --embed-tokens must be at least 1");
    }
    let model = Arc::new(Model::load(&args.model.model)?);
    if !model.config.pooling.embeds() {
        bail!(
            "{} has no pooling type ({}.pooling_type): it computes no embeddings",
            args.model.model.display(),
            model.config.arch
        );
    }
    let mut config = engine_config(&args.compute);
    config.max_seqs = config.max_seqs.max(texts);
    if args.compute.kv_memory_mib.is_none() {
        config.kv_memory_bytes = kv_bytes_for(&model, &args.compute, texts * (tokens + 16));
    }
    let mut prompts = RandomPrompts::new(model.config.vocab_size as u64);
    let (engine, thread) = Engine::start(model, Vec::new(), config)?;
    embed_batch(&engine, (0..texts).map(|_| prompts.next(tokens)).collect())?;
    let mut rates = Vec::new();
    for i in 0..args.repeats {
        progress("embeddings", i, args.repeats);
        let batch = (0..texts).map(|_| prompts.next(tokens)).collect();
        rates.push(texts as f64 / embed_batch(&engine, batch)?);
    }
    progress("embeddings", args.repeats, args.repeats);
    engine.shutdown();
    let _ = thread.join();
    let texts_per_s = median(rates);
    let report = Report {
        threads,
        texts,
        tokens_per_text: tokens,
        texts_per_s,
        tokens_per_s: texts_per_s * tokens as f64,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "threads {threads}, medians of {} batches\nembed    {texts} texts x {tokens} tokens \
             {:>9.1} texts/s  {:>9.1} tok/s",
            args.repeats, report.texts_per_s, report.tokens_per_s
        );
    }
    Ok(())
}

/// Seconds from submitting every text of `batch` to the last vector.
fn embed_batch(engine: &EngineHandle, batch: Vec<Vec<u32>>) -> Result<f64> {
    let params = GenParams {
        embed: true,
        ..Default::default()
    };
    let start = Instant::now();
    let mut pending = Vec::new();
    for text in batch {
        pending.push(engine.submit(text, params.clone())?.1);
    }
    for rx in pending {
        match rx.recv() {
            Ok(Event::Embedding { .. }) => {}
            Ok(Event::Error(e)) => bail!("embedding failed: {e}"),
            Ok(_) | Err(_) => bail!("the engine ended an embedding request without its vector"),
        }
    }
    Ok(start.elapsed().as_secs_f64())
}
