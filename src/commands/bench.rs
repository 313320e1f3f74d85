//! `edgelm bench`: throughput through the real engine (scheduler, paged KV, sampler), the way
//! a serving workload exercises it. Medians over repeats; progress on stderr; figures on
//! stdout (or one JSON object with --json).

use super::{engine_config, init_threads, kv_bytes_for};
use crate::cli::BenchArgs;
use anyhow::{bail, Result};
use edgelm::backend::adapter::Adapter;
use edgelm::engine::{Engine, EngineConfig, EngineHandle, Event, GenParams, Rng, SamplingParams};
use edgelm::grammar::{Constraint, ConstraintSpec, Grammars};
use edgelm::kv::KvType;
use edgelm::model::Model;
use serde::Serialize;
use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

#[derive(Serialize)]
struct Concurrency {
    sequences: usize,
    decode_tok_s: f64,
    /// With `--lora`: the same load, its streams spread over the base model and the adapters
    /// (timed in the same rounds, interleaved).
    #[serde(skip_serializing_if = "Option::is_none")]
    adapters_tok_s: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    threads: usize,
    kv_type: String,
    n_prompt: usize,
    n_gen: usize,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    /// Arithmetic prefill achieved (weights, logits of the last token and attention).
    prefill_gflops: f64,
    /// Bytes one-sequence decode read per second (every weight once per token, plus the K/V
    /// rows attention reads).
    decode_gbs: f64,
    /// Weight bytes a decoded token reads: measured on the CPU's matmuls (0 on another
    /// backend), and what the model's active matrices add up to (of a mixture of experts, the
    /// router and the experts a token picks; of the whole file's matrices, `all`).
    decode_weight_bytes_measured: f64,
    decode_weight_bytes_active: usize,
    weight_bytes_all: usize,
    /// This machine's ceilings, measured by this command on the same threads.
    peak_gflops: f64,
    peak_gbs: f64,
    /// Read-only bandwidth (decode's access pattern: weights read, little written).
    peak_read_gbs: f64,
    concurrency: Vec<Concurrency>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    constrained: Vec<Constrained>,
    #[serde(skip_serializing_if = "Option::is_none")]
    shared_prefix: Option<SharedPrefix>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_lookup: Option<PromptLookup>,
}

/// One greedy task decoded with and without prompt-lookup drafts.
#[derive(Serialize)]
struct PromptLookup {
    prompt_tokens: usize,
    generated_tokens: usize,
    max_draft: usize,
    plain_tok_s: f64,
    lookup_tok_s: f64,
    speedup: f64,
    /// Draft tokens the model agreed with, of those verified.
    acceptance: f64,
    /// Whether both runs generated the same tokens (greedy: they should, up to near-ties).
    same_output: bool,
    /// Tokens each engine step yielded, with drafts and without.
    lookup_tokens_per_step: f64,
    plain_tokens_per_step: f64,
}

/// Decode under a JSON schema beside free decode, on the same prompts.
#[derive(Serialize)]
struct Constrained {
    sequences: usize,
    unconstrained_tok_s: f64,
    constrained_tok_s: f64,
    ratio: f64,
}

#[derive(Serialize)]
struct SharedPrefix {
    prefix_tokens: usize,
    first_ttft_s: f64,
    second_ttft_s: f64,
    ratio: f64,
    /// Prompt tokens of the second request the prefix cache served (the last repeat's).
    second_cached_tokens: usize,
}

/// Timings of one request.
struct Timing {
    submitted: Instant,
    first: Option<Instant>,
    /// Arrival time of every generated token.
    tokens: Vec<Instant>,
    /// The generated tokens.
    ids: Vec<u32>,
    /// Prompt tokens the prefix cache served.
    cached_tokens: usize,
}

impl Timing {
    /// One request's decode rate: tokens after the first over the time they took.
    fn decode_rate(&self) -> f64 {
        let span = match (self.tokens.first(), self.tokens.last()) {
            (Some(a), Some(b)) => b.duration_since(*a).as_secs_f64(),
            _ => 0.0,
        };
        self.tokens.len().saturating_sub(1) as f64 / span.max(1e-9)
    }

