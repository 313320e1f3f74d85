//! Scalar reference dot products, transcribed from ggml-cpu's generic code
//! (`ggml_vec_dot_*_generic` in ggml-cpu/quants.c and `ggml_vec_dot_f16/bf16/
//! f32` in vec.cpp, scalar branch). Integer partial sums are exact, and the
//! f32 operations happen in the same order as in C, so the results equal what
//! a scalar (no-SIMD, `-ffp-contract=off`) ggml build computes. With FMA
//! contraction enabled, as GCC does by default on FMA targets, C may differ in
//! the last bits; that is the C side being build-dependent, not us.
//!
//! These are what every fast path is tested against, and what `vec_dot`
//! falls back to on CPUs without a fast path. All kernels take the row
//! slices already cut to their exact lengths by `quant::vec_dot`.

use crate::quant::formats::blocks::*;

/// Q4_0 × Q8_0.
pub(crate) fn q4_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ4_0>(w), cast::<BlockQ8_0>(x));
    let mut sumf = 0f32;
    for (a, b) in w.iter().zip(x) {
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK / 2 {
            let v0 = (a.qs[j] & 0x0F) as i32 - 8;
            let v1 = (a.qs[j] >> 4) as i32 - 8;
            sumi0 += v0 * b.qs[j] as i32;
            sumi1 += v1 * b.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += sumi as f32 * f16_to_f32(a.d) * f16_to_f32(b.d);
    }
    sumf
}

/// Q4_1 × Q8_1 in the exact order of ggml-cpu's x86 kernel, which is what the peer engine
/// runs: eight f32 lanes, lane k holding the integer sum of elements 4k..4k+4 of each block,
/// accumulated with one fused multiply-add per block; the `m·s` terms summed in a separate
/// scalar chain (fused, as GCC contracts it); then ggml's horizontal sum. This model family
/// is numerically sensitive enough that the order decides greedy tokens.
pub(crate) fn q4_1_q8_1(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ4_1>(w), cast::<BlockQ8_1>(x));
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (a, b) in w.iter().zip(x) {
        let d = f16_to_f32(a.d) * f16_to_f32(b.d);
        summs = f16_to_f32(a.m).mul_add(f16_to_f32(b.s), summs);
        for (lane, acc) in acc.iter_mut().enumerate() {
            let mut sumi = 0i32;
            for e in 4 * lane..4 * lane + 4 {
                let q = if e < 16 {
                    a.qs[e] & 0x0F
                } else {
                    a.qs[e - 16] >> 4
                };
                sumi += q as i32 * b.qs[e] as i32;
            }
            *acc = d.mul_add(sumi as f32, *acc);
        }
    }
    hsum8(&acc) + summs
}

/// ggml's `hsum_float_8`: halves added lane-wise, then pairs, then the last two.
pub(crate) fn hsum8(v: &[f32; 8]) -> f32 {
    let r: [f32; 4] = std::array::from_fn(|i| v[i + 4] + v[i]);
    (r[0] + r[2]) + (r[1] + r[3])
}

/// MXFP4 × Q8_0 (ggml's generic kernel).
pub(crate) fn mxfp4_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockMxfp4>(w), cast::<BlockQ8_0>(x));
    let mut sumf = 0f32;
    for (a, b) in w.iter().zip(x) {
        let d = f16_to_f32(b.d) * e8m0_to_f32_half(a.e);
        let (mut sumi1, mut sumi2) = (0i32, 0i32);
        for j in 0..QK / 2 {
            sumi1 += b.qs[j] as i32 * KVALUES_MXFP4[(a.qs[j] & 0x0F) as usize] as i32;
            sumi2 += b.qs[j + QK / 2] as i32 * KVALUES_MXFP4[(a.qs[j] >> 4) as usize] as i32;
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}

/// Q5_0 × Q8_0.
pub(crate) fn q5_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ5_0>(w), cast::<BlockQ8_0>(x));
    let mut sumf = 0f32;
    for (a, b) in w.iter().zip(x) {
        let qh = u32::from_le_bytes(a.qh);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK / 2 {
            let xh_0 = (((qh >> j) & 1) << 4) as u8;
            let xh_1 = (((qh >> (j + 16)) & 1) << 4) as u8;
            let x0 = ((a.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((a.qs[j] >> 4) | xh_1) as i32 - 16;
            sumi0 += x0 * b.qs[j] as i32;
            sumi1 += x1 * b.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(a.d) * f16_to_f32(b.d)) * sumi as f32;
    }
    sumf
}

/// Q5_1 × Q8_1.
pub(crate) fn q5_1_q8_1(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ5_1>(w), cast::<BlockQ8_1>(x));
    let mut sumf = 0f32;
    for (a, b) in w.iter().zip(x) {
        let qh = u32::from_le_bytes(a.qh);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((a.qs[j] & 0xF) | xh_0) as i32;
            let x1 = ((a.qs[j] >> 4) | xh_1) as i32;
            sumi0 += x0 * b.qs[j] as i32;
            sumi1 += x1 * b.qs[j + QK / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf +=
            (f16_to_f32(a.d) * f16_to_f32(b.d)) * sumi as f32 + f16_to_f32(a.m) * f16_to_f32(b.s);
    }
    sumf
}

/// Q8_0 × Q8_0.
pub(crate) fn q8_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ8_0>(w), cast::<BlockQ8_0>(x));
    let mut sumf = 0f32;
    for (a, b) in w.iter().zip(x) {
        let sumi: i32 =
            a.qs.iter()
                .zip(&b.qs)
                .map(|(&p, &q)| p as i32 * q as i32)
                .sum();
        sumf += sumi as f32 * (f16_to_f32(a.d) * f16_to_f32(b.d));
    }
    sumf
}

