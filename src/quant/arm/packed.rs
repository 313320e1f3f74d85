//! NEON kernels over packed groups (`packed`) of the legacy quants Q4_0, Q4_1, Q5_0 and Q8_0,
//! in the chain order (`Order::Chain`), and what the packed K-quant kernels (`packed_k`) share
//! with them: the integer step of each level, the scale conversions, the stores.
//!
//! The packed layout holds quant dword `j` of a group's sixteen rows in 64 bytes, so one
//! 128-bit load of its quarter `q` is dword `j` of rows `4q..4q+4`: the by-element `sdot`
//! (`sdot vd.4s, vn.16b, vm.4b[lane]`) multiplies each row's four bytes by the token's dword
//! `lane` of the sixteen activation bytes in `vm`, adding each row's four products to its i32
//! lane. Without dotprod, `vmull_s8` and pairwise adds compute the same four sums. Both are
//! exact. The weights enter as stored (Q4_0's nibbles 0..15, Q5_0's values 0..31, Q8_0's
//! signed bytes, Q4_1's nibbles), and each block's integer sum starts at −offset × the sum of
//! the token's 32 quants (Q4_0: 8, Q5_0: 16; computed once per call), so it is exactly the
//! reference's Σ (value − offset)·x without a subtraction per weight byte.
//!
//! The float epilogue is `order::chain_step` for four rows at a time: per (row, token) one
//! fused chain `acc + int·(d_w·d_x)` over the blocks (`vfmaq_f32` is the same fused operation
//! as `f32::mul_add`), Q4_1 adding its fused `m·s` chain at the end, so every output is
//! `order::dot(ty, Order::Chain, ..)` bit for bit (tested in `gemm`).
//!
//! A pass carries up to [`PASS_TOKENS`] tokens, so each weight load serves all of them; a
//! group block (hundreds of bytes) stays in L1 while its four quarters are computed one after
//! the other, which keeps each token's live accumulators to one integer and one float
//! register.

use std::arch::aarch64::*;
use std::arch::asm;

use crate::quant::arm::packed_i8mm::mmla_chains;
use crate::quant::formats::blocks::*;
use crate::quant::formats::packed::{offsets, Out, GROUP};
use crate::quant::GgmlType;

/// Tokens one pass over a group block carries.
pub(super) const PASS_TOKENS: usize = 2;

/// `acc + Σ` of each row's four bytes of `w` (four rows) times dword `lane` of `x`, with the
/// by-element `sdot`. Its intrinsic is not stable in Rust, hence `asm!`; the lane is an
/// immediate, so each value has its own instruction (the match folds away once the callers'
/// loops are unrolled).
#[inline]
#[target_feature(enable = "neon,dotprod")]
pub(super) unsafe fn sdot_lane(
    acc: int32x4_t,
    w: int8x16_t,
    x: int8x16_t,
    lane: usize,
) -> int32x4_t {
    let mut acc = acc;
    macro_rules! sdot {
        ($lane:literal) => {
            // SAFETY: `sdot` reads two vector registers and writes the accumulator; the CPU
            // has it (only the dotprod kernels, handed out after detection, reach here).
            unsafe {
                asm!(
                    concat!("sdot {acc:v}.4s, {w:v}.16b, {x:v}.4b[", $lane, "]"),
                    acc = inout(vreg) acc,
                    w = in(vreg) w,
                    x = in(vreg) x,
                    options(pure, nomem, nostack)
                )
            }
        };
    }
    match lane & 3 {
        0 => sdot!(0),
        1 => sdot!(1),
        2 => sdot!(2),
        _ => sdot!(3),
    }
    acc
}

