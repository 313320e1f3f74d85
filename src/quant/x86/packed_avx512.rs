//! AVX-512 VNNI kernels over packed groups (`packed`): sixteen weight rows per register.
//!
//! Each register holds one i32 or f32 lane per row of the group, so one `vpdpbusd` computes
//! the integer lane sum `j` (four products) of sixteen rows against the token's dword `j`,
//! broadcast from memory, and the scale, conversion and fused multiply-add that follow serve
//! sixteen rows too. What each lane computes is exactly ggml's per-pair arithmetic:
//! - the Lanes order (`vec_dot`): per row and token eight float lanes, lane `l` accumulating
//!   `(d_w·d_x) × (Σ of products 4l..4l+4)` in one fused chain over the blocks; here lane `l`
//!   of every row is register `acc[l]`, and the final horizontal sum adds the eight registers
//!   in `hsum_float_8`'s order ((0+4)+(2+6))+((1+5)+(3+7)); Q4_1 adds its fused `m·s` chain;
//! - the Repacked order of Q4_0 (`order::dot`): one fused chain per row over the blocks' whole
//!   integer sums.
//!
//! So the outputs are bit-identical to the per-pair dots and to every other panel (tested in
//! `gemm`). Signed weights take the usual VNNI offset: the quants as unsigned bytes (Q8_0:
//! w + 128, Q5_0: w + 16, Q4_0: w + 8), with `−c·Σx` of the lane's four activations as the
//! starting value of the integer sum.

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;
use crate::quant::formats::packed::{checked, group_block_bytes, offsets, Out, GROUP};
use crate::quant::x86::panel::ActScales;
use crate::quant::GgmlType;

/// One token's block, prepared once per call for the lane order: the f32 scales and, for
/// signed weights, the starting value of each lane's integer sum (`−c` × the sum of its four
/// activations). `bias_sum`, the whole block's, is for `packed_avx2`'s chain order, which
/// prepares these too; the AVX-512 chain order reads a [`ChainBlock`].
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
pub(super) struct TokenBlock {
    pub(super) bias: [i32; 8],
    pub(super) d: f32,
    pub(super) s: f32,
    pub(super) bias_sum: i32,
}

/// What the chain order reads of a token's block (`chain_group!`): its scales and the whole
/// block's starting sum. A third of a [`TokenBlock`]'s bytes, so a pass over eight tokens
/// streams a third of the lines (the lane offsets serve the lane order only): +1.4% on the
/// reference model's prefill.
#[derive(Clone, Copy, Default)]
#[repr(C, align(16))]
pub(super) struct ChainBlock {
    d: f32,
    s: f32,
    bias_sum: i32,
}

/// A token's activation block as one kernel order reads it, prepared once per call.
trait Prepared: Copy + Default {
    /// `blk` prepared for weights offset by `c` (zero for unsigned weights).
    ///
    /// # Safety
    /// The CPU has the kernels' features.
    unsafe fn from_block<B: ActScales>(blk: &B, c: i32) -> Self;
}

impl Prepared for TokenBlock {
    #[inline(always)]
    unsafe fn from_block<B: ActScales>(blk: &B, c: i32) -> Self {
        let (d, s) = scales_f32(blk);
        let bias = if c != 0 { lane_offsets(blk, c) } else { [0; 8] };
        TokenBlock {
            bias,
            d,
            s,
            bias_sum: 0,
        }
    }
}

impl Prepared for ChainBlock {
    #[inline(always)]
    unsafe fn from_block<B: ActScales>(blk: &B, c: i32) -> Self {
        let (d, s) = scales_f32(blk);
        let bias_sum = if c != 0 {
            lane_offsets(blk, c).iter().sum()
        } else {
            0
        };
        ChainBlock { d, s, bias_sum }
    }
}

