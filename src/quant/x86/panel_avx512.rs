//! 512-bit panels for AVX-512 VNNI: sixteen (or eight) tokens per weight block, two tokens
//! per register.
//!
//! The 256-bit tiles of `x86::panel` spend most of their instructions per (row, token) pair:
//! one `vpdpbusd`, one conversion, one FMA. Here each zmm holds the eight i32 lanes of two
//! tokens side by side (lanes 0–7 token 2p, lanes 8–15 token 2p+1), so one instruction does
//! the work of two pairs; the weight block is unpacked once, into both halves, for all the
//! group's tokens. Each half is still exactly ggml's per-pair chain (the same integer lane sums, the
//! same `d_w·d_x` product, the same FMA order over the blocks, the same horizontal sum), so
//! the outputs are bit-identical to `vec_dot` and to the 256-bit tiles: only speed changes.
//!
//! Q8_0 and Q5_0 weights are signed, and `vpdpbusd` wants unsigned × signed. Rather than
//! flipping the activations' signs per pair (ggml's `sign_epi8`, which AVX-512 lacks), the
//! weights are offset by 128 once per block and the accumulator starts at −128·Σx for each
//! lane's four activations (precomputed per token): Σ(w+128)·x − 128·Σx = Σw·x, the same
//! integers.
//!
//! Tokens go in groups of sixteen (2 rows × 8 pairs per tile), then one of eight (4 rows × 4
//! pairs); the last few (and decode's single token) go to the 256-bit panels. Measured on a
//! Zen 4 core (`gemm` on 64 rows × 16 tokens of the reference model's shapes), these panels do
//! 1.2–1.3× the multiply-adds per second of the 256-bit VNNI tiles.

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;
use crate::quant::x86::dot::{h2f, hsum_f32x8 as hsum8, load32, mxfp4_values, q5_0_values};
use crate::quant::x86::panel::{rows_from, vnni, ActScales};

/// Tokens per group: four registers of two tokens each.
const GROUP: usize = 8;
/// Token pairs per group.
const PAIRS: usize = GROUP / 2;
/// Weight rows per tile: 4 rows × 4 pairs = 16 accumulators, half of AVX-512's registers.
const ROWS: usize = 4;

/// One block index's activations for a group of eight tokens, laid out for the tiles. Pair p
/// is tokens 2p (low half) and 2p+1 (high half): `q[p]` their quants side by side, `d[p]`
/// their `d` each repeated over its half, `bias[p]` (Q8_0's offset weights only) −128·Σ of
/// each lane's four activations; `s` holds Q8_1's eight block sums `d·Σq` (zero for Q8_0).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct GroupBlock {
    q: [[i8; 64]; PAIRS],
    d: [[f32; 16]; PAIRS],
    bias: [[i32; 16]; PAIRS],
    s: [f32; GROUP],
}

impl Default for GroupBlock {
    fn default() -> Self {
        GroupBlock {
            q: [[0; 64]; PAIRS],
            d: [[0.0; 16]; PAIRS],
            bias: [[0; 16]; PAIRS],
            s: [0.0; GROUP],
        }
    }
}

/// Lays out eight tokens' `nb` blocks (`xs`) for the tiles; `with_bias` also computes Q8_0's
/// −128·Σx lane sums.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn lay_out<B: ActScales>(
    nb: usize,
    xs: &[&[B]; GROUP],
    with_bias: bool,
    out: &mut Vec<GroupBlock>,
) {
    out.clear();
    out.resize(nb, GroupBlock::default());
    let ones = _mm256_set1_epi8(1);
    // Σ of each lane's four activations, times −128.
    let bias = |q: __m256i| {
        let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q);
        _mm256_slli_epi32::<7>(_mm256_sub_epi32(_mm256_setzero_si256(), sum))
    };
    for (b, gb) in out.iter_mut().enumerate() {
        let mut hd = [0u16; GROUP];
        let mut hs = [0u16; GROUP];
        for (t, x) in xs.iter().enumerate() {
            let (d, s) = x[b].scales();
            hd[t] = u16::from_le_bytes(d);
            hs[t] = u16::from_le_bytes(s);
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(hd.as_ptr().cast()));
        _mm256_store_ps(
            gb.s.as_mut_ptr(),
            _mm256_cvtph_ps(_mm_loadu_si128(hs.as_ptr().cast())),
        );
        let d = _mm512_castps256_ps512(d);
        for p in 0..PAIRS {
            // Lanes 0–7 from token 2p, lanes 8–15 from token 2p+1.
            let (lo, hi) = (2 * p as i32, 2 * p as i32 + 1);
            let idx = _mm512_set_epi32(
                hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo,
            );
            _mm512_store_ps(gb.d[p].as_mut_ptr(), _mm512_permutexvar_ps(idx, d));
            let (qa, qb) = (load32(xs[2 * p][b].qs()), load32(xs[2 * p + 1][b].qs()));
            _mm512_store_si512(gb.q[p].as_mut_ptr().cast(), halves(qa, qb));
            if with_bias {
                _mm512_store_si512(gb.bias[p].as_mut_ptr().cast(), halves(bias(qa), bias(qb)));
            }
        }
    }
}

