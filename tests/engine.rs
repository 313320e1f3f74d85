//! The engine on the real model: continuous batching, preemption, forks, prefix caching,
//! cancellation and scoring, each checked against the engine's own single-request results or
//! the peer's reference outputs.

mod common;

use common::*;
use edgelm::engine::{
    Engine, EngineConfig, EngineHandle, Event, FinishReason, GenParams, SamplingParams,
};
use edgelm::kv::KvType;
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| Arc::new(Model::load(&model_path()).unwrap()))
        .clone()
}

fn start(
    kv_memory_bytes: usize,
    max_seqs: usize,
    max_batched_tokens: usize,
) -> (EngineHandle, JoinHandle<()>) {
    let m = model();
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let config = EngineConfig {
        kv_type: KvType::F16,
        block_size: 16,
        kv_memory_bytes,
        max_seqs,
        max_batched_tokens,
        max_context: 0,
        prefill_pacing: 0.0,
        ..EngineConfig::default()
    };
    Engine::start(m, tok.eog_tokens().to_vec(), config).unwrap()
}

/// f16 K and V of one token across every layer, from the model's hyper-parameters
/// (2 × layers × KV heads × head dim × 2 bytes): the pool sizes below are in these units.
fn f16_kv_bytes_per_token() -> usize {
    let c = &model().config;
    2 * c.n_layers * c.n_head_kv * c.head_dim * 2
}

fn greedy(max_tokens: usize) -> GenParams {
    GenParams {
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ..Default::default()
    }
}

struct Outcome {
    /// Per completion index: tokens, finish reason, cached prompt tokens.
    completions: Vec<(Vec<u32>, Option<FinishReason>, usize)>,
    prompt_logprobs: Option<Vec<Option<edgelm::engine::TokenLogprob>>>,
}

fn collect(rx: Receiver<Event>, n: usize) -> Outcome {
    let mut out = Outcome {
        completions: vec![(Vec::new(), None, 0); n],
        prompt_logprobs: None,
    };
    let mut finished = 0;
    while finished < n {
        match rx
            .recv_timeout(Duration::from_secs(300))
            .expect("engine answers")
        {
            Event::Token { index, token, .. } => out.completions[index].0.push(token),
            Event::Finished {
                index,
                reason,
                cached_tokens,
                ..
            } => {
                out.completions[index].1 = Some(reason);
                out.completions[index].2 = cached_tokens;
                finished += 1;
            }
            Event::PromptLogprobs(lp) => out.prompt_logprobs = Some(lp),
            Event::Error(e) => panic!("request failed: {e}"),
            Event::Embedding { .. } => panic!("an embedding for a generation request"),
        }
    }
    out
}

fn wait_idle(engine: &EngineHandle) {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let s = engine.stats();
        if s.running == 0 && s.waiting == 0 && s.kv_blocks_used == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let s = engine.stats();
    panic!(
        "engine not idle: {} running, {} waiting, {} blocks used",
        s.running, s.waiting, s.kv_blocks_used
    );
}

fn reference_cases() -> Vec<(Vec<u32>, Vec<u32>)> {
    reference()["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids_of(&c["prompt_ids"]), ids_of(&c["ids"])))
        .collect()
}

/// Every reference prompt's greedy continuation (48 tokens), all submitted at once.
fn run_all_at_once(engine: &EngineHandle) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = reference_cases()
        .iter()
        .map(|(p, _)| engine.submit(p.clone(), greedy(48)).unwrap().1)
        .collect();
    rxs.into_iter()
        .map(|rx| collect(rx, 1).completions[0].0.clone())
        .collect()
}

/// The same continuations, one request at a time on an engine of its own: what the others
/// are compared with. (Against the peer, greedy text may leave it at near-ties only:
/// `tests/reference.rs`.)
fn solo_runs() -> &'static Vec<Vec<u32>> {
    static SOLO: OnceLock<Vec<Vec<u32>>> = OnceLock::new();
    SOLO.get_or_init(|| {
        let (engine, thread) = start(64 << 20, 16, 512);
        let out = reference_cases()
            .iter()
            .map(|(p, _)| {
                let rx = engine.submit(p.clone(), greedy(48)).unwrap().1;
                collect(rx, 1).completions[0].0.clone()
            })
            .collect();
        engine.shutdown();
        thread.join().unwrap();
        out
    })
}

fn identical_to_solo(got: &[Vec<u32>]) -> usize {
    got.iter().zip(solo_runs()).filter(|(a, b)| a == b).count()
}

