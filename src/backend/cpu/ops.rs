//! Element-wise and row-wise ops of a Llama block, written to match ggml's CPU numerics.

use crate::backend::ops::{RopeLayout, RopeTable};
use crate::cpu_features::fma_dispatch;
use crate::kv::HADAMARD_DIM;
use half::f16;
use std::sync::OnceLock;

/// `out = x / rms(x) * w` for each row of `x` (rows of `w.len()` values), as ggml computes it:
/// each square in f32, summed in f64, the mean rounded to f32, then `x · scale` and `· w` as
/// two roundings.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    let group = RMS_ROWS_AT_ONCE * n;
    for (xg, og) in x.chunks(group).zip(out.chunks_mut(group)) {
        let scales = rms_scales(xg, n, eps);
        for ((xr, or), &scale) in xg.chunks_exact(n).zip(og.chunks_exact_mut(n)).zip(&scales) {
            for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
                *o = v * scale * g;
            }
        }
    }
}

/// [`rmsnorm`] of each row of `x` in place.
pub fn rmsnorm_in_place(x: &mut [f32], w: &[f32], eps: f32) {
    let n = w.len();
    for group in x.chunks_mut(RMS_ROWS_AT_ONCE * n) {
        let scales = rms_scales(group, n, eps);
        for (row, &scale) in group.chunks_exact_mut(n).zip(&scales) {
            for (v, &g) in row.iter_mut().zip(w) {
                *v = *v * scale * g;
            }
        }
    }
}

/// Rows whose sums of squares [`rms_scales`] runs side by side.
const RMS_ROWS_AT_ONCE: usize = 8;

/// `1/√(mean(row²) + ε)` for each row of `group` (up to [`RMS_ROWS_AT_ONCE`] rows of `n`
/// values; later entries 0), as ggml computes it: each square in f32, summed in f64 in order,
/// the mean rounded to f32. One row's sum is a chain of dependent adds; a whole group's rows
/// run their chains side by side, each still in order.
fn rms_scales(group: &[f32], n: usize, eps: f32) -> [f32; RMS_ROWS_AT_ONCE] {
    let mut sums = [0f64; RMS_ROWS_AT_ONCE];
    let rows = group.len() / n;
    if rows == RMS_ROWS_AT_ONCE {
        let mut row: [&[f32]; RMS_ROWS_AT_ONCE] = [&[]; RMS_ROWS_AT_ONCE];
        for (r, row) in row.iter_mut().enumerate() {
            *row = &group[r * n..(r + 1) * n];
        }
        for i in 0..n {
            for (sum, row) in sums.iter_mut().zip(&row) {
                *sum += (row[i] * row[i]) as f64;
            }
        }
    } else {
        for (sum, row) in sums.iter_mut().zip(group.chunks_exact(n)) {
            for &v in row {
                *sum += (v * v) as f64;
            }
        }
    }
    let mut scales = [0f32; RMS_ROWS_AT_ONCE];
    for (scale, &sum) in scales[..rows].iter_mut().zip(&sums) {
        let mean = (sum / n as f64) as f32;
        *scale = 1.0 / (mean + eps).sqrt();
    }
    scales
}

