//! The AVX-512 register tile: up to 12 rows × 32 columns, 24 accumulators, each weight step
//! loaded (and converted from F16) once for all the rows. Each output is the same FMA chain
//! as `portable_tile`'s, so the results are bit-identical.

use super::PanelRef;
use std::arch::x86_64::*;

pub const ROWS: usize = 12;

/// Writes `out[r·ldc + c]` for `r < rows` (`1 ≤ rows ≤ ROWS`) and `c < cols`.
///
/// # Safety
/// The CPU has AVX-512 F, FMA and F16C; `x` holds `rows` rows `lda` apart of `depth` values;
/// the panel holds `depth` steps (`PanelRef::check`); those outputs are the caller's.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
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
    macro_rules! run {
        ($($r:literal)*) => {
            match (rows, panel) {
                $(
                    ($r, PanelRef::F16 { bits, stride }) => unsafe {
                        product::<$r, true>(x, lda, depth, bits.as_ptr().cast(), stride, (out, ldc, cols))
                    },
                    ($r, PanelRef::F32 { values, stride }) => unsafe {
                        product::<$r, false>(x, lda, depth, values.as_ptr().cast(), stride, (out, ldc, cols))
                    },
                )*
                _ => unreachable!("1 to {ROWS} rows"),
            }
        };
    }
    run!(1 2 3 4 5 6 7 8 9 10 11 12);
}

#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn product<const R: usize, const HALF: bool>(
    x: *const f32,
    lda: usize,
    depth: usize,
    w: *const u8,
    stride: usize,
    (out, ldc, cols): (*mut f32, usize, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    for i in 0..depth {
        // SAFETY (this block): in bounds by the caller's contract.
        let (w0, w1) = unsafe {
            if HALF {
                let p = w.cast::<u16>().add(i * stride);
                (
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
                    _mm512_cvtph_ps(_mm256_loadu_si256(p.add(16).cast())),
                )
            } else {
                let p = w.cast::<f32>().add(i * stride);
                (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
            }
        };
        for (r, a) in acc.iter_mut().enumerate() {
            // SAFETY: row r < R ≤ rows of `x`.
            let xr = _mm512_set1_ps(unsafe { *x.add(r * lda + i) });
            a[0] = _mm512_fmadd_ps(xr, w0, a[0]);
            a[1] = _mm512_fmadd_ps(xr, w1, a[1]);
        }
    }
    // Lanes past `cols` are masked off: not written, not even touched.
    let lanes = |from: usize| (((1u32 << cols.saturating_sub(from).min(16)) - 1) & 0xFFFF) as u16;
    let (m0, m1) = (lanes(0), lanes(16));
    for (r, a) in acc.iter().enumerate() {
        // SAFETY: row r's first `cols` outputs are the caller's.
        unsafe {
            let row = out.add(r * ldc);
            _mm512_mask_storeu_ps(row, m0, a[0]);
            _mm512_mask_storeu_ps(row.add(16), m1, a[1]);
        }
    }
}
