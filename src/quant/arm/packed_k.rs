//! NEON kernels over packed K-quant groups (`packed`): Q4_K and Q6_K in the chain order
//! (`Order::Chain`: Q4_K's is the peer's repacked one-token step per super-block, Q6_K's its
//! tiled step), each bit-identical to `order::dot` for the same pair (tested in `gemm`).
//!
//! As in `packed`, a 128-bit register holds four rows of a group's quant dword and the integer
//! step ([`sdot_lane`], or [`mull_lane`] without dotprod) adds each row's four products to its
//! i32 lane. The integer parts (a sub-block's sum times its scale, the minimums times the
//! activations' block sums) are exact; the float steps are the reference's, four rows at a
//! time:
//! - Q4_K: `acc + s·(d·dx)` and `acc_min + m·(dmin·dx)`, fused, subtracted at the end;
//! - Q6_K: `acc + (d·s)·dx`, fused, with `d·s` rounded first.
//!
//! Q6_K's quants (0..63) enter unsigned; each 16-value sub-block's sum starts at
//! −32 × its activations' sum, the −32 of every quant.

use std::arch::aarch64::*;

use crate::quant::arm::packed::{
    bytes_i32x4, bytes_u32x4, halves4, in_passes, load_i8, mull_lane, sdot_lane,
};
use crate::quant::formats::blocks::*;
use crate::quant::formats::packed::{checked, group_block_bytes, offsets, Out, GROUP};
use crate::quant::GgmlType;

/// The 6-bit quants of quarter `q` of lane group `l` of half `h` (quarters `c` = 0..4 of the
/// half: values `128h + 32c + 4l..`), from the group block's `ql` and `qh` dwords: the values
/// ggml assembles, each from a nibble of `ql` and two bits of `qh`, here with shift-and-insert
/// steps (`sli`, `sri`: a shift and an or in one), 8 steps for the 4 vectors instead of 15.
/// Those insert two bits too many from `qh` into three of them, cleared by the mask.
#[inline(always)]
unsafe fn q6_k_values(gb: *const u8, h: usize, l: usize, q: usize) -> [int8x16_t; 4] {
    let m63 = vdupq_n_u8(63);
    let at = |base: usize, dword: usize| unsafe { vld1q_u8(gb.add(base + 64 * dword + 16 * q)) };
    let ql1 = at(offsets::Q6_K_QL, 16 * h + l);
    let ql2 = at(offsets::Q6_K_QL, 16 * h + 8 + l);
    let qh = at(offsets::Q6_K_QH, 8 * h + l);
    // qh's bit pairs (0,1), (2,3), (4,5), (6,7) are the high bits of values 0, 1, 2, 3.
    let qh2 = vshrq_n_u8::<2>(qh);
    [
        vandq_u8(vsliq_n_u8::<4>(ql1, qh), m63),
        vandq_u8(vsliq_n_u8::<4>(ql2, qh2), m63),
        vandq_u8(vsriq_n_u8::<4>(qh, ql1), m63),
        // qh2's top two bits are zero: nothing to clear.
        vsriq_n_u8::<4>(qh2, ql2),
    ]
    .map(|v| vreinterpretq_s8_u8(v))
}

/// Σ min·(Σ of its 32 activations) over a Q4_K super-block, for quarter `q`'s four rows.
#[inline(always)]
unsafe fn q4_k_minimums(gb: *const u8, q: usize, x: &BlockQ8K) -> int32x4_t {
    let mut m = vdupq_n_s32(0);
    for k in 0..8 {
        let mins = bytes_u32x4(gb.add(offsets::Q4_K_MIN + GROUP * k + 4 * q));
        let bsum32 = x.bsum(2 * k) as i32 + x.bsum(2 * k + 1) as i32;
        m = vmlaq_n_s32(m, mins, bsum32);
    }
    m
}