/// A token's arithmetic does not depend on what else its step computes (generated tokens:
/// `BatchMeta::generated`; these prompts are one span each either way): batched together,
/// the twelve continuations are the ones each gets alone.
#[test]
fn twelve_concurrent_greedy_requests_match_their_solo_runs() {
    let (engine, thread) = start(64 << 20, 16, 512);
    let exact = identical_to_solo(&run_all_at_once(&engine));
    assert_eq!(exact, 12, "only {exact}/12 identical when batched together");
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}

/// Preemption recomputes a sequence's tokens: generated ones with the same arithmetic as
/// when they were generated. The prompt may then be part of a span long enough for the tiled
/// attention path where it first took the per-row one, which can flip a near-tie: one of the
/// twelve may differ.
#[test]
fn preemption_under_a_tiny_pool_changes_no_output() {
    // 24 blocks of 16 tokens (384 tokens) for 12 sequences of up to ~80 tokens each.
    let geom_bytes_per_block = f16_kv_bytes_per_token() * 16;
    let (engine, thread) = start(24 * geom_bytes_per_block, 12, 128);
    let exact = identical_to_solo(&run_all_at_once(&engine));
    let stats = engine.stats();
    assert!(stats.preemptions > 0, "the pool was meant to be too small");
    assert!(
        exact >= 11,
        "only {exact}/12 identical under preemption ({} preemptions)",
        stats.preemptions
    );
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}