fma_dispatch! {
/// Layer norm of each row of `x` in place (rows of `w.len()` values), as ggml's `norm` then
/// `mul` and `add`: the sum in f64 and its mean rounded to f32, each value less the mean, the
/// squares of those summed in f64 into the variance, then `· 1/√(var + ε)`, `· w`, `+ b`.
/// The f64 sums run in eight lanes (ggml's run in one): a sequential chain is bound by the
/// adder's latency, and the mean and variance in f32 come out the same either way but for
/// one rounding in billions.
pub fn layernorm_in_place(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let mut lanes = [0f64; 8];
        let mut chunks = row.chunks_exact(8);
        for c in &mut chunks {
            lanes.iter_mut().zip(c).for_each(|(l, &v)| *l += f64::from(v));
        }
        let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v)).sum();
        let sum = lanes.iter().sum::<f64>() + tail;
        let mean = (sum / n as f64) as f32;
        row.iter_mut().for_each(|v| *v -= mean);
        let mut lanes = [0f64; 8];
        let mut chunks = row.chunks_exact(8);
        for c in &mut chunks {
            lanes.iter_mut().zip(c).for_each(|(l, &v)| *l += f64::from(v * v));
        }
        let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v * v)).sum();
        let squares = lanes.iter().sum::<f64>() + tail;
        let var = (squares / n as f64) as f32;
        let scale = 1.0 / (var + eps).sqrt();
        for ((v, &g), &c) in row.iter_mut().zip(w).zip(b) {
            *v = *v * scale * g + c;
        }
    }
}
}

/// Precomputed RoPE rotation angles for one position, in ggml's order of operations
/// (theta multiplied by theta_scale pair by pair, in f32; then divided by the pair's factor,
/// times `freq_scale`; cos and sin times `mscale`) so that we match its rounding.
pub fn rope_cos_sin(pos: usize, n_rot: usize, table: &RopeTable, cs: &mut [(f32, f32)]) {
    let theta_scale = table.base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for (i, c) in cs.iter_mut().enumerate().take(n_rot / 2) {
        let ff = table.factors.as_ref().map_or(1.0, |f| f[i]);
        let t = table.freq_scale * (theta / ff);
        *c = (t.cos() * table.mscale, t.sin() * table.mscale);
        theta *= theta_scale;
    }
}

/// [`rope_cos_sin`] for a three-part M-RoPE position (temporal, row, column): pair `i` turns
/// by the part `parts[i]` names, each part's angle carried pair by pair as ggml's
/// `ggml_mrope_cache_init` does, so that a position of three equal parts gives
/// [`rope_cos_sin`]'s bits.
pub fn mrope_cos_sin(
    pos: [usize; 3],
    parts: &[u8],
    n_rot: usize,
    table: &RopeTable,
    cs: &mut [(f32, f32)],
) {
    let theta_scale = table.base.powf(-2.0 / n_rot as f32);
    let mut theta = pos.map(|p| p as f32);
    for (i, c) in cs.iter_mut().enumerate().take(n_rot / 2) {
        let ff = table.factors.as_ref().map_or(1.0, |f| f[i]);
        let t = table.freq_scale * (theta[usize::from(parts[i])] / ff);
        *c = (t.cos() * table.mscale, t.sin() * table.mscale);
        theta.iter_mut().for_each(|t| *t *= theta_scale);
    }
}

/// Token `i` of `batch`'s angles for `table`: by its three-part M-RoPE position where the
/// model turns by them and the batch gives it one (an image's positions), else by its position.
pub fn token_cos_sin(
    batch: &crate::backend::batch::BatchMeta,
    i: usize,
    shape: &crate::backend::ops::Shape,
    table: &RopeTable,
    cs: &mut [(f32, f32)],
) {
    match (&shape.mrope, batch.rope_positions.get(i)) {
        (Some(parts), Some(&pos)) => mrope_cos_sin(pos, parts, shape.n_rot, table, cs),
        _ => rope_cos_sin(batch.positions[i], shape.n_rot, table, cs),
    }
}

fma_dispatch! {
/// Rotates every head of one token's Q or K vector (`x` = n_heads × head_dim).
/// `x0·c - x1·s` is evaluated as one fused multiply-add over a rounded product, the way
/// GCC contracts ggml's C expression (the peer's bits, again).
pub fn rope_apply(
    x: &mut [f32],
    head_dim: usize,
    n_rot: usize,
    layout: RopeLayout,
    cs: &[(f32, f32)],
) {
    for head in x.chunks_exact_mut(head_dim) {
        match layout {
            RopeLayout::Normal => {
                for (i, &(c, s)) in cs.iter().enumerate().take(n_rot / 2) {
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0.mul_add(c, -(x1 * s));
                    head[2 * i + 1] = x0.mul_add(s, x1 * c);
                }
            }
            RopeLayout::Neox => {
                let half = n_rot / 2;
                for (i, &(c, s)) in cs.iter().enumerate().take(half) {
                    let (x0, x1) = (head[i], head[i + half]);
                    head[i] = x0.mul_add(c, -(x1 * s));
                    head[i + half] = x0.mul_add(s, x1 * c);
                }
            }
        }
    }
}
}

