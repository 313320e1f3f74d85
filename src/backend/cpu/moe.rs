//! Mixture-of-experts FFNs on the CPU: the router picks each token's experts, the step's tokens
//! are grouped by expert, and each picked expert's matrices are read once for all the tokens
//! routed to it. A decoding token therefore reads the router and its k experts, not the layer.
//!
//! What is computed is llama.cpp's `build_moe_ffn`: router logits, gating, top-k, optional
//! renormalisation and scale, then each expert's gated FFN, weighted, summed over the picks in
//! their order (best first).

use super::matmul::{matmul_each, matmul_fused, WeightRef};
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

/// Buffers kept between steps: the rows of activations, which are most of a step's memory,
/// are not allocated again once they have grown (the per-token bookkeeping is).
#[derive(Default)]
pub struct MoeScratch {
    logits: Vec<f32>,
    /// Per token, its `used` picks (expert, weight), best first.
    picks: Vec<(usize, f32)>,
    /// The experts some token picked, each with its first row in the gathered buffers and
    /// its pick slots (token · used + slot) in order.
    groups: Vec<Group>,
    /// The picked experts' rows, expert by expert: inputs, kinds, gate, up and down outputs.
    xs: Vec<f32>,
    flags: Vec<bool>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
}

/// One picked expert's share of the gathered rows.
#[derive(Default)]
struct Group {
    expert: usize,
    first: usize,
    slots: Vec<usize>,
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

    gather(&picks, n_expert, k, h, embd, generated, s);
    experts_ffn(w, act, s);
    // Where each pick's output row is: slot → row of `s.down`.
    let mut row_of = vec![0usize; picks.len()];
    for g in &s.groups {
        for (j, &slot) in g.slots.iter().enumerate() {
            row_of[slot] = g.first + j;
        }
    }

    // Weighted, then summed over the picks in order, as ggml's views and adds.
    for t in 0..n_tok {
        let o = &mut out[t * embd..(t + 1) * embd];
        for (slot, &(_, weight)) in picks[t * k..(t + 1) * k].iter().enumerate() {
            let r = row_of[t * k + slot];
            let y = &s.down[r * embd..(r + 1) * embd];
            if slot == 0 {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o = y * weight);
            } else {
                o.iter_mut().zip(y).for_each(|(o, &y)| *o += y * weight);
            }
        }
    }
    s.picks = picks;
}

/// Groups the picks by expert: each picked expert's tokens' rows of `h`, in `s.xs`, one
/// expert after another (`s.groups` says where).
fn gather(
    picks: &[(usize, f32)],
    n_expert: usize,
    k: usize,
    h: &[f32],
    embd: usize,
    generated: &[bool],
    s: &mut MoeScratch,
) {
    let mut slots: Vec<Vec<usize>> = vec![Vec::new(); n_expert];
    for (slot, &(e, _)) in picks.iter().enumerate() {
        slots[e].push(slot);
    }
    s.groups.clear();
    s.xs.clear();
    s.flags.clear();
    let mut first = 0;
    for (expert, slots) in slots.into_iter().enumerate() {
        if slots.is_empty() {
            continue;
        }
        for &slot in &slots {
            let t = slot / k;
            s.xs.extend_from_slice(&h[t * embd..(t + 1) * embd]);
            s.flags.push(generated.get(t).copied().unwrap_or(false));
        }
        let n = slots.len();
        s.groups.push(Group {
            expert,
            first,
            slots,
        });
        first += n;
    }
}

/// Every picked expert's gated FFN over its gathered rows, into `s.down`: all the gate and up
/// matrices in one parallel loop, then all the down matrices in another.
fn experts_ffn(w: &ExpertWeights<'_>, act: Activation, s: &mut MoeScratch) {
    let rows = s.xs.len() / w.router.cols;
    let (ff, embd) = (w.gate[0].rows, w.down[0].rows);
    s.gate.resize(rows * ff, 0.0);
    s.up.resize(rows * ff, 0.0);
    s.down.resize(rows * embd, 0.0);
    let span = |g: &Group, width: usize| g.first * width..(g.first + g.slots.len()) * width;
    {
        let (mut mats, mut xs, mut kinds) = (Vec::new(), Vec::new(), Vec::new());
        for g in &s.groups {
            let (x, f) = (&s.xs[span(g, embd)], &s.flags[span(g, 1)]);
            mats.extend([w.gate[g.expert], w.up[g.expert]]);
            xs.extend([x, x]);
            kinds.extend([f, f]);
        }
        let gates = per_group(&mut s.gate, &s.groups, ff);
        let ups = per_group(&mut s.up, &s.groups, ff);
        let mut outs: Vec<&mut [f32]> = gates
            .into_iter()
            .zip(ups)
            .flat_map(<[_; 2]>::from)
            .collect();
        matmul_each(&mats, &xs, &mut outs, &kinds);
    }
    for g in &s.groups {
        let (gate, up) = (&mut s.gate[span(g, ff)], &mut s.up[span(g, ff)]);
        if let Some(b) = &w.biases {
            add_bias(gate, b[g.expert][0]);
            add_bias(up, b[g.expert][1]);
        }
        gated(act, gate, up);
    }
    let mats: Vec<WeightRef<'_>> = s.groups.iter().map(|g| w.down[g.expert]).collect();
    let xs: Vec<&[f32]> = s.groups.iter().map(|g| &s.gate[span(g, ff)]).collect();
    let kinds: Vec<&[bool]> = s.groups.iter().map(|g| &s.flags[span(g, 1)]).collect();
    let mut outs = per_group(&mut s.down, &s.groups, embd);
    matmul_each(&mats, &xs, &mut outs, &kinds);
    if let Some(b) = &w.biases {
        for g in &s.groups {
            add_bias(&mut s.down[span(g, embd)], b[g.expert][2]);
        }
    }
}

/// `buf`'s rows (`width` values each) cut into each group's share, in the groups' order.
fn per_group<'b>(buf: &'b mut [f32], groups: &[Group], width: usize) -> Vec<&'b mut [f32]> {
    let mut rest = buf;
    groups
        .iter()
        .map(|g| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(g.slots.len() * width);
            rest = tail;
            head
        })
        .collect()
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
