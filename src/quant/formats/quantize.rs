//! Quantization of f32 activations into the "vec_dot types" the weight rows
//! are multiplied against (Q8_0, Q8_1, Q8_K, F16, BF16, F32).
//!
//! Q8_0 and Q8_1 follow ggml-cpu's x86 SIMD `quantize_row_q8_0`/`_q8_1`, not
//! ggml's `quantize_row_*_ref`: the multiplier is `127/amax` and ties round to
//! even, where the reference C code multiplies by `1/d` and uses `roundf`
//! (half away from zero). The two differ by one in a quant, in rare cases
//! where the scaled value sits on a half; we follow what the peer actually
//! runs, and the tests pin that down (ties to even, and agreement with the
//! reference oracle up to such ties). Q8_K follows `quantize_row_q8_K_ref`
//! (`nearest_int`, half to even) and F16/BF16 are plain conversions; those
//! match the oracle vectors byte for byte.

use crate::cpu_features::fma_dispatch;
use crate::quant::formats::blocks::*;
use crate::quant::GgmlType;

/// Quantizes `src` into `dst` (lengths checked by the caller). Returns false
/// for a type that is not a vec-dot type.
pub(crate) fn quantize(dot_ty: GgmlType, src: &[f32], dst: &mut [u8]) -> bool {
    use GgmlType::*;
    match dot_ty {
        F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        F16 => crate::quant::f32_row_to_f16(src, dst),
        BF16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&f32_to_bf16(*s));
            }
        }
        Q8_0 => q8_0(src, cast_mut(dst)),
        Q8_1 => q8_1(src, cast_mut(dst)),
        Q8_K => q8_k(src, cast_mut(dst)),
        _ => return false,
    }
    true
}

/// Largest |x| of a block, with C's `MAX(a, fabsf(v))` semantics.
///
/// Kept in 8 lanes and folded at the end: a maximum does not depend on the order it is taken
/// in, and one running maximum would be a chain of 32 dependent compares per block.
#[inline(always)]
fn amax(x: &[f32]) -> f32 {
    let max = |a: f32, v: f32| if a > v { a } else { v };
    let mut lanes = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = max(*l, v.abs());
        }
    }
    let head = lanes.iter().fold(0.0f32, |a, &l| max(a, l));
    tail.iter().fold(head, |a, &v| max(a, v.abs()))
}

fma_dispatch! {
/// Q8_0 as ggml-cpu's x86 path quantizes activations (`quantize_row_q8_0`): scale
/// `d = amax/127`, multiplier `127/amax`, ties rounded to even. The reference C code uses
/// `1/d` and `roundf`; the two differ in rare last-bit cases, and this model family is
/// sensitive enough to such differences that we follow what the peer actually runs.
///
/// Compiled for AVX2 too (see `fma_dispatch`): round_ties_even becomes one vector instruction
/// instead of a libm call per value.
fn q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, _) = q8_block(x, &mut b.qs);
        b.d = f32_to_f16(d);
    }
}
}

/// One block of 32 activations to int8 (ggml-cpu's x86 rounding): returns the scale `d` and
/// the sum of the quantized values.
#[inline(always)]
fn q8_block(x: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C; `x` holds a whole block (chunks_exact).
        return unsafe { q8_block_avx2(x, qs) };
    }
    q8_block_scalar(x, qs)
}

#[inline(always)]
fn q8_block_scalar(x: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    let (d, id) = scale_and_multiplier(amax(x));
    let mut sum = 0i32;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
        sum += *q as i32;
    }
    (d, sum)
}

/// [`q8_block`] in AVX2, as ggml's `quantize_row_q8_0`/`_q8_1` do it: the same maximum (order
/// does not change a maximum), the same multiply and round-to-nearest-even, an exact integer
/// sum. LLVM does not vectorise the portable form well (the saturating `as i8`).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_block_avx2(x: &[f32], qs: &mut [i8; QK]) -> (f32, i32) {
    use std::arch::x86_64::*;
    assert!(x.len() >= QK);
    let p = x.as_ptr();
    // SAFETY: 32 floats are in bounds (asserted).
    let v = unsafe {
        [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]
    };
    let sign = _mm256_set1_ps(-0.0);
    let abs = |a: __m256| _mm256_andnot_ps(sign, a);
    let m = _mm256_max_ps(
        _mm256_max_ps(abs(v[0]), abs(v[1])),
        _mm256_max_ps(abs(v[2]), abs(v[3])),
    );
    let m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m), _mm256_castps256_ps128(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
    let (d, id) = scale_and_multiplier(amax);
    let mul = _mm256_set1_ps(id);
    let q = v.map(|a| {
        _mm256_cvtps_epi32(_mm256_round_ps::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(_mm256_mul_ps(a, mul)))
    });
    let s8 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    let s4 = _mm_add_epi32(
        _mm256_extracti128_si256::<1>(s8),
        _mm256_castsi256_si128(s8),
    );
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    let sum = _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)));
    // Narrow to bytes; the packs interleave 128-bit lanes, the permute restores the order.
    let w16a = _mm256_packs_epi32(q[0], q[1]);
    let w16b = _mm256_packs_epi32(q[2], q[3]);
    let bytes = _mm256_permutevar8x32_epi32(
        _mm256_packs_epi16(w16a, w16b),
        _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7),
    );
    // SAFETY: `qs` is 32 bytes.
    unsafe { _mm256_storeu_si256(qs.as_mut_ptr().cast(), bytes) };
    (d, sum)
}