fma_dispatch! {
/// SwiGLU: `gate = silu(gate) * up`, in place, with ggml's vectorised exp (see `expf_v`).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + expf_v(0.0 - *g)) * u;
    }
}
}

/// gpt-oss's clamped SwiGLU, in place, as ggml's `swiglu_oai` (α = 1.702, limit 7): the gate
/// clamped above, the up projection clamped both ways and shifted by one.
pub fn swiglu_oai_mul(gate: &mut [f32], up: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(LIMIT);
        let y = u.clamp(-LIMIT, LIMIT);
        *g = x / (1.0 + (ALPHA * -x).exp()) * (y + 1.0);
    }
}

/// `gate = act(gate) · up`, in place.
pub fn gated(act: crate::backend::ops::Activation, gate: &mut [f32], up: &[f32]) {
    use crate::backend::ops::Activation::*;
    match act {
        Silu => silu_mul(gate, up),
        GeluTanh => gelu_mul(gate, up),
        SwigluOai => swiglu_oai_mul(gate, up),
    }
}

/// `x = act(x)` in place, ungated (an encoder's FFN): GELU as ggml-cpu looks it up (see
/// [`gelu_mul`]), or SiLU. gpt-oss's SwiGLU has no ungated form.
pub fn activate(act: crate::backend::ops::Activation, x: &mut [f32]) -> anyhow::Result<()> {
    use crate::backend::ops::Activation::*;
    // Checked first, so that a caller may validate `act` on an empty slice.
    match act {
        // Through the gated form's vector kernels, gated by ones: times 1.0 is exact.
        GeluTanh => {
            const ONES: [f32; 256] = [1.0; 256];
            x.chunks_mut(ONES.len())
                .for_each(|c| gelu_mul(c, &ONES[..c.len()]));
        }
        Silu => x.iter_mut().for_each(|v| *v /= 1.0 + expf_v(0.0 - *v)),
        SwigluOai => anyhow::bail!("gpt-oss's SwiGLU has no ungated form"),
    }
    Ok(())
}

/// GeGLU: `gate = gelu(gate) * up`, in place, with GELU's tanh approximation looked up the way
/// ggml-cpu does it (the peer's numerics): the input rounded to f16 and the result read from a
/// table of f16 values, with the tails outside ±10 taken exactly.
pub fn gelu_mul(gate: &mut [f32], up: &[f32]) {
    let table = gelu_table();
    #[cfg(target_arch = "x86_64")]
    let done = if crate::cpu_features::avx512() {
        // SAFETY: AVX-512 F/BW/VL (and F16C) were detected.
        unsafe { gelu_mul_avx512(gate, up, table) }
    } else if crate::cpu_features::avx2() {
        // SAFETY: AVX2, FMA and F16C were detected.
        unsafe { gelu_mul_avx2(gate, up, table) }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (g, &u) in gate[done..].iter_mut().zip(&up[done..]) {
        *g = gelu_looked_up(*g, table) * u;
    }
}

/// One value of [`gelu_mul`]'s GELU.
fn gelu_looked_up(x: f32, table: &[u16]) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        f16::from_bits(table[f16::from_f32(x).to_bits() as usize]).to_f32()
    }
}

