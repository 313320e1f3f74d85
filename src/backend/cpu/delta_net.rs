//! Qwen3.5's gated DeltaNet on the CPU, as llama.cpp computes it there: the causal convolution
//! (`ggml_ssm_conv`, an f32 sum over the taps from the oldest position) and SiLU over the q, k
//! and v channels; q and k L2-normalised (`build_gdn_l2_norm`: an RMSNorm with ε / d_k, times
//! 1/√d_k); the gated delta rule one token at a time (`ggml_gated_delta_net`, which the peer runs
//! for prompts and decoding alike); and the RMSNorm of its output gated by SiLU(z).

use super::ops::expf_v;
use super::short_conv::keep_rows;
use crate::backend::ops::DeltaNetShape;

/// ggml's SiLU over its vectorised exp (the bits the peer's `ggml_silu` gives).
fn silu(x: f32) -> f32 {
    x / (1.0 + expf_v(0.0 - x))
}

/// One sequence's span of tokens, rows of `n` channels, replaced by SiLU of their causal
/// convolution: `state` holds the `taps - 1` rows before the span (oldest first; `fresh`:
/// none, the span starts the sequence) and is left holding the span's last `taps - 1`;
/// `kernel` has `taps` values per channel, oldest position first. Each of `saves` (the span's
/// tokens before a snapshot, and its part of the snapshot's slot) gets the state there.
pub fn conv_silu_span(
    x: &mut [f32],
    state: &mut [f32],
    fresh: bool,
    kernel: &[f32],
    (taps, n): (usize, usize),
    saves: &mut [(usize, &mut [f32])],
) {
    let tokens = x.len() / n;
    if fresh {
        state.fill(0.0);
    }
    // The rows the convolution slides over: the state's, then the span's.
    let mut rows = Vec::with_capacity(state.len() + x.len());
    rows.extend_from_slice(state);
    rows.extend_from_slice(x);
    for t in 0..tokens {
        let window = &rows[t * n..(t + taps) * n];
        for (j, out) in x[t * n..(t + 1) * n].iter_mut().enumerate() {
            let mut sum = 0f32;
            for (k, &w) in kernel[j * taps..(j + 1) * taps].iter().enumerate() {
                sum += window[k * n + j] * w;
            }
            *out = silu(sum);
        }
    }
    keep_rows(&rows, n, state, saves);
}

/// `x` divided by its L2 norm, as `build_gdn_l2_norm` computes it: ggml's RMSNorm with ε / n
/// (a sum of squares in f64, its mean in f32), then times 1/√n.
pub fn l2_normalize(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps / n).sqrt();
    let after = 1.0 / n.sqrt();
    for v in x.iter_mut() {
        *v = (*v * scale) * after;
    }
}

/// ggml's softplus: `ln(1 + eˣ)`, x itself above 20.
fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// One token's inputs to one value head's delta rule.
pub struct DeltaStep<'a> {
    /// Query and key (d_k values each, L2-normalised), value (d_v).
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    /// The raw β and α logits and the head's `dt_bias` and `a`.
    pub beta: f32,
    pub alpha: f32,
    pub dt_bias: f32,
    pub a: f32,
}

/// One step of the gated delta rule on one head's state `s` (d_v rows of d_k: row j is column
/// j of the d_k × d_v matrix S, as ggml stores it), its output written to `out` (d_v values):
/// S ·= exp(softplus(α + dt_bias) · a); S += k ⊗ σ(β)(v − Sᵀk); out = Sᵀq / √d_k.
pub fn delta_step(s: &mut [f32], x: &DeltaStep<'_>, out: &mut [f32]) {
    let dk = x.k.len();
    let decay = (softplus(x.alpha + x.dt_bias) * x.a).exp();
    let beta = 1.0 / (1.0 + (-x.beta).exp());
    let scale = 1.0 / (dk as f32).sqrt();
    s.iter_mut().for_each(|v| *v *= decay);
    for (row, &v) in s.chunks_exact_mut(dk).zip(x.v) {
        let sk = dot(row, x.k);
        let delta = (v - sk) * beta;
        for (r, &k) in row.iter_mut().zip(x.k) {
            *r = k.mul_add(delta, *r);
        }
    }
    for (o, row) in out.iter_mut().zip(s.chunks_exact(dk)) {
        *o = dot(row, x.q) * scale;
    }
}

/// An f32 dot product in eight lanes, summed pairwise at the end (ggml's `ggml_vec_dot_f32`
/// accumulates in SIMD lanes too; the lanes keep the rounding close to it).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] = x[i].mul_add(y[i], lanes[i]);
        }
    }
    let [a0, a1, a2, a3, a4, a5, a6, a7] = lanes;
    ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)) + tail
}