/// `a` in the low half, `b` in the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn halves(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// The two horizontal sums of a pair accumulator: (low half, high half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn hsum_pair(acc: __m512) -> (f32, f32) {
    let lo = _mm512_castps512_ps256(acc);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc)));
    (hsum8(lo), hsum8(hi))
}

/// A tile's outputs: token 2p + h of row r is half h of `acc[r][p]`, plus lane 2p + h of
/// `summs[r]` (Q8_1's `m·s` terms).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn finish<const R: usize>(
    acc: &[[__m512; PAIRS]; R],
    summs: &[__m256; R],
) -> [[f32; GROUP]; R] {
    let mut out = [[0f32; GROUP]; R];
    for r in 0..R {
        let mut m = [0f32; GROUP];
        _mm256_storeu_ps(m.as_mut_ptr(), summs[r]);
        for p in 0..PAIRS {
            let (lo, hi) = hsum_pair(acc[r][p]);
            out[r][2 * p] = lo + m[2 * p];
            out[r][2 * p + 1] = hi + m[2 * p + 1];
        }
    }
    out
}

/// One R×8 tile of Q4_1 × Q8_1; see `x86::panel`'s `q4_1_tile` for the per-pair order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn q4_1_tile<const R: usize>(
    nb: usize,
    w: [&[BlockQ4_1]; R],
    g: &[GroupBlock],
) -> [[f32; GROUP]; R] {
    let mut acc = [[_mm512_setzero_ps(); PAIRS]; R];
    let mut summs = [_mm256_setzero_ps(); R];
    let shifts = _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0);
    let low4 = _mm512_set1_epi8(0x0F);
    for b in 0..nb {
        // SAFETY (all get_unchecked here): the panel checked every row holds nb blocks, and
        // the group was laid out for nb blocks.
        let gb = unsafe { g.get_unchecked(b) };
        let xs = _mm256_load_ps(gb.s.as_ptr());
        for r in 0..R {
            let blk = unsafe { w[r].get_unchecked(b) };
            // The 16 packed bytes in all four 128-bit lanes; lanes 1 and 3 shifted down a
            // nibble: each 256-bit half is the block's 32 weights in order.
            let packed = _mm512_broadcast_i32x4(_mm_loadu_si128(blk.qs.as_ptr().cast()));
            let wq = _mm512_and_si512(_mm512_srlv_epi64(packed, shifts), low4);
            let dm = _mm_cvtph_ps(_mm_set1_epi32(i32::from_le_bytes([
                blk.d[0], blk.d[1], blk.m[0], blk.m[1],
            ])));
            let wd = _mm512_broadcastss_ps(dm);
            let wm = _mm256_broadcastss_ps(_mm_permute_ps::<0x55>(dm));
            summs[r] = _mm256_fmadd_ps(wm, xs, summs[r]);
            for (p, a) in acc[r].iter_mut().enumerate() {
                let dd = _mm512_mul_ps(wd, _mm512_load_ps(gb.d[p].as_ptr()));
                let xq = _mm512_load_si512(gb.q[p].as_ptr().cast());
                let xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), wq, xq));
                *a = _mm512_fmadd_ps(dd, xy, *a);
            }
        }
    }
    finish(&acc, &summs)
}

