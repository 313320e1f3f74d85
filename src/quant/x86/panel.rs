//! Tiled matrix-multiply micro-kernels for x86: a tile of up to 4 weight rows × 4 activation
//! rows per pass over the blocks, so each weight block is unpacked once for several tokens and
//! the per-pair FMA chains run side by side instead of waiting on each other's latency.
//!
//! Every output is computed with exactly the arithmetic of the per-pair dot in `x86::dot`
//! (ggml's x86 order: one 8-lane FMA chain over the blocks, the same integer lane sums, the
//! same horizontal sum), so a matmul gives the same bits whatever the tiling, the thread
//! count or the instruction set. Only the integer part differs between the variants: AVX2
//! (`maddubs` + `madd`) and AVX-512 VNNI (`vpdpbusd`) compute identical i32 lane sums.
//!
//! The panel functions are the only entry points; `quant::gemm` hands them out only after
//! feature detection confirmed what their `target_feature` lists.

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;

/// How far ahead decode prefetches weights, in bytes: the same block that many bytes' worth
/// of rows further on. Rows are short (a few hundred bytes), so looking ahead within the row
/// would not cover the memory latency; measured on the reference model, 46 KB ahead beat
/// 12 KB by a few percent, and the distance stays well inside any x86 L2.
const PREFETCH_BYTES: usize = 48 * 1024;

/// Rows ahead for [`PREFETCH_BYTES`] with rows of `row_bytes`.
#[inline(always)]
fn prefetch_rows(row_bytes: usize) -> usize {
    (PREFETCH_BYTES / row_bytes.max(1)).max(4)
}

/// Weight rows per pass in decode's GEMV (one token): independent FMA chains and lookahead.
const DECODE_ROWS: usize = 2;

/// Batches up to this many tokens prefetch the weights in their first pass, as decode does.
const SMALL_BATCH: usize = 16;

/// Computes `out[t * rows + r]` for `r < rows`, `t < toks`; weight row `r` is
/// `w[r * w_row..][..w_row]`, activation row `t` is `x[t * x_row..][..x_row]`, `nb` blocks each.
pub(crate) type PanelFn =
    unsafe fn(nb: usize, w: &[u8], rows: usize, x: &[u8], toks: usize, out: &mut [f32]);

/// Σ of 4 adjacent u8×i8 products per i32 lane, AVX2 (no saturation: see `x86::dot`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_us8_avx2(ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(ax, sy))
}

/// The same lane sums with one AVX-512 VNNI instruction (256-bit form, AVX512VL).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn dot_us8_vnni(ax: __m256i, sy: __m256i) -> __m256i {
    _mm256_dpbusd_epi32(_mm256_setzero_si256(), ax, sy)
}

/// Up to 4 tokens' scales for one block index, as f32: `d` (and Q8_1's `s`, the block's sum
/// times d; zero for Q8_0). Lanes past the tile's tokens stay zero.
#[derive(Clone, Copy, Default)]
#[repr(C)]
struct TokenScales {
    d: [f32; 4],
    s: [f32; 4],
}

/// An activation block's f16 scale bits (d, s) and its quants.
pub(in crate::quant) trait ActScales {
    fn scales(&self) -> ([u8; 2], [u8; 2]);
    fn qs(&self) -> &[i8; 32];
}

