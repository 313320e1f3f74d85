//! AVX2 + FMA (+F16C for scale conversion) dot kernels, modelled on
//! ggml-cpu's arch/x86/quants.c. They compute the same integer block sums
//! as the scalar reference and differ only in the order the f32 per-block
//! terms are accumulated (8 lanes + horizontal sum, FMA), so they agree with
//! `reference::dot` to a few ulp of Σ|w·x|.
//!
//! Every kernel is an `unsafe fn` with `#[target_feature]`; the only way
//! they are called is through the `AVX2` table, which `quant::detect` hands
//! out only after `crate::cpu_features` detected avx2, fma and f16c.
//! Memory safety does not depend on `n`: the kernels iterate over the block
//! slices they are given and load only from inside those blocks.

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;
use crate::quant::Kernels;

pub(in crate::quant) const AVX2: Kernels = Kernels {
    name: "avx2",
    q4_0: q4_0_q8_0,
    q4_1: q4_1_q8_1,
    q5_0: q5_0_q8_0,
    q5_1: q5_1_q8_1,
    q8_0: q8_0_q8_0,
    q4_k: q4_k_q8_k,
    q5_k: q5_k_q8_k,
    q6_k: q6_k_q8_k,
    mxfp4: mxfp4_q8_0,
    f16: f16_f16,
    bf16: bf16_bf16,
    f32: f32_f32,
};

// ---------------------------------------------------------------- helpers

/// One f16 → f32 with F16C (cheaper than half's software path plus its
/// runtime feature check).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn h2f(b: [u8; 2]) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(i16::from_le_bytes(b))))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_f32x8(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_f32x4(x: __m128) -> f32 {
    let r = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// 16 bytes of packed nibbles → 32 bytes: low nibbles in lanes 0..16, high
/// nibbles in 16..32 (the ggml legacy-quant element order).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bytes_from_nibbles_32(qs: &[u8; 16]) -> __m256i {
    // Both halves from one broadcast load; the upper half shifted down a nibble.
    let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(qs.as_ptr().cast()));
    let bytes = _mm256_srlv_epi64(both, _mm256_set_epi64x(4, 4, 0, 0));
    _mm256_and_si256(bytes, _mm256_set1_epi8(0x0F))
}

/// Spreads the 32 bits of `qh` to 32 bytes: 0xFF where the bit is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bytes_from_bits_32(qh: [u8; 4]) -> __m256i {
    let x32 = i32::from_le_bytes(qh);
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1))
}

/// Σ of unsigned×signed byte products, 4 per i32 lane, as f32.
/// (`maddubs` saturates at i16, unreachable here: |pair| ≤ 2·255·128 only
/// for full-range bytes, and our unsigned side is ≤ 63 or a |q8| ≤ 128.)
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    let dot = _mm256_maddubs_epi16(ax, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
}

/// Signed×signed version: move x's sign onto y so maddubs can be used.
/// |x| for x = -128 is 0x80, which maddubs reads (unsigned) as 128: right.
/// y must not be -128 where x < 0; activations from `quantize_row` never are.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    mul_sum_us8_pairs_float(ax, sy)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn load32(p: &[i8; 32]) -> __m256i {
    _mm256_loadu_si256(p.as_ptr().cast())
}

/// 32 consecutive bytes at `s[off..]` (bounds-checked slice, then a load).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32_at<T>(s: &[T], off: usize) -> __m256i {
    debug_assert_eq!(std::mem::size_of::<T>(), 1);
    let s = &s[off..off + 32];
    _mm256_loadu_si256(s.as_ptr().cast())
}

// ---------------------------------------------------------- legacy quants