/// Prepares `xs`'s `nb` blocks, token-major (`out[t * nb + b]`), with offset `c`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn prepare<P: Prepared, B: ActScales>(nb: usize, xs: &[&[B]], c: i32, out: &mut Vec<P>) {
    out.clear();
    out.reserve(nb * xs.len());
    // Loops, not an iterator's closure, which would not inherit the target features.
    for x in xs {
        for blk in &x[..nb] {
            out.push(P::from_block(blk, c));
        }
    }
}

/// A block's two f16 scales (`d`, and `s` where the format has one) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn scales_f32<B: ActScales>(blk: &B) -> (f32, f32) {
    let (d, s) = blk.scales();
    let ds = _mm_cvtph_ps(_mm_set1_epi32(i32::from_le_bytes([d[0], d[1], s[0], s[1]])));
    (_mm_cvtss_f32(ds), _mm_cvtss_f32(_mm_movehdup_ps(ds)))
}

/// The starting value of each lane's integer sum for weights offset by `c`: `−c` × the sum of
/// the lane's four activations.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn lane_offsets<B: ActScales>(blk: &B, c: i32) -> [i32; 8] {
    let q = _mm256_loadu_si256(blk.qs().as_ptr().cast());
    let sum = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
    let mut out = [0i32; 8];
    _mm256_storeu_si256(
        out.as_mut_ptr().cast(),
        _mm256_mullo_epi32(sum, _mm256_set1_epi32(-c)),
    );
    out
}

/// Dword `j` of an activation block's quants, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn x_dword(qs: &[i8; 32], j: usize) -> __m512i {
    _mm512_set1_epi32(qs.as_ptr().cast::<i32>().add(j).read_unaligned())
}

/// Sixteen f16 values at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(in crate::quant) unsafe fn halves_at(p: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
}

/// The unsigned quant bytes of lanes `j` and `j + 4` of a group block, for each layout.
mod values {
    use super::*;

    /// Q8_0: dwords `j` and `j + 4`, offset to unsigned (w + 128).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q8_0(gb: *const u8, j: usize, _qh: __m512i) -> (__m512i, __m512i) {
        let flip = _mm512_set1_epi8(-128);
        let q = gb.add(offsets::Q8_0_QS);
        (
            _mm512_xor_si512(_mm512_loadu_si512(q.add(64 * j).cast()), flip),
            _mm512_xor_si512(_mm512_loadu_si512(q.add(64 * (j + 4)).cast()), flip),
        )
    }

    /// The nibbles of quant dword `j`: values `4j..` (low) and `16 + 4j..` (high).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    unsafe fn nibbles(q: *const u8, j: usize) -> (__m512i, __m512i) {
        let m4 = _mm512_set1_epi8(0x0F);
        let v = _mm512_loadu_si512(q.add(64 * j).cast());
        (
            _mm512_and_si512(v, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q4_0(gb: *const u8, j: usize, _qh: __m512i) -> (__m512i, __m512i) {
        nibbles(gb.add(offsets::Q4_0_QS), j)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q4_1(gb: *const u8, j: usize, _qh: __m512i) -> (__m512i, __m512i) {
        nibbles(gb.add(offsets::Q4_1_QS), j)
    }

    /// An unpacked group block (`UNPACKED`): the quant bytes of lanes `j` and `j + 4` as they
    /// were computed when it was unpacked.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn unpacked(gb: *const u8, j: usize, _qh: __m512i) -> (__m512i, __m512i) {
        let q = gb.add(super::UNPACKED_QS);
        (
            _mm512_loadu_si512(q.add(64 * j).cast()),
            _mm512_loadu_si512(q.add(64 * (j + 4)).cast()),
        )
    }

    /// Q5_0: the nibbles with their fifth bits (w + 16), from the rearranged `qh` words.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub unsafe fn q5_0(gb: *const u8, j: usize, qh: __m512i) -> (__m512i, __m512i) {
        let (lo, hi) = nibbles(gb.add(offsets::Q5_0_QS), j);
        let bit4 = _mm512_set1_epi8(0x10);
        let lo_bits = _mm512_sll_epi32(qh, _mm_cvtsi32_si128(4 - j as i32));
        let hi_bits = _mm512_srl_epi32(qh, _mm_cvtsi32_si128(j as i32));
        // a | (b & c): one ternary-logic instruction each.
        (
            _mm512_ternarylogic_epi32::<0xF8>(lo, lo_bits, bit4),
            _mm512_ternarylogic_epi32::<0xF8>(hi, hi_bits, bit4),
        )
    }
}

