//! The AVX2 register tile: up to 6 rows × 16 columns (12 accumulators of sixteen registers),
//! run twice per 32-column panel. Each output is the same FMA chain as `portable_tile`'s, so
//! the results are bit-identical.

use super::PanelRef;
use std::arch::x86_64::*;

pub const ROWS: usize = 6;

/// Writes `out[r·ldc + c]` for `r < rows` (`1 ≤ rows ≤ ROWS`) and `c < cols`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `x` holds `rows` rows `lda` apart of `depth` values; the
/// panel holds `depth` steps (`PanelRef::check`); those outputs are the caller's.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile(
    x: *const f32,
    lda: usize,
    depth: usize,
    panel: PanelRef<'_>,
    out: *mut f32,
    ldc: usize,
    cols: usize,
    rows: usize,
) {
    // The second half only where the panel has columns there.
    for half in [0, 16].into_iter().filter(|&h| h < cols) {
        macro_rules! run {
            ($($r:literal)*) => {
                match (rows, panel) {
                    $(
                        ($r, PanelRef::F16 { bits, stride }) => unsafe {
                            product::<$r, true>(x, lda, depth, bits[half..].as_ptr().cast(), stride, (out, ldc, cols), half)
                        },
                        ($r, PanelRef::F32 { values, stride }) => unsafe {
                            product::<$r, false>(x, lda, depth, values[half..].as_ptr().cast(), stride, (out, ldc, cols), half)
                        },
                    )*
                    _ => unreachable!("1 to {ROWS} rows"),
                }
            };
        }
        run!(1 2 3 4 5 6);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn product<const R: usize, const HALF: bool>(
    x: *const f32,
    lda: usize,
    depth: usize,
    w: *const u8,
    stride: usize,
    (out, ldc, cols): (*mut f32, usize, usize),
    column: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for i in 0..depth {
        // SAFETY (this block): in bounds by the caller's contract.
        let (w0, w1) = unsafe {
            if HALF {
                let p = w.cast::<u16>().add(i * stride);
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
                    _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())),
                )
            } else {
                let p = w.cast::<f32>().add(i * stride);
                (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
            }
        };
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: row r < R ≤ rows of `x`.
            let xr = _mm256_set1_ps(unsafe { *x.add(r * lda + i) });
            a[0] = _mm256_fmadd_ps(xr, w0, a[0]);
            a[1] = _mm256_fmadd_ps(xr, w1, a[1]);
        }
    }
    // Lanes past `cols` are masked off: not written, not even touched.
    let limit = _mm256_set1_epi32(cols as i32);
    let lanes = |from: usize| {
        let index = _mm256_add_epi32(
            _mm256_set1_epi32(from as i32),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        _mm256_cmpgt_epi32(limit, index)
    };
    let (m0, m1) = (lanes(column), lanes(column + 8));
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: row r's first `cols` outputs are the caller's; `column` is 0 or 16.
        unsafe {
            let row = out.add(r * ldc + column);
            _mm256_maskstore_ps(row, m0, a[0]);
            _mm256_maskstore_ps(row.add(8), m1, a[1]);
        }
    }
}
