//! Mixture-of-experts FFNs on the CPU: the router picks each token's experts, the step's tokens
//! are grouped by expert, and each picked expert's matrices are read once for all the tokens
//! routed to it. A decoding token therefore reads the router and its k experts, not the layer.
//!
//! What is computed is llama.cpp's `build_moe_ffn`: router logits, gating, top-k, optional
//! renormalisation and scale, then each expert's gated FFN, weighted, summed over the picks in
//! their order (best first).

use super::matmul::{matmul_fused, WeightRef};
use super::ops::{add_bias, gated};
use crate::backend::ops::{Activation, Gating, Routing};

/// The weights of one mixture-of-experts layer, as the CPU reads them.
pub struct ExpertWeights<'a> {
    pub router: WeightRef<'a>,
    pub router_bias: Option<&'a [f32]>,
    pub gate: Vec<WeightRef<'a>>,
    pub up: Vec<WeightRef<'a>>,
    pub down: Vec<WeightRef<'a>>,
    /// Per expert, the biases of its gate, up and down outputs.
    pub biases: Option<Vec<[&'a [f32]; 3]>>,
}

/// Buffers kept between steps (a step allocates nothing once they have grown).
#[derive(Default)]
pub struct MoeScratch {
    logits: Vec<f32>,
    /// Per token, its `used` picks (expert, weight), best first.
    picks: Vec<(usize, f32)>,
    /// One expert's tokens: their step rows, their pick slots, their kinds.
    rows: Vec<usize>,
    flags: Vec<bool>,
    xs: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// Per token and pick, the expert's output (tokens × used × embd).
    ys: Vec<f32>,
}

/// The smallest sum of chosen weights divided by (llama.cpp clamps it to the least normal f16).
const MIN_WEIGHT_SUM: f32 = 6.103_515_6e-5;

/// A token's picks from its router logits, best first, into `picks`.
pub fn route(logits: &[f32], r: Routing, picks: &mut Vec<(usize, f32)>) {
    picks.clear();
    let mut probs = logits.to_vec();
    if r.gating == Gating::SoftmaxThenTopK {
        softmax(&mut probs);
    }
    let mut order: Vec<usize> = (0..probs.len()).collect();
    // Stable: equal probabilities keep the lower expert first.
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    picks.extend(order.iter().take(r.used).map(|&e| (e, probs[e])));
    if r.gating == Gating::TopKThenSoftmax {
        let mut w: Vec<f32> = picks.iter().map(|p| p.1).collect();
        softmax(&mut w);
        picks.iter_mut().zip(w).for_each(|(p, w)| p.1 = w);
    }
    if r.normalize {
        let sum: f32 = picks.iter().map(|p| p.1).sum::<f32>().max(MIN_WEIGHT_SUM);
        picks.iter_mut().for_each(|p| p.1 /= sum);
    }
    if r.scale != 0.0 && r.scale != 1.0 {
        picks.iter_mut().for_each(|p| p.1 *= r.scale);
    }
}

/// In place, as ggml's: exponentials of the differences from the maximum, summed in f64.
fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// `out` (tokens × embd) = the mixture of `w` applied to `h` (tokens × embd). `generated[t]`:
/// whether token t was generated (the matmuls' order for it; empty: none was).
pub fn moe_ffn(
    w: &ExpertWeights<'_>,
    routing: Routing,
    act: Activation,
    h: &[f32],
    generated: &[bool],
    s: &mut MoeScratch,
    out: &mut [f32],
) {
    let embd = w.router.cols;
    let n_tok = h.len() / embd;
    let (n_expert, k) = (w.router.rows, routing.used);
    s.logits.resize(n_tok * n_expert, 0.0);
    matmul_fused(&[w.router], h, &mut [&mut s.logits[..]], generated);
    if let Some(b) = w.router_bias {
        add_bias(&mut s.logits, b);
    }

    let mut picks = std::mem::take(&mut s.picks);
    picks.clear();
    let mut one = Vec::with_capacity(k);
    for t in 0..n_tok {
        route(
            &s.logits[t * n_expert..(t + 1) * n_expert],
            routing,
            &mut one,
        );
        picks.extend_from_slice(&one);
    }

    s.ys.clear();
    s.ys.resize(n_tok * k * embd, 0.0);
    for e in 0..n_expert {
        s.rows.clear();
        s.flags.clear();
        s.xs.clear();
        for (i, &(pe, _)) in picks.iter().enumerate() {
            if pe == e {
                let t = i / k;
                s.rows.push(i);
                s.flags.push(generated.get(t).copied().unwrap_or(false));
                s.xs.extend_from_slice(&h[t * embd..(t + 1) * embd]);
            }
        }
        if s.rows.is_empty() {
            continue;
        }
        expert_ffn(w, e, act, s);
        for (j, &i) in s.rows.iter().enumerate() {
            s.ys[i * embd..(i + 1) * embd].copy_from_slice(&s.down[j * embd..(j + 1) * embd]);
        }
    }

    // Weighted, then summed over the picks in order, as ggml's views and adds.
    for t in 0..n_tok {
        let o = &mut out[t * embd..(t + 1) * embd];
        for (slot, &(_, weight)) in picks[t * k..(t + 1) * k].iter().enumerate() {
            let y = &s.ys[(t * k + slot) * embd..(t * k + slot + 1) * embd];
            if slot == 0 {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o = y * weight);
            } else {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o += y * weight);
            }
        }
    }
    s.picks = picks;
}

