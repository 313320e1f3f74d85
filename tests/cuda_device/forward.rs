//! The CUDA forward pass on a GPU against the CPU's, on the reference model over the reference
//! prompts (tests/data, `EDGELM_REFERENCE_DIR` overrides): logits parity for prefill
//! and for batched decode steps (graphs on and off), the reference greedy continuations, device
//! sampling, and the KV pool taking all free memory but the reserve.
//!
//! What "parity" can mean for this model: every matmul quantizes its input to int8, so a
//! last-bit difference (another f32 summation order) sometimes moves a value across a rounding
//! boundary, and 30 layers amplify those steps. Measured on the host emulator (emu/cuda), the
//! device matches the CPU to about 1e-7 (relative L2) through one layer with q8_0 pages (both
//! sides compute attention in f32; 5e-4 where one rounding step flips), but the full model's
//! logits rows differ by a few 1e-2 on average, about as much as the CPU's own q8_0 pages
//! differ from its f16 pages. So the checks
//! are: one layer, to a bound only a wrong result exceeds; the whole model, against that
//! yardstick, with the top token the CPU's nearly everywhere and never another one where the
//! CPU is confident.

use edgelm::backend::batch::StepOutput;
use edgelm::backend::cuda::launch::SampleRow;
use edgelm::backend::cuda::{CudaExecutor, ExecutorConfig, KvBudget, Want};
use edgelm::engine::{Session, SessionConfig};
use edgelm::kv::KvType;
use edgelm::model::{BatchMeta, Logits, Model};
use std::path::PathBuf;
use std::sync::Arc;

pub(super) const BT: usize = 16;