impl ActScales for BlockQ8_1 {
    fn scales(&self) -> ([u8; 2], [u8; 2]) {
        (self.d, self.s)
    }
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

impl ActScales for BlockQ8_0 {
    fn scales(&self) -> ([u8; 2], [u8; 2]) {
        (self.d, [0; 2])
    }
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

/// Defines the panel kernels once per instruction-set variant.
macro_rules! panels {
    ($module:ident, $features:literal, $dot_us8:ident, $rt:literal, $tt:literal) => {
        pub(crate) mod $module {
            use super::*;
            // The block helpers are the per-pair kernels' own (their AVX2 feature set is a
            // subset of every variant's, so they inline here).
            use crate::quant::x86::dot::{
                bytes_from_nibbles_32 as nibbles, h2f, hsum_f32x8 as hsum8, load32, mxfp4_values, q5_0_values,
            };

            /// The 4 lanes of `v` in memory, to be broadcast by the load unit (a broadcast
            /// from a register would take a shuffle-port slot per token).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn spill(v: __m128, a: &mut [f32; 4]) -> &[f32; 4] {
                _mm_storeu_ps(a.as_mut_ptr(), v);
                // Opaque to the optimiser, which would otherwise forward the store into
                // register shuffles: the point is to read the lanes back through the load
                // unit.
                std::hint::black_box(a)
            }

            /// The 4 token lanes of a block's scale products `dd`, spilled for broadcasting when
            /// the tile has several tokens (see [`token_scale`]).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn spill_for<const T: usize>(dd: __m128, mem: &mut [f32; 4]) -> &[f32; 4] {
                if T > 1 {
                    spill(dd, mem)
                } else {
                    mem
                }
            }

            /// Token `t`'s scale product in every lane: from the spilled lanes (a load-unit
            /// broadcast) when the tile has several tokens; for one token from the register,
            /// since there is no shuffle pressure and the round trip through memory would sit on
            /// the critical path.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn token_scale<const T: usize>(dd: __m128, lanes: &[f32; 4], t: usize) -> __m256 {
                if T > 1 {
                    _mm256_broadcast_ss(&lanes[t])
                } else {
                    _mm256_broadcastss_ps(dd)
                }
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn lane_f32(v: __m128, t: usize) -> f32 {
                let mut a = [0f32; 4];
                _mm_storeu_ps(a.as_mut_ptr(), v);
                a[t]
            }

            /// One R×T tile of Q4_1 × Q8_1 (see `x86::dot::q4_1_q8_1` for the order). The
            /// scale products `d_w·d_x` and the `m·s` chains run T lanes at a time: each lane
            /// is the same single f32 multiply or fused multiply-add as the per-pair code.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q4_1_tile<const R: usize, const T: usize>(
                nb: usize,
                w: [&[BlockQ4_1]; R],
                x: [&[BlockQ8_1]; T],
                scales: &[TokenScales],
                prefetch: bool,
            ) -> [[f32; T]; R] {
                let mut acc = [[_mm256_setzero_ps(); T]; R];
                let mut summs = [_mm_setzero_ps(); R];
                // Blocks ahead for the decode prefetch.
                let ahead = prefetch_rows(nb * std::mem::size_of::<BlockQ4_1>()) * nb;
                let mut dd_mem = [0f32; 4];
                for b in 0..nb {
                    let mut xq = [_mm256_setzero_si256(); T];
                    for t in 0..T {
                        // SAFETY (all get_unchecked here): the panel checked every row
                        // holds nb blocks, and `scales` holds nb entries.
                        xq[t] = load32(&unsafe { x[t].get_unchecked(b) }.qs);
                    }
                    let sc = unsafe { scales.get_unchecked(b) };
                    let (xd, xs) = (_mm_loadu_ps(sc.d.as_ptr()), _mm_loadu_ps(sc.s.as_ptr()));
                    for r in 0..R {
                        let blk = unsafe { w[r].get_unchecked(b) };
                        if prefetch {
                            _mm_prefetch::<_MM_HINT_T0>(
                                w[r].as_ptr().wrapping_add(b + ahead).cast(),
                            );
                        }
                        let wq = nibbles(&blk.qs);
                        let dm = _mm_cvtph_ps(_mm_set1_epi32(i32::from_le_bytes([
                            blk.d[0], blk.d[1], blk.m[0], blk.m[1],
                        ])));
                        let wd = _mm_permute_ps::<0x00>(dm);
                        let wm = _mm_permute_ps::<0x55>(dm);
                        summs[r] = _mm_fmadd_ps(wm, xs, summs[r]);
                        let dd = _mm_mul_ps(wd, xd);
                        let dd_lanes = spill_for::<T>(dd, &mut dd_mem);
                        for t in 0..T {
                            let xy = _mm256_cvtepi32_ps($dot_us8(wq, xq[t]));
                            let ddt = token_scale::<T>(dd, dd_lanes, t);
                            acc[r][t] = _mm256_fmadd_ps(ddt, xy, acc[r][t]);
                        }
                    }
                }
                let mut out = [[0f32; T]; R];
                for r in 0..R {
                    for t in 0..T {
                        out[r][t] = hsum8(acc[r][t]) + lane_f32(summs[r], t);
                    }
                }
                out
            }