/// GELU (tanh approximation) in f32, ggml's `ggml_gelu_f32` as GCC compiles it (the
/// `1 + a·x·x` contracted into one fused multiply-add, which decides some table entries).
pub fn gelu(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const COEF_A: f32 = 0.044715;
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (COEF_A * x).mul_add(x, 1.0)).tanh())
}

/// [`gelu_mul`] sixteen values at a time, with the same steps: the input rounded to f16 to
/// nearest even, its table entry gathered and widened, the tails taken exactly, the product
/// with `up`. Returns how many values it did (whole vectors); the caller does the rest.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn gelu_mul_avx512(gate: &mut [f32], up: &[f32], table: &[u16]) -> usize {
    use std::arch::x86_64::*;
    // A 32-bit gather at entry i reads entries i and i + 1: the table has one past the last.
    assert!(table.len() > u16::MAX as usize + 1);
    let n = gate.len().min(up.len()) / 16 * 16;
    let (lo, hi) = (_mm512_set1_ps(-10.0), _mm512_set1_ps(10.0));
    for i in (0..n).step_by(16) {
        let x = _mm512_loadu_ps(gate.as_ptr().add(i));
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let entries = _mm512_i32gather_epi32::<2>(_mm512_cvtepu16_epi32(h), table.as_ptr().cast());
        let mut y = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(entries));
        y = _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi), x);
        y = _mm512_maskz_mov_ps(!_mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, lo), y);
        let u = _mm512_loadu_ps(up.as_ptr().add(i));
        _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(y, u));
    }
    n
}

/// [`gelu_mul_avx512`] eight values at a time, for CPUs without AVX-512: the same steps, the
/// gathered entries' low halves packed to eight f16 values before widening (AVX2 has no
/// 32-to-16-bit narrowing).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_mul_avx2(gate: &mut [f32], up: &[f32], table: &[u16]) -> usize {
    use std::arch::x86_64::*;
    // A 32-bit gather at entry i reads entries i and i + 1: the table has one past the last.
    assert!(table.len() > u16::MAX as usize + 1);
    let n = gate.len().min(up.len()) / 8 * 8;
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let low_half = _mm256_set1_epi32(0xFFFF);
    for i in (0..n).step_by(8) {
        let x = _mm256_loadu_ps(gate.as_ptr().add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
        let entries = _mm256_i32gather_epi32::<2>(table.as_ptr().cast(), _mm256_cvtepu16_epi32(h));
        let entries = _mm256_and_si256(entries, low_half);
        // Packed within each 128-bit half, then the halves' low quadwords side by side.
        let halves = _mm256_permute4x64_epi64::<0b1000>(_mm256_packus_epi32(entries, entries));
        let mut y = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
        y = _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
        y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), y);
        let u = _mm256_loadu_ps(up.as_ptr().add(i));
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(y, u));
    }
    n
}

/// `gelu` of every f16 value, rounded to f16 (ggml's `ggml_table_gelu_f16`), and one zero
/// entry past the last (for 32-bit gathers).
fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(gelu(f16::from_bits(bits).to_f32())).to_bits())
            .chain([0])
            .collect()
    })
}