/// [`sdot_lane`] with baseline NEON: the dword broadcast, eight products per `vmull_s8` (two
/// rows), each row's four summed pairwise (|product| ≤ 2^14, so nothing overflows).
#[inline]
#[target_feature(enable = "neon")]
pub(super) unsafe fn mull_lane(
    acc: int32x4_t,
    w: int8x16_t,
    x: int8x16_t,
    lane: usize,
) -> int32x4_t {
    let x32 = vreinterpretq_s32_s8(x);
    let b = vreinterpretq_s8_s32(match lane & 3 {
        0 => vdupq_laneq_s32::<0>(x32),
        1 => vdupq_laneq_s32::<1>(x32),
        2 => vdupq_laneq_s32::<2>(x32),
        _ => vdupq_laneq_s32::<3>(x32),
    });
    let p0 = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(b)));
    let p1 = vpaddlq_s16(vmull_high_s8(w, b));
    vaddq_s32(acc, vpaddq_s32(p0, p1))
}

/// Four f16 values at `p` as f32 (`fcvtl`, exact; its intrinsic takes the unstable `f16`).
#[inline(always)]
pub(super) unsafe fn halves4(p: *const u8) -> float32x4_t {
    let h = vld1_u8(p);
    let out: float32x4_t;
    // SAFETY: `fcvtl` is baseline AArch64 SIMD; it reads and writes registers only.
    unsafe {
        asm!(
            "fcvtl {out:v}.4s, {h:v}.4h",
            out = lateout(vreg) out,
            h = in(vreg) h,
            options(pure, nomem, nostack)
        )
    };
    out
}

/// Four bytes at `p` (one per row of a quarter) as i32 lanes, zero-extended.
#[inline(always)]
pub(super) unsafe fn bytes_u32x4(p: *const u8) -> int32x4_t {
    let v = vreinterpret_u8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned()));
    vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(v))))
}

/// Four bytes at `p` as i32 lanes, sign-extended.
#[inline(always)]
pub(super) unsafe fn bytes_i32x4(p: *const u8) -> int32x4_t {
    let v = vreinterpret_s8_u32(vdup_n_u32(p.cast::<u32>().read_unaligned()));
    vmovl_s16(vget_low_s16(vmovl_s8(v)))
}

/// Sixteen bytes at `p` as signed bytes.
#[inline(always)]
pub(super) unsafe fn load_i8(p: *const u8) -> int8x16_t {
    vld1q_s8(p.cast())
}

impl Out {
    /// Stores `v`, rows `4q..4q+4` of group `g`, for token `t`.
    #[inline(always)]
    pub(super) unsafe fn put_quarter(self, t: usize, g: usize, q: usize, v: float32x4_t) {
        vst1q_f32(self.ptr.add(t * self.stride + g * GROUP + 4 * q), v)
    }

    /// Stores group `g`'s sixteen rows of each of the tokens `t0..` of a pass.
    #[inline(always)]
    pub(super) unsafe fn put_pass<const T: usize>(
        self,
        t0: usize,
        g: usize,
        v: [[float32x4_t; 4]; T],
    ) {
        for (t, rows) in v.into_iter().enumerate() {
            for (q, r) in rows.into_iter().enumerate() {
                self.put_quarter(t0 + t, g, q, r);
            }
        }
    }
}

/// Runs `$pass!(t0, T)` over a batch of `$toks` tokens in passes of at most [`PASS_TOKENS`],
/// as even as that allows (three tokens as two and one).
macro_rules! in_passes {
    ($toks:expr, $pass:ident) => {{
        let toks: usize = $toks;
        let size = toks.div_ceil(toks.div_ceil($crate::quant::arm::packed::PASS_TOKENS));
        let mut t0 = 0;
        while t0 < toks {
            let n = (toks - t0).min(size);
            match n {
                1 => $pass!(t0, 1),
                _ => $pass!(t0, 2),
            }
            t0 += n;
        }
    }};
}
pub(super) use in_passes;

/// An activation block of the legacy quants: its quants and its f32 scales (`d`, and Q8_1's
/// `s`), converted once per call.
pub(super) trait ActBlock: Block {
    fn qs(&self) -> &[i8; 32];
    fn scales(&self) -> [f32; 2];
}