/// The eight lane registers of each row, summed as `hsum_float_8` sums a row's lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn hsum_lanes(a: &[__m512; 8]) -> __m512 {
    _mm512_add_ps(
        _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
        _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
    )
}

/// Defines the per-group kernel of one layout in the Lanes order: the sixteen rows of group
/// block run `g` against `T` tokens.
macro_rules! lanes_group {
    ($name:ident, $ty:expr, $xb:ty, $values:path, $minimums:literal, $signed:literal) => {
        lanes_group!(
            $name,
            group_block_bytes($ty),
            $ty == GgmlType::Q5_0,
            $xb,
            $values,
            $minimums,
            $signed
        );
    };
    ($name:ident, $gbb:expr, $has_qh:expr, $xb:ty, $values:path, $minimums:literal, $signed:literal) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        unsafe fn $name<const T: usize>(
            nb: usize,
            g: *const u8,
            x: [&[$xb]; T],
            tb: [&[TokenBlock]; T],
        ) -> [__m512; T] {
            let gbb = $gbb;
            let mut acc = [[_mm512_setzero_ps(); 8]; T];
            let mut summs = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let gb = g.add(b * gbb);
                let dw = halves_at(gb.add(offsets::D));
                let qh = if $has_qh {
                    _mm512_loadu_si512(gb.add(offsets::QH).cast())
                } else {
                    _mm512_setzero_si512()
                };
                // SAFETY (get_unchecked): the panel checked both hold nb blocks per token.
                let toks: [&TokenBlock; T] =
                    std::array::from_fn(|t| unsafe { tb[t].get_unchecked(b) });
                let xq: [&[i8; 32]; T] =
                    std::array::from_fn(|t| unsafe { &x[t].get_unchecked(b).qs });
                let d: [__m512; T] =
                    std::array::from_fn(|t| _mm512_mul_ps(dw, _mm512_set1_ps(toks[t].d)));
                if $minimums {
                    let m = halves_at(gb.add(offsets::M));
                    for t in 0..T {
                        summs[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(toks[t].s), summs[t]);
                    }
                }
                for j in 0..4 {
                    let (lo, hi) = $values(gb, j, qh);
                    for t in 0..T {
                        // Unsigned weights start from zero (no broadcast to spend).
                        let start = |l: usize| {
                            if $signed {
                                _mm512_set1_epi32(toks[t].bias[l])
                            } else {
                                _mm512_setzero_si512()
                            }
                        };
                        let il = _mm512_dpbusd_epi32(start(j), lo, x_dword(xq[t], j));
                        let ih = _mm512_dpbusd_epi32(start(j + 4), hi, x_dword(xq[t], j + 4));
                        acc[t][j] = _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(il), acc[t][j]);
                        acc[t][j + 4] =
                            _mm512_fmadd_ps(d[t], _mm512_cvtepi32_ps(ih), acc[t][j + 4]);
                    }
                }
            }
            std::array::from_fn(|t| _mm512_add_ps(hsum_lanes(&acc[t]), summs[t]))
        }
    };
}

/// A group block unpacked for a batch (`unpack_group`): the sixteen rows' f16 `d` (and 32
/// bytes unused), then the unsigned quant bytes of the eight lanes, 64 B each, ready to
/// load. A batch of several tokens unpacks each group once instead of once per pass: worth it
/// for Q5_0, whose fifth bits take seven instructions per register to put back (measured
/// +30% at 64 tokens); for Q4_1 and Q8_0 the store and reload cost what the unpacking saves.
pub(super) const UNPACKED_BYTES: usize = 64 + 8 * 64;
pub(super) const UNPACKED_QS: usize = 64;