/// ggml-cpu's vectorised `expf` (`ggml_v_expf`, after ARM's optimized routine): a degree-5
/// polynomial on the reduced argument, scaled by 2^n. Within 1.5 ulp of `expf`, but not the
/// same bits, and the peer uses it for SiLU and softmax; we evaluate the very same fused
/// operations one value at a time so our activations round exactly as the peer's do.
#[inline(always)]
pub fn expf_v(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), r); // log2(e)
    let n = z - r;
    // b = x - n·ln2_hi - n·ln2_lo, as two fused steps
    let b = (-n).mul_add(
        f32::from_bits(0x35BF_BE8E),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3F31_7200), x), // 0x1.62e4p-1
    );
    let u = b * b;
    let j = f32::from_bits(0x3C07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3D2B_9F17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3E2A_AF33).mul_add(b, f32::from_bits(0x3EFF_FEDB)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(u, f32::from_bits(0x3F7F_FFF6).mul_add(b, 1.0)); // 0x1.ffffecp-1
                                                                  // j · 2^n. For |n| ≤ 192 (the rest saturates below), n is z's low mantissa bits (z lies
                                                                  // in [2^23, 2^24), where floats are the integers), and 2^n is two normal powers of two, so
                                                                  // neither factor overflows on its own: integer and select steps only, which vectorise
                                                                  // (a float-to-int cast and branches did not, which made this loop scalar per lane).
    let ni = (z.to_bits() as i32).wrapping_sub(r.to_bits() as i32);
    let half = ni / 2;
    let pow2 = |e: i32| f32::from_bits((e.wrapping_add(127) as u32) << 23);
    let scaled = j * pow2(half) * pow2(ni.wrapping_sub(half));
    let saturated = if n <= 0.0 { 0.0 } else { f32::INFINITY };
    if n.abs() > 192.0 {
        saturated
    } else {
        scaled
    }
}

