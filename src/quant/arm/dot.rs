//! NEON dot kernels for aarch64 (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K, MXFP4;
//! everything else uses the scalar reference). Modelled on ggml-cpu's arch/arm/quants.c, in two
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

/// A variant's table: its own kernels, the scalar reference for the rest.
macro_rules! table {
    ($name:literal, $module:ident) => {
        Kernels {
            name: $name,
            q4_0: $module::q4_0_q8_0,
            q4_1: $module::q4_1_q8_1,
            q5_0: $module::q5_0_q8_0,
            q8_0: $module::q8_0_q8_0,
            q4_k: $module::q4_k_q8_k,
            q6_k: $module::q6_k_q8_k,
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

/// Sixteen fifth bits (bit `i` of `bits` for byte `i`) as bytes of 0 or 0x10.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn fifth_bits(bits: u16) -> uint8x16_t {
    const BIT: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let v = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
    vandq_u8(vtstq_u8(v, vld1q_u8(BIT.as_ptr())), vdupq_n_u8(0x10))
}

/// Σ min·(Σ of its 32 activations) over a Q4_K super-block (ggml's `vpaddq_s16` of the
/// sixteen block sums, times the minimums).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn q4_k_minimums(mins: &[u8; 8], b: &BlockQ8K) -> i32 {
    let bsums = b.bsums.as_ptr().cast::<u8>();
    let q8sums = vpaddq_s16(
        vreinterpretq_s16_u8(vld1q_u8(bsums)),
        vreinterpretq_s16_u8(vld1q_u8(bsums.add(16))),
    );
    let m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mins.as_ptr())));
    let prod = vaddq_s32(
        vmull_s16(vget_low_s16(q8sums), vget_low_s16(m)),
        vmull_high_s16(q8sums, m),
    );
    vaddvq_s32(prod)
}

/// Σ scale·bsum over a Q6_K super-block's sixteen sub-blocks.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn q6_k_scaled_bsums(a: &BlockQ6K, b: &BlockQ8K) -> i32 {
    let bsums = b.bsums.as_ptr().cast::<u8>();
    let q8 = [0, 1].map(|h| vreinterpretq_s16_u8(vld1q_u8(bsums.add(16 * h))));
    let scales = vld1q_s8(a.scales.as_ptr());
    let sc = [vmovl_s8(vget_low_s8(scales)), vmovl_high_s8(scales)];
    let mut prod = vdupq_n_s32(0);
    for h in 0..2 {
        prod = vmlal_s16(prod, vget_low_s16(q8[h]), vget_low_s16(sc[h]));
        prod = vmlal_high_s16(prod, q8[h], sc[h]);
    }
    vaddvq_s32(prod)
}

