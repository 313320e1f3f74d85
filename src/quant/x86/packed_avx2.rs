//! 256-bit VNNI kernels over packed groups (`packed`): eight weight rows per register, each
//! group of sixteen rows as two halves.
//!
//! They compute exactly what `packed_avx512`'s kernels compute, lane for lane: the same
//! integer lane sums (`vpdpbusd` of the unsigned quants against the token's dword `j`, started
//! at `−c·Σx` for signed weights), the same scale products, the same fused chains and the same
//! final sums, in the same order; only the register width differs, so a row's result does not
//! depend on which half of a register it sat in, and the outputs are the per-pair dots' bits
//! (tested in `gemm` against `gemm` on the unpacked rows).
//!
//! With sixteen registers, a Lanes pass (eight accumulators a token) carries one token and a
//! chain pass (an accumulator and an integer sum a token) four; the second half of a group
//! finds its blocks in L1, where the first half's pass left them.
//!
//! The same code is built three times, differing only in how `vpdpbusd` is had:
//! - `vex`: AVX-VNNI, the VEX form (Intel Alder Lake and later, the N100, AMD Zen 5), on CPUs
//!   with AVX2 and no AVX-512;
//! - `evex`: AVX-512 VNNI + VL's 256-bit form of the same instruction, so that the kernels run
//!   (and are tested and measured, `EDGELM_SIMD=avx2-vnni`) on AVX-512 machines that lack the
//!   VEX form, as AMD Zen 4 does;
//! - `plain`: AVX2 alone, `vpdpbusd` emulated exactly ([`dpbusd_u7`], [`dpbusd_u8`]), for
//!   CPUs without either (Haswell to Comet Lake, Zen 1 to 3).

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;
use crate::quant::formats::packed::{checked, group_block_bytes, offsets, Out, PackedFn, GROUP};
use crate::quant::order::Order;
use crate::quant::x86::packed_avx512::{TokenBlock, UNPACKED_BYTES, UNPACKED_QS};
use crate::quant::x86::panel::ActScales;
use crate::quant::GgmlType;

/// Rows per register: half a group.
const HALF: usize = GROUP / 2;

/// The legacy layouts, as the kernels' const parameter.
mod layout {
    pub const Q8_0: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q4_1: u8 = 2;
    pub const Q5_0: u8 = 3;
    /// Q5_0 group blocks unpacked for a batch (`unpack_q5_0`): `packed_avx512`'s unpacked
    /// layout, whose half `h` of each lane's 64 bytes is this kernel's half.
    pub const UNPACKED: u8 = 4;
}

/// Bytes of one group block of layout `l`.
fn block_bytes(l: u8) -> usize {
    if l == layout::UNPACKED {
        UNPACKED_BYTES
    } else {
        group_block_bytes(layout_type(l))
    }
}

/// Chain batches of at least this many tokens unpack each Q5_0 group once for all their
/// passes: with sixteen registers a pass carries four tokens, so the fifth bits (six
/// instructions a register to put back) would otherwise be unpacked again every four.
const UNPACK_FROM_TOKENS: usize = 8;

const fn layout_type(l: u8) -> GgmlType {
    match l {
        layout::Q8_0 => GgmlType::Q8_0,
        layout::Q4_0 => GgmlType::Q4_0,
        layout::Q4_1 => GgmlType::Q4_1,
        _ => GgmlType::Q5_0,
    }
}

/// The offset `c` that makes a layout's quants unsigned (`w + c`), zero for Q4_1's.
const fn offset(l: u8) -> i32 {
    match l {
        layout::Q8_0 => 128,
        layout::Q4_0 => 8,
        layout::Q5_0 => 16,
        _ => 0,
    }
}

/// Tokens one Lanes pass carries: its eight accumulators take half the registers.
const LANES_PASS: usize = 1;
/// Tokens one chain pass carries: an accumulator and an integer sum each.
const CHAIN_PASS: usize = 4;