/// Batches of at least this many tokens unpack each group once for all their passes.
const UNPACK_FROM_TOKENS: usize = 4;

/// The `nb` Q5_0 group blocks at `g`, unpacked into `dst` (`nb * UNPACKED_BYTES`) with the
/// same `values::q5_0` the direct kernel uses.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn unpack_q5_0(nb: usize, g: *const u8, dst: &mut [u8]) {
    assert!(dst.len() >= nb * UNPACKED_BYTES);
    let gbb = group_block_bytes(GgmlType::Q5_0);
    for b in 0..nb {
        let gb = g.add(b * gbb);
        let out = dst.as_mut_ptr().add(b * UNPACKED_BYTES);
        std::ptr::copy_nonoverlapping(gb.add(offsets::D), out, 32);
        let qh = _mm512_loadu_si512(gb.add(offsets::QH).cast());
        for j in 0..4 {
            let (lo, hi) = values::q5_0(gb, j, qh);
            _mm512_storeu_si512(out.add(UNPACKED_QS + 64 * j).cast(), lo);
            _mm512_storeu_si512(out.add(UNPACKED_QS + 64 * (j + 4)).cast(), hi);
        }
    }
}

lanes_group!(
    unpacked_signed_lanes,
    UNPACKED_BYTES,
    false,
    BlockQ8_0,
    values::unpacked,
    false,
    true
);

lanes_group!(
    q8_0_lanes,
    GgmlType::Q8_0,
    BlockQ8_0,
    values::q8_0,
    false,
    true
);
lanes_group!(
    q4_0_lanes,
    GgmlType::Q4_0,
    BlockQ8_0,
    values::q4_0,
    false,
    true
);
lanes_group!(
    q4_1_lanes,
    GgmlType::Q4_1,
    BlockQ8_1,
    values::q4_1,
    true,
    false
);
lanes_group!(
    q5_0_lanes,
    GgmlType::Q5_0,
    BlockQ8_0,
    values::q5_0,
    false,
    true
);

