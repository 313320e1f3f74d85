//! AVX2 versions of the peer-order kernels of `order` (repacked Q4_0/Q4_K, tiled
//! Q4_K/Q5_K/Q6_K), bit-identical to its scalar dots: the integer parts are exact whatever
//! computes them, so only they are vectorized; the float epilogues are `order`'s own step
//! functions, applied in the same order.
//!
//! A panel runs the batch's tokens four at a time over each weight row (ggml's repacked Q4_K
//! GEMM groups them the same way, and its last `n mod 4` tokens go through its GEMV), so each
//! weight block is unpacked once for four tokens and their four float chains overlap.
//!
//! [`panel`] is the only entry point; `quant::gemm` hands it out only after feature detection
//! confirmed avx2, fma and f16c.

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;
use crate::quant::reference::order::{chain_step, tiled_step, Order};
use crate::quant::x86::dot::{bytes_from_nibbles_32, h2f, load32};
use crate::quant::GgmlType;

/// Tokens per pass over a weight row.
const TOKENS: usize = 4;

/// `out[t * rows + r] = order::dot(ty, order, t, toks, w_r, x_t)` bit for bit, for weight row
/// `r < rows` (`ty.row_bytes(n)` each in `w`) and activation row `t < toks` (each
/// `ty.vec_dot_type().row_bytes(n)` in `x`).
///
/// # Panics
/// If `order::has(ty, order)` is false or a buffer is too short.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn panel(
    ty: GgmlType,
    order: Order,
    n: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    toks: usize,
    out: &mut [f32],
) {
    let w_row = ty.row_bytes(n as u64).expect("row fits") as usize;
    let x_row = ty.vec_dot_type().row_bytes(n as u64).expect("row fits") as usize;
    let w_r = |r: usize| &w[r * w_row..(r + 1) * w_row];
    let x_t = |t: usize| &x[t * x_row..(t + 1) * x_row];
    let grouped = toks - toks % TOKENS;
    for t0 in (0..grouped).step_by(TOKENS) {
        let xs: [&[u8]; TOKENS] = std::array::from_fn(|i| x_t(t0 + i));
        for r in 0..rows {
            for (i, v) in dots(ty, order, true, w_r(r), xs).into_iter().enumerate() {
                out[(t0 + i) * rows + r] = v;
            }
        }
    }
    for t in grouped..toks {
        for r in 0..rows {
            out[t * rows + r] = dots(ty, order, false, w_r(r), [x_t(t)])[0];
        }
    }
}

/// One weight row against `T` tokens; `gemm`: the tokens are one of the GEMM's groups of four.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots<const T: usize>(
    ty: GgmlType,
    order: Order,
    gemm: bool,
    w: &[u8],
    xs: [&[u8]; T],
) -> [f32; T] {
    use GgmlType::*;
    match (ty, order) {
        (Q4_0, Order::Repacked) => q4_0_repacked(cast(w), xs.map(cast)),
        (Q4_K, Order::Repacked) => q4_k_repacked(gemm, cast(w), xs.map(cast)),
        (Q4_K, Order::Tiled) => k_tiled(cast::<BlockQ4K>(w), xs.map(cast)),
        (Q5_K, Order::Tiled) => k_tiled(cast::<BlockQ5K>(w), xs.map(cast)),
        (Q6_K, Order::Tiled) => q6_k_tiled(cast(w), xs.map(cast)),
        _ => panic!("no {order:?} kernel for {ty}"),
    }
}

// ---------------------------------------------------------------- helpers

/// The four i32 sums of `v[0..4]` (8 lanes each), in that order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4(v: [__m256i; 4]) -> [i32; 4] {
    let c = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let r = _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256::<1>(c));
    let mut s = [0i32; 4];
    _mm_storeu_si128(s.as_mut_ptr().cast(), r);
    s
}

/// The sum of the eight i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum8(v: __m256i) -> i32 {
    let r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    _mm_cvtsi128_si32(_mm_add_epi32(r, _mm_shuffle_epi32::<1>(r)))
}

/// 32 bytes from `s[off..]` (bounds-checked, then one unaligned load).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load32_at<T: Copy>(s: &[T], off: usize) -> __m256i {
    debug_assert_eq!(std::mem::size_of::<T>(), 1);
    _mm256_loadu_si256(s[off..off + 32].as_ptr().cast())
}