    /// Seconds from submission to the first token (0 when none came).
    fn time_to_first_token(&self) -> f64 {
        self.first
            .unwrap_or(self.submitted)
            .duration_since(self.submitted)
            .as_secs_f64()
    }
}

fn run_requests(
    engine: &EngineHandle,
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
) -> Result<Vec<Timing>> {
    run_constrained(engine, prompts, max_tokens, None)
}

/// [`run_requests`], each request's output following `constraint` when given.
fn run_constrained(
    engine: &EngineHandle,
    prompts: Vec<Vec<u32>>,
    max_tokens: usize,
    constraint: Option<&Constraint>,
) -> Result<Vec<Timing>> {
    run_with(engine, prompts, &greedy_params(max_tokens, constraint))
}

/// Greedy decode of `max_tokens` tokens past any end, following `constraint` when given.
fn greedy_params(max_tokens: usize, constraint: Option<&Constraint>) -> GenParams {
    GenParams {
        max_tokens: Some(max_tokens),
        sampling: SamplingParams::greedy(),
        ignore_eos: true,
        constraint: constraint.cloned(),
        ..Default::default()
    }
}

/// Each prompt as one request with `params`, all at once.
fn run_with(
    engine: &EngineHandle,
    prompts: Vec<Vec<u32>>,
    params: &GenParams,
) -> Result<Vec<Timing>> {
    run_each(
        engine,
        prompts.into_iter().map(|p| (p, params.clone())).collect(),
    )
}

