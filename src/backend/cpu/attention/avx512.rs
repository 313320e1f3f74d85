//! AVX-512 forms of the tiled attention path's two inner loops (`tiled.rs`) and of the per-row
//! path's f16 block loop (`per_row.rs`), with their accumulators in registers: the portable
//! loops keep them in memory, a load and a store around every fused multiply-add. Each output
//! is the same chain of fused multiply-adds in the same order as the portable loop's, so the
//! results are bit-identical.

use std::arch::x86_64::*;

/// Query heads scored together: 16 registers of scores.
pub const HEADS: usize = 4;

/// `rows[h][i] = Σ_d q[h][d] · kt[d][i]` (one chain per position over `d` in order, from 0)
/// for the `heads ≤ HEADS` rows of `q` (each `hd` long) against a K tile stored transposed,
/// `kt[d * 64 + i]`, for the first `positions` positions rounded up to sixteen (the later
/// lanes of `rows` are left as they were).
///
/// # Safety
/// The CPU has AVX-512F; `kt` holds `hd × 64` values and every `q[h]` `hd`.
#[target_feature(enable = "avx512f")]
pub unsafe fn kq_tile(
    kt: &[f32],
    q: &[&[f32]],
    hd: usize,
    positions: usize,
    rows: &mut [[f32; 64]],
) {
    let heads = q.len();
    assert!(heads <= HEADS && rows.len() >= heads && kt.len() >= hd * 64);
    assert!(q.iter().all(|r| r.len() >= hd) && positions <= 64);
    match (heads, positions.div_ceil(16)) {
        (_, 0) => {}
        (1, 1) => kq_run::<1, 1>(kt, q, hd, rows),
        (1, 2) => kq_run::<1, 2>(kt, q, hd, rows),
        (1, 3) => kq_run::<1, 3>(kt, q, hd, rows),
        (1, _) => kq_run::<1, 4>(kt, q, hd, rows),
        (2, 1) => kq_run::<2, 1>(kt, q, hd, rows),
        (2, 2) => kq_run::<2, 2>(kt, q, hd, rows),
        (2, 3) => kq_run::<2, 3>(kt, q, hd, rows),
        (2, _) => kq_run::<2, 4>(kt, q, hd, rows),
        (3, 1) => kq_run::<3, 1>(kt, q, hd, rows),
        (3, 2) => kq_run::<3, 2>(kt, q, hd, rows),
        (3, 3) => kq_run::<3, 3>(kt, q, hd, rows),
        (3, _) => kq_run::<3, 4>(kt, q, hd, rows),
        (_, 1) => kq_run::<4, 1>(kt, q, hd, rows),
        (_, 2) => kq_run::<4, 2>(kt, q, hd, rows),
        (_, 3) => kq_run::<4, 3>(kt, q, hd, rows),
        _ => kq_run::<4, 4>(kt, q, hd, rows),
    }
}

/// [`kq_tile`] for `H` heads and the first `C` sixteens of positions, every accumulator in a
/// register.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn kq_run<const H: usize, const C: usize>(
    kt: &[f32],
    q: &[&[f32]],
    hd: usize,
    rows: &mut [[f32; 64]],
) {
    let mut acc = [[_mm512_setzero_ps(); C]; H];
    let kp = kt.as_ptr();
    for d in 0..hd {
        let mut k = [_mm512_setzero_ps(); C];
        for (c, k) in k.iter_mut().enumerate() {
            *k = _mm512_loadu_ps(kp.add(d * 64 + 16 * c));
        }
        for (h, acc) in acc.iter_mut().enumerate() {
            let qd = _mm512_set1_ps(*q.get_unchecked(h).get_unchecked(d));
            for (a, &k) in acc.iter_mut().zip(&k) {
                *a = _mm512_fmadd_ps(qd, k, *a);
            }
        }
    }
    for (row, a) in rows.iter_mut().zip(&acc) {
        for (c, &v) in a.iter().enumerate() {
            _mm512_storeu_ps(row.as_mut_ptr().add(16 * c), v);
        }
    }
}