/// Q4_0 × Q8_0 in ggml's x86 order: one FMA chain over blocks, as both its `vec_dot` and its
/// llamafile `tinyBLAS_Q0` (prompt) path compute each (row, token) pair. Latency-bound for a
/// single pair; matmul hides that by running many pairs.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ4_0>(w), cast::<BlockQ8_0>(x));
    let off = _mm256_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let qx = _mm256_sub_epi8(bytes_from_nibbles_32(&a.qs), off);
        let q = mul_sum_i8_pairs_float(qx, load32(&b.qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_f32x8(acc)
}

/// MXFP4 × Q8_0 (ggml's AVX2 order): each nibble looked up in the doubled E2M1 table with one
/// byte shuffle, then the Q4_0 block step with the block's E8M0 scale.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockMxfp4>(w), cast::<BlockQ8_0>(x));
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let d = _mm256_set1_ps(h2f(b.d) * e8m0_to_f32_half(a.e));
        let q = mul_sum_i8_pairs_float(mxfp4_values(a), load32(&b.qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_f32x8(acc)
}

/// Q4_1 × Q8_1 — the reference model's main weight type — in ggml's x86 order (see
/// `reference::dot::q4_1_q8_1`): one FMA chain over blocks, `m·s` summed in a scalar fused chain.
/// Bit-identical to the reference; batching rows or tokens is how matmul hides the latency.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1_q8_1(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ4_1>(w), cast::<BlockQ8_1>(x));
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (a, b) in w.iter().zip(x) {
        summs = h2f(a.m).mul_add(h2f(b.s), summs);
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let xy = mul_sum_us8_pairs_float(bytes_from_nibbles_32(&a.qs), load32(&b.qs));
        acc = _mm256_fmadd_ps(d, xy, acc);
    }
    hsum_f32x8(acc) + summs
}

/// q - 16 as signed bytes for a Q5_0 block: OR 0xF0 into the nibble where
/// the 5th bit is clear (0x0q | 0xF0 = q - 16), leave it where it is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0_values(a: &BlockQ5_0) -> __m256i {
    let bxhi = _mm256_andnot_si256(bytes_from_bits_32(a.qh), _mm256_set1_epi8(0xF0u8 as i8));
    _mm256_or_si256(bytes_from_nibbles_32(&a.qs), bxhi)
}

/// The 32 weights of an MXFP4 block as signed bytes (the doubled E2M1 table looked up by a
/// byte shuffle), to be scaled by `e8m0_to_f32_half(a.e)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn mxfp4_values(a: &BlockMxfp4) -> __m256i {
    let table = _mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i);
    _mm256_shuffle_epi8(
        _mm256_broadcastsi128_si256(table),
        bytes_from_nibbles_32(&a.qs),
    )
}

/// Unsigned 5-bit values of a Q5_1 block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1_values(a: &BlockQ5_1) -> __m256i {
    let bxhi = _mm256_and_si256(bytes_from_bits_32(a.qh), _mm256_set1_epi8(0x10));
    _mm256_or_si256(bytes_from_nibbles_32(&a.qs), bxhi)
}

