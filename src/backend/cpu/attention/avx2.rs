//! AVX2 forms of the tiled attention path's two inner loops (`tiled.rs`), for CPUs without
//! AVX-512 (and `EDGELM_SIMD=avx2`/`avx2-vnni`): the accumulators in registers, where the
//! portable loops load and store them around every fused multiply-add. Sixteen registers hold
//! fewer of them than AVX-512's 32, so a pass covers 16 positions (K·Q) or 16 dimensions (V)
//! for every head. Each output is the same chain of fused multiply-adds in the same order as
//! the portable loop's, so the results are bit-identical.

use std::arch::x86_64::*;

/// Query heads scored together: eight registers of accumulators.
pub const HEADS: usize = 4;

/// `rows[h][i] = Σ_d q[h][d] · kt[d][i]` (one chain per position over `d` in order, from 0)
/// for the `heads ≤ HEADS` rows of `q` (each `hd` long) against a K tile stored transposed,
/// `kt[d * 64 + i]`, for the first `positions` positions rounded up to sixteen (the later
/// lanes of `rows` are left as they were).
///
/// # Safety
/// The CPU has AVX2 and FMA; `kt` holds `hd × 64` values and every `q[h]` `hd`.
#[target_feature(enable = "avx2,fma")]
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
    let kp = kt.as_ptr();
    for i0 in (0..positions).step_by(16) {
        macro_rules! run {
            ($h:literal) => {{
                let mut acc = [[_mm256_setzero_ps(); 2]; $h];
                for d in 0..hd {
                    let k0 = _mm256_loadu_ps(kp.add(d * 64 + i0));
                    let k1 = _mm256_loadu_ps(kp.add(d * 64 + i0 + 8));
                    for (h, a) in acc.iter_mut().enumerate() {
                        let qd = _mm256_set1_ps(*q.get_unchecked(h).get_unchecked(d));
                        a[0] = _mm256_fmadd_ps(qd, k0, a[0]);
                        a[1] = _mm256_fmadd_ps(qd, k1, a[1]);
                    }
                }
                for (row, a) in rows.iter_mut().zip(&acc) {
                    _mm256_storeu_ps(row.as_mut_ptr().add(i0), a[0]);
                    _mm256_storeu_ps(row.as_mut_ptr().add(i0 + 8), a[1]);
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

/// For each head `h ≤ HEADS` (a row of `p`, and `hd` values of `acc`):
/// `acc[h][d] = p[h][i] · v[i * hd + d] + acc[h][d]` for the positions `i` in `range`, in
/// order. Sixteen dimensions at a time with every head's accumulators in registers (each V
/// load feeds every head); dimensions past the last whole sixteen one by one.
///
/// # Safety
/// The CPU has AVX2 and FMA; `v` holds the rows of `range` (`hd` values each).
#[target_feature(enable = "avx2,fma")]
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
    let whole = hd / 16 * 16;
    for d0 in (0..whole).step_by(16) {
        macro_rules! run {
            ($h:literal) => {{
                let at = |h: usize, c: usize| base.add(h * hd + d0 + 8 * c);
                let mut a: [[__m256; 2]; $h] =
                    std::array::from_fn(|h| [_mm256_loadu_ps(at(h, 0)), _mm256_loadu_ps(at(h, 1))]);
                for i in range.clone() {
                    let row = v.as_ptr().add(i * hd + d0);
                    let (x0, x1) = (_mm256_loadu_ps(row), _mm256_loadu_ps(row.add(8)));
                    for (h, a) in a.iter_mut().enumerate() {
                        let pi = _mm256_set1_ps(*p.get_unchecked(h).get_unchecked(i));
                        a[0] = _mm256_fmadd_ps(pi, x0, a[0]);
                        a[1] = _mm256_fmadd_ps(pi, x1, a[1]);
                    }
                }
                for (h, a) in a.iter().enumerate() {
                    _mm256_storeu_ps(at(h, 0), a[0]);
                    _mm256_storeu_ps(at(h, 1), a[1]);
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
    for (p, acc) in p.iter().zip(acc.chunks_exact_mut(hd)) {
        for i in range.clone() {
            for (a, &x) in acc[whole..]
                .iter_mut()
                .zip(&v[i * hd + whole..(i + 1) * hd])
            {
                *a = p[i].mul_add(x, *a);
            }
        }
    }
}

/// `kt[d * 64 + i] = rows[i * hd + d]` for the whole eights of rows from `range.start`
/// (`hd` a multiple of 8), in 8 × 8 register transposes. Returns the first row it left.
///
/// # Safety
/// The CPU has AVX2; `rows` holds `range.end` rows of `hd`, `kt` `hd` rows of 64.
#[target_feature(enable = "avx2")]
pub unsafe fn transpose_rows(
    rows: &[f32],
    range: std::ops::Range<usize>,
    hd: usize,
    kt: &mut [f32],
) -> usize {
    assert!(hd.is_multiple_of(8) && range.end <= 64);
    assert!(rows.len() >= range.end * hd && kt.len() >= hd * 64);
    let mut i0 = range.start;
    while i0 + 8 <= range.end {
        for d0 in (0..hd).step_by(8) {
            let r: [__m256; 8] =
                std::array::from_fn(|k| _mm256_loadu_ps(rows.as_ptr().add((i0 + k) * hd + d0)));
            for (k, col) in transpose_8x8(r).into_iter().enumerate() {
                _mm256_storeu_ps(kt.as_mut_ptr().add((d0 + k) * 64 + i0), col);
            }
        }
        i0 += 8;
    }
    i0
}

/// The transpose of eight rows of eight floats: element `j` of row `k` becomes element `k` of
/// row `j`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose_8x8(r: [__m256; 8]) -> [__m256; 8] {
    // Pairs of rows interleaved by elements (within each 128-bit half), then by pairs of
    // elements: 4 × 4 blocks transposed within each half.
    // Loops, not `array::from_fn`, whose closures (without this function's target features)
    // were not inlined: a call per register.
    let mut t = [_mm256_setzero_ps(); 8];
    for (k, t) in t.iter_mut().enumerate() {
        let (a, b) = (r[k & !1], r[k | 1]);
        *t = if k % 2 == 0 {
            _mm256_unpacklo_ps(a, b)
        } else {
            _mm256_unpackhi_ps(a, b)
        };
    }
    let mut s = [_mm256_setzero_ps(); 8];
    for (k, s) in s.iter_mut().enumerate() {
        let base = k & !3;
        let (a, b) = (t[base + (k >> 1 & 1)], t[base + 2 + (k >> 1 & 1)]);
        *s = if k % 2 == 0 {
            _mm256_shuffle_ps::<0x44>(a, b)
        } else {
            _mm256_shuffle_ps::<0xEE>(a, b)
        };
    }
    // Then the halves: rows 0..4 of the result are the low halves of the first four's blocks
    // beside those of the last four; rows 4..8 the high halves.
    let mut out = [_mm256_setzero_ps(); 8];
    for (k, o) in out.iter_mut().enumerate() {
        let (a, b) = (s[k % 4], s[k % 4 + 4]);
        *o = if k < 4 {
            _mm256_permute2f128_ps::<0x20>(a, b)
        } else {
            _mm256_permute2f128_ps::<0x31>(a, b)
        };
    }
    out
}