/// Each prompt as one request with its own parameters, all at once.
fn run_each(engine: &EngineHandle, requests: Vec<(Vec<u32>, GenParams)>) -> Result<Vec<Timing>> {
    // One reader thread per request, so every token is timestamped as it arrives.
    let mut readers = Vec::new();
    for (p, params) in requests {
        let submitted = Instant::now();
        let (_, rx) = engine.submit(p, params)?;
        readers.push(std::thread::spawn(move || -> Result<Timing> {
            let mut t = Timing {
                submitted,
                first: None,
                tokens: Vec::new(),
                ids: Vec::new(),
                cached_tokens: 0,
            };
            for ev in rx {
                match ev {
                    Event::Token { token, .. } => {
                        let now = Instant::now();
                        t.first.get_or_insert(now);
                        t.tokens.push(now);
                        t.ids.push(token);
                    }
                    Event::Finished { cached_tokens, .. } => {
                        t.cached_tokens = cached_tokens;
                        break;
                    }
                    Event::Error(e) => bail!("benchmark request failed: {e}"),
                    // Generation requests get no embeddings.
                    Event::PromptLogprobs(_) | Event::Embedding { .. } => {}
                }
            }
            Ok(t)
        }));
    }
    let mut out = Vec::new();
    for r in readers {
        out.push(
            r.join()
                .map_err(|_| anyhow::anyhow!("reader thread panicked"))??,
        );
    }
    Ok(out)
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(super) fn progress(label: &str, i: usize, n: usize) {
    let width = 20;
    let filled = (i * width) / n.max(1);
    eprint!(
        "\r[{}{}] {label} {i}/{n}   ",
        "#".repeat(filled),
        ".".repeat(width - filled)
    );
    let _ = std::io::stderr().flush();
    if i == n {
        eprintln!();
    }
}

pub fn run(args: BenchArgs) -> Result<()> {
    super::require_model(&args.model.model)?;
    if !args.lora.is_empty() && (args.embeddings || args.mmproj.is_some()) {
        bail!("--lora times decode; the embeddings and image benches take no adapter");
    }
    if args.embeddings {
        return super::bench_embeddings::run(&args);
    }
    if args.mmproj.is_some() || args.image.is_some() {
        return super::bench_images::run(&args);
    }
    let threads = init_threads(&args.compute)?;
    args.compute.backend.resolve("benchmarking");
    if args.repeats == 0 || args.n_gen < 2 || args.n_prompt == 0 {
        bail!("--repeats must be ≥ 1, -n ≥ 2 and -p ≥ 1");
    }
    let model = Arc::new(Model::load(&args.model.model)?);
    let mut prompts = RandomPrompts::new(model.config.vocab_size as u64);
    let lookup_task = load_lookup_task(&args, &model)?;
    let config = bench_engine_config(&args, &model, lookup_task.as_ref());
    // Ceilings first, on an idle pool.
    let peaks = Peaks::measure();
    let prefill_flops = prefill_flops(&model, args.n_prompt);
    let decode_bytes = decode_bytes(&model, &args);
    let weight_bytes = (model.weight_bytes(), model.all_weight_bytes());
    let constraint = load_constraint(&args, &model)?;
    let eog = lookup_task
        .as_ref()
        .map(|t| t.eog.clone())
        .unwrap_or_default();
    let adapters = super::load_adapters(&model, &args.lora)?;
    let (engine, thread) = Engine::start(model, eog, config)?;
    let m = measure(
        &engine,
        &mut prompts,
        &args,
        constraint.as_ref(),
        lookup_task.as_ref(),
        &adapters,
    );
    engine.shutdown();
    let _ = thread.join();
    let m = m?;

    let (prefill_tok_s, decode_tok_s) = (median(m.prefill), median(m.decode));
    let report = Report {
        threads,
        kv_type: args.compute.kv_type.to_string(),
        n_prompt: args.n_prompt,
        n_gen: args.n_gen,
        prefill_tok_s,
        decode_tok_s,
        prefill_gflops: prefill_flops * prefill_tok_s / args.n_prompt as f64 / 1e9,
        decode_gbs: decode_bytes * decode_tok_s / 1e9,
        decode_weight_bytes_measured: m.decode_weight_bytes,
        decode_weight_bytes_active: weight_bytes.0,
        weight_bytes_all: weight_bytes.1,
        peak_gflops: peaks.gflops,
        peak_gbs: peaks.copy_gbs,
        peak_read_gbs: peaks.read_gbs,
        concurrency: m.concurrency,
        constrained: m.constrained,
        shared_prefix: m.shared_prefix,
        prompt_lookup: m.prompt_lookup,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    report.print_throughput(args.repeats);
    report.print_features();
    Ok(())
}

/// What the timed requests measured (the report's figures before they are set against the
/// model and the machine).
struct Measured {
    prefill: Vec<f64>,
    decode: Vec<f64>,
    decode_weight_bytes: f64,
    concurrency: Vec<Concurrency>,
    constrained: Vec<Constrained>,
    shared_prefix: Option<SharedPrefix>,
    prompt_lookup: Option<PromptLookup>,
}

/// Every timed run `args` asks for on `engine`: prefill, decode, concurrency, then the
/// optional ones (a constraint, a shared prefix, prompt lookup on a task).
fn measure(
    engine: &EngineHandle,
    prompts: &mut RandomPrompts,
    args: &BenchArgs,
    constraint: Option<&Constraint>,
    lookup_task: Option<&LookupTask>,
    adapters: &[Arc<Adapter>],
) -> Result<Measured> {
    // A warm-up request first, untimed (as llama-bench runs one): the first step of a process
    // grows its buffers and faults in the pages it writes, which no later request pays.
    progress("warm-up", 0, 1);
    run_requests(engine, vec![prompts.next(args.n_prompt)], 2)?;
    Ok(Measured {
        prefill: time_prefill(engine, prompts, args)?,
        decode: time_decode(engine, prompts, args)?,
        decode_weight_bytes: measure_decode_weight_bytes(engine, prompts, args)?,
        concurrency: time_concurrency(engine, prompts, args, adapters)?,
        constrained: match constraint {
            Some(c) => time_constrained(engine, prompts, args, c)?,
            None => Vec::new(),
        },
        shared_prefix: match args.shared_prefix > 0 {
            true => Some(time_shared_prefix(engine, prompts, args)?),
            false => None,
        },
        // Prompt lookup: the task greedy, plain and with drafts, interleaved.
        prompt_lookup: match lookup_task {
            Some(task) => Some(time_prompt_lookup(
                engine,
                &task.prompt,
                args.n_gen,
                args.compute.prompt_lookup,
                args.repeats,
                args.compute.max_batched_tokens,
            )?),
            None => None,
        },
    })
}

/// Random prompts: fresh tokens each time, so that no request finds another's in the prefix
/// cache (a seeded generator: every run asks for the same tokens).
pub(super) struct RandomPrompts {
    rng: Rng,
    vocab: u64,
}

impl RandomPrompts {
    pub(super) fn new(vocab: u64) -> RandomPrompts {
        RandomPrompts {
            rng: Rng::new(0x5eed),
            vocab,
        }
    }

    pub(super) fn next(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| (self.rng.next_u64() % self.vocab) as u32)
            .collect()
    }
}

/// `--lookup-task`: the task's prompt (as a chat when the model has a template) and the tokens
/// that end the model's answer (the lookup task stops there; the other tests ignore EOS).
struct LookupTask {
    prompt: Vec<u32>,
    eog: Vec<u32>,
}

fn load_lookup_task(args: &BenchArgs, model: &Model) -> Result<Option<LookupTask>> {
    let Some(path) = &args.lookup_task else {
        return Ok(None);
    };
    if args.compute.prompt_lookup == 0 {
        bail!("--lookup-task needs --prompt-lookup N (the draft tokens per step)");
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let tokenizer = edgelm::tokenizer::Tokenizer::from_gguf(&model.file)?;
    let prompt = match tokenizer.chat_template() {
        Some(_) => {
            let tmpl = super::chat_template(&tokenizer, None)?;
            super::generate::render_chat(&tmpl, None, &text)?
        }
        None => text,
    };
    Ok(Some(LookupTask {
        prompt: tokenizer.encode(&prompt, true)?,
        eog: tokenizer.eog_tokens().to_vec(),
    }))
}

/// `--json-schema`: the schema compiled against the model's vocabulary.
fn load_constraint(args: &BenchArgs, model: &Model) -> Result<Option<Constraint>> {
    let Some(path) = &args.json_schema else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let schema = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not JSON: {e}", path.display()))?;
    let tokenizer = edgelm::tokenizer::Tokenizer::from_gguf(&model.file)?;
    let grammars = Grammars::new(&tokenizer)?;
    let constraint = grammars
        .compile(&ConstraintSpec::JsonSchema(schema))
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(Some(constraint))
}

/// The engine settings of the compute flags, with room for the widest concurrency and, unless
/// `--kv-memory-mib` sizes it, a KV pool twice what the longest test holds.
fn bench_engine_config(
    args: &BenchArgs,
    model: &Model,
    lookup_task: Option<&LookupTask>,
) -> EngineConfig {
    let max_conc = args.concurrency.iter().copied().max().unwrap_or(1);
    let mut config = engine_config(&args.compute);
    config.max_seqs = config.max_seqs.max(max_conc);
    if args.compute.kv_memory_mib.is_none() {
        let need = (max_conc * (args.concurrency_prompt + args.n_gen + 32))
            .max(args.n_prompt + args.n_gen)
            .max(2 * (args.shared_prefix + 64))
            .max(lookup_task.map_or(0, |t| t.prompt.len() + args.n_gen + 32));
        config.kv_memory_bytes = 2 * kv_bytes_for(model, &args.compute, need);
    }
    config
}

/// This machine's ceilings, measured on the compute threads.
struct Peaks {
    gflops: f64,
    copy_gbs: f64,
    read_gbs: f64,
}

impl Peaks {
    fn measure() -> Peaks {
        progress("machine peaks", 0, 3);
        let gflops = edgelm::backend::cpu::peak::peak_gflops();
        progress("machine peaks", 1, 3);
        let copy_gbs = edgelm::backend::cpu::peak::stream_copy_gbs();
        progress("machine peaks", 2, 3);
        let read_gbs = edgelm::backend::cpu::peak::stream_read_gbs();
        progress("machine peaks", 3, 3);
        Peaks {
            gflops,
            copy_gbs,
            read_gbs,
        }
    }
}

/// Arithmetic of an `n_prompt`-token prefill: the weights for every token, the logits of the
/// last one and attention over each token's growing context.
fn prefill_flops(model: &Model, n_prompt: usize) -> f64 {
    n_prompt as f64 * model.block_flops_per_token()
        + model.output_flops()
        + (1..=n_prompt)
            .map(|ctx| model.attention_flops(ctx))
            .sum::<f64>()
}

/// Bytes one-sequence decode reads per token: every weight once, and the K/V rows of the mean
/// context (decode starts after an 8-token prompt: the mean context is 8 + n_gen / 2).
fn decode_bytes(model: &Model, args: &BenchArgs) -> f64 {
    let kv_bytes_per_pos = kv_bytes_per_token(model, args.compute.kv_type);
    (model.weight_bytes() + kv_bytes_per_pos * (8 + args.n_gen / 2)) as f64
}

/// KV bytes one token takes in every layer (K and V); 0 when `kv_type` cannot hold a row of
/// this head size (the engine then refuses to start).
fn kv_bytes_per_token(model: &Model, kv_type: KvType) -> usize {
    let cfg = &model.config;
    if kv_type.row_bytes(cfg.head_dim).is_none() {
        return 0;
    }
    // A page holds one KV group's layers, and the groups together hold every layer; the block
    // size does not enter a token's bytes.
    cfg.page_geometry(kv_type, 1).bytes_per_token() * cfg.kv_layout().num_groups()
}

/// Prefill rates: an `n_prompt`-token prompt over the time to its first token, per repeat.
fn time_prefill(
    engine: &EngineHandle,
    prompts: &mut RandomPrompts,
    args: &BenchArgs,
) -> Result<Vec<f64>> {
    let mut prefill = Vec::new();
    for i in 0..args.repeats {
        progress("prefill", i, args.repeats);
        let t = &run_requests(engine, vec![prompts.next(args.n_prompt)], 1)?[0];
        prefill.push(args.n_prompt as f64 / t.time_to_first_token());
    }
    progress("prefill", args.repeats, args.repeats);
    Ok(prefill)
}

/// Decode rates of one sequence after an 8-token prompt, per repeat.
fn time_decode(
    engine: &EngineHandle,
    prompts: &mut RandomPrompts,
    args: &BenchArgs,
) -> Result<Vec<f64>> {
    let mut decode = Vec::new();
    for i in 0..args.repeats {
        progress("decode", i, args.repeats);
        let t = &run_requests(engine, vec![prompts.next(8)], args.n_gen)?[0];
        decode.push(t.decode_rate());
    }
    progress("decode", args.repeats, args.repeats);
    Ok(decode)
}

/// Weight bytes the CPU's matmuls read per decoded token, measured: a request's bytes less
/// those of the same-sized request that stops at its first token, over the tokens between.
/// 0 on a backend that is not the CPU.
fn measure_decode_weight_bytes(
    engine: &EngineHandle,
    prompts: &mut RandomPrompts,
    args: &BenchArgs,
) -> Result<f64> {
    let bytes_of = |prompts: &mut RandomPrompts, n: usize| -> Result<u64> {
        let before = edgelm::backend::cpu::matmul::weight_bytes_read();
        run_requests(engine, vec![prompts.next(8)], n)?;
        Ok(edgelm::backend::cpu::matmul::weight_bytes_read() - before)
    };
    let first = bytes_of(prompts, 1)?;
    let all = bytes_of(prompts, args.n_gen)?;
    Ok(all.saturating_sub(first) as f64 / (args.n_gen - 1) as f64)
}

/// Aggregate decode at each `--concurrency` (see [`decode_rate`]), medians over the repeats;
/// with `adapters`, each round also runs the same load spread over the base model and them.
fn time_concurrency(
    engine: &EngineHandle,
    prompts: &mut RandomPrompts,
    args: &BenchArgs,
    adapters: &[Arc<Adapter>],
) -> Result<Vec<Concurrency>> {
    let mut concurrency = Vec::new();
    for &n in &args.concurrency {
        let (mut rates, mut adapted) = (Vec::new(), Vec::new());
        for i in 0..args.repeats {
            progress(&format!("{n} sequences"), i, args.repeats);
            let batch = (0..n)
                .map(|_| prompts.next(args.concurrency_prompt))
                .collect();
            rates.push(decode_rate(&run_requests(engine, batch, args.n_gen)?));
            if adapters.is_empty() {
                continue;
            }
            // Stream k runs the base model where k is a multiple of adapters + 1, else adapter
            // (k mod (adapters + 1)) - 1.
            let spread = (0..n).map(|k| {
                let params = GenParams {
                    adapter: (k % (adapters.len() + 1))
                        .checked_sub(1)
                        .map(|a| adapters[a].clone()),
                    ..greedy_params(args.n_gen, None)
                };
                (prompts.next(args.concurrency_prompt), params)
            });
            adapted.push(decode_rate(&run_each(engine, spread.collect())?));
        }
        progress(&format!("{n} sequences"), args.repeats, args.repeats);
        concurrency.push(Concurrency {
            sequences: n,
            decode_tok_s: median(rates),
            adapters_tok_s: (!adapted.is_empty()).then(|| median(adapted)),
        });
    }
    Ok(concurrency)
}

/// Constrained decode at each `--concurrency`: the same prompts free and under the schema,
/// interleaved (the schema should not let the output end before n_gen tokens, or fewer tokens
/// are timed).
fn time_constrained(
    engine: &EngineHandle,
    prompts: &mut RandomPrompts,
    args: &BenchArgs,
    constraint: &Constraint,
) -> Result<Vec<Constrained>> {
    let mut constrained = Vec::new();
    for &n in &args.concurrency {
        let (mut free, mut bound) = (Vec::new(), Vec::new());
        let label = format!("{n} sequences, constrained");
        for i in 0..args.repeats {
            progress(&label, i, args.repeats);
            let batch: Vec<Vec<u32>> = (0..n)
                .map(|_| prompts.next(args.concurrency_prompt))
                .collect();
            free.push(decode_rate(&run_constrained(
                engine,
                batch.clone(),
                args.n_gen,
                None,
            )?));
            bound.push(decode_rate(&run_constrained(
                engine,
                batch,
                args.n_gen,
                Some(constraint),
            )?));
        }
        progress(&label, args.repeats, args.repeats);
        let (u, k) = (median(free), median(bound));
        constrained.push(Constrained {
            sequences: n,
            unconstrained_tok_s: u,
            constrained_tok_s: k,
            ratio: k / u,
        });
    }
    Ok(constrained)
}

/// The prefix cache: a long shared system prompt, then a second request that extends it; the
/// time to first token of each.
fn time_shared_prefix(
    engine: &EngineHandle,
    prompts: &mut RandomPrompts,
    args: &BenchArgs,
) -> Result<SharedPrefix> {
    let (mut first, mut second, mut cached) = (Vec::new(), Vec::new(), 0);
    for i in 0..args.repeats {
        progress("shared prefix", i, args.repeats);
        let system = prompts.next(args.shared_prefix);
        let ask = |suffix: Vec<u32>| -> Result<Timing> {
            let mut p = system.clone();
            p.extend(suffix);
            Ok(run_requests(engine, vec![p], 1)?.remove(0))
        };
        first.push(ask(prompts.next(16))?.time_to_first_token());
        let warm = ask(prompts.next(16))?;
        second.push(warm.time_to_first_token());
        cached = warm.cached_tokens;
    }
    progress("shared prefix", args.repeats, args.repeats);
    let (a, b) = (median(first), median(second));
    Ok(SharedPrefix {
        prefix_tokens: args.shared_prefix,
        first_ttft_s: a,
        second_ttft_s: b,
        ratio: b / a,
        second_cached_tokens: cached,
    })
}

impl Report {
    /// The prefill, decode and concurrency lines, against the machine's ceilings.
    fn print_throughput(&self, repeats: usize) {
        println!(
            "threads {}, KV {}, medians of {} runs",
            self.threads, self.kv_type, repeats
        );
        println!(
            "prefill  pp{:<5} {:>9.1} tok/s   {:>6.1} GFLOP/s = {:>4.1}% of {:.1} GFLOP/s (FMA loop peak)",
            self.n_prompt,
            self.prefill_tok_s,
            self.prefill_gflops,
            100.0 * self.prefill_gflops / self.peak_gflops,
            self.peak_gflops
        );
        println!(
            "decode   tg{:<5} {:>9.1} tok/s   {:>6.1} GB/s    = {:>4.1}% of {:.1} GB/s (copy peak), {:.1}% of {:.1} GB/s (read peak)",
            self.n_gen,
            self.decode_tok_s,
            self.decode_gbs,
            100.0 * self.decode_gbs / self.peak_gbs,
            self.peak_gbs,
            100.0 * self.decode_gbs / self.peak_read_gbs,
            self.peak_read_gbs
        );
        if self.decode_weight_bytes_measured > 0.0 {
            let mib = |b: f64| b / (1 << 20) as f64;
            println!(
                "decode   weights read per token: {:.1} MiB measured, {:.1} MiB active ({:.2}x), of {:.1} MiB in all",
                mib(self.decode_weight_bytes_measured),
                mib(self.decode_weight_bytes_active as f64),
                self.decode_weight_bytes_measured / self.decode_weight_bytes_active as f64,
                mib(self.weight_bytes_all as f64),
            );
        }
        let single = self
            .concurrency
            .iter()
            .find(|c| c.sequences == 1)
            .map(|c| c.decode_tok_s);
        for c in &self.concurrency {
            let x = single
                .map(|s| format!("  ({:.2}x one sequence)", c.decode_tok_s / s))
                .unwrap_or_default();
            println!(
                "decode   {:>3} seqs  {:>9.1} tok/s aggregate{x}",
                c.sequences, c.decode_tok_s
            );
            if let Some(a) = c.adapters_tok_s {
                println!(
                    "lora     {:>3} seqs  {a:>9.1} tok/s aggregate over the base and the adapters \
                     ({:.2}x the base alone)",
                    c.sequences,
                    a / c.decode_tok_s
                );
            }
        }
    }

    /// The lines of the optional tests: schema, shared prefix, prompt lookup.
    fn print_features(&self) {
        for c in &self.constrained {
            println!(
                "schema   {:>3} seqs  {:>9.1} tok/s constrained, {:.1} free ({:.0}%)",
                c.sequences,
                c.constrained_tok_s,
                c.unconstrained_tok_s,
                100.0 * c.ratio
            );
        }
        if let Some(s) = &self.shared_prefix {
            println!(
                "prefix   {} shared tokens: TTFT {:.3} s cold, {:.3} s cached ({:.0}%; {} tokens from the cache)",
                s.prefix_tokens,
                s.first_ttft_s,
                s.second_ttft_s,
                s.ratio * 100.0,
                s.second_cached_tokens
            );
        }
        if let Some(p) = &self.prompt_lookup {
            println!(
                "lookup   {} prompt tokens, {} generated: {:.1} tok/s with drafts of up to {}, {:.1} plain ({:.2}x); {:.0}% of draft tokens accepted, {:.2} tokens per step; {}",
                p.prompt_tokens,
                p.generated_tokens,
                p.lookup_tok_s,
                p.max_draft,
                p.plain_tok_s,
                p.speedup,
                100.0 * p.acceptance,
                p.lookup_tokens_per_step,
                if p.same_output { "same output" } else { "outputs differ (a near-tie)" }
            );
        }
    }
}

/// Greedy decode of `prompt` (up to `n_gen` tokens) without and with prompt-lookup drafts,
/// interleaved `repeats` times: tokens after the first over the time they took, medians.
/// `step_budget`: tokens an engine step takes at most (the prompt's steps are not counted).
fn time_prompt_lookup(
    engine: &EngineHandle,
    prompt: &[u32],
    n_gen: usize,
    max_draft: usize,
    repeats: usize,
    step_budget: usize,
) -> Result<PromptLookup> {
    let (mut plain, mut lookup) = (Vec::new(), Vec::new());
    let (mut plain_ids, mut lookup_ids) = (Vec::new(), Vec::new());
    // Per mode: (tokens, engine steps).
    let mut per_step = [(0usize, 0u64); 2];
    // One untimed run first: it fills the prefix cache, which changes how later runs prefill
    // the prompt (and so, at a near-tie, their tokens); every timed run then starts alike.
    let plain_params = GenParams {
        max_tokens: Some(n_gen),
        sampling: SamplingParams::greedy(),
        ..Default::default()
    };
    run_with(engine, vec![prompt.to_vec()], &plain_params)?;
    let before = engine.stats();
    for i in 0..repeats {
        progress("prompt lookup", i, repeats);
        for speculate in [false, true] {
            let params = GenParams {
                prompt_lookup: speculate,
                ..plain_params.clone()
            };
            let steps_before = engine.stats().steps;
            let t = run_with(engine, vec![prompt.to_vec()], &params)?.remove(0);
            // The prompt's steps are not decode steps.
            let steps = engine.stats().steps - steps_before;
            let decode_steps = steps.saturating_sub(prompt.len().div_ceil(step_budget) as u64);
            if t.tokens.len() < 2 {
                bail!("the lookup task generated fewer than 2 tokens");
            }
            let m = &mut per_step[usize::from(speculate)];
            m.0 += t.tokens.len() - 1;
            m.1 += decode_steps;
            let (rates, ids) = if speculate {
                (&mut lookup, &mut lookup_ids)
            } else {
                (&mut plain, &mut plain_ids)
            };
            rates.push(t.decode_rate());
            *ids = t.ids;
        }
    }
    progress("prompt lookup", repeats, repeats);
    let after = engine.stats();
    let drafted = after.draft_tokens - before.draft_tokens;
    let accepted = after.accepted_draft_tokens - before.accepted_draft_tokens;
    let (p, l) = (median(plain), median(lookup));
    Ok(PromptLookup {
        prompt_tokens: prompt.len(),
        generated_tokens: lookup_ids.len(),
        max_draft,
        plain_tok_s: p,
        lookup_tok_s: l,
        speedup: l / p,
        acceptance: accepted as f64 / (drafted as f64).max(1.0),
        same_output: plain_ids == lookup_ids,
        lookup_tokens_per_step: per_step[1].0 as f64 / per_step[1].1.max(1) as f64,
        plain_tokens_per_step: per_step[0].0 as f64 / per_step[0].1.max(1) as f64,
    })
}

/// Aggregate decode rate of requests that ran together: tokens generated once every one is
/// past its prompt, over that window (prefill excluded, as llama-batched-bench reports S_TG).
fn decode_rate(ts: &[Timing]) -> f64 {
    let t0 = ts.iter().filter_map(|t| t.first).max().unwrap();
    let t1 = ts
        .iter()
        .filter_map(|t| t.tokens.last().copied())
        .max()
        .unwrap();
    let tokens = ts
        .iter()
        .flat_map(|t| t.tokens.iter())
        .filter(|&&at| at > t0)
        .count();
    tokens as f64 / t1.duration_since(t0).as_secs_f64().max(1e-9)
}