/// Σ q·y − 8·Σ y per 4 bytes, as i32 lanes: `q` unsigned nibbles, `y` signed. Both `maddubs`
/// stay far from i16 saturation (|pair| ≤ 2·15·128), whatever `y` holds.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_lanes(q: __m256i, y: __m256i) -> __m256i {
    let qy = _mm256_maddubs_epi16(q, y);
    let sy = _mm256_maddubs_epi16(_mm256_set1_epi8(1), y);
    let p16 = _mm256_sub_epi16(qy, _mm256_slli_epi16::<3>(sy));
    _mm256_madd_epi16(p16, _mm256_set1_epi16(1))
}

// ---------------------------------------------------------- Q4_0 repacked

/// Q4_0 in the repacked order: one chain per pair, a block's exact integer dot per step.
/// Blocks go four at a time so one horizontal sum serves four blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0_repacked<const T: usize>(w: &[BlockQ4_0], xs: [&[BlockQ8_0]; T]) -> [f32; T] {
    let mut acc = [0f32; T];
    for (c, wc) in w.chunks(4).enumerate() {
        let q: [__m256i; 4] = std::array::from_fn(|k| match wc.get(k) {
            Some(a) => bytes_from_nibbles_32(&a.qs),
            None => _mm256_setzero_si256(),
        });
        for (x, acc) in xs.iter().zip(&mut acc) {
            let xc = &x[4 * c..4 * c + wc.len()];
            let mut v = [_mm256_setzero_si256(); 4];
            for (k, b) in xc.iter().enumerate() {
                v[k] = q4_0_lanes(q[k], load32(&b.qs));
            }
            for ((s, a), b) in hsum4(v).into_iter().zip(wc).zip(xc) {
                *acc = chain_step(*acc, s, h2f(a.d), h2f(b.d));
            }
        }
    }
    acc
}

// ------------------------------------------------------------- Q4_K, Q5_K

/// A Q4_K or Q5_K block unpacked once for every token: per 64 values `j`, the quants of
/// sub-blocks 2j and 2j+1 as bytes with their scales, and the mins in step with the
/// activation's `bsums` (16 i16: both sums of sub-block k meet min k).
struct KBlock {
    q: [[__m256i; 2]; 4],
    sc: [[__m256i; 2]; 4],
    mins: __m256i,
    d: f32,
    dmin: f32,
}

/// The two 4-bit (Q4_K) or 5-bit (Q5_K) super-block types.
trait KQuant {
    /// # Safety
    /// The CPU has avx2, fma and f16c.
    unsafe fn unpack(&self) -> KBlock;
}

impl KQuant for BlockQ4K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(&self) -> KBlock {
        let m4 = _mm256_set1_epi8(0xF);
        let q = std::array::from_fn(|j| {
            let bits = load32_at(&self.qs, 32 * j);
            [
                _mm256_and_si256(bits, m4),
                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
            ]
        });
        k_block(q, &self.scales, self.d, self.dmin)
    }
}

impl KQuant for BlockQ5K {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack(&self) -> KBlock {
        let (m4, m1) = (_mm256_set1_epi8(0xF), _mm256_set1_epi8(1));
        // Bits 2j and 2j+1 of qh[l] are the fifth bits of value l of sub-blocks 2j and 2j+1.
        let hbits = load32_at(&self.qh, 0);
        let q = std::array::from_fn(|j| {
            let bits = load32_at(&self.qs, 32 * j);
            let h = _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(2 * j as i32));
            let h_l = _mm256_slli_epi16::<4>(_mm256_and_si256(h, m1));
            let h_h = _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srli_epi16::<1>(h), m1));
            [
                _mm256_or_si256(_mm256_and_si256(bits, m4), h_l),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4), h_h),
            ]
        });
        k_block(q, &self.scales, self.d, self.dmin)
    }
}

/// The scale side of [`KBlock`], shared by Q4_K and Q5_K.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_block(
    q: [[__m256i; 2]; 4],
    scales: &[u8; K_SCALE_SIZE],
    d: [u8; 2],
    dmin: [u8; 2],
) -> KBlock {
    let (sc, mins) = unpack_scale_min_k4(scales);
    let m8 = _mm_loadl_epi64(mins.as_ptr().cast());
    KBlock {
        q,
        sc: std::array::from_fn(|j| {
            [
                _mm256_set1_epi16(sc[2 * j] as i16),
                _mm256_set1_epi16(sc[2 * j + 1] as i16),
            ]
        }),
        mins: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)),
        d: h2f(d),
        dmin: h2f(dmin),
    }
}