/// Expert `e`'s gated FFN over the rows gathered in `s.xs`, into `s.down`.
fn expert_ffn(w: &ExpertWeights<'_>, e: usize, act: Activation, s: &mut MoeScratch) {
    let n = s.rows.len();
    let (ff, embd) = (w.gate[e].rows, w.down[e].rows);
    s.gate.resize(n * ff, 0.0);
    s.up.resize(n * ff, 0.0);
    s.down.resize(n * embd, 0.0);
    matmul_fused(
        &[w.gate[e], w.up[e]],
        &s.xs,
        &mut [&mut s.gate[..n * ff], &mut s.up[..n * ff]],
        &s.flags,
    );
    if let Some(b) = &w.biases {
        add_bias(&mut s.gate[..n * ff], b[e][0]);
        add_bias(&mut s.up[..n * ff], b[e][1]);
    }
    gated(act, &mut s.gate[..n * ff], &s.up[..n * ff]);
    matmul_fused(
        &[w.down[e]],
        &s.gate[..n * ff],
        &mut [&mut s.down[..n * embd]],
        &s.flags,
    );
    if let Some(b) = &w.biases {
        add_bias(&mut s.down[..n * embd], b[e][2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::GgmlType;

    fn routing(used: usize, normalize: bool) -> Routing {
        Routing {
            used,
            gating: Gating::SoftmaxThenTopK,
            normalize,
            scale: 1.0,
        }
    }

    #[test]
    fn softmax_gating_picks_the_most_probable_experts_best_first() {
        let mut picks = Vec::new();
        route(&[0.0, 2.0, 1.0, -1.0], routing(2, false), &mut picks);
        let e: Vec<usize> = picks.iter().map(|p| p.0).collect();
        assert_eq!(e, [1, 2]);
        let z: f32 = [0.0f32, 2.0, 1.0, -1.0].iter().map(|v| v.exp()).sum();
        assert!((picks[0].1 - 2f32.exp() / z).abs() < 1e-6);
        assert!((picks[1].1 - 1f32.exp() / z).abs() < 1e-6);

        route(&[0.0, 2.0, 1.0, -1.0], routing(2, true), &mut picks);
        let sum: f32 = picks.iter().map(|p| p.1).sum();
        assert!((sum - 1.0).abs() < 1e-6, "renormalised weights sum to 1");
        assert!((picks[0].1 / picks[1].1 - 1f32.exp()).abs() < 1e-5);
    }

    /// gpt-oss's gating: the top k logits, weighted by a softmax over those alone (the same
    /// weights as the softmax over all, renormalised over the picks).
    #[test]
    fn top_k_then_softmax_weighs_the_picks_by_their_own_softmax() {
        let r = Routing {
            used: 2,
            gating: Gating::TopKThenSoftmax,
            normalize: false,
            scale: 1.0,
        };
        let mut picks = Vec::new();
        route(&[0.5, -1.0, 3.0, 1.0], r, &mut picks);
        assert_eq!(picks.iter().map(|p| p.0).collect::<Vec<_>>(), [2, 3]);
        let z = 3f32.exp() + 1f32.exp();
        assert!((picks[0].1 - 3f32.exp() / z).abs() < 1e-6);
        assert!((picks[1].1 - 1f32.exp() / z).abs() < 1e-6);
    }

    /// Two experts, each the identity scaled (2 and 3) in an f32 "FFN" whose down matrix
    /// undoes the SiLU: the mixture's output is the picks' weights times their scales.
    #[test]
    fn each_token_gets_its_own_experts_weighted_and_summed() {
        let f32_rows = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        // Router: expert 0 likes dimension 0, expert 1 dimension 1.
        let router = f32_rows(&[8.0, 0.0, 0.0, 8.0]);
        let eye = f32_rows(&[1.0, 0.0, 0.0, 1.0]);
        let big = f32_rows(&[30.0, 0.0, 0.0, 30.0]);
        let down = [
            f32_rows(&[2.0 / 30.0, 0.0, 0.0, 2.0 / 30.0]),
            f32_rows(&[0.1, 0.0, 0.0, 0.1]),
        ];
        fn r(w: &[u8]) -> WeightRef<'_> {
            WeightRef {
                w,
                ty: GgmlType::F32,
                rows: 2,
                cols: 2,
                height: 2,
                packed: false,
            }
        }
        let w = ExpertWeights {
            router: r(&router),
            router_bias: None,
            biases: None,
            // SiLU(30·x) ≈ 30·x for x = 1: gate scales by 30, up passes x, down brings it back.
            gate: vec![r(&big), r(&big)],
            up: vec![r(&eye), r(&eye)],
            down: vec![r(&down[0]), r(&down[1])],
        };
        let h = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut out = vec![0.0; 6];
        let mut s = MoeScratch::default();
        moe_ffn(
            &w,
            routing(1, true),
            Activation::Silu,
            &h,
            &[],
            &mut s,
            &mut out,
        );
        // Token 0 goes to expert 0 (×2·1·1), token 1 to expert 1 (×0.1·30·1).
        assert!(
            (out[0] - 2.0).abs() < 1e-3 && out[1].abs() < 1e-3,
            "{out:?}"
        );
        assert!(
            out[2].abs() < 1e-3 && (out[3] - 3.0).abs() < 1e-3,
            "{out:?}"
        );
        // Token 2 ties: expert 0 (the lower) alone, with weight 1.
        assert!((out[4] - 2.0).abs() < 1e-3, "{out:?}");
        moe_ffn(
            &w,
            routing(2, false),
            Activation::Silu,
            &h,
            &[],
            &mut s,
            &mut out,
        );
        // Both experts at probability ½ each: ½·2 + ½·3 on each dimension.
        assert!(
            (out[4] - 2.5).abs() < 1e-3 && (out[5] - 2.5).abs() < 1e-3,
            "{out:?}"
        );
    }
}