            /// One R×T tile of a signed-byte weight type (Q8_0, Q5_0) × Q8_0: ggml's single
            /// FMA chain per pair. `$values` gives a block's 32 weights as signed bytes.
            macro_rules! signed_tile {
                ($tile_name:ident, $wblock:ty, $blk:ident => $values:expr, $scale:expr) => {
                    #[inline]
                    #[target_feature(enable = $features)]
                    unsafe fn $tile_name<const R: usize, const T: usize>(
                        nb: usize,
                        w: [&[$wblock]; R],
                        x: [&[BlockQ8_0]; T],
                        scales: &[TokenScales],
                        prefetch: bool,
                    ) -> [[f32; T]; R] {
                        let mut acc = [[_mm256_setzero_ps(); T]; R];
                        let mut dd_mem = [0f32; 4];
                        let ahead = prefetch_rows(nb * std::mem::size_of::<$wblock>()) * nb;
                        for b in 0..nb {
                            let mut xq = [_mm256_setzero_si256(); T];
                            for t in 0..T {
                                xq[t] = load32(&unsafe { x[t].get_unchecked(b) }.qs);
                            }
                            let xd = _mm_loadu_ps(unsafe { scales.get_unchecked(b) }.d.as_ptr());
                            for r in 0..R {
                                let blk = unsafe { w[r].get_unchecked(b) };
                                if prefetch {
                                    // Decode streams the weights once: ask for them ahead (the
                                    // hardware prefetcher loses track of several rows in
                                    // lockstep).
                                    _mm_prefetch::<_MM_HINT_T0>(
                                        w[r].as_ptr().wrapping_add(b + ahead).cast(),
                                    );
                                }
                                let wsig = {
                                    let $blk = blk;
                                    $values
                                };
                                let wabs = _mm256_sign_epi8(wsig, wsig);
                                let wd = _mm_set1_ps({
                                    let $blk = blk;
                                    $scale
                                });
                                let dd = _mm_mul_ps(wd, xd);
                                let dd_lanes = spill_for::<T>(dd, &mut dd_mem);
                                for t in 0..T {
                                    // |w| × (x with w's sign): the signed products, as maddubs
                                    // needs.
                                    let sy = _mm256_sign_epi8(xq[t], wsig);
                                    let q = _mm256_cvtepi32_ps($dot_us8(wabs, sy));
                                    let ddt = token_scale::<T>(dd, dd_lanes, t);
                                    acc[r][t] = _mm256_fmadd_ps(ddt, q, acc[r][t]);
                                }
                            }
                        }
                        let mut out = [[0f32; T]; R];
                        for r in 0..R {
                            for t in 0..T {
                                out[r][t] = hsum8(acc[r][t]);
                            }
                        }
                        out
                    }
                };
            }
            signed_tile!(q8_0_tile, BlockQ8_0, blk => load32(&blk.qs), h2f(blk.d));
            signed_tile!(q5_0_tile, BlockQ5_0, blk => q5_0_values(blk), h2f(blk.d));
            signed_tile!(mxfp4_tile, BlockMxfp4, blk => mxfp4_values(blk), e8m0_to_f32_half(blk.e));

            panel!(q4_1, q4_1_tile, BlockQ4_1, BlockQ8_1, $features, $rt, $tt);
            panel!(q8_0, q8_0_tile, BlockQ8_0, BlockQ8_0, $features, $rt, $tt);
            panel!(q5_0, q5_0_tile, BlockQ5_0, BlockQ8_0, $features, $rt, $tt);
            panel!(mxfp4, mxfp4_tile, BlockMxfp4, BlockQ8_0, $features, $rt, $tt);

            /// Each token's block scales as f32, converted once per panel rather than
            /// once per tile row: per block, up to 4 tokens' `d` and `s` in one F16C
            /// conversion, stored as one [`TokenScales`].
            #[target_feature(enable = $features)]
            unsafe fn token_scales<B: ActScales>(
                nb: usize,
                xs: &[&[B]],
                out: &mut Vec<TokenScales>,
            ) {
                debug_assert!(xs.len() <= 4);
                out.clear();
                out.resize(nb, TokenScales::default());
                for (b, sc) in out.iter_mut().enumerate() {
                    let mut h = [0u16; 8];
                    for (t, x) in xs.iter().enumerate() {
                        let (d, s) = x[b].scales();
                        h[t] = u16::from_le_bytes(d);
                        h[4 + t] = u16::from_le_bytes(s);
                    }
                    let v = _mm256_cvtph_ps(_mm_loadu_si128(h.as_ptr().cast()));
                    // SAFETY: TokenScales is 8 f32 (repr(C)).
                    _mm256_storeu_ps((sc as *mut TokenScales).cast(), v);
                }
            }
        }
    };
}

/// Decode's GEMV in [`panel!`] (`toks == 1`): `DECODE_ROWS` rows per pass over the one
/// activation row, then the rows left one at a time. Statements of the kernel's body, so that
/// they compile with its target features.
macro_rules! panel_gemv {
    ($tile:ident, $nb:ident, $rows:ident, $wr:ident, $xr:ident, $sc:ident, $out:ident) => {
        token_scales($nb, &[$xr(0)], &mut $sc);
        let mut r0 = 0;
        while r0 + DECODE_ROWS <= $rows {
            let v = $tile::<DECODE_ROWS, 1>($nb, rows_from(&$wr, r0), [$xr(0)], &$sc, true);
            for (i, row) in v.iter().enumerate() {
                $out[r0 + i] = row[0];
            }
            r0 += DECODE_ROWS;
        }
        for r in r0..$rows {
            $out[r] = $tile::<1, 1>($nb, [$wr(r)], [$xr(0)], &$sc, true)[0][0];
        }
    };
}