/// `o` (one head's output, d_v values) RMS-normalised, times `w`, times SiLU of the head's
/// `z`, written over `z` (llama.cpp's `build_norm_gated`).
pub fn gated_rmsnorm(o: &[f32], w: &[f32], eps: f32, z: &mut [f32]) {
    let sum: f64 = o.iter().map(|&v| (v * v) as f64).sum();
    let mean = (sum / o.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((z, &v), &g) in z.iter_mut().zip(o).zip(w) {
        *z = (v * scale * g) * silu(*z);
    }
}

/// Where one token's q, k and v of value head `h` sit in its row of convolved channels.
pub fn head_ranges(
    d: &DeltaNetShape,
    h: usize,
) -> (
    std::ops::Range<usize>,
    std::ops::Range<usize>,
    std::ops::Range<usize>,
) {
    let hd = d.head_dim;
    // Value head h reads key head h mod k_heads (llama.cpp's tiled order).
    let kh = h % d.k_heads;
    let q = kh * hd..(kh + 1) * hd;
    let k = d.key_dim() + kh * hd..d.key_dim() + (kh + 1) * hd;
    let v = 2 * d.key_dim() + h * hd..2 * d.key_dim() + (h + 1) * hd;
    (q, k, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The delta rule against its definition on a 2 × 2 head, in f64: S ← g·S; S ← S + k ⊗
    /// β(v − Sᵀk); out = Sᵀq/√2.
    #[test]
    fn the_delta_rule_follows_its_definition() {
        let (q, k, v) = ([0.6f32, 0.8], [1.0f32, 0.0], [0.5f32, -2.0]);
        let (beta_logit, alpha, dt_bias, a) = (0.3f32, -0.2f32, 0.1f32, -0.7f32);
        // S as d_k × d_v, stored by ggml as rows j (d_v) of d_k.
        let mut s_math = [[0.2f64, -0.1], [0.4, 0.3]]; // s_math[i][j]
        let mut s = [0.2f32, 0.4, -0.1, 0.3];
        let mut out = [0f32; 2];
        let step = DeltaStep {
            q: &q,
            k: &k,
            v: &v,
            beta: beta_logit,
            alpha,
            dt_bias,
            a,
        };
        delta_step(&mut s, &step, &mut out);

        let g = (((alpha + dt_bias) as f64).exp().ln_1p() * a as f64).exp();
        let b = 1.0 / (1.0 + (-beta_logit as f64).exp());
        s_math.iter_mut().flatten().for_each(|x| *x *= g);
        for j in 0..2 {
            let sk: f64 = (0..2).map(|i| s_math[i][j] * k[i] as f64).sum();
            let d = (v[j] as f64 - sk) * b;
            for i in 0..2 {
                s_math[i][j] += k[i] as f64 * d;
            }
        }
        for j in 0..2 {
            let o: f64 = (0..2).map(|i| s_math[i][j] * q[i] as f64).sum::<f64>() / 2f64.sqrt();
            assert!(
                (out[j] as f64 - o).abs() < 1e-6,
                "out {j}: {} vs {o}",
                out[j]
            );
            for i in 0..2 {
                assert!((s[j * 2 + i] as f64 - s_math[i][j]).abs() < 1e-6);
            }
        }
    }

    /// The convolution of a span equals the same tokens one at a time, the state carried.
    #[test]
    fn the_convolution_carries_its_state_between_spans() {
        let (n, taps) = (3, 4);
        let kernel: Vec<f32> = (0..n * taps).map(|i| 0.1 + 0.05 * i as f32).collect();
        let x: Vec<f32> = (0..5 * n).map(|i| (i as f32 - 7.0) * 0.3).collect();
        let mut whole = x.clone();
        let mut state = vec![5.0; (taps - 1) * n];
        conv_silu_span(&mut whole, &mut state, true, &kernel, (taps, n), &mut []);
        // Token 0, channel 1: only its own (newest) tap sees a value.
        assert_eq!(whole[1], silu(x[1] * kernel[taps + taps - 1]));
        let mut steps = x.clone();
        let mut state2 = vec![0.0; (taps - 1) * n];
        for t in 0..5 {
            let r = t * n..(t + 1) * n;
            conv_silu_span(
                &mut steps[r],
                &mut state2,
                t == 0,
                &kernel,
                (taps, n),
                &mut [],
            );
        }
        assert_eq!(steps, whole);
        assert_eq!(state, state2);
    }

    #[test]
    fn l2_normalize_gives_a_unit_vector() {
        let mut x = [3.0f32, 4.0];
        l2_normalize(&mut x, 1e-6);
        assert!(
            (x[0] - 0.6).abs() < 1e-6 && (x[1] - 0.8).abs() < 1e-6,
            "{x:?}"
        );
    }

    /// Value heads share key heads in the tiled order: with 2 key heads and 4 value heads,
    /// value head 3 reads key head 1.
    #[test]
    fn value_heads_read_their_key_heads_tiled() {
        let d = DeltaNetShape {
            head_dim: 2,
            k_heads: 2,
            v_heads: 4,
            taps: 4,
        };
        let (q, k, v) = head_ranges(&d, 3);
        assert_eq!((q, k, v), (2..4, 6..8, 14..16));
    }
}