/// Defines the per-group kernel of one layout in the chain order (`Order::Chain`, and Q4_0's
/// `Order::Repacked`, which is the same): each row's whole-block integer sum (the eight lane
/// sums in one register, started at the whole block's offset), then one fused chain
/// `acc + int·(d_w·d_x)` over the blocks; Q4_1 adds its fused `m·s` chain at the end. A
/// third of the lane order's vector work, for small batches, where that work (not memory)
/// bounds a token's cost.
macro_rules! chain_group {
    ($name:ident, $ty:expr, $xb:ty, $values:path, $minimums:literal) => {
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        unsafe fn $name<const T: usize>(
            nb: usize,
            g: *const u8,
            x: [&[$xb]; T],
            tb: [&[ChainBlock]; T],
        ) -> [__m512; T] {
            let gbb = group_block_bytes($ty);
            let mut acc = [_mm512_setzero_ps(); T];
            let mut summs = [_mm512_setzero_ps(); T];
            for b in 0..nb {
                let gb = g.add(b * gbb);
                let dw = halves_at(gb.add(offsets::D));
                let qh = if $ty == GgmlType::Q5_0 {
                    _mm512_loadu_si512(gb.add(offsets::QH).cast())
                } else {
                    _mm512_setzero_si512()
                };
                // Plain loops and macros, not `array::from_fn` or closures: those were not
                // inlined here (a call per token and block, 6% of a prefill).
                // SAFETY (get_unchecked): the entry checked both hold nb blocks per token.
                macro_rules! toks {
                    ($t:expr) => {
                        unsafe { tb[$t].get_unchecked(b) }
                    };
                }
                macro_rules! xq {
                    ($t:expr) => {
                        unsafe { &x[$t].get_unchecked(b).qs }
                    };
                }
                let mut sum = [_mm512_setzero_si512(); T];
                for t in 0..T {
                    // Q4_1's quants are unsigned already: no offset to start from.
                    if $ty != GgmlType::Q4_1 {
                        sum[t] = _mm512_set1_epi32(toks!(t).bias_sum);
                    }
                    // The activations and scales two blocks ahead: a pass reads eight tokens'
                    // rows at once, more streams than the hardware prefetchers follow.
                    _mm_prefetch::<_MM_HINT_T0>(x[t].as_ptr().wrapping_add(b + 2).cast());
                    _mm_prefetch::<_MM_HINT_T0>(tb[t].as_ptr().wrapping_add(b + 2).cast());
                }
                for j in 0..4 {
                    let (lo, hi) = $values(gb, j, qh);
                    for t in 0..T {
                        sum[t] = _mm512_dpbusd_epi32(sum[t], lo, x_dword(xq!(t), j));
                        sum[t] = _mm512_dpbusd_epi32(sum[t], hi, x_dword(xq!(t), j + 4));
                    }
                }
                if $minimums {
                    let m = halves_at(gb.add(offsets::M));
                    for t in 0..T {
                        summs[t] = _mm512_fmadd_ps(m, _mm512_set1_ps(toks!(t).s), summs[t]);
                    }
                }
                for t in 0..T {
                    let dd = _mm512_mul_ps(dw, _mm512_set1_ps(toks!(t).d));
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[t]), dd, acc[t]);
                }
            }
            if $minimums {
                for t in 0..T {
                    acc[t] = _mm512_add_ps(acc[t], summs[t]);
                }
            }
            acc
        }
    };
}

chain_group!(q4_0_chains, GgmlType::Q4_0, BlockQ8_0, values::q4_0, false);
chain_group!(q4_1_chains, GgmlType::Q4_1, BlockQ8_1, values::q4_1, true);
chain_group!(q5_0_chains, GgmlType::Q5_0, BlockQ8_0, values::q5_0, false);
chain_group!(q8_0_chains, GgmlType::Q8_0, BlockQ8_0, values::q8_0, false);