impl KBlock {
    /// `order::q4_k_pair_ints` (or Q5_K's per-64 parts): (Σ scale·Σ q·q8, Σ min·Σ q8) for
    /// each 64 values. `maddubs` cannot saturate: |pair| ≤ 2·31·128.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn pair_ints(&self, b: &BlockQ8K) -> ([i32; 4], [i32; 4]) {
        let v = std::array::from_fn(|j| {
            let [lo, hi] = self.q[j];
            let p_lo = _mm256_maddubs_epi16(lo, load32_at(&b.qs, 64 * j));
            let p_hi = _mm256_maddubs_epi16(hi, load32_at(&b.qs, 64 * j + 32));
            _mm256_add_epi32(
                _mm256_madd_epi16(self.sc[j][0], p_lo),
                _mm256_madd_epi16(self.sc[j][1], p_hi),
            )
        });
        // Lane k of `m` is min k times the sum of sub-block k; lanes 2j and 2j+1 make pair j.
        let m = _mm256_madd_epi16(self.mins, _mm256_loadu_si256(b.bsums.as_ptr().cast()));
        let m = _mm_hadd_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256::<1>(m));
        let mut mins = [0i32; 4];
        _mm_storeu_si128(mins.as_mut_ptr().cast(), m);
        (hsum4(v), mins)
    }
}

/// Q4_K in the repacked order: two chains per pair (scales, mins), one step per 64 values in
/// the GEMM (`gemm`), one per block in the GEMV.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_repacked<const T: usize>(
    gemm: bool,
    w: &[BlockQ4K],
    xs: [&[BlockQ8K]; T],
) -> [f32; T] {
    let mut acc = [(0f32, 0f32); T];
    for (i, a) in w.iter().enumerate() {
        let k = a.unpack();
        for (x, (acc, acc_min)) in xs.iter().zip(&mut acc) {
            let b = &x[i];
            let dx = b.d();
            let (s, m) = k.pair_ints(b);
            if gemm {
                for (s, m) in s.into_iter().zip(m) {
                    *acc = chain_step(*acc, s, k.d, dx);
                    *acc_min = chain_step(*acc_min, m, k.dmin, dx);
                }
            } else {
                *acc = chain_step(*acc, s.iter().sum(), k.d, dx);
                *acc_min = chain_step(*acc_min, m.iter().sum(), k.dmin, dx);
            }
        }
    }
    acc.map(|(acc, acc_min)| acc - acc_min)
}

/// Q4_K or Q5_K in the tiled order: one step per block of the block's (scales, mins) sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_tiled<B: KQuant, const T: usize>(w: &[B], xs: [&[BlockQ8K]; T]) -> [f32; T] {
    let mut acc = [0f32; T];
    for (i, a) in w.iter().enumerate() {
        let k = a.unpack();
        for (x, acc) in xs.iter().zip(&mut acc) {
            let b = &x[i];
            let (s, m) = k.pair_ints(b);
            let ints = (s.iter().sum(), m.iter().sum());
            *acc = tiled_step(*acc, ints, k.d, k.dmin, b.d());
        }
    }
    acc
}

// ------------------------------------------------------------------- Q6_K

/// A Q6_K block unpacked once for every token: per half `h` and quarter `c`, the 6-bit codes
/// of 32 values (sub-blocks 2c and 2c+1 of the half) with their two scales, and the 16
/// scales in step with the activation's `bsums` for the −32 bias.
struct Q6KBlock {
    q: [[__m256i; 4]; 2],
    sc: [[__m256i; 4]; 2],
    scales: __m256i,
    d: f32,
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_unpack(a: &BlockQ6K) -> Q6KBlock {
    let (m3, m15) = (_mm256_set1_epi8(3), _mm256_set1_epi8(15));
    let q = std::array::from_fn(|h| {
        let ql1 = load32_at(&a.ql, 64 * h);
        let ql2 = load32_at(&a.ql, 64 * h + 32);
        let qh = load32_at(&a.qh, 32 * h);
        let hi = |c: i32| {
            _mm256_slli_epi16::<4>(_mm256_and_si256(
                _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c)),
                m3,
            ))
        };
        [
            _mm256_or_si256(_mm256_and_si256(ql1, m15), hi(0)),
            _mm256_or_si256(_mm256_and_si256(ql2, m15), hi(1)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m15), hi(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql2), m15), hi(3)),
        ]
    });
    let sc = std::array::from_fn(|h| {
        std::array::from_fn(|c| {
            let (lo, hi) = (a.scales[8 * h + 2 * c], a.scales[8 * h + 2 * c + 1]);
            _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16))
        })
    });
    Q6KBlock {
        q,
        sc,
        scales: _mm256_cvtepi8_epi16(_mm_loadu_si128(a.scales.as_ptr().cast())),
        d: h2f(a.d),
    }
}