/// Rotates every 64-value chunk of `x` by the orthonormal Walsh-Hadamard matrix (a fast
/// transform, scaled by 1/8): see `KvType::rotated` for when and why.
pub fn hadamard_64(x: &mut [f32]) {
    for chunk in x.chunks_exact_mut(HADAMARD_DIM) {
        let mut h = 1;
        while h < HADAMARD_DIM {
            for i in (0..HADAMARD_DIM).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (chunk[j], chunk[j + h]);
                    chunk[j] = a + b;
                    chunk[j + h] = a - b;
                }
            }
            h *= 2;
        }
        for v in chunk.iter_mut() {
            *v *= 0.125; // 1/sqrt(64)
        }
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds a bias vector to every row.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layernorm_centres_scales_and_shifts_each_row() {
        let mut x = [1.0f32, 3.0, 10.0, 10.0];
        layernorm_in_place(&mut x, &[2.0, 1.0], &[0.5, -0.5], 1e-12);
        // Row 1: mean 2, deviations ±1, variance 1: (-1·2 + 0.5, 1·1 - 0.5).
        assert_eq!(x[..2], [-1.5, 0.5]);
        // Row 2: no variance: the deviations are 0, only the bias is left.
        assert_eq!(x[2..], [0.5, -0.5]);
    }

    #[test]
    fn ungated_gelu_is_the_gated_one_times_one() {
        let xs: Vec<f32> = (-300..300).map(|i| i as f32 * 0.041).collect();
        let mut gated = xs.clone();
        gelu_mul(&mut gated, &vec![1.0; xs.len()]);
        let mut ungated = xs;
        activate(crate::backend::ops::Activation::GeluTanh, &mut ungated).unwrap();
        assert_eq!(gated, ungated);
    }

    #[test]
    fn rms_scales_side_by_side_match_one_row_at_a_time() {
        let mut seed = 0x9e37_79b9u32;
        let n = 37;
        let x: Vec<f32> = (0..19 * n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                (seed % 20001) as f32 / 997.0 - 10.0
            })
            .collect();
        let got: Vec<f32> = x
            .chunks(RMS_ROWS_AT_ONCE * n)
            .flat_map(|g| rms_scales(g, n, 1e-5)[..g.len() / n].to_vec())
            .collect();
        assert_eq!(got.len(), 19);
        for (row, &got) in x.chunks_exact(n).zip(&got) {
            let sum: f64 = row.iter().fold(0.0, |s, &v| s + (v * v) as f64);
            let want = 1.0 / ((sum / n as f64) as f32 + 1e-5).sqrt();
            assert_eq!(got.to_bits(), want.to_bits());
        }
        let w: Vec<f32> = (0..n).map(|i| 0.5 + i as f32 / 16.0).collect();
        let (mut out, mut inplace) = (vec![0f32; x.len()], x.clone());
        rmsnorm(&x, &w, 1e-5, &mut out);
        rmsnorm_in_place(&mut inplace, &w, 1e-5);
        assert_eq!(out, inplace);
    }

    #[test]
    fn rmsnorm_unit_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0f32; 4];
        rmsnorm(&x, &[1.0; 4], 0.0, &mut out);
        // rms = sqrt(25/4) = 2.5
        assert!((out[0] - 1.2).abs() < 1e-6 && (out[1] - 1.6).abs() < 1e-6);
    }

    #[test]
    fn vectorised_gelu_is_the_scalar_lookup_bit_for_bit() {
        let table = gelu_table();
        // A sweep through both tails, the ±10 edges, f16 rounding ties and subnormals, on a
        // length that leaves a scalar tail.
        let mut xs: Vec<f32> = (-2200..2200).map(|i| i as f32 * 0.00517).collect();
        xs.extend([
            -10.0, 10.0, -9.999, 9.999, 1e-6, -1e-6, 0.0, -0.0, 65504.0, -1e30,
        ]);
        xs.extend((0..37).map(|i| f16::from_bits(0x3C00 + i).to_f32() + 2f32.powi(-12)));
        let up: Vec<f32> = (0..xs.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let check = |got: &[f32], form: &str| {
            for ((&x, &u), &y) in xs.iter().zip(&up).zip(got) {
                let want = gelu_looked_up(x, table) * u;
                assert_eq!(y.to_bits(), want.to_bits(), "{form}: x = {x}");
            }
        };
        let mut got = xs.clone();
        gelu_mul(&mut got, &up);
        check(&got, "dispatched");
        // The AVX2 form too where the dispatch took AVX-512 (its vectors, then the tail).
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_features::avx2() {
            let mut got = xs.clone();
            // SAFETY: AVX2, FMA and F16C were detected.
            let done = unsafe { gelu_mul_avx2(&mut got, &up, table) };
            for (g, &u) in got[done..].iter_mut().zip(&up[done..]) {
                *g = gelu_looked_up(*g, table) * u;
            }
            check(&got, "avx2");
        }
    }

    #[test]
    fn gelu_table_follows_the_formula_at_f16_precision() {
        let up = vec![1.0f32; 9];
        let xs = [-12.0f32, -3.0, -1.0, -0.1, 0.0, 0.1, 1.0, 3.0, 12.0];
        let mut g = xs.to_vec();
        gelu_mul(&mut g, &up);
        for (&x, &y) in xs.iter().zip(&g) {
            let want = if x.abs() >= 10.0 { x.max(0.0) } else { gelu(x) };
            assert!(
                (y - want).abs() <= 2e-3 * want.abs().max(1e-2),
                "{x}: {y} vs {want}"
            );
        }
        assert_eq!(g[4], 0.0);
    }

    /// gpt-oss's SwiGLU: x·σ(1.702x)·(u + 1), the gate clamped above at 7 and the up value to
    /// ±7.
    #[test]
    fn swiglu_oai_clamps_the_gate_above_and_the_up_value_both_ways() {
        let want = |g: f32, u: f32| {
            let x = g.min(7.0);
            x / (1.0 + (-1.702 * x).exp()) * (u.clamp(-7.0, 7.0) + 1.0)
        };
        let gate = [-3.0, 0.0, 1.5, 9.0, 2.0];
        let up = [0.5, 2.0, -10.0, 1.0, 12.0];
        let mut got = gate;
        swiglu_oai_mul(&mut got, &up);
        for i in 0..gate.len() {
            assert!(
                (got[i] - want(gate[i], up[i])).abs() < 1e-6,
                "{i}: {}",
                got[i]
            );
        }
        // Past the clamps the output no longer grows.
        assert_eq!(got[3], 7.0 / (1.0 + (-1.702f32 * 7.0).exp()) * 2.0);
        assert!((got[2] - 1.5 / (1.0 + (-1.702f32 * 1.5).exp()) * -6.0).abs() < 1e-6);
    }

    #[test]
    fn expf_v_is_close_to_expf() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0437;
            let (a, b) = (expf_v(x), x.exp());
            assert!(((a - b) / b).abs() < 4e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(expf_v(0.0), 1.0);
        assert_eq!(expf_v(-200.0), 0.0);
        assert_eq!(expf_v(200.0), f32::INFINITY);
        // Where 2^n takes both factors: subnormal results, and overflow. The bits of the
        // earlier form (a float-to-int cast, checked equal on every f32).
        for (x, bits) in [
            (-103.0f32, 0x0000_0001),
            (-100.0, 0x0000_001b),
            (-88.5, 0x0027_fce2),
            (-87.0, 0x00b3_3686),
            (88.0, 0x7ef8_82b7),
            (88.7, 0x7f7a_37fc),
            (89.0, 0x7f80_0000),
            (133.0, 0x7f80_0000),
            (-133.0, 0x0000_0000),
        ] {
            assert_eq!(expf_v(x).to_bits(), bits, "{x}");
        }
        assert!(expf_v(f32::NAN).is_nan());
        assert_eq!(expf_v(f32::NEG_INFINITY), 0.0);
    }

    #[test]
    fn hadamard_is_orthonormal_and_its_own_inverse() {
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.1)
            .collect();
        let y: Vec<f32> = (0..128)
            .map(|i| ((i * 11 % 7) as f32 - 3.0) * 0.5)
            .collect();
        let (mut hx, mut hy) = (x.clone(), y.clone());
        hadamard_64(&mut hx);
        hadamard_64(&mut hy);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&x, &y) - dot(&hx, &hy)).abs() < 1e-3);
        hadamard_64(&mut hx);
        for (a, b) in x.iter().zip(&hx) {
            assert!((a - b).abs() < 1e-5);
        }
        // An outlier is spread evenly over its chunk.
        let mut spike = vec![0f32; 64];
        spike[5] = 8.0;
        hadamard_64(&mut spike);
        assert!(spike.iter().all(|v| v.abs() == 1.0));
    }

    #[test]
    fn rope_position_zero_is_identity_and_norm_preserving() {
        let mut cs = vec![(0f32, 0f32); 4];
        let table = RopeTable {
            base: 10_000.0,
            freq_scale: 1.0,
            mscale: 1.0,
            factors: None,
        };
        rope_cos_sin(0, 8, &table, &mut cs);
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        for layout in [RopeLayout::Normal, RopeLayout::Neox] {
            let mut x = orig.clone();
            rope_apply(&mut x, 8, 8, layout, &cs);
            assert_eq!(x, orig);
        }
        rope_cos_sin(17, 8, &table, &mut cs);
        let mut x = orig.clone();
        rope_apply(&mut x, 8, 8, RopeLayout::Neox, &cs);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x) - n(&orig)).abs() < 1e-3);
        assert_ne!(x, orig);
    }

    #[test]
    fn an_mrope_position_of_equal_parts_turns_as_a_plain_one_and_each_part_turns_its_pairs() {
        let table = RopeTable {
            base: 10_000.0,
            freq_scale: 1.0,
            mscale: 1.0,
            factors: None,
        };
        let parts = [0u8, 1, 2, 0, 1, 2, 0, 0];
        let (mut plain, mut three) = (vec![(0f32, 0f32); 8], vec![(0f32, 0f32); 8]);
        rope_cos_sin(37, 16, &table, &mut plain);
        mrope_cos_sin([37; 3], &parts, 16, &table, &mut three);
        assert_eq!(plain, three);
        // Row 5, column 0 at start 0: only the row's pairs turn.
        mrope_cos_sin([0, 5, 0], &parts, 16, &table, &mut three);
        for (i, &(c, s)) in three.iter().enumerate() {
            assert_eq!(parts[i] == 1, (c, s) != (1.0, 0.0), "pair {i}");
        }
    }
}