/// Shared tail of the k-quant kernels: ggml accumulates the integer
/// products into 8 lanes (`aux32[l]`, lane = index mod 8) and the scaled
/// lanes into 8 float sums (`sums[l]`) that are added to `sumf` only at the
/// very end. `a` are the unpacked weight quants, `scale(j)` the integer
/// scale of the j-th group of `group` values.
#[inline(always)]
fn lanes8(a: &[i8; QK_K], q8: &[i8; QK_K], group: usize, scale: impl Fn(usize) -> i32) -> [i32; 8] {
    let mut aux32 = [0i32; 8];
    for (g, (ag, qg)) in a
        .chunks_exact(group)
        .zip(q8.chunks_exact(group))
        .enumerate()
    {
        let s = scale(g);
        for (a8, q8) in ag.chunks_exact(8).zip(qg.chunks_exact(8)) {
            for l in 0..8 {
                // aux16 = q8*a fits i16 (|.| ≤ 128*63); then widened.
                let aux16 = (q8[l] as i16) * (a8[l] as i16);
                aux32[l] += s * aux16 as i32;
            }
        }
    }
    aux32
}

/// Q4_K × Q8_K.
pub(crate) fn q4_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ4K>(w), cast::<BlockQ8K>(x));
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    let mut aux8 = [0i8; QK_K];
    for (a, b) in w.iter().zip(x) {
        for (q4, out) in a.qs.chunks_exact(32).zip(aux8.chunks_exact_mut(64)) {
            for l in 0..32 {
                out[l] = (q4[l] & 0xF) as i8;
                out[l + 32] = (q4[l] >> 4) as i8;
            }
        }
        let (scales, mins) = unpack_scale_min_k4(&a.scales);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            sumi += b.bsum(j) as i32 * mins[j / 2] as i32;
        }
        let aux32 = lanes8(&aux8, &b.qs, 32, |g| scales[g] as i32);
        let d = f16_to_f32(a.d) * b.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = f16_to_f32(a.dmin) * b.d();
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// Q5_K × Q8_K.
pub(crate) fn q5_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ5K>(w), cast::<BlockQ8K>(x));
    let mut sums = [0f32; 8];
    let mut sumf = 0f32;
    let mut aux8 = [0i8; QK_K];
    for (a, b) in w.iter().zip(x) {
        let mut m = 1u8;
        for (q4, out) in a.qs.chunks_exact(32).zip(aux8.chunks_exact_mut(64)) {
            for l in 0..32 {
                let h = if a.qh[l] & m != 0 { 16 } else { 0 };
                out[l] = (q4[l] & 0xF) as i8 + h;
            }
            m <<= 1;
            for l in 0..32 {
                let h = if a.qh[l] & m != 0 { 16 } else { 0 };
                out[l + 32] = (q4[l] >> 4) as i8 + h;
            }
            m <<= 1;
        }
        let (scales, mins) = unpack_scale_min_k4(&a.scales);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            sumi += b.bsum(j) as i32 * mins[j / 2] as i32;
        }
        let aux32 = lanes8(&aux8, &b.qs, 32, |g| scales[g] as i32);
        let d = f16_to_f32(a.d) * b.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = f16_to_f32(a.dmin) * b.d();
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// Q6_K × Q8_K.
pub(crate) fn q6_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ6K>(w), cast::<BlockQ8K>(x));
    let mut sums = [0f32; 8];
    let mut aux8 = [0i8; QK_K];
    for (a, b) in w.iter().zip(x) {
        for h in 0..2 {
            let q4 = &a.ql[64 * h..64 * h + 64];
            let qh = &a.qh[32 * h..32 * h + 32];
            let out = &mut aux8[128 * h..128 * h + 128];
            for l in 0..32 {
                out[l] = ((q4[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                out[l + 32] = ((q4[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                out[l + 64] = ((q4[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                out[l + 96] = ((q4[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        let aux32 = lanes8(&aux8, &b.qs, 16, |g| a.scales[g] as i32);
        let d = f16_to_f32(a.d) * b.d();
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// F16 × F16: products in f32, accumulated in f64 (`ggml_float`), as the
/// scalar branch of `ggml_vec_dot_f16`.
pub(crate) fn f16_f16(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f64;
    for (a, b) in w.chunks_exact(2).zip(x.chunks_exact(2)) {
        sumf += (f16_to_f32([a[0], a[1]]) * f16_to_f32([b[0], b[1]])) as f64;
    }
    sumf as f32
}

/// BF16 × BF16, same structure as F16.
pub(crate) fn bf16_bf16(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f64;
    for (a, b) in w.chunks_exact(2).zip(x.chunks_exact(2)) {
        sumf += (bf16_to_f32([a[0], a[1]]) * bf16_to_f32([b[0], b[1]])) as f64;
    }
    sumf as f32
}

/// F32 × F32, f64 accumulation.
pub(crate) fn f32_f32(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let mut sumf = 0f64;
    for (a, b) in w.chunks_exact(4).zip(x.chunks_exact(4)) {
        let a = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
        let b = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        sumf += (a * b) as f64;
    }
    sumf as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::{random_row, Rng};
    use crate::quant::{dequantize_row, quantize_row, reference, GgmlType};

    /// Σ |m| * |s| * 2^-9 over the blocks of a Q4_1/Q5_1 row.
    fn min_term_bound(ty: GgmlType, w: &[u8], xq: &[u8]) -> f64 {
        let ms: Vec<f32> = match ty {
            GgmlType::Q4_1 => cast::<BlockQ4_1>(w)
                .iter()
                .map(|b| f16_to_f32(b.m))
                .collect(),
            _ => cast::<BlockQ5_1>(w)
                .iter()
                .map(|b| f16_to_f32(b.m))
                .collect(),
        };
        let x = cast::<BlockQ8_1>(xq);
        ms.iter()
            .zip(x)
            .map(|(&m, b)| (m as f64 * f16_to_f32(b.s) as f64).abs() / 512.0)
            .sum()
    }

    /// An MXFP4 block decodes to its E2M1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
    /// negatives) times 2^(e − 127): 8 for e = 130; the low nibbles are the block's first half.
    #[test]
    fn mxfp4_blocks_decode_to_e2m1_values_times_their_scale() {
        let mut block = vec![130u8];
        block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut y = vec![0f32; 32];
        dequantize_row(GgmlType::MXFP4, &block, &mut y).unwrap();
        let e2m1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        for j in 0..16 {
            let want = |i: usize| e2m1[i % 8] * if i >= 8 { -8.0 } else { 8.0 };
            assert_eq!(y[j], want(j), "low nibble {j}");
            assert_eq!(y[j + 16], want(15 - j), "high nibble {j}");
        }
        assert_eq!(e8m0_to_f32_half(0), 2f32.powi(-128));
        assert_eq!(e8m0_to_f32_half(1), 2f32.powi(-127));
        assert_eq!(e8m0_to_f32_half(255), 2f32.powi(127));
    }

    /// The reference dot must agree with the plain f64 dot of the two
    /// dequantized rows: this checks the kernels' decoding and scale
    /// bookkeeping independently of the transcription from C.
    #[test]
    fn reference_equals_dequantized_dot() {
        use GgmlType::*;
        let mut rng = Rng::new(0xd07);
        for ty in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, MXFP4,
        ] {
            let vt = ty.vec_dot_type();
            for blocks in [1usize, 3, 7] {
                let n = blocks * ty.block_elems().max(vt.block_elems()).max(32);
                let w = random_row(&mut rng, ty, n);
                let act: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
                let mut xq = vec![0u8; vt.row_bytes(n as u64).unwrap() as usize];
                quantize_row(vt, &act, &mut xq);

                let mut wf = vec![0f32; n];
                let mut xf = vec![0f32; n];
                dequantize_row(ty, &w, &mut wf).unwrap();
                dequantize_row(vt, &xq, &mut xf).unwrap();
                let want: f64 = wf.iter().zip(&xf).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale: f64 = wf
                    .iter()
                    .zip(&xf)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();

                let got = reference::vec_dot(ty, n, &w, &xq) as f64;
                // Q4_1/Q5_1 fold the minimum in through the f16 `s` field
                // (f16(d * Σq), d unrounded), which differs from the
                // dequantized f16(d) * Σq by up to ~2^-10 relative.
                let mut tol = 2e-6 * scale;
                if matches!(ty, Q4_1 | Q5_1) {
                    tol += min_term_bound(ty, &w, &xq);
                }
                assert!(
                    (got - want).abs() <= tol.max(1e-6),
                    "{ty} n={n}: got {got} want {want} (tol {tol})"
                );
            }
        }
    }
}