/// For each head `h ≤ HEADS` (a row of `p`, and `hd` values of `acc`):
/// `acc[h][d] = p[h][i] · v[i * hd + d] + acc[h][d]` for the positions `i` in `range`, in
/// order. Sixty-four dimensions at a time, every head's accumulators in registers: each V
/// load feeds every head.
///
/// # Safety
/// The CPU has AVX-512F; `v` holds the rows of `range` (`hd` values each).
#[target_feature(enable = "avx512f")]
pub unsafe fn accumulate_v(
    p: &[[f32; 64]],
    range: std::ops::Range<usize>,
    v: &[f32],
    hd: usize,
    acc: &mut [f32],
) {
    let heads = p.len();
    assert!(heads <= HEADS && acc.len() == heads * hd && range.end <= 64);
    if range.is_empty() {
        return;
    }
    assert!(range.end * hd <= v.len());
    let base = acc.as_mut_ptr();
    for d0 in (0..hd).step_by(64) {
        let n = (hd - d0).min(64);
        // Lanes past `n` are masked off: neither loaded nor stored.
        let mask: [__mmask16; 4] = std::array::from_fn(|c| {
            let lanes = n.saturating_sub(16 * c).min(16);
            ((1u32 << lanes) - 1) as __mmask16
        });
        macro_rules! run {
            ($h:literal) => {{
                let at = |h: usize, c: usize| base.add(h * hd + d0 + 16 * c);
                let mut a: [[__m512; 4]; $h] = std::array::from_fn(|h| {
                    std::array::from_fn(|c| _mm512_maskz_loadu_ps(mask[c], at(h, c)))
                });
                for i in range.clone() {
                    let row = v.as_ptr().add(i * hd + d0);
                    let x: [__m512; 4] =
                        std::array::from_fn(|c| _mm512_maskz_loadu_ps(mask[c], row.add(16 * c)));
                    for h in 0..$h {
                        let pi = _mm512_set1_ps(*p.get_unchecked(h).get_unchecked(i));
                        for c in 0..4 {
                            a[h][c] = _mm512_fmadd_ps(pi, x[c], a[h][c]);
                        }
                    }
                }
                for (h, a) in a.iter().enumerate() {
                    for (c, &v) in a.iter().enumerate() {
                        _mm512_mask_storeu_ps(at(h, c), mask[c], v);
                    }
                }
            }};
        }
        match heads {
            1 => run!(1),
            2 => run!(2),
            3 => run!(3),
            _ => run!(4),
        }
    }
}

/// One query row's state in the per-row path's online softmax.
pub struct RowState<'a> {
    pub max: &'a mut f32,
    pub sum: &'a mut f32,
    /// `hd` values, each the f16 value ggml's accumulator holds.
    pub acc: &'a mut [f32],
}

/// ggml's per-row flash attention on f16 pages, over the positions `seen` of one block for one
/// query row: `k` and `v` are the block's rows (`hd` values each, f16 values held in f32), `q`
/// the row's query rounded to f16. Each score is ggml's f16 dot product (four 16-lane
/// accumulators over 64 values at a time, folded pairwise, then the lanes reduced as GCC's
/// `_mm512_reduce_add_ps` does) times `scale`; the softmax factors are the scalar `expf` steps
/// of the portable path; every accumulator update is one fused multiply-add rounded to f16.
/// The accumulator stays in registers through the block.
///
/// # Safety
/// The CPU has AVX-512F and F16C; `hd` is `16 * L` and a multiple of 64; `k` and `v` hold the
/// rows of `seen`, `q` and `acc` hold `hd` values; `scores` holds `seen.end` values.
#[target_feature(enable = "avx512f,f16c,avx2,fma")]
pub unsafe fn per_row_block_f16<const L: usize>(
    k: &[f32],
    v: &[f32],
    seen: std::ops::Range<usize>,
    q: &[f32],
    scale: f32,
    scores: &mut [f32],
    state: RowState<'_>,
) {
    let hd = 16 * L;
    assert!(hd.is_multiple_of(64) && q.len() >= hd && state.acc.len() >= hd);
    assert!(seen.end * hd <= k.len().min(v.len()) && scores.len() >= seen.end);
    let qv: [__m512; L] = std::array::from_fn(|c| _mm512_loadu_ps(q.as_ptr().add(16 * c)));
    // Scores, each position independent.
    for p in seen.clone() {
        let kp = k.as_ptr().add(p * hd);
        let mut a = [_mm512_setzero_ps(); 4];
        for c in 0..L {
            a[c % 4] = _mm512_fmadd_ps(_mm512_loadu_ps(kp.add(16 * c)), qv[c], a[c % 4]);
        }
        let folded = _mm512_add_ps(_mm512_add_ps(a[0], a[2]), _mm512_add_ps(a[1], a[3]));
        *scores.get_unchecked_mut(p) = reduce_add_16(folded) * scale;
    }
    // The running maximum and the accumulator, position by position.
    let mut acc: [__m512; L] =
        std::array::from_fn(|c| _mm512_loadu_ps(state.acc.as_ptr().add(16 * c)));
    let round = |x: __m512| {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(x))
    };
    let (mut max, mut sum) = (*state.max, *state.sum);
    for p in seen {
        let sc = *scores.get_unchecked(p);
        let (ms, vs) = if sc > max {
            let ms = (max - sc).exp();
            max = sc;
            (ms, 1.0)
        } else {
            (1.0, (sc - max).exp())
        };
        if ms != 1.0 {
            let m = _mm512_set1_ps(ms);
            for a in acc.iter_mut() {
                *a = round(_mm512_mul_ps(*a, m));
            }
        }
        let (vp, s) = (v.as_ptr().add(p * hd), _mm512_set1_ps(vs));
        for (c, a) in acc.iter_mut().enumerate() {
            *a = round(_mm512_fmadd_ps(_mm512_loadu_ps(vp.add(16 * c)), s, *a));
        }
        sum = sum.mul_add(ms, vs);
    }
    *state.max = max;
    *state.sum = sum;
    for (c, a) in acc.iter().enumerate() {
        _mm512_storeu_ps(state.acc.as_mut_ptr().add(16 * c), *a);
    }
}

