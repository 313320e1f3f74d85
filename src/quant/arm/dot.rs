//! NEON dot kernels for aarch64 (Q4_0, Q4_1, Q8_0, MXFP4; everything else uses
//! the scalar reference). Modelled on ggml-cpu's arch/arm/quants.c, in two
//! variants chosen at run time: baseline NEON (`vmull_s8` + pairwise adds)
//! and, where the CPU has it (`dotprod`, Armv8.2+: Cortex-A78AE in Jetson
//! Orin, Neoverse, Apple), the `sdot` instruction. Its intrinsic is not
//! stable in Rust, so it is issued with `asm!`.
//!
//! NEON is part of the aarch64 baseline; the dotprod table is handed out
//! only after `is_aarch64_feature_detected!("dotprod")`. The kernels only
//! read inside the block slices they are given. CI runs the shared
//! `fast_paths_match_reference` test for both tables under qemu-aarch64
//! (`scripts/test-aarch64.sh`).

use std::arch::aarch64::*;
use std::arch::asm;

use crate::quant::formats::blocks::*;
use crate::quant::Kernels;

/// A variant's table: its own legacy-quant kernels, the scalar reference for the rest.
macro_rules! table {
    ($name:literal, $module:ident) => {
        Kernels {
            name: $name,
            q4_0: $module::q4_0_q8_0,
            q4_1: $module::q4_1_q8_1,
            q8_0: $module::q8_0_q8_0,
            mxfp4: $module::mxfp4_q8_0,
            ..crate::quant::SCALAR
        }
    };
}

pub(in crate::quant) const NEON: Kernels = table!("neon", neon);
pub(in crate::quant) const NEON_DOTPROD: Kernels = table!("neon-dotprod", dotprod);

/// Σ a[i]·b[i] over 16 signed bytes, as 4 i32 lanes (each lane holds the
/// sum of 4 products; |sum| ≤ 4·128·128 fits easily).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn dot_i8x16(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let p0 = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let p1 = vmull_high_s8(a, b);
    vaddq_s32(vpaddlq_s16(p0), vpaddlq_s16(p1))
}

/// Unpacks 16 bytes of nibbles into (low nibbles, high nibbles) as bytes.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let v = vld1q_u8(qs.as_ptr());
    (vandq_u8(v, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(v))
}

/// The same 16-byte dot with `sdot` (lane j = Σ of products 4j..4j+4).
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn sdot_i8x16(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = vdupq_n_s32(0);
    // SAFETY: `sdot` only reads the two vector registers and writes the accumulator; the
    // CPU has it (this function is reached only through the dotprod table).
    unsafe {
        asm!(
            "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack)
        );
    }
    acc
}

/// The block kernels, once per variant (only the integer dot differs).
macro_rules! kernels {
    ($module:ident, $features:literal, $dot:ident) => {
        mod $module {
            use super::*;

            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q4_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ4_0>(w), cast::<BlockQ8_0>(x));
                let s8b = vdupq_n_s8(8);
                let mut acc = vdupq_n_f32(0.0);
                for (a, b) in w.iter().zip(x) {
                    let (lo, hi) = nibbles(&a.qs);
                    let xl = vsubq_s8(vreinterpretq_s8_u8(lo), s8b);
                    let xh = vsubq_s8(vreinterpretq_s8_u8(hi), s8b);
                    let yl = vld1q_s8(b.qs.as_ptr());
                    let yh = vld1q_s8(b.qs.as_ptr().add(16));
                    let p = vaddq_s32($dot(xl, yl), $dot(xh, yh));
                    let d = f16_to_f32(a.d) * f16_to_f32(b.d);
                    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), d);
                }
                vaddvq_f32(acc)
            }

            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q4_1_q8_1(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ4_1>(w), cast::<BlockQ8_1>(x));
                let mut acc = vdupq_n_f32(0.0);
                let mut summs = 0f32;
                for (a, b) in w.iter().zip(x) {
                    summs += f16_to_f32(a.m) * f16_to_f32(b.s);
                    // Nibbles are 0..15, so reinterpreting them as signed is exact.
                    let (lo, hi) = nibbles(&a.qs);
                    let yl = vld1q_s8(b.qs.as_ptr());
                    let yh = vld1q_s8(b.qs.as_ptr().add(16));
                    let p = vaddq_s32(
                        $dot(vreinterpretq_s8_u8(lo), yl),
                        $dot(vreinterpretq_s8_u8(hi), yh),
                    );
                    let d = f16_to_f32(a.d) * f16_to_f32(b.d);
                    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), d);
                }
                vaddvq_f32(acc) + summs
            }

            /// Each nibble looked up in the doubled E2M1 table with one `tbl`.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn mxfp4_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockMxfp4>(w), cast::<BlockQ8_0>(x));
                let table = vld1q_s8(KVALUES_MXFP4.as_ptr());
                let mut acc = vdupq_n_f32(0.0);
                for (a, b) in w.iter().zip(x) {
                    let (lo, hi) = nibbles(&a.qs);
                    let xl = vqtbl1q_s8(table, lo);
                    let xh = vqtbl1q_s8(table, hi);
                    let yl = vld1q_s8(b.qs.as_ptr());
                    let yh = vld1q_s8(b.qs.as_ptr().add(16));
                    let p = vaddq_s32($dot(xl, yl), $dot(xh, yh));
                    let d = f16_to_f32(b.d) * e8m0_to_f32_half(a.e);
                    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), d);
                }
                vaddvq_f32(acc)
            }

            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q8_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ8_0>(w), cast::<BlockQ8_0>(x));
                let mut acc = vdupq_n_f32(0.0);
                for (a, b) in w.iter().zip(x) {
                    let p = vaddq_s32(
                        $dot(vld1q_s8(a.qs.as_ptr()), vld1q_s8(b.qs.as_ptr())),
                        $dot(
                            vld1q_s8(a.qs.as_ptr().add(16)),
                            vld1q_s8(b.qs.as_ptr().add(16)),
                        ),
                    );
                    let d = f16_to_f32(a.d) * f16_to_f32(b.d);
                    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(p), d);
                }
                vaddvq_f32(acc)
            }
        }
    };
}

kernels!(neon, "neon", dot_i8x16);
kernels!(dotprod, "neon,dotprod", sdot_i8x16);