/// Q5_0 × Q8_0 in ggml's x86 order: one FMA chain over blocks (see `q4_0_q8_0`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ5_0>(w), cast::<BlockQ8_0>(x));
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let q = mul_sum_i8_pairs_float(q5_0_values(a), load32(&b.qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_f32x8(acc)
}

/// Q5_1 × Q8_1 in ggml's x86 order (as `q4_1_q8_1`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_1_q8_1(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ5_1>(w), cast::<BlockQ8_1>(x));
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0f32;
    for (a, b) in w.iter().zip(x) {
        summs = h2f(a.m).mul_add(h2f(b.s), summs);
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let q = mul_sum_us8_pairs_float(q5_1_values(a), load32(&b.qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_f32x8(acc) + summs
}

/// Q8_0 × Q8_0 in ggml's x86 order: one FMA chain over the blocks (bit-identical to the
/// tiled panels in `x86::panel`, which hide the chain's latency by running several pairs).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ8_0>(w), cast::<BlockQ8_0>(x));
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let d = _mm256_set1_ps(h2f(a.d) * h2f(b.d));
        let q = mul_sum_i8_pairs_float(load32(&a.qs), load32(&b.qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_f32x8(acc)
}

// ---------------------------------------------------------------- k-quants

/// Σ_j bsums[j] · mins[j/2] for Q4_K/Q5_K, as 4 i32 lanes: pairs of bsums
/// are added (hadd, ≤ 2·16·127 fits i16) and multiplied with the 8 mins.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mins_dot_bsums(b: &BlockQ8K, mins: &[u8; 8]) -> __m128i {
    let q8sums = _mm256_loadu_si256(b.bsums.as_ptr().cast());
    let q8s = _mm_hadd_epi16(
        _mm256_castsi256_si128(q8sums),
        _mm256_extracti128_si256::<1>(q8sums),
    );
    let m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64(mins.as_ptr().cast()));
    _mm_madd_epi16(m16, q8s)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ4K>(w), cast::<BlockQ8K>(x));
    let m4 = _mm256_set1_epi8(0xF);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let d = b.d() * h2f(a.d);
        let dmin = -b.d() * h2f(a.dmin);
        let (sc, mins) = unpack_scale_min_k4(&a.scales);
        let prod = mins_dot_bsums(b, &mins);
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);

        let mut sumi = _mm256_setzero_si256();
        for j in 0..QK_K / 64 {
            let scale_l = _mm256_set1_epi16(sc[2 * j] as i16);
            let scale_h = _mm256_set1_epi16(sc[2 * j + 1] as i16);
            let q4bits = load32_at(&a.qs, 32 * j);
            let q4l = _mm256_and_si256(q4bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4);
            let p16l = _mm256_maddubs_epi16(q4l, load32_at(&b.qs, 64 * j));
            let p16h = _mm256_maddubs_epi16(q4h, load32_at(&b.qs, 64 * j + 32));
            let p32l = _mm256_madd_epi16(scale_l, p16l);
            let p32h = _mm256_madd_epi16(scale_h, p16h);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p32l, p32h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_f32x8(acc) + hsum_f32x4(acc_m)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ5K>(w), cast::<BlockQ8K>(x));
    let m4 = _mm256_set1_epi8(0xF);
    let m1 = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    // ggml sums the minimum terms in a scalar (one exact integer per block, then a fused
    // multiply-add), unlike Q4_K's vector of four.
    let mut summs = 0f32;
    for (a, b) in w.iter().zip(x) {
        let d = b.d() * h2f(a.d);
        let dmin = -b.d() * h2f(a.dmin);
        let (sc, mins) = unpack_scale_min_k4(&a.scales);
        let prod = mins_dot_bsums(b, &mins);
        let hsum = _mm_hadd_epi32(
            _mm_hadd_epi32(prod, _mm_setzero_si128()),
            _mm_setzero_si128(),
        );
        summs = dmin.mul_add(_mm_cvtsi128_si32(hsum) as f32, summs);

        // Bit 2j / 2j+1 of qh[l] is the 5th bit of value l of sub-block
        // 2j / 2j+1; shift hbits right by 2 per 64 values and mask bit 0/1.
        let mut hbits = load32_at(&a.qh, 0);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..QK_K / 64 {
            let scale_l = _mm256_set1_epi16(sc[2 * j] as i16);
            let scale_h = _mm256_set1_epi16(sc[2 * j + 1] as i16);
            let q4bits = load32_at(&a.qs, 32 * j);
            let h_l = _mm256_slli_epi16::<4>(_mm256_and_si256(hbits, m1));
            let h_h = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<1>(hbits), m1));
            hbits = _mm256_srli_epi16::<2>(hbits);
            let q5l = _mm256_or_si256(_mm256_and_si256(q4bits, m4), h_l);
            let q5h = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(q4bits), m4), h_h);
            let p16l = _mm256_maddubs_epi16(q5l, load32_at(&b.qs, 64 * j));
            let p16h = _mm256_maddubs_epi16(q5h, load32_at(&b.qs, 64 * j + 32));
            let p32l = _mm256_madd_epi16(scale_l, p16l);
            let p32h = _mm256_madd_epi16(scale_h, p16h);
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p32l, p32h));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_f32x8(acc) + summs
}