thread_local! {
    /// Per-thread scratch for the prepared activation blocks and an unpacked group (reused,
    /// never shrunk).
    static SCRATCH: std::cell::RefCell<(Vec<TokenBlock>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `packed_avx512`'s preparation of the activation blocks with AVX2 alone: the f32 scales and
/// `−c × (the sum of each lane's four activations)`, token-major (`out[t * nb + b]`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prepare<B: ActScales>(nb: usize, xs: &[&[B]], c: i32, out: &mut Vec<TokenBlock>) {
    out.clear();
    out.resize(nb * xs.len(), TokenBlock::default());
    let (ones8, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
    let shift = _mm_cvtsi32_si128(c.max(1).trailing_zeros() as i32);
    for (x, dst) in xs.iter().zip(out.chunks_exact_mut(nb)) {
        for (blk, tb) in x[..nb].iter().zip(dst.iter_mut()) {
            let (d, s) = blk.scales();
            let ds = _mm_cvtph_ps(_mm_set1_epi32(i32::from_le_bytes([d[0], d[1], s[0], s[1]])));
            tb.d = _mm_cvtss_f32(ds);
            tb.s = _mm_cvtss_f32(_mm_movehdup_ps(ds));
            if c != 0 {
                // 1 × x pairs cannot saturate `maddubs`: the four-value sums are exact.
                let q = _mm256_loadu_si256(blk.qs().as_ptr().cast());
                let sum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
                let bias = _mm256_sll_epi32(_mm256_sub_epi32(_mm256_setzero_si256(), sum), shift);
                _mm256_storeu_si256(tb.bias.as_mut_ptr().cast(), bias);
                tb.bias_sum = tb.bias.iter().sum();
            }
        }
    }
}

/// `vpdpbusd` (`acc + Σ of four u8 × i8 products` per i32 lane) for unsigned bytes under
/// 128, exactly: a `vpmaddubsw` pair is then within ±127·128·2 = ±32512 and never saturates,
/// and `vpmaddwd` against ones adds the two pairs of a lane in i32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dpbusd_u7(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
    let pairs = _mm256_maddubs_epi16(u, x);
    _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
}

/// `vpdpbusd` for any unsigned bytes, exactly: a pair of 255 × −128 would saturate
/// `vpmaddubsw`, so each byte is split into its low seven bits (pairs within ±32512) and its
/// top bit (pairs `128·(x₀ + x₁)` within [−32768, 32512]), each summed as [`dpbusd_u7`] does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dpbusd_u8(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
    let top = _mm256_and_si256(u, _mm256_set1_epi8(-128));
    let low = _mm256_xor_si256(u, top);
    let ones = _mm256_set1_epi16(1);
    let low_sum = _mm256_madd_epi16(_mm256_maddubs_epi16(low, x), ones);
    let top_sum = _mm256_madd_epi16(_mm256_maddubs_epi16(top, x), ones);
    _mm256_add_epi32(acc, _mm256_add_epi32(low_sum, top_sum))
}