/// What a pass needs of a token's activation block beside its quants, prepared once per call:
/// its scales as f32 and where each row's integer sum starts (−offset × Σ quants).
#[derive(Clone, Copy)]
pub(super) struct BlockScales {
    pub d: f32,
    pub s: f32,
    pub start: i32,
}

impl BlockScales {
    pub(super) fn of<L: Legacy>(x: &L::X) -> Self {
        let [d, s] = x.scales();
        let start = match L::OFFSET {
            0 => 0,
            o => -o * x.qs().iter().map(|&q| i32::from(q)).sum::<i32>(),
        };
        BlockScales { d, s, start }
    }
}

impl ActBlock for BlockQ8_0 {
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    fn scales(&self) -> [f32; 2] {
        [f16_to_f32(self.d), 0.0]
    }
}

impl ActBlock for BlockQ8_1 {
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    fn scales(&self) -> [f32; 2] {
        [f16_to_f32(self.d), f16_to_f32(self.s)]
    }
}

/// A legacy layout: its type, activation block, and the stored quants of quarter `q` of dword
/// `j` of a group block: `(values 4j.., values 16 + 4j..)` (for Q8_0, dwords `j` and `j + 4`),
/// which pair with the token's dwords `j` and `j + 4`.
pub(super) trait Legacy {
    const TY: GgmlType;
    /// Whether the rows have minimums (Q4_1's `m`, times the token's `s`).
    const MINIMUMS: bool = false;
    /// What the format subtracts from every stored value (`BlockScales::start` takes it off
    /// each block's integer sum at once).
    const OFFSET: i32 = 0;
    type X: ActBlock;
    unsafe fn values(gb: *const u8, j: usize, q: usize) -> (int8x16_t, int8x16_t);
}