/// The last `tn` tokens in [`panel!`] (fewer than a tile's), for the `rn` rows from `r0`: one
/// token at a time, a full tile of rows or else row by row (the same arithmetic per pair as a
/// tile's). Statements of the kernel's body, so that they compile with its target features.
macro_rules! panel_token_edge {
    (
        $tile:ident, $rt:literal, $nb:ident, $wr:ident, $xr:ident, $sc1:ident, $out:ident,
        $at:ident
    ) => {
        let (rows, r0, rn, t0, tn, prefetch) = $at;
        for j in 0..tn {
            token_scales($nb, &[$xr(t0 + j)], &mut $sc1);
            if rn == $rt {
                let v = $tile::<$rt, 1>($nb, rows_from(&$wr, r0), [$xr(t0 + j)], &$sc1, prefetch);
                for (i, row) in v.iter().enumerate() {
                    $out[(t0 + j) * rows + r0 + i] = row[0];
                }
            } else {
                for i in 0..rn {
                    let v = $tile::<1, 1>($nb, [$wr(r0 + i)], [$xr(t0 + j)], &$sc1, prefetch);
                    $out[(t0 + j) * rows + r0 + i] = v[0][0];
                }
            }
        }
    };
}

/// The loop over tiles for one type: full `$rt`×`$tt` tiles, then the ragged edges one row or
/// one token at a time (same arithmetic per pair, so edges cost speed, never bits).
macro_rules! panel {
    ($name:ident, $tile:ident, $wb:ty, $xb:ty, $features:literal, $rt:literal, $tt:literal) => {
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn $name(
            nb: usize,
            w: &[u8],
            rows: usize,
            x: &[u8],
            toks: usize,
            out: &mut [f32],
        ) {
            let (w, x) = (cast::<$wb>(w), cast::<$xb>(x));
            assert!(w.len() >= rows * nb && x.len() >= toks * nb && out.len() >= rows * toks);
            let wr = |r: usize| &w[r * nb..(r + 1) * nb];
            let xr = |t: usize| &x[t * nb..(t + 1) * nb];
            let mut sc = Vec::new();
            if toks == 1 {
                panel_gemv!($tile, nb, rows, wr, xr, sc, out);
                return;
            }
            let mut sc1 = Vec::new();
            let mut t0 = 0;
            while t0 < toks {
                let tn = (toks - t0).min($tt);
                // A few tokens (a speculative decode step, small batches) still stream the
                // weights from memory, in the first pass over them; later passes and longer
                // batches find them in cache.
                let prefetch = t0 == 0 && toks <= SMALL_BATCH;
                let group: Vec<&[$xb]> = (t0..t0 + tn).map(xr).collect();
                token_scales(nb, &group, &mut sc);
                let mut r0 = 0;
                while r0 < rows {
                    let rn = (rows - r0).min($rt);
                    if rn == $rt && tn == $tt {
                        let v = $tile::<$rt, $tt>(
                            nb,
                            rows_from(&wr, r0),
                            rows_from(&xr, t0),
                            &sc,
                            prefetch,
                        );
                        for (i, row) in v.iter().enumerate() {
                            for (j, &val) in row.iter().enumerate() {
                                out[(t0 + j) * rows + r0 + i] = val;
                            }
                        }
                    } else if tn == $tt {
                        for i in 0..rn {
                            let v = $tile::<1, $tt>(
                                nb,
                                [wr(r0 + i)],
                                rows_from(&xr, t0),
                                &sc,
                                prefetch,
                            );
                            for (j, &val) in v[0].iter().enumerate() {
                                out[(t0 + j) * rows + r0 + i] = val;
                            }
                        }
                    } else {
                        let at = (rows, r0, rn, t0, tn, prefetch);
                        panel_token_edge!($tile, $rt, nb, wr, xr, sc1, out, at);
                    }
                    r0 += rn;
                }
                t0 += tn;
            }
        }
    };
}

/// `[f(first), f(first + 1), …]` (what `array::from_fn` does, but inlined into the kernel:
/// `from_fn`'s closure is not, inside a `target_feature` function).
#[inline(always)]
pub(in crate::quant) fn rows_from<'a, B, const N: usize>(
    f: &impl Fn(usize) -> &'a [B],
    first: usize,
) -> [&'a [B]; N] {
    let mut out: [&[B]; N] = [&[]; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = f(first + i);
    }
    out
}

// AVX2 has 16 vector registers: 4×2 tiles keep the 8 accumulators and operands in them.
panels!(avx2, "avx2,fma,f16c", dot_us8_avx2, 4, 2);
// AVX-512 doubles the register file (usable for 256-bit code through AVX512VL).
panels!(
    vnni,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    dot_us8_vnni,
    4,
    4
);