/// Sub-block `r` (0..8) of half `h` of a Q6_K block: its sixteen 6-bit quants (0..63) as
/// bytes, the low four bits from `ql`, the high two from `qh`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn q6_k_sub_block(a: &BlockQ6K, h: usize, r: usize) -> int8x16_t {
    let ql = vld1q_u8(a.ql.as_ptr().add(64 * h + 16 * (r % 4)));
    let qh = vld1q_u8(a.qh.as_ptr().add(32 * h + 16 * (r % 2)));
    let low = if r < 4 {
        vandq_u8(ql, vdupq_n_u8(0x0F))
    } else {
        vshrq_n_u8::<4>(ql)
    };
    let high = vandq_u8(vshlq_u8(qh, vdupq_n_s8(-2 * (r / 2) as i8)), vdupq_n_u8(3));
    vreinterpretq_s8_u8(vorrq_u8(low, vshlq_n_u8::<4>(high)))
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

            /// One block of a legacy dot: `acc + (Σ xl·y[..16] + Σ xh·y[16..])·d`, the
            /// integer sum exact and the fused step ggml's.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn block_step(
                acc: float32x4_t,
                (xl, xh): (int8x16_t, int8x16_t),
                y: &[i8; 32],
                d: f32,
            ) -> float32x4_t {
                let yl = vld1q_s8(y.as_ptr());
                let yh = vld1q_s8(y.as_ptr().add(16));
                let p = vaddq_s32($dot(xl, yl), $dot(xh, yh));
                vfmaq_n_f32(acc, vcvtq_f32_s32(p), d)
            }

            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q4_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ4_0>(w), cast::<BlockQ8_0>(x));
                let s8b = vdupq_n_s8(8);
                let mut acc = vdupq_n_f32(0.0);
                for (a, b) in w.iter().zip(x) {
                    let (lo, hi) = nibbles(&a.qs);
                    let xl = vsubq_s8(vreinterpretq_s8_u8(lo), s8b);
                    let xh = vsubq_s8(vreinterpretq_s8_u8(hi), s8b);
                    let d = f16_to_f32(a.d) * f16_to_f32(b.d);
                    acc = block_step(acc, (xl, xh), &b.qs, d);
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
                    let x = (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi));
                    let d = f16_to_f32(a.d) * f16_to_f32(b.d);
                    acc = block_step(acc, x, &b.qs, d);
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
                    let x = (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi));
                    let d = f16_to_f32(b.d) * e8m0_to_f32_half(a.e);
                    acc = block_step(acc, x, &b.qs, d);
                }
                vaddvq_f32(acc)
            }

            /// The nibbles with their fifth bits put back (value − 16 as signed bytes).
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q5_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ5_0>(w), cast::<BlockQ8_0>(x));
                let s16 = vdupq_n_s8(16);
                let mut acc = vdupq_n_f32(0.0);
                for (a, b) in w.iter().zip(x) {
                    let qh = u32::from_le_bytes(a.qh);
                    let (lo, hi) = nibbles(&a.qs);
                    let lo = vorrq_u8(lo, fifth_bits(qh as u16));
                    let hi = vorrq_u8(hi, fifth_bits((qh >> 16) as u16));
                    let xl = vsubq_s8(vreinterpretq_s8_u8(lo), s16);
                    let xh = vsubq_s8(vreinterpretq_s8_u8(hi), s16);
                    let d = f16_to_f32(a.d) * f16_to_f32(b.d);
                    acc = block_step(acc, (xl, xh), &b.qs, d);
                }
                vaddvq_f32(acc)
            }

            /// ggml's `ggml_vec_dot_q4_K_q8_K`: per sub-block of 32 the nibbles' dot times
            /// its scale, the minimums from the block sums.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q4_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ4K>(w), cast::<BlockQ8K>(x));
                let mut sumf = 0f32;
                for (a, b) in w.iter().zip(x) {
                    let d = b.d() * f16_to_f32(a.d);
                    let dmin = b.d() * f16_to_f32(a.dmin);
                    let (sc, mins) = unpack_scale_min_k4(&a.scales);
                    sumf -= dmin * q4_k_minimums(&mins, b) as f32;
                    let mut sumi = 0i32;
                    for j in 0..QK_K / 64 {
                        let q4 = a.qs.as_ptr().add(32 * j);
                        let q8 = b.qs.as_ptr().add(64 * j);
                        let (l0, h0) = nibbles(&*q4.cast::<[u8; 16]>());
                        let (l1, h1) = nibbles(&*q4.add(16).cast::<[u8; 16]>());
                        let y = |k: usize| unsafe { vld1q_s8(q8.add(16 * k)) };
                        let pl = vaddq_s32(
                            $dot(vreinterpretq_s8_u8(l0), y(0)),
                            $dot(vreinterpretq_s8_u8(l1), y(1)),
                        );
                        let ph = vaddq_s32(
                            $dot(vreinterpretq_s8_u8(h0), y(2)),
                            $dot(vreinterpretq_s8_u8(h1), y(3)),
                        );
                        sumi += vaddvq_s32(pl) * sc[2 * j] as i32;
                        sumi += vaddvq_s32(ph) * sc[2 * j + 1] as i32;
                    }
                    sumf += d * sumi as f32;
                }
                sumf
            }

            /// ggml's `ggml_vec_dot_q6_K_q8_K`: the quants unsigned (0..63), per sub-block of
            /// 16 their dot times its scale, less 32 × Σ scale·bsum.
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q6_k_q8_k(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ6K>(w), cast::<BlockQ8K>(x));
                let mut sum = 0f32;
                for (a, b) in w.iter().zip(x) {
                    let mut isum = 0i32;
                    for h in 0..2 {
                        for r in 0..8 {
                            let y = vld1q_s8(b.qs.as_ptr().add(128 * h + 16 * r));
                            let p = $dot(q6_k_sub_block(a, h, r), y);
                            isum += vaddvq_s32(p) * a.scales[8 * h + r] as i32;
                        }
                    }
                    let isum_mins = q6_k_scaled_bsums(a, b);
                    sum += f16_to_f32(a.d) * b.d() * (isum - 32 * isum_mins) as f32;
                }
                sum
            }

            #[target_feature(enable = $features)]
            pub(crate) unsafe fn q8_0_q8_0(_n: usize, w: &[u8], x: &[u8]) -> f32 {
                let (w, x) = (cast::<BlockQ8_0>(w), cast::<BlockQ8_0>(x));
                let mut acc = vdupq_n_f32(0.0);
                for (a, b) in w.iter().zip(x) {
                    let x = (vld1q_s8(a.qs.as_ptr()), vld1q_s8(a.qs.as_ptr().add(16)));
                    let d = f16_to_f32(a.d) * f16_to_f32(b.d);
                    acc = block_step(acc, x, &b.qs, d);
                }
                vaddvq_f32(acc)
            }
        }
    };
}

kernels!(neon, "neon", dot_i8x16);
kernels!(dotprod, "neon,dotprod", sdot_i8x16);