/// The nibbles of quarter `q` of quant dword `j` at `qs` as bytes: (low, high).
#[inline(always)]
unsafe fn nibbles(qs: *const u8, j: usize, q: usize) -> (uint8x16_t, uint8x16_t) {
    let v = vld1q_u8(qs.add(64 * j + 16 * q));
    (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q8_0;

impl Legacy for Q4_0 {
    const TY: GgmlType = GgmlType::Q4_0;
    const OFFSET: i32 = 8;
    type X = BlockQ8_0;
    #[inline(always)]
    unsafe fn values(gb: *const u8, j: usize, q: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(gb.add(offsets::Q4_0_QS), j, q);
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

impl Legacy for Q4_1 {
    const TY: GgmlType = GgmlType::Q4_1;
    const MINIMUMS: bool = true;
    type X = BlockQ8_1;
    /// The nibbles as they are: 0..15 is the same as signed bytes.
    #[inline(always)]
    unsafe fn values(gb: *const u8, j: usize, q: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(gb.add(offsets::Q4_1_QS), j, q);
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

impl Legacy for Q5_0 {
    const TY: GgmlType = GgmlType::Q5_0;
    const OFFSET: i32 = 16;
    type X = BlockQ8_0;
    /// The nibbles with their fifth bits from the rearranged `qh` words (`packed`): bit `j`
    /// of a byte belongs to its low value, bit `4 + j` to its high one; byte shifts move
    /// each to bit 4, and a bit select (`bsl`) puts it beside the nibble.
    #[inline(always)]
    unsafe fn values(gb: *const u8, j: usize, q: usize) -> (int8x16_t, int8x16_t) {
        let (lo, hi) = nibbles(gb.add(offsets::Q5_0_QS), j, q);
        let qh = vld1q_u8(gb.add(offsets::QH + 16 * q));
        let bit4 = vdupq_n_u8(0x10);
        let lo = vbslq_u8(bit4, vshlq_u8(qh, vdupq_n_s8(4 - j as i8)), lo);
        let hi = vbslq_u8(bit4, vshlq_u8(qh, vdupq_n_s8(-(j as i8))), hi);
        (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
    }
}

impl Legacy for Q8_0 {
    const TY: GgmlType = GgmlType::Q8_0;
    type X = BlockQ8_0;
    #[inline(always)]
    unsafe fn values(gb: *const u8, j: usize, q: usize) -> (int8x16_t, int8x16_t) {
        let qs = gb.add(offsets::Q8_0_QS + 16 * q);
        (load_i8(qs.add(64 * j)), load_i8(qs.add(64 * (j + 4))))
    }
}

/// The float chains of a pass: per token and quarter one register of four rows' `acc` (and
/// Q4_1's `summs`), stepped as `order::chain_step` (and `m·s`, fused) once per block.
pub(super) struct Chains<const T: usize> {
    acc: [[float32x4_t; 4]; T],
    summs: [[float32x4_t; 4]; T],
}

impl<const T: usize> Chains<T> {
    #[inline(always)]
    pub(super) unsafe fn new() -> Self {
        let zero = [[vdupq_n_f32(0.0); 4]; T];
        Chains {
            acc: zero,
            summs: zero,
        }
    }

    /// One block's step for quarter `q` of group block `gb`: each token's integer sums and
    /// scales (`[d, s]`).
    #[inline(always)]
    pub(super) unsafe fn step<L: Legacy>(
        &mut self,
        gb: *const u8,
        q: usize,
        sum: [int32x4_t; T],
        xs: &[BlockScales; T],
    ) {
        let dw = halves4(gb.add(offsets::D + 8 * q));
        for t in 0..T {
            let dd = vmulq_n_f32(dw, xs[t].d);
            self.acc[t][q] = vfmaq_f32(self.acc[t][q], vcvtq_f32_s32(sum[t]), dd);
        }
        if L::MINIMUMS {
            let m = halves4(gb.add(offsets::M + 8 * q));
            for (summs, x) in self.summs.iter_mut().zip(xs) {
                summs[q] = vfmaq_n_f32(summs[q], m, x.s);
            }
        }
    }

    /// The rows' results: `acc`, plus `summs` where the layout has minimums.
    #[inline(always)]
    pub(super) unsafe fn finish<L: Legacy>(self) -> [[float32x4_t; 4]; T] {
        let mut acc = self.acc;
        if L::MINIMUMS {
            for (rows, summs) in acc.iter_mut().zip(&self.summs) {
                for (r, &m) in rows.iter_mut().zip(summs) {
                    *r = vaddq_f32(*r, m);
                }
            }
        }
        acc
    }
}

thread_local! {
    /// Per-thread scratch for the activation blocks' [`BlockScales`] (reused, never shrunk).
    static SCALES: std::cell::RefCell<Vec<BlockScales>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// The packed kernels of one level, `$dot` its integer step ([`sdot_lane`] or
/// [`mull_lane`]), compiled for `$features`; `$pair`, where given, computes passes of two
/// tokens (the i8mm level's `smmla`).
macro_rules! level {
    ($module:ident, $features:literal, $dot:ident) => {
        level!($module, $features, $dot, chains);
    };
    ($module:ident, $features:literal, $dot:ident, $pair:ident) => {
        pub(in crate::quant) mod $module {
            use super::*;
            use crate::quant::formats::packed::{checked, group_block_bytes, PackedFn};
            use crate::quant::order::Order;

            /// This level's packed kernel for `ty` in `order`: the chain order only.
            pub(in crate::quant) fn kernel(ty: GgmlType, order: Order) -> Option<PackedFn> {
                use crate::quant::arm::packed_k::$module as k;
                use GgmlType as G;
                Some(match (ty, order) {
                    (G::Q4_0, Order::Chain) => chain::<Q4_0>,
                    (G::Q4_1, Order::Chain) => chain::<Q4_1>,
                    (G::Q5_0, Order::Chain) => chain::<Q5_0>,
                    (G::Q8_0, Order::Chain) => chain::<Q8_0>,
                    (G::Q4_K, Order::Chain) => k::q4_k_chain,
                    (G::Q6_K, Order::Chain) => k::q6_k_chain,
                    _ => return None,
                })
            }

            /// Quarter `q` of group block `gb`: each token's whole-block integer sums, from
            /// `start`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn block_sums<L: Legacy, const T: usize>(
                gb: *const u8,
                q: usize,
                x: &[[int8x16_t; 2]; T],
                start: [int32x4_t; T],
            ) -> [int32x4_t; T] {
                let mut sum = start;
                for j in 0..4 {
                    let (lo, hi) = L::values(gb, j, q);
                    for t in 0..T {
                        sum[t] = $dot(sum[t], lo, x[t][0], j);
                        sum[t] = $dot(sum[t], hi, x[t][1], j);
                    }
                }
                sum
            }

            /// The sixteen rows of the `nb` group blocks at `g` against `T` tokens (their
            /// blocks and scales), in the chain order.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn chains<L: Legacy, const T: usize>(
                nb: usize,
                g: *const u8,
                x: [&[L::X]; T],
                scales: [&[BlockScales]; T],
            ) -> [[float32x4_t; 4]; T] {
                let gbb = group_block_bytes(L::TY);
                let mut chains = Chains::<T>::new();
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    // SAFETY (get_unchecked): the entry checked every token holds nb blocks.
                    let xq: [[int8x16_t; 2]; T] = std::array::from_fn(|t| {
                        let qs = unsafe { x[t].get_unchecked(b) }.qs().as_ptr().cast::<u8>();
                        unsafe { [load_i8(qs), load_i8(qs.add(16))] }
                    });
                    let xs: [BlockScales; T] =
                        std::array::from_fn(|t| unsafe { *scales[t].get_unchecked(b) });
                    let start = xs.map(|x| vdupq_n_s32(x.start));
                    for q in 0..4 {
                        let sums = block_sums::<L, T>(gb, q, &xq, start);
                        chains.step::<L>(gb, q, sums, &xs);
                    }
                }
                chains.finish::<L>()
            }

            /// Two tokens' pass ([`chains`], or `$pair` where the level has its own).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn chains_2<L: Legacy>(
                nb: usize,
                g: *const u8,
                x: [&[L::X]; 2],
                scales: [&[BlockScales]; 2],
            ) -> [[float32x4_t; 4]; 2] {
                $pair::<L, 2>(nb, g, x, scales)
            }

            /// A legacy layout in the chain order (see [`PackedFn`]): groups outside, tokens in
            /// passes inside (a group's weights come from memory once, later passes find them
            /// in L1).
            #[target_feature(enable = $features)]
            unsafe fn chain<L: Legacy>(
                nb: usize,
                w: &[u8],
                groups: usize,
                x: &[u8],
                toks: usize,
                out: Out,
            ) {
                let x = checked::<L::X>(L::TY, nb, w, groups, x, toks);
                let gb = nb * group_block_bytes(L::TY);
                SCALES.with_borrow_mut(|sc| {
                    sc.clear();
                    sc.extend(x[..toks * nb].iter().map(BlockScales::of::<L>));
                    for g in 0..groups {
                        let gp = w.as_ptr().add(g * gb);
                        macro_rules! pass {
                                    ($t0:expr, $t:tt) => {{
                                        let xt: [&[L::X]; $t] =
                                            std::array::from_fn(|i| &x[($t0 + i) * nb..][..nb]);
                                        let st: [&[BlockScales]; $t] =
                                            std::array::from_fn(|i| &sc[($t0 + i) * nb..][..nb]);
                                        out.put_pass($t0, g, pass!(@run $t, xt, st));
                                    }};
                                    (@run 1, $xt:ident, $st:ident) => {
                                        chains::<L, 1>(nb, gp, $xt, $st)
                                    };
                                    (@run 2, $xt:ident, $st:ident) => {
                                        chains_2::<L>(nb, gp, $xt, $st)
                                    };
                                }
                        in_passes!(toks, pass);
                    }
                });
            }
        }
    };
}

level!(neon, "neon", mull_lane);
level!(dotprod, "neon,dotprod", sdot_lane);
level!(i8mm, "neon,dotprod,i8mm", sdot_lane, mmla_chains);
