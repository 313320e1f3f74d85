//! The hybrid test models (lfm2's short convolutions, qwen35's gated DeltaNets) on the device:
//! each sequence's recurrent state stays in its own state slot, a fork's copy and a restored
//! prefix-cache snapshot give exactly the logits their source would (decode graphs on), and the
//! real binary's `run`, `perplexity`, `bench` and `serve` run them on the device. The
//! architecture test (`architectures.rs`) checks their logits against the CPU's.

use super::device_test_model;
use super::forward::{executor, logits, BT};
use super::moe::{run_perplexity_and_bench, serve_a_completion};
use edgelm::backend::cuda::{CudaExecutor, KvBudget};
use edgelm::kv::KvType;
use edgelm::model::{BatchMeta, Logits, Model};
use std::sync::Arc;

const HYBRIDS: [&str; 2] = ["lfm2", "qwen35"];

/// One span of a step: tokens from `pos`, block `block` (one block of BT tokens holds all of
/// a sequence here), state slot `slot`, a snapshot after `save.0` tokens into slot `save.1`.
struct Span<'a> {
    tokens: &'a [u32],
    pos: usize,
    block: u32,
    slot: u32,
    save: Option<(usize, u32)>,
}

/// The last token's logits of each span, in one step. Every step here has at most 8 tokens
/// (the GEMV's), so a token's logits do not depend on what else the step holds.
fn step(x: &mut CudaExecutor, model: &Model, spans: &[Span<'_>]) -> Vec<Vec<f32>> {
    let mut b = BatchMeta::default();
    for s in spans {
        b.push_span_single(s.tokens, s.pos, vec![s.block], Logits::Last);
        b.set_state_slot(s.slot);
        if let Some((after, slot)) = s.save {
            b.save_state_after(after, slot);
        }
    }
    let vocab = model.config.vocab_size;
    logits(x, model, &b)
        .chunks_exact(vocab)
        .map(<[f32]>::to_vec)
        .collect()
}

fn span(tokens: &[u32], pos: usize, block: u32, slot: u32) -> Span<'_> {
    Span {
        tokens,
        pos,
        block,
        slot,
        save: None,
    }
}

/// Sequences A (slot 0) and B (slot 1) prefill 8 tokens in two steps, side by side, A's state
/// after its first 4 saved into snapshot slot 4. Then D resumes A's prompt after 4 tokens from
/// that snapshot (restored into slot 3, beside a copy of A's block): its logits are A's. A
/// fork C of A (state copied into slot 2, block copied) decodes the token A decodes, in the
/// same step and in a decode graph with B: its logits are A's each time.
fn states_stay_apart(arch: &str) {
    let model = Arc::new(Model::load(&device_test_model(arch)).unwrap());
    let mut x = executor(&model, KvType::F16, true, KvBudget::Blocks(8));
    let a: Vec<u32> = (0..8).map(|i| 100 + 37 * i).collect();
    let b: Vec<u32> = (0..8).map(|i| 2000 + 11 * i).collect();
    let first_a = Span {
        save: Some((4, 4)),
        ..span(&a[..4], 0, 0, 0)
    };
    step(&mut x, &model, &[first_a, span(&b[..4], 0, 1, 1)]);
    let a2 = step(
        &mut x,
        &model,
        &[span(&a[4..], 4, 0, 0), span(&b[4..], 4, 1, 1)],
    );
    // The restore: A's first block (its K/V) and its snapshot after 4 tokens.
    x.copy_block(0, 5).unwrap();
    x.copy_state(4, 3).unwrap();
    // The fork after 8 tokens.
    x.copy_block(0, 6).unwrap();
    x.copy_state(0, 2).unwrap();
    let next = [7u32];
    // 7 tokens: D's 4, then A, its fork C and B decode one each.
    let got = step(
        &mut x,
        &model,
        &[
            span(&a[4..], 4, 5, 3),
            span(&next, 8, 0, 0),
            span(&next, 8, 6, 2),
            span(&next, 8, 1, 1),
        ],
    );
    assert_eq!(got[0], a2[0], "{arch}: the restored snapshot's logits");
    assert_eq!(got[1], got[2], "{arch}: the fork's logits");
    // Plain decode steps (a graph of 4: three sequences and a padding token).
    for pos in 9..11 {
        let t = [pos as u32 * 3];
        let got = step(
            &mut x,
            &model,
            &[
                span(&t, pos, 0, 0),
                span(&t, pos, 6, 2),
                span(&t, pos, 1, 1),
            ],
        );
        assert_eq!(got[0], got[1], "{arch}: the fork's logits at {pos}");
        assert_ne!(got[0], got[2], "{arch}: B's state is its own");
    }
    assert!(x.graphs_captured() > 0, "{arch}: no decode graph ran");
    eprintln!("{arch}: states apart, the fork and the restored snapshot exact on the device");
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_hybrid_states_stay_apart_fork_and_restore() {
    const { assert!(BT >= 16, "each sequence's positions fit one block") };
    HYBRIDS.into_iter().for_each(states_stay_apart);
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_hybrids_run_perplexity_and_bench() {
    HYBRIDS.into_iter().for_each(run_perplexity_and_bench);
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_hybrids_serve_a_completion() {
    HYBRIDS.into_iter().for_each(serve_a_completion);
}