fn reference() -> serde_json::Value {
    let dir = std::env::var_os("EDGELM_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"));
    let text = std::fs::read_to_string(dir.join("smollm2-llamacpp.json"))
        .unwrap_or_else(|e| panic!("reference data missing in {}: {e}", dir.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// `EDGELM_CUDA_TEST_<name>` as a number: how much of the reference data to use. All of it on
/// a GPU; a part under the host emulator (emu/cuda/), where a forward pass takes seconds.
pub(super) fn limit(name: &str) -> usize {
    std::env::var(format!("EDGELM_CUDA_TEST_{name}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
}

/// The 12 greedy cases (the first EDGELM_CUDA_TEST_PROMPTS of them): (prompt ids, the peer's
/// greedy continuation, cut to EDGELM_CUDA_TEST_TOKENS tokens).
fn cases() -> Vec<(Vec<u32>, Vec<u32>)> {
    reference()["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .take(limit("PROMPTS"))
        .map(|c| {
            let mut gen = ids(&c["ids"]);
            gen.truncate(limit("TOKENS"));
            (ids(&c["prompt_ids"]), gen)
        })
        .collect()
}

fn model() -> Arc<Model> {
    Arc::new(Model::load(&crate::model()).unwrap())
}

pub(super) fn executor(
    model: &Arc<Model>,
    kv: KvType,
    graphs: bool,
    kv_budget: KvBudget,
) -> CudaExecutor {
    let cfg = ExecutorConfig {
        kv_type: kv,
        block_size: BT,
        max_tokens: 512,
        max_seqs: 16,
        context: 2048,
        kv: kv_budget,
        graphs,
        // A hybrid's: one per sequence, as many again for snapshots.
        state_slots: 32,
    };
    CudaExecutor::new(0, model.as_ref(), cfg).unwrap_or_else(|e| panic!("no CUDA executor: {e}"))
}

pub(super) fn logits(x: &mut CudaExecutor, model: &Model, b: &BatchMeta) -> Vec<f32> {
    match x.forward(model, b, Want::Logits).unwrap() {
        StepOutput::Logits(l) => l,
        StepOutput::Tokens(_) => panic!("tokens for logits"),
    }
}

/// ||a - b|| / ||b||.
fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let (mut d, mut n) = (0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        d += (x as f64 - y as f64).powi(2);
        n += (y as f64).powi(2);
    }
    (d / n.max(1e-30)).sqrt()
}

fn argmax_and_margin(l: &[f32]) -> (usize, f32) {
    let (mut best, mut second, mut at) = (f32::NEG_INFINITY, f32::NEG_INFINITY, 0);
    for (i, &v) in l.iter().enumerate() {
        if v > best {
            second = best;
            best = v;
            at = i;
        } else if v > second {
            second = v;
        }
    }
    (at, best - second)
}

/// How the device's logits rows compare with the CPU's.
#[derive(Default)]
pub(super) struct Agreement {
    rows: usize,
    rel_sum: f64,
    rel_worst: f64,
    worst_at: String,
    top1_same: usize,
    /// Rows whose top token differs although the CPU's top-2 margin is at least 0.5.
    confident_flips: Vec<String>,
}

impl Agreement {
    pub(super) fn add(&mut self, what: &str, got: &[f32], want: &[f32]) {
        let e = rel_l2(got, want);
        self.rows += 1;
        self.rel_sum += e;
        if e > self.rel_worst {
            self.rel_worst = e;
            self.worst_at = what.to_string();
        }
        let (g, _) = argmax_and_margin(got);
        let (w, margin) = argmax_and_margin(want);
        if g == w {
            self.top1_same += 1;
        } else if margin >= 0.5 {
            self.confident_flips
                .push(format!("{what}: {g} instead of {w} (margin {margin:.2})"));
        }
    }

    pub(super) fn summary(&self) -> String {
        format!(
            "{} rows, relative L2 mean {:.2e}, worst {:.2e} ({}); top token the same in {}/{}; \
             {} confident flips {:?}",
            self.rows,
            self.rel_sum / self.rows.max(1) as f64,
            self.rel_worst,
            self.worst_at,
            self.top1_same,
            self.rows,
            self.confident_flips.len(),
            self.confident_flips
        )
    }

    fn mean(&self) -> f64 {
        self.rel_sum / self.rows.max(1) as f64
    }

    /// Mean relative L2 at most twice the yardstick's (the CPU with its other page format), or
    /// 1e-2.
    fn assert_distance(&self, yardstick: &Agreement) {
        let bound = (2.0 * yardstick.mean()).max(1e-2);
        assert!(
            self.mean() <= bound,
            "mean relative L2 {:.2e} exceeds {bound:.2e}: {}",
            self.mean(),
            self.summary()
        );
    }

    /// For models whose rows are near-flat (the test models: their top tokens tie often, so a
    /// few dozen rows say little about top-1 agreement): the distance bound, and no more
    /// confident flips than the yardstick has.
    pub(super) fn assert_close_in_distance(&self, yardstick: &Agreement) {
        self.assert_distance(yardstick);
        assert!(
            self.confident_flips.len() <= yardstick.confident_flips.len(),
            "{}",
            self.summary()
        );
    }

    /// The device is as close to the CPU as `yardstick` is: the distance bound, the top token
    /// the CPU's in at least 95% of rows, and never another top token where the CPU's margin
    /// is at least 0.5.
    pub(super) fn assert_close(&self, yardstick: &Agreement) {
        self.assert_distance(yardstick);
        assert!(
            self.top1_same * 100 >= 95 * self.rows,
            "top token differs too often: {}",
            self.summary()
        );
        assert!(self.confident_flips.is_empty(), "{}", self.summary());
    }
}

/// The model cut to its first layer, every reference prompt prefilled: a wrong result (RoPE,
/// the causal mask, GQA, a page format) shows at once, before 30 layers blur it. The bound is
/// rounding plus the one int8 rounding step a last-bit difference can cause; with f16 pages also
/// the CPU's f16 steps (f16 query, f16 accumulator: ggml's), which the device's f32 attention
/// does not take.
fn one_layer_parity(kv: KvType) {
    let mut m = Model::load(&crate::model()).unwrap();
    m.weights.layers.truncate(1);
    m.config.layers.truncate(1);
    m.config.n_layers = 1;
    m.layout = m.config.kv_layout();
    let model = Arc::new(m);
    let vocab = model.config.vocab_size;
    let bound = if kv == KvType::F16 { 3e-2 } else { 5e-3 };
    let mut x = executor(&model, kv, false, KvBudget::Blocks(8));
    let mut worst = 0f64;
    for (i, (prompt, _)) in cases().iter().enumerate() {
        let cpu = cpu_logits(&model, prompt, kv);
        let mut b = BatchMeta::default();
        b.push_span_single(prompt, 0, table(0, 8 * BT), Logits::All);
        let got = logits(&mut x, &model, &b);
        for (r, (g, w)) in got
            .chunks_exact(vocab)
            .zip(cpu.chunks_exact(vocab))
            .enumerate()
        {
            let e = rel_l2(g, w);
            worst = worst.max(e);
            assert!(
                e <= bound,
                "one layer, {kv} pages: prompt {i} row {r}: relative L2 {e:.2e}"
            );
        }
    }
    eprintln!("one layer, {kv} pages: worst relative L2 {worst:.2e} (bound {bound:.0e})");
}

/// The CPU's logits for every position of `tokens`, with `kv` pages.
pub(super) fn cpu_logits(model: &Arc<Model>, tokens: &[u32], kv: KvType) -> Vec<f32> {
    Session::new(model.clone(), SessionConfig::cpu(kv, BT, tokens.len(), 512))
        .unwrap()
        .extend(tokens, Logits::All)
        .unwrap()
}

fn table(first: u32, tokens: usize) -> Vec<u32> {
    (first..first + tokens.div_ceil(BT) as u32).collect()
}

/// Every prompt prefilled alone (all rows' logits), then the reference continuations decoded
/// teacher-forced with all live sequences in one step (12 sequences: a padded bucket of 16,
/// the GEMM; fewer at the end: the GEMV), against the CPU scoring the same tokens.
fn parity(kv: KvType, graphs: bool) {
    one_layer_parity(kv);
    let model = model();
    let vocab = model.config.vocab_size;
    let cases = cases();
    let mut x = executor(&model, kv, graphs, KvBudget::Blocks(12 * 8));
    assert_eq!(
        x.weights_zero_copy(),
        x.device().info.integrated,
        "weights are read in place exactly on an integrated GPU"
    );
    let tables: Vec<Vec<u32>> = (0..cases.len())
        .map(|i| table(i as u32 * 8, 8 * BT))
        .collect();
    let mut stats = Agreement::default();
    let mut check = |what: &str, got: &[f32], want: &[f32]| {
        for (g, w) in got.chunks_exact(vocab).zip(want.chunks_exact(vocab)) {
            stats.add(what, g, w);
        }
    };
    // The yardstick: the CPU with the other KV page format, on the same rows.
    let other = if kv == KvType::F16 {
        KvType::Q8_0
    } else {
        KvType::F16
    };
    let mut yardstick = Agreement::default();
    let mut want_rows = Vec::new();
    for (i, (prompt, gen)) in cases.iter().enumerate() {
        let mut all = prompt.clone();
        all.extend(gen);
        let cpu = cpu_logits(&model, &all, kv);
        let cpu_other = cpu_logits(&model, &all, other);
        for (g, w) in cpu_other.chunks_exact(vocab).zip(cpu.chunks_exact(vocab)) {
            yardstick.add("", g, w);
        }
        let mut b = BatchMeta::default();
        b.push_span_single(prompt, 0, tables[i].clone(), Logits::All);
        let got = logits(&mut x, &model, &b);
        check(
            &format!("prompt {i} prefill ({} tokens)", prompt.len()),
            &got,
            &cpu[..prompt.len() * vocab],
        );
        want_rows.push(cpu);
    }
    let longest = cases.iter().map(|c| c.1.len()).max().unwrap();
    for k in 0..longest.saturating_sub(1) {
        let mut b = BatchMeta::default();
        let mut live = Vec::new();
        for (i, (prompt, gen)) in cases.iter().enumerate() {
            if k + 1 < gen.len() {
                b.push_span_single(
                    &gen[k..k + 1],
                    prompt.len() + k,
                    tables[i].clone(),
                    Logits::Last,
                );
                live.push(i);
            }
        }
        let got = logits(&mut x, &model, &b);
        for (j, &i) in live.iter().enumerate() {
            let at = cases[i].0.len() + k;
            check(
                &format!("prompt {i} decode step {k} ({} sequences)", live.len()),
                &got[j * vocab..(j + 1) * vocab],
                &want_rows[i][at * vocab..(at + 1) * vocab],
            );
        }
    }
    eprintln!(
        "{kv} pages, graphs {}: device vs CPU: {}; {} decode graphs\n  yardstick, the CPU's \
         {other} pages vs its {kv} pages: {}",
        if graphs { "on" } else { "off" },
        stats.summary(),
        x.graphs_captured(),
        yardstick.summary()
    );
    stats.assert_close(&yardstick);
    if graphs {
        assert!(x.graphs_captured() > 0, "no decode graph was captured");
    }
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_logits_match_the_cpu_f16_pages() {
    parity(KvType::F16, true);
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_logits_match_the_cpu_without_graphs_and_q8_0_pages() {
    parity(KvType::Q8_0, false);
}

/// Greedy generation on the device (only token ids come back), one prompt at a time, as the
/// reference test does on the CPU. Neither side is held to the peer's 48-token continuations
/// token for token: tests/reference.rs lets the CPU leave them only where the peer's top-2
/// margin is under 0.5, since any perturbation of this model's K/V changes whole trajectories
/// (its q8_0 pages keep 4 of the 12 f16 continuations, the peer's own q8_0 cache 3 of 12).
/// What must hold here: wherever the device's continuation leaves the reference, the two
/// tokens were a near tie for the CPU too (top-2 margin < 0.5 on the same context), never a
/// token the CPU was sure of; identical continuations are only counted.
#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_greedy_continuations_match_the_reference() {
    let model = model();
    let tok = edgelm::tokenizer::Tokenizer::from_gguf(&model.file).unwrap();
    let mut x = executor(&model, KvType::F16, true, KvBudget::Blocks(8));
    let greedy = |x: &mut CudaExecutor, b: &BatchMeta| match x
        .forward(model.as_ref(), b, Want::Greedy)
        .unwrap()
    {
        StepOutput::Tokens(t) => t,
        StepOutput::Logits(_) => panic!("logits for tokens"),
    };
    let vocab = model.config.vocab_size;
    let mut exact = 0;
    let mut report = Vec::new();
    let mut confident = Vec::new();
    let cases = cases();
    for (i, (prompt, want)) in cases.iter().enumerate() {
        let t = table(0, 8 * BT);
        let mut b = BatchMeta::default();
        b.push_span_single(prompt, 0, t.clone(), Logits::Last);
        let mut next = greedy(&mut x, &b)[0];
        // The same row through sample_rows: top_k = 1 is the argmax whatever the temperature.
        let row = SampleRow {
            temperature: 0.8,
            top_p: 1.0,
            min_p: 0.0,
            top_k: 1,
            seed: 7,
            step: 0,
        };
        match x.forward(model.as_ref(), &b, Want::Sample(&[row])).unwrap() {
            StepOutput::Tokens(s) => assert_eq!(s[0], next, "sample_rows top_k=1 vs argmax"),
            StepOutput::Logits(_) => panic!("logits for tokens"),
        }
        let mut got = Vec::new();
        while got.len() < want.len() {
            got.push(next);
            if tok.is_eog(next) {
                break;
            }
            let mut b = BatchMeta::default();
            b.push_span_single(
                &[next],
                prompt.len() + got.len() - 1,
                t.clone(),
                Logits::Last,
            );
            next = greedy(&mut x, &b)[0];
        }
        if &got == want {
            exact += 1;
            continue;
        }
        // The first token that differs (or where one continuation ended first).
        let d = got
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap_or(got.len().min(want.len()));
        let mut all = prompt.clone();
        all.extend(want);
        let cpu = cpu_logits(&model, &all, KvType::F16);
        let row = &cpu[(prompt.len() + d - 1) * vocab..(prompt.len() + d) * vocab];
        let (_, margin) = argmax_and_margin(row);
        let line = format!(
            "prompt {i}: same for {d} tokens, then {:?} for {:?} (CPU margin {margin:.3})",
            got.get(d),
            want.get(d)
        );
        if d < want.len() && margin >= 0.5 {
            confident.push(line.clone());
        }
        report.push(line);
    }
    let n = cases.len();
    eprintln!("CUDA greedy: {exact}/{n} identical; {}", report.join("; "));
    assert!(
        confident.is_empty(),
        "the device left the reference where the CPU was sure: {}",
        confident.join("; ")
    );
}

/// The pool is all free device memory but the reserve (within a block and the allocator's
/// rounding).
#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_kv_pool_takes_free_memory_minus_the_reserve() {
    let model = model();
    let reserve = 512usize << 20;
    let x = executor(&model, KvType::F16, false, KvBudget::AllBut(reserve));
    x.device().ctx.bind_to_thread().unwrap();
    let (free, total) = cudarc::driver::result::mem_get_info().unwrap();
    let block = x.geometry().block_bytes();
    eprintln!(
        "KV pool {} MiB ({} blocks); {} MiB free of {} MiB after it (reserve {} MiB)",
        x.kv_bytes() >> 20,
        x.blocks(),
        free >> 20,
        total >> 20,
        reserve >> 20
    );
    let slack = 2 * block + (64 << 20);
    assert!(
        free + slack >= reserve && free <= reserve + slack,
        "{} MiB free after the pool, want about {} MiB",
        free >> 20,
        reserve >> 20
    );
}