thread_local! {
    /// Per-thread scratch for the prepared activation blocks and an unpacked group (reused,
    /// never shrunk).
    static SCRATCH: std::cell::RefCell<(Vec<TokenBlock>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
    /// The chain order's prepared blocks (and an unused unpacking scratch).
    static CHAIN_SCRATCH: std::cell::RefCell<(Vec<ChainBlock>, Vec<u8>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

impl Out {
    /// Stores the sixteen rows of group `g` for token `t`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
    pub(crate) unsafe fn put(self, t: usize, g: usize, v: __m512) {
        _mm512_storeu_ps(self.ptr.add(t * self.stride + g * GROUP), v)
    }
}

/// Defines a kernel entry: tokens in passes of up to the last of the pass sizes `[$n]` (two
/// in the lane order, whose eight accumulators a token fill sixteen of the 32 registers;
/// eight in the chain order, an accumulator and an integer sum a token), groups outside (a
/// group's weights come from memory once, later passes find them in L1). With an `$unpack`
/// for the layout, a batch of
/// [`UNPACK_FROM_TOKENS`] or more unpacks each group once and runs its passes with
/// `$unpacked`.
macro_rules! packed_kernel {
    ($name:ident, $group:ident, $ty:expr, $xb:ty, $offset:expr $(, $unpack:ident, $unpacked:ident)?) => {
        packed_kernel!(@entry $name, $group, $ty, $xb, $offset, TokenBlock, SCRATCH, [1 2] $(, $unpack, $unpacked)?);
    };
    (chain $name:ident, $group:ident, $ty:expr, $xb:ty, $offset:expr) => {
        packed_kernel!(@entry $name, $group, $ty, $xb, $offset, ChainBlock, CHAIN_SCRATCH, [1 2 3 4 5 6 7 8]);
    };
    (@entry $name:ident, $group:ident, $ty:expr, $xb:ty, $offset:expr, $blk:ty, $scratch:ident, [$($n:literal)+] $(, $unpack:ident, $unpacked:ident)?) => {
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
        pub(crate) unsafe fn $name(
            nb: usize,
            w: &[u8],
            groups: usize,
            x: &[u8],
            toks: usize,
            out: Out,
        ) {
            let gb = nb * group_block_bytes($ty);
            let x = checked::<$xb>($ty, nb, w, groups, x, toks);
            let xs: Vec<&[$xb]> = (0..toks).map(|t| &x[t * nb..(t + 1) * nb]).collect();
            $scratch.with_borrow_mut(|(tbs, _unpacked)| {
                prepare(nb, &xs, $offset, tbs);
                // Every pass of group `g`, whose blocks are at `gp`, by `kernel`.
                macro_rules! passes {
                    ($g:expr, $gp:expr, $kernel:ident) => {{
                        let (g, gp) = ($g, $gp);
                        // Passes as even as the pass size allows (five tokens as three and
                        // two, not four and one: a pass's loads cost the same for any size).
                        let most = [$($n),+].len();
                        let size = toks.div_ceil(toks.div_ceil(most));
                        let mut t0 = 0;
                        while t0 < toks {
                            let n = (toks - t0).min(size);
                            macro_rules! pass {
                                ($t:literal) => {{
                                    // Loops, not `array::from_fn`, whose closures were not
                                    // inlined (13% of a prefill's samples).
                                    let mut xt: [&[$xb]; $t] = [&[]; $t];
                                    let mut bt: [&[$blk]; $t] = [&[]; $t];
                                    for i in 0..$t {
                                        xt[i] = xs[t0 + i];
                                        bt[i] = &tbs[(t0 + i) * nb..(t0 + i + 1) * nb];
                                    }
                                    for (i, v) in $kernel::<$t>(nb, gp, xt, bt).into_iter().enumerate() {
                                        out.put(t0 + i, g, v);
                                    }
                                }};
                            }
                            match n {
                                $($n => pass!($n),)+
                                _ => unreachable!("a pass holds at most {most} tokens"),
                            }
                            t0 += n;
                        }
                    }};
                }
                $(
                    if toks >= UNPACK_FROM_TOKENS {
                        _unpacked.resize(nb * UNPACKED_BYTES, 0);
                        for g in 0..groups {
                            $unpack(nb, w.as_ptr().add(g * gb), _unpacked);
                            passes!(g, _unpacked.as_ptr(), $unpacked);
                        }
                        return;
                    }
                )?
                for g in 0..groups {
                    passes!(g, w.as_ptr().add(g * gb), $group);
                }
            });
        }
    };
}

packed_kernel!(q8_0, q8_0_lanes, GgmlType::Q8_0, BlockQ8_0, 128);
packed_kernel!(q4_0, q4_0_lanes, GgmlType::Q4_0, BlockQ8_0, 8);
packed_kernel!(chain q4_0_chain, q4_0_chains, GgmlType::Q4_0, BlockQ8_0, 8);
packed_kernel!(chain q4_1_chain, q4_1_chains, GgmlType::Q4_1, BlockQ8_1, 0);
packed_kernel!(chain q5_0_chain, q5_0_chains, GgmlType::Q5_0, BlockQ8_0, 16);
packed_kernel!(chain q8_0_chain, q8_0_chains, GgmlType::Q8_0, BlockQ8_0, 128);
packed_kernel!(q4_1, q4_1_lanes, GgmlType::Q4_1, BlockQ8_1, 0);
packed_kernel!(
    q5_0,
    q5_0_lanes,
    GgmlType::Q5_0,
    BlockQ8_0,
    16,
    unpack_q5_0,
    unpacked_signed_lanes
);