/// Two 16-value scales as one 16×i16 vector (lanes 0..8 ← lo, 8..16 ← hi),
/// matching the pair sums maddubs produces for 32 bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale_pair(lo: i8, hi: i8) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
}

/// Q6_K × Q8_K in ggml's x86 order: the 6-bit codes are dotted unsigned and the −32 bias is
/// taken off once per block as 32·Σ bsums·scales, in the same lanes as ggml (which decides
/// how the eight lane sums round).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (w, x) = (cast::<BlockQ6K>(w), cast::<BlockQ8K>(x));
    let m3 = _mm256_set1_epi8(3);
    let m15 = _mm256_set1_epi8(15);
    let mut acc = _mm256_setzero_ps();
    for (a, b) in w.iter().zip(x) {
        let d = b.d() * h2f(a.d);
        let q8sums = _mm256_loadu_si256(b.bsums.as_ptr().cast());
        let scales_16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(a.scales.as_ptr().cast()));
        let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, scales_16));
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let sc = &a.scales[8 * h..8 * h + 8];
            let q4bits1 = load32_at(&a.ql, 64 * h);
            let q4bits2 = load32_at(&a.ql, 64 * h + 32);
            let bits_h = load32_at(&a.qh, 32 * h);
            let q4h_0 = _mm256_slli_epi16::<4>(_mm256_and_si256(bits_h, m3));
            let q4h_1 = _mm256_slli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(12)));
            let q4h_2 = _mm256_and_si256(bits_h, _mm256_set1_epi8(48));
            let q4h_3 = _mm256_srli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(-64)));
            let q = [
                _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0),
                _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits1), m15),
                    q4h_2,
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16::<4>(q4bits2), m15),
                    q4h_3,
                ),
            ];
            let mut p = [_mm256_setzero_si256(); 4];
            for (c, &qc) in q.iter().enumerate() {
                let p16 = _mm256_maddubs_epi16(qc, load32_at(&b.qs, 128 * h + 32 * c));
                p[c] = _mm256_madd_epi16(scale_pair(sc[2 * c], sc[2 * c + 1]), p16);
            }
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[0], p[1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p[2], p[3]));
        }
        sumi = _mm256_sub_epi32(sumi, q8sclsub);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_f32x8(acc)
}

// ------------------------------------------------------------ float types

/// F32 · F32 with four 8-wide FMA accumulators (f32, not ggml's scalar f64).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f32_f32(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let n = n.min(w.len() / 4).min(x.len() / 4);
    let (wp, xp) = (w.as_ptr().cast::<f32>(), x.as_ptr().cast::<f32>());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // Loads: i + 32 ≤ n ≤ both slice lengths in f32s; loadu has no
    // alignment requirement.
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 8 * k;
            *a = _mm256_fmadd_ps(_mm256_loadu_ps(wp.add(o)), _mm256_loadu_ps(xp.add(o)), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(
            _mm256_loadu_ps(wp.add(i)),
            _mm256_loadu_ps(xp.add(i)),
            acc[0],
        );
        i += 8;
    }
    let mut s = hsum_f32x8(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += wp.add(i).read_unaligned() * xp.add(i).read_unaligned();
        i += 1;
    }
    s
}

/// Eight halves at `p + 2i` widened to f32. Caller keeps i + 8 in bounds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld(p: *const u8, i: usize) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i).cast()))
}