/// The kernels of one level, `$dot` its integer step.
macro_rules! level {
    ($module:ident, $features:literal, $dot:ident) => {
        pub(in crate::quant) mod $module {
            use super::*;

            /// Quarter `q` of a Q4_K group block: each token's Σ scale·Σ q·x over the
            /// super-block (the nibbles 0..15 as signed bytes).
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q4_k_sums<const T: usize>(
                gb: *const u8,
                q: usize,
                x: [&BlockQ8K; T],
            ) -> [int32x4_t; T] {
                let mut s = [vdupq_n_s32(0); T];
                for j in 0..4 {
                    // The token's values 64j.. (low nibbles) and 64j + 32.. (high).
                    let xr: [[int8x16_t; 4]; T] = std::array::from_fn(|t| {
                        let qs = x[t].qs.as_ptr().cast::<u8>();
                        std::array::from_fn(|r| unsafe { load_i8(qs.add(64 * j + 16 * r)) })
                    });
                    let mut dl = [vdupq_n_s32(0); T];
                    let mut dh = [vdupq_n_s32(0); T];
                    // Quant dwords 8j + 4·half + lane against the token's dwords 4·half + lane.
                    // Each lane is written out: the compiler leaves a loop over them rolled, the
                    // lane a run-time branch and the token's registers on the stack.
                    for half in 0..2 {
                        let at = offsets::Q4_K_QS + 64 * (8 * j + 4 * half) + 16 * q;
                        let v = [0, 1, 2, 3].map(|l| unsafe { vld1q_u8(gb.add(at + 64 * l)) });
                        let lo = v.map(|v| vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F))));
                        let hi = v.map(|v| vreinterpretq_s8_u8(vshrq_n_u8::<4>(v)));
                        for t in 0..T {
                            let (xl, xh) = (xr[t][half], xr[t][2 + half]);
                            dl[t] = $dot($dot(dl[t], lo[0], xl, 0), lo[1], xl, 1);
                            dl[t] = $dot($dot(dl[t], lo[2], xl, 2), lo[3], xl, 3);
                            dh[t] = $dot($dot(dh[t], hi[0], xh, 0), hi[1], xh, 1);
                            dh[t] = $dot($dot(dh[t], hi[2], xh, 2), hi[3], xh, 3);
                        }
                    }
                    let sc = |k: usize| unsafe {
                        bytes_u32x4(gb.add(offsets::Q4_K_SC + GROUP * k + 4 * q))
                    };
                    let (sc_lo, sc_hi) = (sc(2 * j), sc(2 * j + 1));
                    for t in 0..T {
                        s[t] = vmlaq_s32(vmlaq_s32(s[t], dl[t], sc_lo), dh[t], sc_hi);
                    }
                }
                s
            }

            /// Q4_K × Q8_K, `T` tokens: the two chains per row, a step per super-block.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q4_k_chains<const T: usize>(
                nb: usize,
                g: *const u8,
                x: [&[BlockQ8K]; T],
            ) -> [[float32x4_t; 4]; T] {
                let gbb = group_block_bytes(GgmlType::Q4_K);
                let mut acc = [[vdupq_n_f32(0.0); 4]; T];
                let mut acc_min = [[vdupq_n_f32(0.0); 4]; T];
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    // SAFETY: the entry checked every token holds nb super-blocks.
                    let xb: [&BlockQ8K; T] =
                        std::array::from_fn(|t| unsafe { x[t].get_unchecked(b) });
                    for q in 0..4 {
                        let s = q4_k_sums::<T>(gb, q, xb);
                        let dw = halves4(gb.add(offsets::D + 8 * q));
                        let dmin = halves4(gb.add(offsets::Q4_K_DMIN + 8 * q));
                        for t in 0..T {
                            let m = q4_k_minimums(gb, q, xb[t]);
                            let (sf, mf) = (vcvtq_f32_s32(s[t]), vcvtq_f32_s32(m));
                            let dx = xb[t].d();
                            acc[t][q] = vfmaq_f32(acc[t][q], sf, vmulq_n_f32(dw, dx));
                            acc_min[t][q] = vfmaq_f32(acc_min[t][q], mf, vmulq_n_f32(dmin, dx));
                        }
                    }
                }
                std::array::from_fn(|t| {
                    std::array::from_fn(|q| vsubq_f32(acc[t][q], acc_min[t][q]))
                })
            }

            /// Quarter `q` of half `h` of a Q6_K group block: each token's
            /// Σ scale·Σ (q − 32)·x over the half's eight sub-blocks of 16.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q6_k_half<const T: usize>(
                gb: *const u8,
                h: usize,
                q: usize,
                x: [&BlockQ8K; T],
            ) -> [int32x4_t; T] {
                // Sub-block 8h + 2c + k (quarter c, k = l / 4), started at −32·bsum.
                let mut sub: [[[int32x4_t; 2]; 4]; T] = std::array::from_fn(|t| {
                    std::array::from_fn(|c| {
                        std::array::from_fn(|k| {
                            vdupq_n_s32(-32 * x[t].bsum(8 * h + 2 * c + k) as i32)
                        })
                    })
                });
                // Lane groups 4k + lane against the token's dwords `lane` of its 16 values
                // 128h + 32c + 16k; each lane written out (see `q4_k_sums`).
                for k in 0..2 {
                    let xr: [[int8x16_t; 4]; T] = std::array::from_fn(|t| {
                        let qs = x[t].qs.as_ptr().cast::<u8>();
                        [0, 1, 2, 3].map(|c| unsafe { load_i8(qs.add(128 * h + 32 * c + 16 * k)) })
                    });
                    macro_rules! lane {
                        ($lane:literal) => {
                            let v = q6_k_values(gb, h, 4 * k + $lane, q);
                            for c in 0..4 {
                                for t in 0..T {
                                    sub[t][c][k] = $dot(sub[t][c][k], v[c], xr[t][c], $lane);
                                }
                            }
                        };
                    }
                    lane!(0);
                    lane!(1);
                    lane!(2);
                    lane!(3);
                }
                let mut s = [vdupq_n_s32(0); T];
                for k in 0..8 {
                    let at = offsets::Q6_K_SC + GROUP * (8 * h + k) + 4 * q;
                    let scale = bytes_i32x4(gb.add(at));
                    for t in 0..T {
                        s[t] = vmlaq_s32(s[t], sub[t][k / 2][k % 2], scale);
                    }
                }
                s
            }

            /// Q6_K × Q8_K, `T` tokens: per row and super-block the exact integer sum, then
            /// `acc + (d·s)·dx`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q6_k_chains<const T: usize>(
                nb: usize,
                g: *const u8,
                x: [&[BlockQ8K]; T],
            ) -> [[float32x4_t; 4]; T] {
                let gbb = group_block_bytes(GgmlType::Q6_K);
                let mut acc = [[vdupq_n_f32(0.0); 4]; T];
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    // SAFETY: the entry checked every token holds nb super-blocks.
                    let xb: [&BlockQ8K; T] =
                        std::array::from_fn(|t| unsafe { x[t].get_unchecked(b) });
                    for q in 0..4 {
                        let (s0, s1) = (q6_k_half::<T>(gb, 0, q, xb), q6_k_half::<T>(gb, 1, q, xb));
                        let dw = halves4(gb.add(offsets::D + 8 * q));
                        for t in 0..T {
                            let r = vmulq_f32(dw, vcvtq_f32_s32(vaddq_s32(s0[t], s1[t])));
                            acc[t][q] = vfmaq_n_f32(acc[t][q], r, xb[t].d());
                        }
                    }
                }
                acc
            }

            /// Defines a K-quant entry (see `packed::PackedFn`): groups outside, tokens in
            /// passes of `$chains` inside.
            macro_rules! entry {
                ($name:ident, $ty:expr, $chains:ident) => {
                    #[target_feature(enable = $features)]
                    pub(in crate::quant) unsafe fn $name(
                        nb: usize,
                        w: &[u8],
                        groups: usize,
                        x: &[u8],
                        toks: usize,
                        out: Out,
                    ) {
                        let x = checked::<BlockQ8K>($ty, nb, w, groups, x, toks);
                        let gb = nb * group_block_bytes($ty);
                        for g in 0..groups {
                            let gp = w.as_ptr().add(g * gb);
                            macro_rules! pass {
                                ($t0:expr, $t:literal) => {{
                                    let xt: [&[BlockQ8K]; $t] =
                                        std::array::from_fn(|i| &x[($t0 + i) * nb..][..nb]);
                                    out.put_pass($t0, g, $chains::<$t>(nb, gp, xt));
                                }};
                            }
                            in_passes!(toks, pass);
                        }
                    }
                };
            }

            entry!(q4_k_chain, GgmlType::Q4_K, q4_k_chains);
            entry!(q6_k_chain, GgmlType::Q6_K, q6_k_chains);
        }
    };
}

level!(neon, "neon", mull_lane);
level!(dotprod, "neon,dotprod", sdot_lane);
// The i8mm level's K-quant kernels: the `sdot` ones, compiled in its feature set.
level!(i8mm, "neon,dotprod,i8mm", sdot_lane);