impl Q6KBlock {
    /// `order::q6_k_ints`: the codes are dotted unsigned (|pair| ≤ 2·63·128, no saturation)
    /// and the bias taken off as 32·Σ scale·bsum.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn ints(&self, b: &BlockQ8K) -> i32 {
        let mut sum = _mm256_setzero_si256();
        for h in 0..2 {
            for c in 0..4 {
                let p16 = _mm256_maddubs_epi16(self.q[h][c], load32_at(&b.qs, 128 * h + 32 * c));
                sum = _mm256_add_epi32(sum, _mm256_madd_epi16(self.sc[h][c], p16));
            }
        }
        let bsums = _mm256_loadu_si256(b.bsums.as_ptr().cast());
        let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, self.scales));
        hsum8(_mm256_sub_epi32(sum, bias))
    }
}

/// Q6_K in the tiled order (no mins: `dmin` 0, as in `order::dot`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_tiled<const T: usize>(w: &[BlockQ6K], xs: [&[BlockQ8K]; T]) -> [f32; T] {
    let mut acc = [0f32; T];
    for (i, a) in w.iter().enumerate() {
        let k = q6_k_unpack(a);
        for (x, acc) in xs.iter().zip(&mut acc) {
            let b = &x[i];
            *acc = tiled_step(*acc, (k.ints(b), 0), k.d, 0.0, b.d());
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row;
    use crate::quant::reference::order::{dot, has};
    use crate::quant::test_util::{random_row, Rng};

    /// Every (type, order) kernel, through the GEMM's token groups and the GEMV tail, gives
    /// `order::dot`'s bits.
    #[test]
    #[cfg_attr(not(host_avx2), ignore = "this CPU lacks AVX2, FMA or F16C")]
    fn avx2_order_kernels_match_the_scalar_dots_bit_for_bit() {
        assert!(
            crate::cpu_features::hardware().avx2,
            "this x86-64 CPU lacks AVX2, FMA or F16C: the AVX2 order kernels cannot be compared here"
        );
        let mut rng = Rng::new(0x0de5_a5c2);
        for (ty, order) in [
            (GgmlType::Q4_0, Order::Repacked),
            (GgmlType::Q4_K, Order::Repacked),
            (GgmlType::Q4_K, Order::Tiled),
            (GgmlType::Q5_K, Order::Tiled),
            (GgmlType::Q6_K, Order::Tiled),
        ] {
            assert!(has(ty, order));
            let be = ty.block_elems();
            for (rows, toks, blocks) in [
                (1, 1, 1),
                (2, 3, 2),
                (3, 4, 1),
                (2, 5, 3),
                (4, 8, 5),
                (3, 9, 8),
                (5, 11, 4),
                (2, 16, 9),
            ] {
                let n = be * blocks;
                let w: Vec<u8> = (0..rows)
                    .flat_map(|_| random_row(&mut rng, ty, n))
                    .collect();
                let vt = ty.vec_dot_type();
                let x_row = vt.row_bytes(n as u64).unwrap() as usize;
                let mut x = vec![0u8; toks * x_row];
                for xt in x.chunks_exact_mut(x_row) {
                    let scale = rng.range(0.1, 30.0);
                    let v: Vec<f32> = (0..n).map(|_| rng.f32() * scale).collect();
                    quantize_row(vt, &v, xt);
                }
                let w_row = w.len() / rows;
                let mut got = vec![f32::NAN; rows * toks];
                // SAFETY: avx2, fma and f16c were detected above.
                unsafe { panel(ty, order, n, &w, rows, &x, toks, &mut got) };
                for t in 0..toks {
                    for r in 0..rows {
                        let want = dot(
                            ty,
                            order,
                            t,
                            toks,
                            &w[r * w_row..(r + 1) * w_row],
                            &x[t * x_row..(t + 1) * x_row],
                        );
                        assert_eq!(
                            got[t * rows + r].to_bits(),
                            want.to_bits(),
                            "{ty} {order:?} rows={rows} toks={toks} n={n} at ({r},{t}): {} vs {want}",
                            got[t * rows + r]
                        );
                    }
                }
            }
        }
    }
}