/// Defines the kernels in module `$module`, compiled for `$features`, with `$dpbusd` as the
/// `vpdpbusd` (`acc + Σ of four u8 × i8 products` per i32 lane) for bytes under 128 and
/// `$dpbusd_u8` for any (the same instruction where there is one).
macro_rules! packed_kernels {
    ($module:ident, $features:literal, $dpbusd:ident, $dpbusd_u8:ident) => {
        pub(crate) mod $module {
            use super::*;

            /// `vpdpbusd` on layout `L`'s unsigned quants: Q8_0's span all of u8, the other
            /// layouts' stay under 32.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dpbusd<const L: u8>(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
                // The unpacked layout holds Q5_0's values: under 32.
                if L == layout::Q8_0 {
                    $dpbusd_u8(acc, u, x)
                } else {
                    $dpbusd(acc, u, x)
                }
            }

            /// Dword `j` of an activation block's quants, in every lane.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn x_dword(qs: &[i8; 32], j: usize) -> __m256i {
                _mm256_set1_epi32(qs.as_ptr().cast::<i32>().add(j).read_unaligned())
            }

            /// Eight f16 values at `p` as f32.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn halves_at(p: *const u8) -> __m256 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
            }

            /// The unsigned quant bytes of lanes `j` and `j + 4` of half `h` of a group block
            /// (`qh`: Q5_0's rearranged fifth bits of that half).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn values<const L: u8>(
                gb: *const u8,
                h: usize,
                j: usize,
                qh: __m256i,
            ) -> (__m256i, __m256i) {
                let load = |at: usize| _mm256_loadu_si256(gb.add(at + 32 * h).cast());
                if L == layout::UNPACKED {
                    return (load(UNPACKED_QS + 64 * j), load(UNPACKED_QS + 64 * (j + 4)));
                }
                if L == layout::Q8_0 {
                    let flip = _mm256_set1_epi8(-128);
                    let q = offsets::Q8_0_QS;
                    return (
                        _mm256_xor_si256(load(q + 64 * j), flip),
                        _mm256_xor_si256(load(q + 64 * (j + 4)), flip),
                    );
                }
                let qs = match L {
                    layout::Q4_0 => offsets::Q4_0_QS,
                    layout::Q4_1 => offsets::Q4_1_QS,
                    _ => offsets::Q5_0_QS,
                };
                let m4 = _mm256_set1_epi8(0x0F);
                let v = load(qs + 64 * j);
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                if L != layout::Q5_0 {
                    return (lo, hi);
                }
                let bit4 = _mm256_set1_epi8(0x10);
                let lo_bits = _mm256_sll_epi32(qh, _mm_cvtsi32_si128(4 - j as i32));
                let hi_bits = _mm256_srl_epi32(qh, _mm_cvtsi32_si128(j as i32));
                (
                    _mm256_or_si256(lo, _mm256_and_si256(lo_bits, bit4)),
                    _mm256_or_si256(hi, _mm256_and_si256(hi_bits, bit4)),
                )
            }

            /// Q5_0's rearranged `qh` words of half `h` (zero for the other layouts).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn fifth_bits<const L: u8>(gb: *const u8, h: usize) -> __m256i {
                if L == layout::Q5_0 {
                    _mm256_loadu_si256(gb.add(offsets::QH + 32 * h).cast())
                } else {
                    _mm256_setzero_si256()
                }
            }

            /// The `nb` Q5_0 group blocks at `g`, both halves, unpacked into `dst` (`nb *
            /// UNPACKED_BYTES`) with the same `values` the direct kernel uses.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn unpack_q5_0(nb: usize, g: *const u8, dst: &mut [u8]) {
                assert!(dst.len() >= nb * UNPACKED_BYTES);
                let gbb = group_block_bytes(GgmlType::Q5_0);
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    let out = dst.as_mut_ptr().add(b * UNPACKED_BYTES);
                    std::ptr::copy_nonoverlapping(gb.add(offsets::D), out, 32);
                    for h in 0..2 {
                        let qh = fifth_bits::<{ layout::Q5_0 }>(gb, h);
                        for j in 0..4 {
                            let (lo, hi) = values::<{ layout::Q5_0 }>(gb, h, j, qh);
                            let at = |lane: usize| out.add(UNPACKED_QS + 64 * lane + 32 * h).cast();
                            _mm256_storeu_si256(at(j), lo);
                            _mm256_storeu_si256(at(j + 4), hi);
                        }
                    }
                }
            }

            /// The eight lane registers of each row, summed as `hsum_float_8` sums a row's lanes.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn hsum_lanes(a: &[__m256; 8]) -> __m256 {
                _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(a[0], a[4]), _mm256_add_ps(a[2], a[6])),
                    _mm256_add_ps(_mm256_add_ps(a[1], a[5]), _mm256_add_ps(a[3], a[7])),
                )
            }

            /// Half `h` of group `g` against `T` tokens in the Lanes order (`vec_dot`'s eight
            /// lanes per pair, `packed_avx512`'s `lanes_group`).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn lanes<const L: u8, const T: usize, B: ActScales>(
                nb: usize,
                g: *const u8,
                h: usize,
                x: [&[B]; T],
                tb: [&[TokenBlock]; T],
            ) -> [__m256; T] {
                let gbb = block_bytes(L);
                let mut acc = [[_mm256_setzero_ps(); 8]; T];
                let mut summs = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    let dw = halves_at(gb.add(offsets::D + 2 * HALF * h));
                    let qh = fifth_bits::<L>(gb, h);
                    // SAFETY (get_unchecked): the entry checked both hold nb blocks per token.
                    // Loops, not `array::from_fn`: its closures lack the target features and
                    // were not inlined (a call per token and block).
                    let mut toks: [&TokenBlock; T] = [&tb[0][0]; T];
                    let mut xq: [&[i8; 32]; T] = [x[0][0].qs(); T];
                    let mut d = [_mm256_setzero_ps(); T];
                    for t in 0..T {
                        toks[t] = unsafe { tb[t].get_unchecked(b) };
                        xq[t] = unsafe { x[t].get_unchecked(b).qs() };
                        d[t] = _mm256_mul_ps(dw, _mm256_set1_ps(toks[t].d));
                    }
                    if L == layout::Q4_1 {
                        let m = halves_at(gb.add(offsets::M + 2 * HALF * h));
                        for t in 0..T {
                            summs[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(toks[t].s), summs[t]);
                        }
                    }
                    for j in 0..4 {
                        let (lo, hi) = values::<L>(gb, h, j, qh);
                        for t in 0..T {
                            let start = |l: usize| {
                                if L == layout::Q4_1 {
                                    _mm256_setzero_si256()
                                } else {
                                    _mm256_set1_epi32(toks[t].bias[l])
                                }
                            };
                            let il = dpbusd::<L>(start(j), lo, x_dword(xq[t], j));
                            let ih = dpbusd::<L>(start(j + 4), hi, x_dword(xq[t], j + 4));
                            acc[t][j] = _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(il), acc[t][j]);
                            acc[t][j + 4] =
                                _mm256_fmadd_ps(d[t], _mm256_cvtepi32_ps(ih), acc[t][j + 4]);
                        }
                    }
                }
                let mut sums = [_mm256_setzero_ps(); T];
                for t in 0..T {
                    sums[t] = _mm256_add_ps(hsum_lanes(&acc[t]), summs[t]);
                }
                sums
            }

            /// Half `h` of group `g` against `T` tokens in the chain order (`Order::Chain`, and
            /// Q4_0's `Order::Repacked`): each row's whole-block integer sum, then one fused
            /// chain over the blocks; Q4_1 adds its `m·s` chain at the end.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn chains<const L: u8, const T: usize, B: ActScales>(
                nb: usize,
                g: *const u8,
                h: usize,
                x: [&[B]; T],
                tb: [&[TokenBlock]; T],
            ) -> [__m256; T] {
                let gbb = block_bytes(L);
                let mut acc = [_mm256_setzero_ps(); T];
                let mut summs = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    let dw = halves_at(gb.add(offsets::D + 2 * HALF * h));
                    let qh = fifth_bits::<L>(gb, h);
                    // Plain loops and macros, not `array::from_fn` or closures: those were not
                    // inlined here (as in `packed_avx512`'s chain groups).
                    // SAFETY (get_unchecked): the entry checked both hold nb blocks per token.
                    macro_rules! toks {
                        ($t:expr) => {
                            unsafe { tb[$t].get_unchecked(b) }
                        };
                    }
                    macro_rules! xq {
                        ($t:expr) => {
                            unsafe { x[$t].get_unchecked(b).qs() }
                        };
                    }
                    let mut sum = [_mm256_setzero_si256(); T];
                    for t in 0..T {
                        sum[t] = _mm256_set1_epi32(toks!(t).bias_sum);
                    }
                    for j in 0..4 {
                        let (lo, hi) = values::<L>(gb, h, j, qh);
                        for t in 0..T {
                            sum[t] = dpbusd::<L>(sum[t], lo, x_dword(xq!(t), j));
                            sum[t] = dpbusd::<L>(sum[t], hi, x_dword(xq!(t), j + 4));
                        }
                    }
                    if L == layout::Q4_1 {
                        let m = halves_at(gb.add(offsets::M + 2 * HALF * h));
                        for t in 0..T {
                            summs[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(toks!(t).s), summs[t]);
                        }
                    }
                    for t in 0..T {
                        let dd = _mm256_mul_ps(dw, _mm256_set1_ps(toks!(t).d));
                        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[t]), dd, acc[t]);
                    }
                }
                if L == layout::Q4_1 {
                    for t in 0..T {
                        acc[t] = _mm256_add_ps(acc[t], summs[t]);
                    }
                }
                acc
            }

            /// Tokens `t0..t0 + T` against half `h` of group `g` (at `gp`), stored.
            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn pass<const L: u8, const CHAIN: bool, const T: usize, B: ActScales>(
                nb: usize,
                gp: *const u8,
                (g, h): (usize, usize),
                xs: &[&[B]],
                tbs: &[TokenBlock],
                t0: usize,
                out: Out,
            ) {
                // Loops, not `array::from_fn`, whose closures were not inlined.
                let mut x: [&[B]; T] = [&[]; T];
                let mut tb: [&[TokenBlock]; T] = [&[]; T];
                for i in 0..T {
                    x[i] = xs[t0 + i];
                    tb[i] = &tbs[(t0 + i) * nb..(t0 + i + 1) * nb];
                }
                let v = if CHAIN {
                    chains::<L, T, B>(nb, gp, h, x, tb)
                } else {
                    lanes::<L, T, B>(nb, gp, h, x, tb)
                };
                for (i, v) in v.into_iter().enumerate() {
                    let at = (t0 + i) * out.stride + g * GROUP + h * HALF;
                    _mm256_storeu_ps(out.ptr.add(at), v);
                }
            }

            /// A packed kernel (`PackedFn`) of layout `L` in the chain order or the Lanes
            /// order: groups outside, then each half's tokens in passes as even as the pass
            /// size allows.
            #[target_feature(enable = $features)]
            unsafe fn entry<const L: u8, const CHAIN: bool, B: ActScales + Block>(
                nb: usize,
                w: &[u8],
                groups: usize,
                x: &[u8],
                toks: usize,
                out: Out,
            ) {
                let ty = layout_type(L);
                let gb = nb * group_block_bytes(ty);
                let x = checked::<B>(ty, nb, w, groups, x, toks);
                let xs: Vec<&[B]> = (0..toks).map(|t| &x[t * nb..(t + 1) * nb]).collect();
                SCRATCH.with_borrow_mut(|(tbs, unpacked)| {
                    prepare(nb, &xs, offset(L), tbs);
                    let most = if CHAIN { CHAIN_PASS } else { LANES_PASS };
                    let size = toks.div_ceil(toks.div_ceil(most).max(1)).max(1);
                    // Every pass over group `g`, whose blocks (of layout `$l`) are at `gp`.
                    macro_rules! passes {
                        ($l:expr, $g:expr, $gp:expr) => {
                            for h in 0..2 {
                                let mut t0 = 0;
                                while t0 < toks {
                                    let n = (toks - t0).min(size);
                                    let (at, gp) = (($g, h), $gp);
                                    match n {
                                        1 => pass::<{ $l }, CHAIN, 1, B>(
                                            nb, gp, at, &xs, tbs, t0, out,
                                        ),
                                        2 => pass::<{ $l }, CHAIN, 2, B>(
                                            nb, gp, at, &xs, tbs, t0, out,
                                        ),
                                        3 => pass::<{ $l }, CHAIN, 3, B>(
                                            nb, gp, at, &xs, tbs, t0, out,
                                        ),
                                        _ => pass::<{ $l }, CHAIN, 4, B>(
                                            nb, gp, at, &xs, tbs, t0, out,
                                        ),
                                    }
                                    t0 += n;
                                }
                            }
                        };
                    }
                    if CHAIN && L == layout::Q5_0 && toks >= UNPACK_FROM_TOKENS {
                        unpacked.resize(nb * UNPACKED_BYTES, 0);
                        for g in 0..groups {
                            unpack_q5_0(nb, w.as_ptr().add(g * gb), unpacked);
                            passes!(layout::UNPACKED, g, unpacked.as_ptr());
                        }
                        return;
                    }
                    for g in 0..groups {
                        passes!(L, g, w.as_ptr().add(g * gb));
                    }
                });
            }

            /// The kernel for `ty` in `order`, where there is one (the K-quants' in
            /// `packed_k_avx2`).
            pub(crate) fn kernel(ty: GgmlType, order: Order) -> Option<PackedFn> {
                use layout::*;
                use GgmlType as G;
                Some(match (ty, order) {
                    (G::Q8_0, Order::Lanes) => entry::<Q8_0, false, BlockQ8_0>,
                    (G::Q8_0, Order::Chain) => entry::<Q8_0, true, BlockQ8_0>,
                    (G::Q4_0, Order::Lanes) => entry::<Q4_0, false, BlockQ8_0>,
                    (G::Q4_0, Order::Repacked | Order::Chain) => entry::<Q4_0, true, BlockQ8_0>,
                    (G::Q4_1, Order::Lanes) => entry::<Q4_1, false, BlockQ8_1>,
                    (G::Q4_1, Order::Chain) => entry::<Q4_1, true, BlockQ8_1>,
                    (G::Q5_0, Order::Lanes) => entry::<Q5_0, false, BlockQ8_0>,
                    (G::Q5_0, Order::Chain) => entry::<Q5_0, true, BlockQ8_0>,
                    _ => return crate::quant::x86::packed_k_avx2::$module::kernel(ty, order),
                })
            }
        }
    };
}

