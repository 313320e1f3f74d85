//! Every architecture's forward pass on the device against the CPU's, on the test models made
//! from the reference model (tests/common/test_models.rs): llama with Llama 3's rope_freqs and
//! an untied output, qwen2's biases, qwen3's Q/K norms, phi3's fused tensors and LongRoPE,
//! smollm3's layers without RoPE, granite's scales, qwen3moe's experts, gpt-oss's MXFP4
//! experts with their biases, clamped SwiGLU, attention sinks and YaRN, gemma3 with its four
//! norms, GELU, its scales and sliding windows (cut to 4 positions here, so that even the
//! emulator's short run crosses them), and the hybrids: lfm2's short convolutions, qwen35's
//! gated DeltaNets, gated attention and M-RoPE, each sequence's recurrent state in a state
//! slot of its own. Two sequences are prefilled in one step (all rows' logits), then decoded
//! together (graphs on); the windowed groups' blocks behind the window are handed back as the
//! engine hands them back (NO_BLOCK in their tables), so a kernel that read one would show.
//! The bar: as close to the CPU's f16 pages as the CPU's own q8_0 pages are, in distance
//! (these models' rows are near-flat, so top-1 agreement is only reported).

use super::device_test_model;
use super::forward::{cpu_logits, executor, limit, logits, Agreement, BT};
use crate::common::TEST_ARCHS;
use edgelm::backend::cuda::KvBudget;
use edgelm::kv::{KvType, NO_BLOCK};
use edgelm::model::{BatchMeta, Logits, Model, Window};
use std::sync::Arc;

/// Tokens of sequence `s`: a fixed, spread-out walk through the vocabulary.
fn tokens(s: usize, n: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + s * 104_729 + 13) % vocab) as u32)
        .collect()
}

/// Sequence `s`'s block tables (one per KV group) for a step at position `pos`: blocks the step
/// no longer reads in a windowed group are gone.
fn tables(model: &Model, s: usize, blocks: usize, pos: usize) -> Vec<Vec<u32>> {
    let layout = &model.layout;
    (0..layout.num_groups())
        .map(|g| {
            let first = (s * layout.num_groups() + g) * blocks;
            let keep = layout.first_needed_block(g, pos, BT);
            (0..blocks)
                .map(|b| {
                    if b < keep {
                        NO_BLOCK
                    } else {
                        (first + b) as u32
                    }
                })
                .collect()
        })
        .collect()
}

/// A hybrid's sequence `s` keeps its recurrent state in state slot `s`.
fn state_slot(b: &mut BatchMeta, model: &Model, s: usize) {
    if model.config.state_floats() > 0 {
        b.set_state_slot(s as u32);
    }
}

/// Sliding windows this short are crossed by the shortest run (the emulator's).
const WINDOW: usize = 4;

fn check(arch: &str) {
    let mut model = Model::load(&device_test_model(arch)).unwrap();
    for layer in &mut model.config.layers {
        if layer.window.is_some() {
            layer.window = Some(Window::Trailing(WINDOW));
        }
    }
    model.layout = model.config.kv_layout();
    let model = Arc::new(model);
    let vocab = model.config.vocab_size;
    // A prompt longer than a window, then decode steps (past a block boundary on a GPU).
    let (prompt, steps) = (limit("ARCH_PROMPT").min(120), limit("ARCH_STEPS").min(12));
    let total = prompt + steps;
    let blocks = total.div_ceil(BT);
    let seqs: Vec<Vec<u32>> = (0..2).map(|s| tokens(s, total, vocab)).collect();
    let want: Vec<Vec<f32>> = seqs
        .iter()
        .map(|t| cpu_logits(&model, t, KvType::F16))
        .collect();
    let mut yardstick = Agreement::default();
    for (t, w) in seqs.iter().zip(&want) {
        let other = cpu_logits(&model, t, KvType::Q8_0);
        for (g, w) in other.chunks_exact(vocab).zip(w.chunks_exact(vocab)) {
            yardstick.add("", g, w);
        }
    }
    let groups = model.layout.num_groups();
    let mut x = executor(
        &model,
        KvType::F16,
        true,
        KvBudget::Blocks(2 * groups * blocks),
    );
    let mut stats = Agreement::default();
    let mut b = BatchMeta::default();
    for (s, t) in seqs.iter().enumerate() {
        b.push_span(&t[..prompt], 0, tables(&model, s, blocks, 0), Logits::All);
        state_slot(&mut b, &model, s);
    }
    let got = logits(&mut x, &model, &b);
    for (s, rows) in got.chunks_exact(prompt * vocab).enumerate() {
        for (r, (g, w)) in rows
            .chunks_exact(vocab)
            .zip(want[s].chunks_exact(vocab))
            .enumerate()
        {
            stats.add(&format!("{arch} sequence {s} prefill row {r}"), g, w);
        }
    }
    for pos in prompt..total {
        let mut b = BatchMeta::default();
        for (s, t) in seqs.iter().enumerate() {
            b.push_span(
                &t[pos..pos + 1],
                pos,
                tables(&model, s, blocks, pos),
                Logits::Last,
            );
            state_slot(&mut b, &model, s);
        }
        let got = logits(&mut x, &model, &b);
        for (s, g) in got.chunks_exact(vocab).enumerate() {
            let w = &want[s][pos * vocab..(pos + 1) * vocab];
            stats.add(&format!("{arch} sequence {s} decode at {pos}"), g, w);
        }
    }
    eprintln!(
        "{arch}: device vs CPU: {}\n  yardstick, the CPU's q8_0 pages vs its f16 pages: {}",
        stats.summary(),
        yardstick.summary()
    );
    stats.assert_close_in_distance(&yardstick);
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_every_architecture_matches_the_cpu() {
    // EDGELM_CUDA_TEST_ARCHS=lfm2,qwen35: only those (the emulator takes minutes per model).
    let only = std::env::var("EDGELM_CUDA_TEST_ARCHS").ok();
    for arch in TEST_ARCHS {
        if only
            .as_ref()
            .is_some_and(|o| !o.split(',').any(|a| a == arch))
        {
            continue;
        }
        check(arch);
    }
}