/// F16 · F16: widen 8 halves at a time with F16C, accumulate in f32.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_f16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(x.len() / 2);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // Loads: each 16-byte load covers halves i..i+8 with i + 8 ≤ n.
    while i + 32 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 8 * k;
            *a = _mm256_fmadd_ps(ld(wp, o), ld(xp, o), *a);
        }
        i += 32;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(ld(wp, i), ld(xp, i), acc[0]);
        i += 8;
    }
    let mut s = hsum_f32x8(_mm256_add_ps(
        _mm256_add_ps(acc[0], acc[1]),
        _mm256_add_ps(acc[2], acc[3]),
    ));
    while i < n {
        s += h2f([w[2 * i], w[2 * i + 1]]) * h2f([x[2 * i], x[2 * i + 1]]);
        i += 1;
    }
    s
}

/// BF16 · BF16: widen 8 values at a time (bf16 is the top half of an f32).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bf16_bf16(n: usize, w: &[u8], x: &[u8]) -> f32 {
    let n = n.min(w.len() / 2).min(x.len() / 2);
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    // Loads: each 16-byte load covers values i..i+8 with i + 8 ≤ n.
    while i + 16 <= n {
        for (k, a) in acc.iter_mut().enumerate() {
            let o = i + 8 * k;
            *a = _mm256_fmadd_ps(ld_bf16(wp, o), ld_bf16(xp, o), *a);
        }
        i += 16;
    }
    while i + 8 <= n {
        acc[0] = _mm256_fmadd_ps(ld_bf16(wp, i), ld_bf16(xp, i), acc[0]);
        i += 8;
    }
    let mut s = hsum_f32x8(_mm256_add_ps(acc[0], acc[1]));
    while i < n {
        s += bf16_to_f32([w[2 * i], w[2 * i + 1]]) * bf16_to_f32([x[2 * i], x[2 * i + 1]]);
        i += 1;
    }
    s
}

/// Eight bf16 at `p + 2i` widened to f32. Caller keeps i + 8 in bounds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn ld_bf16(p: *const u8, i: usize) -> __m256 {
    let v = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i).cast()));
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v))
}

/// f16 → f32 for a whole row, 8 values per instruction (K/V page rows in attention), 16 where
/// the CPU has AVX-512.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_row(src: &[u8], dst: &mut [f32]) {
    let n = dst.len().min(src.len() / 2);
    let mut start = 0;
    if crate::cpu_features::avx512() {
        start = f16_row_avx512(src, &mut dst[..n]);
    }
    let main = start + (n - start) / 8 * 8;
    for i in (start..main).step_by(8) {
        // SAFETY: bytes 2i..2i+16 and floats i..i+8 are in bounds (i + 8 <= main <= n).
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(2 * i).cast());
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
    }
    for i in main..n {
        dst[i] = h2f([src[2 * i], src[2 * i + 1]]);
    }
}

/// f32 → f16 (little-endian bytes) for a whole row, 8 values per instruction, rounding to
/// nearest even as `half::f16::from_f32` does (K/V rows written into f16 pages).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f32_row_to_f16(src: &[f32], dst: &mut [u8]) {
    let n = src.len().min(dst.len() / 2);
    let main = n / 8 * 8;
    for i in (0..main).step_by(8) {
        // SAFETY: floats i..i+8 and bytes 2i..2i+16 are in bounds (i + 8 <= main <= n).
        unsafe {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            _mm_storeu_si128(dst.as_mut_ptr().add(2 * i).cast(), h);
        }
    }
    for i in main..n {
        dst[2 * i..2 * i + 2].copy_from_slice(&f32_to_f16(src[i]));
    }
}

/// The whole sixteens of [`f16_row`] (`dst.len()` values, which `src` holds): how many it did.
#[target_feature(enable = "avx2,fma,f16c,avx512f")]
unsafe fn f16_row_avx512(src: &[u8], dst: &mut [f32]) -> usize {
    let main = dst.len() / 16 * 16;
    for i in (0..main).step_by(16) {
        // SAFETY: bytes 2i..2i+32 and floats i..i+16 are in bounds (i + 16 <= main).
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(2 * i).cast());
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
    }
    main
}
