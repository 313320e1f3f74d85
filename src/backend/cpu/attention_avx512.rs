//! AVX-512 forms of the tiled attention path's two inner loops (`attention`), with their
//! accumulators in registers: the portable loops keep them in memory, a load and a store
//! around every fused multiply-add. Each output is the same chain of fused multiply-adds in
//! the same order as the portable loop's, so the results are bit-identical.

use std::arch::x86_64::*;

/// Query heads scored together: 16 registers of scores.
pub const HEADS: usize = 4;

/// `rows[h][i] = Σ_d q[h][d] · kt[d][i]` (one chain per position over `d` in order, from 0)
/// for the `heads ≤ HEADS` rows of `q` (each `hd` long) against a K tile stored transposed,
/// `kt[d * 64 + i]`.
///
/// # Safety
/// The CPU has AVX-512F; `kt` holds `hd × 64` values and every `q[h]` `hd`.
#[target_feature(enable = "avx512f")]
pub unsafe fn kq_tile(kt: &[f32], q: &[&[f32]], hd: usize, rows: &mut [[f32; 64]]) {
    let heads = q.len();
    assert!(heads <= HEADS && rows.len() >= heads && kt.len() >= hd * 64);
    assert!(q.iter().all(|r| r.len() >= hd));
    let mut acc = [[_mm512_setzero_ps(); 4]; HEADS];
    let kp = kt.as_ptr();
    macro_rules! run {
        ($h:literal) => {
            for d in 0..hd {
                let k: [__m512; 4] =
                    std::array::from_fn(|c| _mm512_loadu_ps(kp.add(d * 64 + 16 * c)));
                for h in 0..$h {
                    let qd = _mm512_set1_ps(*q.get_unchecked(h).get_unchecked(d));
                    for c in 0..4 {
                        acc[h][c] = _mm512_fmadd_ps(qd, k[c], acc[h][c]);
                    }
                }
            }
        };
    }
    match heads {
        1 => run!(1),
        2 => run!(2),
        3 => run!(3),
        _ => run!(4),
    }
    for (row, a) in rows.iter_mut().zip(&acc).take(heads) {
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