#[test]
fn forked_completions_share_the_prompt_and_copy_on_write() {
    let (engine, thread) = start(64 << 20, 16, 512);
    let (prompt, _) = reference_cases()[1].clone();
    // Greedy forks must all equal the single greedy continuation (a COW bug would corrupt them).
    let (_, rx) = engine
        .submit(prompt.clone(), GenParams { n: 3, ..greedy(48) })
        .unwrap();
    let o = collect(rx, 3);
    for (toks, _, _) in &o.completions {
        assert_eq!(toks, &solo_runs()[1]);
    }
    // Sampled forks with a seed: reproducible, and not all the same.
    let sampled = GenParams {
        n: 4,
        max_tokens: Some(24),
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(11),
            ..Default::default()
        },
        ..Default::default()
    };
    let a = collect(engine.submit(prompt.clone(), sampled.clone()).unwrap().1, 4);
    let b = collect(engine.submit(prompt, sampled).unwrap().1, 4);
    let toks = |o: &Outcome| {
        o.completions
            .iter()
            .map(|c| c.0.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(toks(&a), toks(&b), "seeded sampling is reproducible");
    assert!(
        toks(&a).windows(2).any(|w| w[0] != w[1]),
        "forks sample independently"
    );
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}

#[test]
fn a_repeated_prefix_is_served_from_the_cache_with_the_same_result() {
    let (engine, thread) = start(64 << 20, 16, 512);
    let tok = Tokenizer::from_gguf(&model().file).unwrap();
    let system = "You are a helpful assistant. ".repeat(12);
    let ask = |q: &str| {
        tok.encode(&format!("{system}Question: {q}\nAnswer:"), true)
            .unwrap()
    };
    let first = collect(
        engine
            .submit(ask("What is the capital of France?"), greedy(16))
            .unwrap()
            .1,
        1,
    );
    assert_eq!(first.completions[0].2, 0, "cold cache");
    let again = collect(
        engine
            .submit(ask("What is the capital of France?"), greedy(16))
            .unwrap()
            .1,
        1,
    );
    assert!(
        again.completions[0].2 >= 64,
        "cached prompt tokens: {}",
        again.completions[0].2
    );
    assert_eq!(
        again.completions[0].0, first.completions[0].0,
        "cache hits change nothing"
    );
    let other = collect(engine.submit(ask("Name a color."), greedy(4)).unwrap().1, 1);
    assert!(
        other.completions[0].2 >= 48,
        "a shared system prompt is reused"
    );
    let s = engine.stats();
    assert!(s.prefix_hit_tokens > 0 && s.prefix_hit_tokens < s.prefix_queried_tokens);
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}

#[test]
fn cancellation_returns_every_block() {
    let (engine, thread) = start(64 << 20, 16, 512);
    let mut rxs = Vec::new();
    for _ in 0..4 {
        let params = GenParams {
            ignore_eos: true,
            ..greedy(400)
        };
        rxs.push(
            engine
                .submit(vec![504, 3575, 282, 4649, 314], params)
                .unwrap(),
        );
    }
    for (id, rx) in &rxs {
        // Wait for the first token, then cancel mid-generation.
        loop {
            if let Event::Token { .. } = rx.recv_timeout(Duration::from_secs(60)).unwrap() {
                break;
            }
        }
        engine.cancel(*id);
    }
    for (_, rx) in rxs {
        let reason = rx.iter().find_map(|e| match e {
            Event::Finished { reason, .. } => Some(reason),
            _ => None,
        });
        assert_eq!(reason, Some(FinishReason::Cancelled));
    }
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}

#[test]
fn scoring_the_peer_tokens_agrees_with_its_argmax() {
    let (engine, thread) = start(64 << 20, 16, 512);
    let reference = reference();
    let (mut agree, mut total) = (0, 0);
    // Logit gaps between the engine's top token and the peer's where they differ.
    let mut gaps: Vec<f32> = Vec::new();
    for case in reference["greedy"].as_array().unwrap().iter().take(4) {
        let (prompt, gen) = (ids_of(&case["prompt_ids"]), ids_of(&case["ids"]));
        let mut all = prompt.clone();
        all.extend(&gen);
        let params = GenParams {
            max_tokens: Some(0),
            prompt_logprobs: Some(1),
            ..Default::default()
        };
        let o = collect(engine.submit(all.clone(), params).unwrap().1, 1);
        let lp = o.prompt_logprobs.expect("prompt logprobs");
        assert_eq!(lp.len(), all.len());
        assert!(lp[0].is_none());
        for (k, &t) in gen.iter().enumerate() {
            let entry = lp[prompt.len() + k].as_ref().unwrap();
            assert_eq!(entry.token, t);
            total += 1;
            agree += usize::from(entry.top[0].0 == t);
            if entry.top[0].0 != t {
                gaps.push(entry.top[0].1 - entry.logprob);
            }
        }
    }
    // Packed matrices compute prompt tokens in the chain order, not in the peer's
    // (docs/numerics.md): the argmax may differ from the peer's where the two are near a tie,
    // as a q8_0 cache's does (tests/reference.rs has the figures).
    assert!(
        agree * 100 >= total * 95 && gaps.iter().all(|&g| g < 0.5),
        "{agree}/{total}, gaps {gaps:?}"
    );
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}

#[test]
fn requests_that_can_never_fit_are_rejected_up_front() {
    let (engine, thread) = start(16 * f16_kv_bytes_per_token() * 16, 4, 128); // 256 tokens of KV
    let err = engine
        .submit(vec![1; 200], greedy(100))
        .unwrap_err()
        .to_string();
    assert!(err.contains("KV pool"), "{err}");
    let err = engine
        .submit(vec![1; 10], greedy(9000))
        .unwrap_err()
        .to_string();
    assert!(err.contains("context"), "{err}");
    assert!(engine.submit(vec![], greedy(4)).is_err());
    assert!(engine.submit(vec![49_152], greedy(4)).is_err());
    engine.shutdown();
    thread.join().unwrap();
}

/// What the engine hands a device sampler per row, (parameters, the sampler's generator state),
/// draws the token that row's own sampler would draw next, step after step (the executor's
/// CPU implementation of `forward_sample`; kernels/sample.cu takes the same draw from the same
/// pair, tests/cuda_device/sample.rs).
#[test]
fn sampling_from_the_generator_state_is_the_samplers_next_draw() {
    use edgelm::backend::select::Backend;
    use edgelm::engine::executor::{Executor, ExecutorPlan};
    use edgelm::engine::Sampler;
    use edgelm::model::{BatchMeta, Logits};
    let m = model();
    let geom = m.config.page_geometry(KvType::F16, 16);
    let plan = ExecutorPlan {
        backend: Backend::Cpu,
        geom,
        cpu_blocks: 4,
        max_tokens: 64,
        max_seqs: 1,
        context: 64,
        gpu_reserve_bytes: 0,
        state_snapshot_bytes: 0,
    };
    let mut exec = Executor::start(&m, &plan).unwrap();
    let params = SamplingParams {
        temperature: 1.2,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.02,
        seed: Some(11),
        ..Default::default()
    };
    let mut own = Sampler::new(params.clone());
    let mut tokens = vec![1u32, 4093, 314];
    let mut batch = BatchMeta::default();
    batch.push_span_single(&tokens, 0, vec![0, 1, 2, 3], Logits::Last);
    for _ in 0..8 {
        // Scoring the whole sequence again each time keeps the pages consistent.
        let logits = exec.forward(&m, &batch).unwrap();
        let got = exec
            .forward_sample(&m, &batch, &[(params.clone(), own.rng_state())])
            .unwrap()[0];
        let want = own.sample(&logits, &[]);
        assert_eq!(got, want);
        tokens.push(want);
        batch = BatchMeta::default();
        batch.push_span_single(&tokens, 0, vec![0, 1, 2, 3], Logits::Last);
    }
}

/// The extraction task in tests/data, through the model's chat template.
fn extraction_prompt(tok: &Tokenizer) -> Vec<u32> {
    let task =
        std::fs::read_to_string(repo_root().join("tests/data/lookup-extraction.txt")).unwrap();
    let tmpl = edgelm::tokenizer::ChatTemplate::new(
        tok.chat_template()
            .expect("the reference model has a chat template"),
        tok.special_text(tok.bos),
        tok.special_text(tok.eos),
    )
    .unwrap();
    let msgs = [edgelm::tokenizer::ChatMessage {
        role: "user".into(),
        content: task,
        ..Default::default()
    }];
    tok.encode(&tmpl.render(&msgs, true).unwrap(), true)
        .unwrap()
}

fn start_with_lookup(max_draft: usize, kv_memory_bytes: usize) -> (EngineHandle, JoinHandle<()>) {
    let m = model();
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let config = EngineConfig {
        kv_memory_bytes,
        prefill_pacing: 0.0,
        prompt_lookup: max_draft,
        ..EngineConfig::default()
    };
    Engine::start(m, tok.eog_tokens().to_vec(), config).unwrap()
}

#[test]
fn prompt_lookup_drafts_change_no_greedy_output_and_are_counted() {
    let tok = Tokenizer::from_gguf(&model().file).unwrap();
    let prompt = extraction_prompt(&tok);
    let (engine, thread) = start_with_lookup(8, 64 << 20);
    let run = |lookup: bool| {
        let params = GenParams {
            prompt_lookup: lookup,
            ..greedy(160)
        };
        collect(engine.submit(prompt.clone(), params).unwrap().1, 1).completions[0].clone()
    };
    // The first run fills the prefix cache, which changes how the next ones prefill (the
    // prompt's last block alone, in the per-row attention path, not the tiled one): a
    // near-tie may then flip. The plain run compared with is the second, in that same state.
    run(false);
    let plain = run(false);
    assert_eq!(
        engine.stats().draft_tokens,
        0,
        "no request asked for drafts"
    );
    let drafted = run(true);
    // Decode spans grow, the arithmetic per token does not (generated tokens take the same
    // bits whatever the batch: `BatchMeta::generated`): the same tokens and ending.
    assert_eq!(
        tok.decode(&drafted.0, false),
        tok.decode(&plain.0, false),
        "prompt lookup changed the greedy output"
    );
    assert_eq!(drafted.1, plain.1);
    let s = engine.stats();
    assert!(
        s.accepted_draft_tokens > 0 && s.accepted_draft_tokens <= s.draft_tokens,
        "drafts: {} verified, {} accepted",
        s.draft_tokens,
        s.accepted_draft_tokens
    );
    // Copying fields from the prompt: most of the answer comes from accepted drafts.
    assert!(
        s.accepted_draft_tokens as usize * 3 >= drafted.0.len(),
        "{} of {} tokens accepted from drafts",
        s.accepted_draft_tokens,
        drafted.0.len()
    );
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}

#[test]
fn prompt_lookup_beside_sampled_requests_in_a_tight_pool() {
    // Drafts in steps that also carry sampled rows (logits read out), with a pool small
    // enough that drafts must sometimes be dropped for lack of blocks, and requests reaching
    // their length limit inside an accepted draft: each ends with exactly max_tokens tokens,
    // and every block comes back.
    let tok = Tokenizer::from_gguf(&model().file).unwrap();
    let prompt = extraction_prompt(&tok);
    let pool = (prompt.len() + 64) * 4 * f16_kv_bytes_per_token();
    let (engine, thread) = start_with_lookup(16, pool);
    let mut rxs = Vec::new();
    for i in 0..4 {
        let params = GenParams {
            prompt_lookup: true,
            ..greedy(37)
        };
        rxs.push(engine.submit(prompt.clone(), params).unwrap().1);
        let sampled = GenParams {
            max_tokens: Some(20),
            sampling: SamplingParams {
                temperature: 0.8,
                seed: Some(i),
                ..Default::default()
            },
            prompt_lookup: true,
            ..Default::default()
        };
        rxs.push(
            engine
                .submit(prompt[..prompt.len() / 2].to_vec(), sampled)
                .unwrap()
                .1,
        );
    }
    for (i, rx) in rxs.into_iter().enumerate() {
        let o = collect(rx, 1);
        let (tokens, reason, _) = &o.completions[0];
        if i % 2 == 0 {
            assert_eq!(
                (tokens.len(), *reason),
                (37, Some(FinishReason::Length)),
                "request {i}"
            );
        }
    }
    let s = engine.stats();
    assert!(s.accepted_draft_tokens > 0 && s.accepted_draft_tokens <= s.draft_tokens);
    wait_idle(&engine);
    engine.shutdown();
    thread.join().unwrap();
}