/// One R×8 tile of a signed-byte weight type (Q8_0, Q5_0) × Q8_0: ggml's single FMA chain
/// per pair, weights offset by 128. `$values` gives a block's 32 weights as signed bytes.
macro_rules! signed_tile {
    ($tile_name:ident, $wblock:ty, $blk:ident => $values:expr, $scale:expr) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        unsafe fn $tile_name<const R: usize>(
            nb: usize,
            w: [&[$wblock]; R],
            g: &[GroupBlock],
        ) -> [[f32; GROUP]; R] {
            let mut acc = [[_mm512_setzero_ps(); PAIRS]; R];
            let offset = _mm512_set1_epi8(-128);
            for b in 0..nb {
                let gb = unsafe { g.get_unchecked(b) };
                for r in 0..R {
                    let blk = unsafe { w[r].get_unchecked(b) };
                    let wsig = {
                        let $blk = blk;
                        $values
                    };
                    // w + 128 as unsigned bytes (xor flips the sign bit), in both halves.
                    let wu = _mm512_xor_si512(_mm512_broadcast_i64x4(wsig), offset);
                    let wd = _mm512_set1_ps({
                        let $blk = blk;
                        $scale
                    });
                    for (p, a) in acc[r].iter_mut().enumerate() {
                        let dd = _mm512_mul_ps(wd, _mm512_load_ps(gb.d[p].as_ptr()));
                        let xq = _mm512_load_si512(gb.q[p].as_ptr().cast());
                        let bias = _mm512_load_si512(gb.bias[p].as_ptr().cast());
                        let xy = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(bias, wu, xq));
                        *a = _mm512_fmadd_ps(dd, xy, *a);
                    }
                }
            }
            finish(&acc, &[_mm256_setzero_ps(); R])
        }
    };
}
signed_tile!(q8_0_tile, BlockQ8_0, blk => load32(&blk.qs), h2f(blk.d));
signed_tile!(q5_0_tile, BlockQ5_0, blk => q5_0_values(blk), h2f(blk.d));
signed_tile!(mxfp4_tile, BlockMxfp4, blk => mxfp4_values(blk), e8m0_to_f32_half(blk.e));

thread_local! {
    /// Per-thread scratch for the laid-out activations (reused, never shrunk).
    static SCRATCH: std::cell::RefCell<Vec<GroupBlock>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Defines a panel: groups of eight tokens through the 4-row × 4-pair tiles, the rest (fewer
/// than eight, decode's one) through the 256-bit VNNI panel.
macro_rules! panel {
    ($name:ident, $tile:ident, $wb:ty, $xb:ty, $bias:literal) => {
        /// `out[t * rows + r]` for every weight row and token (see `x86::panel::PanelFn`).
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) unsafe fn $name(
            nb: usize,
            w_bytes: &[u8],
            rows: usize,
            x_bytes: &[u8],
            toks: usize,
            out: &mut [f32],
        ) {
            let (w, x) = (cast::<$wb>(w_bytes), cast::<$xb>(x_bytes));
            assert!(w.len() >= rows * nb && x.len() >= toks * nb && out.len() >= rows * toks);
            let wr = |r: usize| &w[r * nb..(r + 1) * nb];
            let xr = |t: usize| &x[t * nb..(t + 1) * nb];
            let mut t0 = 0;
            SCRATCH.with_borrow_mut(|g| {
                while toks - t0 >= GROUP {
                    lay_out(nb, &rows_from::<_, GROUP>(&xr, t0), $bias, g);
                    let mut r0 = 0;
                    while r0 < rows {
                        let rn = (rows - r0).min(ROWS);
                        let v = if rn == ROWS {
                            $tile::<ROWS>(nb, rows_from(&wr, r0), g)
                        } else {
                            let mut v = [[0.0; GROUP]; ROWS];
                            for (i, vi) in v.iter_mut().enumerate().take(rn) {
                                *vi = $tile::<1>(nb, [wr(r0 + i)], g)[0];
                            }
                            v
                        };
                        for (i, row) in v.iter().enumerate().take(rn) {
                            for (j, &val) in row.iter().enumerate() {
                                out[(t0 + j) * rows + r0 + i] = val;
                            }
                        }
                        r0 += rn;
                    }
                    t0 += GROUP;
                }
            });
            if t0 < toks {
                let x_row = nb * std::mem::size_of::<$xb>();
                vnni::$name(
                    nb,
                    w_bytes,
                    rows,
                    &x_bytes[t0 * x_row..],
                    toks - t0,
                    &mut out[t0 * rows..],
                );
            }
        }
    };
}

panel!(q4_1, q4_1_tile, BlockQ4_1, BlockQ8_1, false);
panel!(q8_0, q8_0_tile, BlockQ8_0, BlockQ8_0, true);
panel!(q5_0, q5_0_tile, BlockQ5_0, BlockQ8_0, true);
panel!(mxfp4, mxfp4_tile, BlockMxfp4, BlockQ8_0, true);
