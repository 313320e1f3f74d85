//! The CUDA forward pass on a GPU against the CPU's, on the reference model over the reference
//! prompts (../shared/reference, `EDGELM_REFERENCE_DIR` overrides): logits parity (relative L2
//! error < 1e-2) for prefill and for batched decode steps (graphs on and off), the reference
//! greedy continuations (>= 10 of 12 identical, as the CPU must), device sampling, and the KV
//! pool taking all free memory but the reserve.

use edgelm::backend::cuda::launch::SampleRow;
use edgelm::backend::cuda::{CudaExecutor, ExecutorConfig, KvBudget, StepOut, Want};
use edgelm::engine::Session;
use edgelm::kv::KvType;
use edgelm::model::{BatchMeta, Logits, Model};
use std::path::PathBuf;
use std::sync::Arc;

const BT: usize = 16;

fn reference() -> serde_json::Value {
    let dir = std::env::var_os("EDGELM_REFERENCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/reference"));
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

/// The 12 greedy cases: (prompt ids, the peer's greedy continuation).
fn cases() -> Vec<(Vec<u32>, Vec<u32>)> {
    reference()["greedy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (ids(&c["prompt_ids"]), ids(&c["ids"])))
        .collect()
}

fn model() -> Arc<Model> {
    Arc::new(Model::load(&crate::model()).unwrap())
}

fn executor(model: &Arc<Model>, kv: KvType, graphs: bool, kv_budget: KvBudget) -> CudaExecutor {
    let cfg = ExecutorConfig {
        kv_type: kv,
        block_tokens: BT,
        max_tokens: 512,
        max_seqs: 16,
        context: 2048,
        kv: kv_budget,
        graphs,
    };
    CudaExecutor::new(0, model.clone(), cfg).unwrap_or_else(|e| panic!("no CUDA executor: {e}"))
}

fn logits(x: &mut CudaExecutor, b: &BatchMeta) -> Vec<f32> {
    match x.forward(b, Want::Logits).unwrap() {
        StepOut::Logits(l) => l,
        StepOut::Tokens(_) => panic!("tokens for logits"),
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

fn table(first: u32, tokens: usize) -> Vec<u32> {
    (first..first + tokens.div_ceil(BT) as u32).collect()
}

/// Every prompt prefilled alone (all rows' logits), then the reference continuations decoded
/// teacher-forced with all live sequences in one step (12 sequences: a padded bucket of 16,
/// the GEMM; fewer at the end: the GEMV), against the CPU scoring the same tokens.
fn parity(kv: KvType, graphs: bool) {
    let model = model();
    let vocab = model.config.vocab_size;
    let cases = cases();
    let mut x = executor(&model, kv, graphs, KvBudget::Blocks(12 * 8));
    let tables: Vec<Vec<u32>> = (0..cases.len())
        .map(|i| table(i as u32 * 8, 8 * BT))
        .collect();
    let (mut worst, mut sum, mut count) = (0f64, 0f64, 0usize);
    let mut check = |what: &str, got: &[f32], want: &[f32]| {
        let e = rel_l2(got, want);
        worst = worst.max(e);
        sum += e;
        count += 1;
        assert!(e < 1e-2, "{what}: relative L2 error {e:.2e}");
    };
    let mut want_rows = Vec::new();
    for (i, (prompt, gen)) in cases.iter().enumerate() {
        let mut all = prompt.clone();
        all.extend(gen);
        let mut s = Session::new(&model, all.len(), kv, BT).unwrap();
        let cpu = s.extend(&all, Logits::All, 512).unwrap();
        let mut b = BatchMeta::default();
        b.push_span(prompt, 0, tables[i].clone(), Logits::All);
        let got = logits(&mut x, &b);
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
                b.push_span(
                    &gen[k..k + 1],
                    prompt.len() + k,
                    tables[i].clone(),
                    Logits::Last,
                );
                live.push(i);
            }
        }
        let got = logits(&mut x, &b);
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
        "{kv} pages, graphs {}: {count} comparisons, relative L2 mean {:.2e}, worst {worst:.2e}; {} decode graphs",
        if graphs { "on" } else { "off" },
        sum / count as f64,
        x.graphs_captured()
    );
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
/// reference test does on the CPU.
#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_greedy_continuations_match_the_reference() {
    let model = model();
    let tok = edgelm::tokenizer::Tokenizer::from_gguf(&model.file).unwrap();
    let mut x = executor(&model, KvType::F16, true, KvBudget::Blocks(8));
    let greedy = |x: &mut CudaExecutor, b: &BatchMeta| match x.forward(b, Want::Greedy).unwrap() {
        StepOut::Tokens(t) => t,
        StepOut::Logits(_) => panic!("logits for tokens"),
    };
    let mut exact = 0;
    let mut report = Vec::new();
    for (i, (prompt, want)) in cases().iter().enumerate() {
        let t = table(0, 8 * BT);
        let mut b = BatchMeta::default();
        b.push_span(prompt, 0, t.clone(), Logits::Last);
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
        match x.forward(&b, Want::Sample(&[row])).unwrap() {
            StepOut::Tokens(s) => assert_eq!(s[0], next, "sample_rows top_k=1 vs argmax"),
            StepOut::Logits(_) => panic!("logits for tokens"),
        }
        let mut got = Vec::new();
        while got.len() < 48 {
            got.push(next);
            if tok.is_eog(next) {
                break;
            }
            let mut b = BatchMeta::default();
            b.push_span(
                &[next],
                prompt.len() + got.len() - 1,
                t.clone(),
                Logits::Last,
            );
            next = greedy(&mut x, &b)[0];
        }
        if &got == want {
            exact += 1;
        } else {
            let at = got.iter().zip(want).position(|(a, b)| a != b);
            report.push(format!("prompt {i}: first difference at {at:?}"));
        }
    }
    eprintln!("CUDA greedy: {exact}/12 identical; {}", report.join("; "));
    assert!(
        exact >= 10,
        "only {exact}/12 greedy continuations identical"
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
