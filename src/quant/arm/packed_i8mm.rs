//! The i8mm level's two-token passes over packed legacy-quant groups (`packed`): `smmla`
//! multiplies a 2 × 8 matrix of signed bytes by another's transpose, so two rows' quant
//! dwords `j` and `j + 4` (a `vzip1q_s32`/`vzip2q_s32` of two row-quarter loads) against two
//! tokens' same dwords give the four (row, token) sums of eight products in one instruction,
//! where `sdot` gives four rows of one token. The integer sums are exact, and the float chains
//! are `packed::Chains`, so the outputs are the other levels' bits (tested in `gemm`). A
//! single token, and the K-quants, take the `sdot` kernels compiled for this level.

use std::arch::aarch64::*;
use std::arch::asm;

use crate::quant::arm::packed::{load_i8, ActBlock, BlockScales, Chains, Legacy};
use crate::quant::formats::packed::group_block_bytes;

/// `acc + a·bᵀ`: `a` two rows of 8 signed bytes, `b` two tokens' 8 bytes, the result
/// `[r0·t0, r0·t1, r1·t0, r1·t1]`. Its intrinsic is not stable in Rust, hence `asm!`.
#[inline]
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn smmla(acc: int32x4_t, a: int32x4_t, b: int32x4_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: `smmla` reads two vector registers and writes the accumulator; the CPU has it
    // (this level is handed out only after i8mm was detected).
    unsafe {
        asm!(
            "smmla {acc:v}.4s, {a:v}.16b, {b:v}.16b",
            acc = inout(vreg) acc,
            a = in(vreg) a,
            b = in(vreg) b,
            options(pure, nomem, nostack)
        )
    };
    acc
}

/// Two tokens' activation block as `smmla`'s B operands: for each `j` in 0..4, token 0's
/// dwords `j` and `j + 4`, then token 1's.
#[inline]
#[target_feature(enable = "neon,dotprod,i8mm")]
unsafe fn token_pairs(x0: &[i8; 32], x1: &[i8; 32]) -> [int32x4_t; 4] {
    let halves = |qs: &[i8; 32]| {
        let p = qs.as_ptr().cast::<u8>();
        // SAFETY: both loads are inside the 32 bytes.
        let (lo, hi) = unsafe { (load_i8(p), load_i8(p.add(16))) };
        let (lo, hi) = (vreinterpretq_s32_s8(lo), vreinterpretq_s32_s8(hi));
        // [d0, d4, d1, d5] and [d2, d6, d3, d7], as 64-bit pairs.
        [vzip1q_s32(lo, hi), vzip2q_s32(lo, hi)].map(|v| vreinterpretq_s64_s32(v))
    };
    let (a, b) = (halves(x0), halves(x1));
    [
        vzip1q_s64(a[0], b[0]),
        vzip2q_s64(a[0], b[0]),
        vzip1q_s64(a[1], b[1]),
        vzip2q_s64(a[1], b[1]),
    ]
    .map(|v| vreinterpretq_s32_s64(v))
}

/// Two tokens against the sixteen rows of the `nb` group blocks at `g`, in the chain order
/// (`T` is 2: the generic parameter keeps the other levels' pass signature).
#[inline]
#[target_feature(enable = "neon,dotprod,i8mm")]
pub(super) unsafe fn mmla_chains<L: Legacy, const T: usize>(
    nb: usize,
    g: *const u8,
    x: [&[L::X]; 2],
    scales: [&[BlockScales]; 2],
) -> [[float32x4_t; 4]; 2] {
    let gbb = group_block_bytes(L::TY);
    let mut chains = Chains::<2>::new();
    for b in 0..nb {
        let gb = g.add(b * gbb);
        // SAFETY (get_unchecked): the entry checked both tokens hold nb blocks.
        let (x0, x1) = unsafe { (x[0].get_unchecked(b), x[1].get_unchecked(b)) };
        let bj = token_pairs(x0.qs(), x1.qs());
        let xs = unsafe { [*scales[0].get_unchecked(b), *scales[1].get_unchecked(b)] };
        // Each (row, token) sum's start, in `smmla`'s order: [r·t0, r·t1] for two rows.
        let start = [xs[0].start, xs[1].start, xs[0].start, xs[1].start];
        let start = vld1q_s32(start.as_ptr());
        for q in 0..4 {
            // Rows 4q, 4q + 1 and rows 4q + 2, 4q + 3, each against both tokens.
            let (mut s01, mut s23) = (start, start);
            for (j, &bj) in bj.iter().enumerate() {
                let (lo, hi) = L::values(gb, j, q);
                let (lo, hi) = (vreinterpretq_s32_s8(lo), vreinterpretq_s32_s8(hi));
                s01 = smmla(s01, vzip1q_s32(lo, hi), bj);
                s23 = smmla(s23, vzip2q_s32(lo, hi), bj);
            }
            let sums = [vuzp1q_s32(s01, s23), vuzp2q_s32(s01, s23)];
            chains.step::<L>(gb, q, sums, &xs);
        }
    }
    chains.finish::<L>()
}