fma_dispatch! {
/// Q8_1 as ggml-cpu's x86 path does: Q8_0's rounding plus `s = f16(d * sum(qs))`.
fn q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK)) {
        let (d, sum) = q8_block(x, &mut b.qs);
        b.d = f32_to_f16(d);
        b.s = f32_to_f16(d * sum as f32);
    }
}
}

#[inline(always)]
fn scale_and_multiplier(amax: f32) -> (f32, f32) {
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (amax / 127.0, id)
}

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick, valid for
/// |v| ≤ 2^22 (always true here: |v| ≤ 127).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let val = v + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

fma_dispatch! {
/// `quantize_row_q8_K_ref`: the scale is taken from the signed value of
/// largest magnitude (`iscale = -127/max`), so that value maps to -127 and
/// everything else lands in [-127, 127] after the `MIN(127, v)` clamp.
///
/// The reference finds that value in one scan (`if ax > amax`: the first of the largest, NaNs
/// passed over); here the largest magnitude comes from eight lanes (a maximum does not depend
/// on its order), then its first occurrence: the same value, without a chain of 256 dependent
/// compares and branches.
fn q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (b, x) in y.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut lanes = [0.0f32; 8];
        for c in x.chunks_exact(8) {
            for (l, &v) in lanes.iter_mut().zip(c) {
                // Written so that a NaN never wins, as in the reference's scan.
                *l = if v.abs() > *l { v.abs() } else { *l };
            }
        }
        let amax = lanes.iter().fold(0.0f32, |m, &l| if l > m { l } else { m });
        if amax == 0.0 {
            b.d = 0.0f32.to_le_bytes();
            b.qs = [0; QK_K];
            // ggml leaves bsums untouched here (the block memory is whatever
            // it was); we zero them so the output is deterministic and the
            // sums stay consistent with qs.
            b.bsums = [[0; 2]; QK_K / 16];
            continue;
        }
        let max = x[x.iter().position(|v| v.abs() == amax).expect("amax is some |v|")];
        let iscale = -127.0f32 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (sum, qs) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *sum = (qs.iter().map(|&q| q as i32).sum::<i32>() as i16).to_le_bytes();
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::{from_hex, hex_f32s, Rng};
    use crate::quant::testdata::vectors::QUANT;
    use crate::quant::{quantize_row, GgmlType};

    /// gguf-py implements Q8_0 (bit-exact with the C reference, its comment
    /// says), F16 and BF16; the Q8_1 and Q8_K vectors come from a numpy
    /// transcription of the C code in gen_vectors.py (a second, independent
    /// implementation rather than a true oracle).
    #[test]
    fn matches_oracle_bytes() {
        let mut seen = std::collections::HashSet::new();
        for v in QUANT {
            let ty = GgmlType::from_u32(v.ty).unwrap();
            seen.insert(ty);
            let src = hex_f32s(v.src);
            let want = from_hex(v.want);
            let mut got = vec![0u8; want.len()];
            quantize_row(ty, &src, &mut got);
            if matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) {
                // The oracle is ggml's reference rounding (1/d, half away from zero); we
                // follow ggml-cpu's x86 path (127/amax, half to even). Scales agree; a
                // quant may differ by one, only where x·127/amax sits on a half.
                assert_same_up_to_ties(ty, &src, &got, &want, v.note);
            } else {
                assert_eq!(got, want, "{ty} ({})", v.note);
            }
        }
        use GgmlType::*;
        for t in [Q8_0, Q8_1, Q8_K, F16, BF16] {
            assert!(seen.contains(&t), "no oracle vectors for {t}");
        }
    }

    fn assert_same_up_to_ties(ty: GgmlType, src: &[f32], got: &[u8], want: &[u8], note: &str) {
        let bb = ty.block_bytes();
        for (bi, (g, w)) in got.chunks(bb).zip(want.chunks(bb)).enumerate() {
            assert_eq!(g[..2], w[..2], "{ty} ({note}) block {bi}: scale");
            let x = &src[bi * 32..(bi + 1) * 32];
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let qs_off = if ty == GgmlType::Q8_1 { 4 } else { 2 };
            for j in 0..32 {
                let (a, b) = (g[qs_off + j] as i8, w[qs_off + j] as i8);
                if a != b {
                    let v = x[j] * 127.0 / amax;
                    assert!(
                        (a as i32 - b as i32).abs() == 1 && ((v.abs().fract()) - 0.5).abs() < 1e-3,
                        "{ty} ({note}) block {bi} value {j}: {a} vs {b} for {v}"
                    );
                }
            }
        }
    }

    #[test]
    fn q8_0_ties_round_to_even_like_ggml_cpu() {
        // amax = 127 gives d = 1 and id = 1 exactly, so 2.5 → 2, -3.5 → -4 and 0.5 → 0.
        let mut x = [0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[3] = 0.5;
        let mut out = [0u8; 34];
        quantize_row(GgmlType::Q8_0, &x, &mut out);
        let b = &cast::<BlockQ8_0>(&out)[0];
        assert_eq!(&b.qs[..4], &[127, 2, -4, 0]);
    }

    #[test]
    fn q8_k_ties_round_to_even_and_bsums_add_up() {
        // max = -127 → iscale = -127/max = 1, d = 1; 2.5 → 2 and -3.5 → -4
        // (half to even, where ggml's reference `roundf` would give 3 and -4).
        let mut x = vec![0f32; 256];
        x[0] = -127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        x[17] = 5.0;
        let mut out = vec![0u8; 292];
        quantize_row(GgmlType::Q8_K, &x, &mut out);
        let b = &cast::<BlockQ8K>(&out)[0];
        assert_eq!(b.d(), 1.0);
        assert_eq!(&b.qs[..3], &[-127, 2, -4]);
        assert_eq!(b.bsum(0), -127 + 2 - 4);
        assert_eq!(b.bsum(1), 5);

        // With a positive max, iscale = -127/max < 0: max itself maps to -127,
        // -max to +127, and d = 1/iscale is negative.
        let mut y = vec![0f32; 256];
        y[5] = 254.0;
        y[6] = -254.0; // equal magnitude, later: the first one wins
        y[7] = 1.0; // -0.5 → 0 (half to even)
        quantize_row(GgmlType::Q8_K, &y, &mut out);
        let b = &cast::<BlockQ8K>(&out)[0];
        assert_eq!(b.d(), -2.0);
        assert_eq!(&b.qs[5..8], &[-127, 127, 0]);

        let mut rng = Rng::new(7);
        let x: Vec<f32> = (0..512).map(|_| rng.f32() * 3.0).collect();
        let mut out = vec![0u8; 2 * 292];
        quantize_row(GgmlType::Q8_K, &x, &mut out);
        for b in cast::<BlockQ8K>(&out) {
            for j in 0..16 {
                let s: i32 = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i32).sum();
                assert_eq!(s, b.bsum(j) as i32);
            }
            assert!(b.qs.iter().all(|&q| q != -128));
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(host_avx2), ignore = "this CPU lacks AVX2, FMA or F16C")]
    fn q8_block_avx2_matches_scalar() {
        use crate::quant::formats::blocks::QK;
        assert!(
            crate::cpu_features::hardware().avx2,
            "this x86-64 CPU lacks AVX2, FMA or F16C: q8_block_avx2 cannot be compared here"
        );
        let mut rng = Rng::new(7);
        for case in 0..2000 {
            let x: Vec<f32> = (0..QK)
                .map(|i| match case % 4 {
                    0 => 0.0,
                    // Exact ties after scaling by 127/amax: multiples of amax/254.
                    1 => ((i as f32) - 16.0) * 0.5 / 127.0 * 3.0,
                    _ => rng.f32() * 10.0 - 5.0,
                })
                .collect();
            let (mut a, mut b) = ([0i8; QK], [0i8; QK]);
            // SAFETY: checked the features above.
            let got = unsafe { super::q8_block_avx2(&x, &mut a) };
            let want = super::q8_block_scalar(&x, &mut b);
            assert_eq!(
                (got.0.to_bits(), got.1, a),
                (want.0.to_bits(), want.1, b),
                "case {case}"
            );
        }
    }

    #[test]
    fn q8_1_sum_field_and_zero_blocks() {
        let mut rng = Rng::new(3);
        let mut x: Vec<f32> = (0..96).map(|_| rng.f32()).collect();
        x[32..64].iter_mut().for_each(|v| *v = 0.0);
        let mut out = vec![0u8; 3 * 36];
        quantize_row(GgmlType::Q8_1, &x, &mut out);
        let bl = cast::<BlockQ8_1>(&out);
        for (i, b) in bl.iter().enumerate() {
            let d = amax(&x[32 * i..32 * i + 32]) / 127.0;
            let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
            assert_eq!(b.s, f32_to_f16(sum as f32 * d));
        }
        assert_eq!(f16_to_f32(bl[1].d), 0.0);
        assert!(bl[1].qs.iter().all(|&q| q == 0));
    }

    #[test]
    fn nearest_int_is_round_half_even() {
        for (v, want) in [
            (0.5f32, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (126.7, 127),
        ] {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }

    #[test]
    #[should_panic]
    fn quantize_row_panics_on_weight_types() {
        quantize_row(GgmlType::Q4_0, &[0.0; 32], &mut [0u8; 18]);
    }

    #[test]
    #[should_panic]
    fn quantize_row_panics_on_bad_length() {
        quantize_row(GgmlType::Q8_0, &[0.0; 32], &mut [0u8; 35]);
    }
}