/// GCC's `_mm512_reduce_add_ps` order: halves, quarters, then pairs.
#[inline]
#[target_feature(enable = "avx512f,avx2")]
unsafe fn reduce_add_16(v: __m512) -> f32 {
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let t8 = _mm256_add_ps(hi, _mm512_castps512_ps256(v));
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let t2 = _mm_add_ps(t4, _mm_movehl_ps(t4, t4));
    _mm_cvtss_f32(_mm_add_ss(t2, _mm_movehdup_ps(t2)))
}

/// `kt[d * 64 + i] = rows[i * hd + d]` for the whole sixteens of rows from `range.start`
/// (`hd` a multiple of 16), in 16 × 16 register transposes. Returns the first row it left.
///
/// # Safety
/// The CPU has AVX-512F; `rows` holds `range.end` rows of `hd`, `kt` `hd` rows of 64.
#[target_feature(enable = "avx512f")]
pub unsafe fn transpose_rows(
    rows: &[f32],
    range: std::ops::Range<usize>,
    hd: usize,
    kt: &mut [f32],
) -> usize {
    assert!(hd.is_multiple_of(16) && range.end <= 64);
    assert!(rows.len() >= range.end * hd && kt.len() >= hd * 64);
    let mut i0 = range.start;
    while i0 + 16 <= range.end {
        for d0 in (0..hd).step_by(16) {
            let r: [__m512; 16] =
                std::array::from_fn(|k| _mm512_loadu_ps(rows.as_ptr().add((i0 + k) * hd + d0)));
            for (k, col) in transpose_16x16(r).into_iter().enumerate() {
                _mm512_storeu_ps(kt.as_mut_ptr().add((d0 + k) * 64 + i0), col);
            }
        }
        i0 += 16;
    }
    i0
}

/// The transpose of sixteen rows of sixteen floats: element `j` of row `k` becomes element
/// `k` of row `j`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_16x16(r: [__m512; 16]) -> [__m512; 16] {
    let pd = |v: __m512| _mm512_castps_pd(v);
    let ps = |v: __m512d| _mm512_castpd_ps(v);
    // Pairs of rows interleaved by 32-bit elements, then by 64-bit ones: 4 × 4 blocks
    // transposed within each 128-bit lane.
    let t: [__m512; 16] = std::array::from_fn(|k| {
        let (a, b) = (r[k & !1], r[k | 1]);
        if k % 2 == 0 {
            _mm512_unpacklo_ps(a, b)
        } else {
            _mm512_unpackhi_ps(a, b)
        }
    });
    let u: [__m512; 16] = std::array::from_fn(|k| {
        let base = k & !3;
        let (a, b) = (t[base + (k >> 1 & 1)], t[base + 2 + (k >> 1 & 1)]);
        if k % 2 == 0 {
            ps(_mm512_unpacklo_pd(pd(a), pd(b)))
        } else {
            ps(_mm512_unpackhi_pd(pd(a), pd(b)))
        }
    });
    // Then the 128-bit lanes: pairs four rows apart, then eight apart.
    let v: [__m512; 16] = std::array::from_fn(|k| {
        let (half, j) = (k / 8, k % 8);
        let (a, b) = (u[8 * half + j % 4], u[8 * half + j % 4 + 4]);
        if j < 4 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    });
    std::array::from_fn(|k| {
        let (a, b) = (v[k % 8], v[k % 8 + 8]);
        if k < 8 {
            _mm512_shuffle_f32x4::<0x88>(a, b)
        } else {
            _mm512_shuffle_f32x4::<0xDD>(a, b)
        }
    })
}