packed_kernels!(
    vex,
    "avx2,fma,f16c,avxvnni",
    _mm256_dpbusd_avx_epi32,
    _mm256_dpbusd_avx_epi32
);
packed_kernels!(
    evex,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    _mm256_dpbusd_epi32,
    _mm256_dpbusd_epi32
);
packed_kernels!(plain, "avx2,fma,f16c", dpbusd_u7, dpbusd_u8);

#[cfg(test)]
mod tests {
    use super::*;

    /// `vpdpbusd`'s i32 lanes, computed plainly.
    fn dpbusd_ref(acc: [i32; 8], u: [u8; 32], x: [i8; 32]) -> [i32; 8] {
        std::array::from_fn(|l| {
            let dot: i32 = (0..4)
                .map(|k| u[4 * l + k] as i32 * x[4 * l + k] as i32)
                .sum();
            acc[l].wrapping_add(dot)
        })
    }

    /// The emulations against the plain sums, at the extremes (where `vpmaddubsw` would
    /// saturate: 255 and 127 against −128 and 127) and on random bytes.
    #[test]
    #[cfg_attr(not(host_avx2), ignore = "this CPU lacks AVX2, FMA or F16C")]
    fn emulated_dpbusd_is_exact() {
        assert!(crate::cpu_features::hardware().avx2, "this CPU lacks AVX2");
        let mut rng = crate::quant::test_util::Rng::new(0x5eed_0003);
        let edges_u = [0u8, 1, 31, 63, 127, 128, 129, 255];
        let edges_x = [-128i8, -127, -1, 0, 1, 126, 127];
        for case in 0..4000 {
            let mut byte = |edges: &[u8]| {
                let r = (rng.f32().abs() * 1e6) as usize;
                if case % 2 == 0 {
                    edges[r % edges.len()]
                } else {
                    r as u8
                }
            };
            let u: [u8; 32] = std::array::from_fn(|_| byte(&edges_u));
            let xe: Vec<u8> = edges_x.iter().map(|&v| v as u8).collect();
            let x: [i8; 32] = std::array::from_fn(|_| byte(&xe) as i8);
            let acc: [i32; 8] = std::array::from_fn(|l| l as i32 * 1000 - 4000);
            let small: [u8; 32] = u.map(|b| b & 0x7F);
            let run = |f: unsafe fn(__m256i, __m256i, __m256i) -> __m256i, u: [u8; 32]| {
                let mut got = [0i32; 8];
                // SAFETY: the CPU has AVX2 (asserted above); the arrays are 32 bytes each.
                unsafe {
                    let r = f(
                        _mm256_loadu_si256(acc.as_ptr().cast()),
                        _mm256_loadu_si256(u.as_ptr().cast()),
                        _mm256_loadu_si256(x.as_ptr().cast()),
                    );
                    _mm256_storeu_si256(got.as_mut_ptr().cast(), r);
                }
                got
            };
            assert_eq!(run(dpbusd_u8, u), dpbusd_ref(acc, u, x), "u8 {u:?} {x:?}");
            assert_eq!(
                run(dpbusd_u7, small),
                dpbusd_ref(acc, small, x),
                "u7 {small:?} {x:?}"
            );
        }
    }
}
