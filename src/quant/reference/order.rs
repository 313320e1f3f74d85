//! The order in which the peer (ggml-cpu on x86) accumulates a quantized matrix product, which
//! is what its last bits depend on, and dot products that follow each order.
//!
//! ggml picks a kernel per (weight type, matrix height, batch size):
//! - `vec_dot` (and llamafile's `tinyBLAS` for Q8_0/Q4_0/Q5_0 prompts, which accumulates the
//!   same way): eight float lanes per pair, summed at the end. `x86::dot`/`reference::dot` are these.
//! - repacked weights (its default `CPU_REPACK` buffer: Q4_0 and Q4_K matrices whose height is
//!   a multiple of 8): one float chain per (row, token), one fused multiply-add per block of
//!   the block's exact integer dot (its Q4_K GEMM, which takes the batch's tokens four at a
//!   time, adds one per 64 values instead; the last `n mod 4` tokens go through its GEMV);
//! - the tiled K-quant matmul (Q4_K that is not repacked, Q5_K, Q6_K; batches of 8 tokens or
//!   more): per block `(s·d − dmin·m)` times the activation scale, added to one float sum.
//!
//! These differ only in rounding, but a model like Gemma 3 turns a last-bit difference in
//! every layer into a visible logit difference (llama.cpp's own repacking on and off are as far
//! apart as its q8_0 KV cache from its f16 one), so edgelm follows the peer's choice. The
//! integer parts are exact and shared; only the float epilogues differ.
//!
//! The dots here are the scalar reference (and the fallback). `x86::order` computes the same
//! integer parts with AVX2 and runs them through the same step functions ([`chain_step`],
//! [`tiled_step`]), so its results are these bit for bit.

use crate::quant::formats::blocks::*;
use crate::quant::GgmlType;

/// How one matrix product accumulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// Eight lanes per pair (`vec_dot`): the kernels in `x86::dot`/`reference::dot`.
    Lanes,
    /// ggml's repacked layout: one fused chain per pair over the blocks' integer dots.
    Repacked,
    /// ggml's tiled K-quant matmul.
    Tiled,
    /// Not a peer order: one fused chain per (row, token) over the blocks' whole integer sums
    /// (Q4_1 adds its `m·s` chain at the end), for every batch size. What packed matrices
    /// compute every token in (`packed_order`, `prompt_order`): a third of the lane order's
    /// vector work, the same for a row whatever the batch. For Q4_0 it is the repacked order,
    /// for Q4_K the repacked order's per-super-block step, for Q6_K the tiled order.
    Chain,
}

/// The order a packed matrix of `ty` computes a model's generated tokens (decode, drafts) in:
/// [`Order::Chain`] where there are kernels for it (`quant::packs_type`), else the peer's
/// order for a batch of `tokens`.
pub fn packed_order(ty: GgmlType, rows: usize, tokens: usize) -> Order {
    if crate::quant::packs_type(ty) && has(ty, Order::Chain) {
        Order::Chain
    } else {
        order(ty, rows, tokens)
    }
}

/// The order a packed matrix of `ty` computes prompt tokens (prefill, scoring) in: the
/// generated tokens' [`packed_order`], whose prefill is up to twice as fast as the peer's lane
/// order and which keeps every KLD bar (docs/numerics.md), unless `EDGELM_PROMPT_ORDER=peer`
/// asks for the order llama.cpp's x86 CPU backend accumulates in ([`order`]) on x86-64.
pub fn prompt_order(ty: GgmlType, rows: usize, tokens: usize) -> Order {
    // aarch64 has packed kernels for the chain order alone (and no peer order to follow).
    if prompts_follow_peer() && cfg!(target_arch = "x86_64") {
        order(ty, rows, tokens)
    } else {
        packed_order(ty, rows, tokens)
    }
}

/// `EDGELM_PROMPT_ORDER`, read once: `peer` for the peer's order, `chain` (the default) or
/// unset for [`packed_order`].
fn prompts_follow_peer() -> bool {
    static PEER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *PEER.get_or_init(|| match std::env::var("EDGELM_PROMPT_ORDER") {
        Ok(v) if v == "peer" => true,
        Ok(v) if v == "chain" || v.is_empty() => false,
        Ok(v) => {
            log::warn!("EDGELM_PROMPT_ORDER={v} is neither `peer` nor `chain`: using `chain`");
            false
        }
        Err(_) => false,
    })
}

/// The order ggml-cpu uses for a `rows`-row matrix of `ty` times `tokens` activation rows.
pub fn order(ty: GgmlType, rows: usize, tokens: usize) -> Order {
    use GgmlType::*;
    let repacked = matches!(ty, Q4_0 | Q4_K) && rows.is_multiple_of(8);
    if repacked && cfg!(target_arch = "x86_64") {
        return Order::Repacked;
    }
    if matches!(ty, Q4_K | Q5_K | Q6_K) && tokens >= 8 && cfg!(target_arch = "x86_64") {
        return Order::Tiled;
    }
    Order::Lanes
}

/// Whether [`dot`] has a kernel for `ty` in `order` (else the lane kernels are used).
pub fn has(ty: GgmlType, order: Order) -> bool {
    use GgmlType::*;
    match order {
        Order::Lanes => false,
        Order::Repacked => matches!(ty, Q4_0 | Q4_K),
        Order::Tiled => matches!(ty, Q4_K | Q5_K | Q6_K),
        Order::Chain => matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q4_K | Q6_K),
    }
}

/// One weight row (`ty`) times the quantized activation row of token `t` of an `n`-token
/// batch, accumulated in `order` (which [`has`] a kernel for `ty`).
pub fn dot(ty: GgmlType, order: Order, t: usize, n: usize, w: &[u8], x: &[u8]) -> f32 {
    use GgmlType::*;
    match (ty, order) {
        (Q4_K, Order::Repacked) if t < n - n % 4 => q4_k_repacked_gemm(w, x),
        (Q4_0, Order::Repacked) => chain(
            cast::<BlockQ4_0>(w)
                .iter()
                .zip(cast::<BlockQ8_0>(x))
                .map(|(a, b)| (q4_0_ints(a, b), f16_to_f32(a.d), f16_to_f32(b.d))),
        ),
        (Q4_K, Order::Repacked) => q4_k_repacked_gemv(w, x),
        (Q4_K, Order::Tiled) => tiled(
            cast::<BlockQ4K>(w)
                .iter()
                .zip(cast::<BlockQ8K>(x))
                .map(|(a, b)| (q4_k_ints(a, b), f16_to_f32(a.d), f16_to_f32(a.dmin), b.d())),
        ),
        (Q5_K, Order::Tiled) => tiled(
            cast::<BlockQ5K>(w)
                .iter()
                .zip(cast::<BlockQ8K>(x))
                .map(|(a, b)| (q5_k_ints(a, b), f16_to_f32(a.d), f16_to_f32(a.dmin), b.d())),
        ),
        // The repacked order's one-token form (its GEMV).
        (Q4_0 | Q4_K, Order::Chain) => dot(ty, Order::Repacked, 0, 1, w, x),
        (Q6_K, Order::Chain) => dot(ty, Order::Tiled, t, n, w, x),
        (Q4_1, Order::Chain) => q4_1_chain(w, x),
        (Q5_0, Order::Chain) => chain(
            cast::<BlockQ5_0>(w)
                .iter()
                .zip(cast::<BlockQ8_0>(x))
                .map(|(a, b)| (q5_0_ints(a, b), f16_to_f32(a.d), f16_to_f32(b.d))),
        ),
        (Q8_0, Order::Chain) => chain(cast::<BlockQ8_0>(w).iter().zip(cast::<BlockQ8_0>(x)).map(
            |(a, b)| {
                let s =
                    a.qs.iter()
                        .zip(&b.qs)
                        .map(|(&p, &q)| p as i32 * q as i32)
                        .sum();
                (s, f16_to_f32(a.d), f16_to_f32(b.d))
            },
        )),
        (Q6_K, Order::Tiled) => tiled(
            cast::<BlockQ6K>(w)
                .iter()
                .zip(cast::<BlockQ8K>(x))
                .map(|(a, b)| ((q6_k_ints(a, b), 0), f16_to_f32(a.d), 0.0, b.d())),
        ),
        _ => panic!("no {order:?} kernel for {ty}"),
    }
}

/// ggml's Q4_K GEMM (the repacked order for tokens in whole fours): one fused step per 64
/// values (two sub-blocks), for the scales and for the minimums, subtracted at the end.
fn q4_k_repacked_gemm(w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in cast::<BlockQ4K>(w).iter().zip(cast::<BlockQ8K>(x)) {
        let (dx, dw, dmin) = (b.d(), f16_to_f32(a.d), f16_to_f32(a.dmin));
        for (s, m) in q4_k_pair_ints(a, b) {
            acc = chain_step(acc, s, dw, dx);
            acc_min = chain_step(acc_min, m, dmin, dx);
        }
    }
    acc - acc_min
}

/// The repacked Q4_K order's GEMV (and the tokens past the whole fours): two chains, one step
/// per block, subtracted at the end: Σ s·(d·dx) − Σ m·(dmin·dx).
fn q4_k_repacked_gemv(w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut acc_min) = (0f32, 0f32);
    for (a, b) in cast::<BlockQ4K>(w).iter().zip(cast::<BlockQ8K>(x)) {
        let (s, m) = q4_k_ints(a, b);
        acc = chain_step(acc, s, f16_to_f32(a.d), b.d());
        acc_min = chain_step(acc_min, m, f16_to_f32(a.dmin), b.d());
    }
    acc - acc_min
}

/// Q4_1's chain: the scaled integer sums in one chain, the minimums' products in another,
/// added at the end.
fn q4_1_chain(w: &[u8], x: &[u8]) -> f32 {
    let (mut acc, mut summs) = (0f32, 0f32);
    for (a, b) in cast::<BlockQ4_1>(w).iter().zip(cast::<BlockQ8_1>(x)) {
        let s: i32 = (0..QK / 2)
            .map(|j| {
                (a.qs[j] & 0xF) as i32 * b.qs[j] as i32
                    + (a.qs[j] >> 4) as i32 * b.qs[j + QK / 2] as i32
            })
            .sum();
        acc = chain_step(acc, s, f16_to_f32(a.d), f16_to_f32(b.d));
        summs = f16_to_f32(a.m).mul_add(f16_to_f32(b.s), summs);
    }
    acc + summs
}

/// Σ over blocks of `int · (dw·dx)`, one fused multiply-add per block.
fn chain(blocks: impl Iterator<Item = (i32, f32, f32)>) -> f32 {
    blocks.fold(0f32, |acc, (s, dw, dx)| chain_step(acc, s, dw, dx))
}

/// One step of the repacked kernels' chains: `acc + int·(dw·dx)`, fused. Shared with
/// `x86::order`, whose integers come from SIMD, so both round alike by construction.
#[inline(always)]
pub(in crate::quant) fn chain_step(acc: f32, s: i32, dw: f32, dx: f32) -> f32 {
    (s as f32).mul_add(dw * dx, acc)
}

/// The tiled kernel's epilogue over the blocks (see [`tiled_step`]).
fn tiled(blocks: impl Iterator<Item = ((i32, i32), f32, f32, f32)>) -> f32 {
    blocks.fold(0f32, |acc, ((s, m), d, dmin, dx)| {
        tiled_step(acc, (s, m), d, dmin, dx)
    })
}

/// The tiled kernel's epilogue for one block: `r = s·d − dmin·m` (one fused step), then
/// `acc += r·dx` (another), as its AVX2 micro-kernel computes them. Shared with `x86::order`.
#[inline(always)]
pub(in crate::quant) fn tiled_step(
    acc: f32,
    (s, m): (i32, i32),
    d: f32,
    dmin: f32,
    dx: f32,
) -> f32 {
    (-dmin).mul_add(m as f32, d * s as f32).mul_add(dx, acc)
}

/// Σ (q − 16)·q8 over one Q5_0 block (the fifth bit of value `j` is bit `j` of `qh`).
fn q5_0_ints(a: &BlockQ5_0, b: &BlockQ8_0) -> i32 {
    let qh = u32::from_le_bytes(a.qh);
    (0..QK / 2)
        .map(|j| {
            let lo = ((a.qs[j] & 0xF) as u32 | ((qh >> j) & 1) << 4) as i32 - 16;
            let hi = ((a.qs[j] >> 4) as u32 | ((qh >> (j + 16)) & 1) << 4) as i32 - 16;
            lo * b.qs[j] as i32 + hi * b.qs[j + QK / 2] as i32
        })
        .sum()
}

/// Σ (q − 8)·q8 over one Q4_0 block.
fn q4_0_ints(a: &BlockQ4_0, b: &BlockQ8_0) -> i32 {
    let mut s = 0i32;
    for j in 0..QK / 2 {
        s += ((a.qs[j] & 0xF) as i32 - 8) * b.qs[j] as i32;
        s += ((a.qs[j] >> 4) as i32 - 8) * b.qs[j + QK / 2] as i32;
    }
    s
}

/// (Σ scale·Σ q·q8, Σ min·Σ q8) over one Q4_K super-block: sub-blocks of 32, the nibbles of
/// each 32 bytes holding two of them.
fn q4_k_ints(a: &BlockQ4K, b: &BlockQ8K) -> (i32, i32) {
    q4_k_pair_ints(a, b)
        .iter()
        .fold((0, 0), |(s, m), &(ps, pm)| (s + ps, m + pm))
}

/// [`q4_k_ints`] for each 64 values (sub-blocks 2j and 2j+1).
fn q4_k_pair_ints(a: &BlockQ4K, b: &BlockQ8K) -> [(i32, i32); QK_K / 64] {
    let (sc, mins) = unpack_scale_min_k4(&a.scales);
    std::array::from_fn(|j| {
        let q4 = &a.qs[32 * j..32 * j + 32];
        let (lo, hi) = (&b.qs[64 * j..64 * j + 32], &b.qs[64 * j + 32..64 * j + 64]);
        let (mut dl, mut dh) = (0i32, 0i32);
        for l in 0..32 {
            dl += (q4[l] & 0xF) as i32 * lo[l] as i32;
            dh += (q4[l] >> 4) as i32 * hi[l] as i32;
        }
        let bsum32 = |k: usize| b.bsum(2 * k) as i32 + b.bsum(2 * k + 1) as i32;
        (
            sc[2 * j] as i32 * dl + sc[2 * j + 1] as i32 * dh,
            mins[2 * j] as i32 * bsum32(2 * j) + mins[2 * j + 1] as i32 * bsum32(2 * j + 1),
        )
    })
}

/// As [`q4_k_ints`] with a fifth bit per value from `qh`.
fn q5_k_ints(a: &BlockQ5K, b: &BlockQ8K) -> (i32, i32) {
    let (sc, mins) = unpack_scale_min_k4(&a.scales);
    let mut s = 0i32;
    for j in 0..QK_K / 64 {
        let q4 = &a.qs[32 * j..32 * j + 32];
        let (lo, hi) = (&b.qs[64 * j..64 * j + 32], &b.qs[64 * j + 32..64 * j + 64]);
        let (mut dl, mut dh) = (0i32, 0i32);
        for l in 0..32 {
            let hl = ((a.qh[l] >> (2 * j)) & 1) as i32 * 16;
            let hh = ((a.qh[l] >> (2 * j + 1)) & 1) as i32 * 16;
            dl += ((q4[l] & 0xF) as i32 + hl) * lo[l] as i32;
            dh += ((q4[l] >> 4) as i32 + hh) * hi[l] as i32;
        }
        s += sc[2 * j] as i32 * dl + sc[2 * j + 1] as i32 * dh;
    }
    (s, min_ints(b, &mins))
}

/// Σ min·(sum of the sub-block's q8): sub-block j of 32 is bsums 2j and 2j+1.
fn min_ints(b: &BlockQ8K, mins: &[u8; 8]) -> i32 {
    (0..8)
        .map(|j| mins[j] as i32 * (b.bsum(2 * j) as i32 + b.bsum(2 * j + 1) as i32))
        .sum()
}

/// Σ scale·Σ (q − 32)·q8 over one Q6_K super-block (sub-blocks of 16).
fn q6_k_ints(a: &BlockQ6K, b: &BlockQ8K) -> i32 {
    let mut s = 0i32;
    for h in 0..2 {
        let ql = &a.ql[64 * h..64 * h + 64];
        let qh = &a.qh[32 * h..32 * h + 32];
        let q8 = &b.qs[128 * h..128 * h + 128];
        let mut sub = [0i32; 8];
        for l in 0..32 {
            let q = [
                ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32,
                ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32,
                ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32,
                ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32,
            ];
            for (c, &qc) in q.iter().enumerate() {
                // Value l of quarter c is sub-block 2c + l/16 of this half.
                sub[2 * c + l / 16] += qc * q8[32 * c + l] as i32;
            }
        }
        for (k, &v) in sub.iter().enumerate() {
            s += a.scales[8 * h + k] as i32 * v;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::{random_row, Rng};
    use crate::quant::{dequantize_row, quantize_row};

    /// Every order computes the same dot product up to rounding.
    #[test]
    fn orders_agree_with_the_dequantized_product() {
        let mut rng = Rng::new(0x0de5);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let n = 512;
            let w = random_row(&mut rng, ty, n);
            let xf: Vec<f32> = (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect();
            let vt = ty.vec_dot_type();
            let mut x = vec![0u8; vt.row_bytes(n as u64).unwrap() as usize];
            quantize_row(vt, &xf, &mut x);
            let (mut wd, mut xd) = (vec![0f32; n], vec![0f32; n]);
            dequantize_row(ty, &w, &mut wd).unwrap();
            dequantize_row(vt, &x, &mut xd).unwrap();
            let want: f64 = wd
                .iter()
                .zip(&xd)
                .map(|(a, b)| (*a as f64) * (*b as f64))
                .sum();
            let lanes = crate::quant::vec_dot(ty, n, &w, &x) as f64;
            for order in [Order::Repacked, Order::Tiled] {
                if has(ty, order) {
                    let got = dot(ty, order, 0, 1, &w, &x) as f64;
                    let gemm = dot(ty, order, 0, 4, &w, &x) as f64;
                    assert!((gemm - want).abs() < 1e-4 * want.abs().max(1.0));
                    let tol = 1e-4 * want.abs().max(1.0);
                    assert!((got - want).abs() < tol, "{ty} {order:?}: {got} vs {want}");
                    assert!((got - lanes).abs() < tol, "{ty} {order:?} vs lanes");
                }
            }
        }
    }

    #[test]
    fn the_peer_repacks_q4_matrices_whose_height_is_a_multiple_of_eight() {
        if cfg!(target_arch = "x86_64") {
            assert_eq!(order(GgmlType::Q4_K, 640, 1), Order::Repacked);
            assert_eq!(order(GgmlType::Q4_K, 100, 1), Order::Lanes);
            assert_eq!(order(GgmlType::Q4_K, 100, 9), Order::Tiled);
            assert_eq!(order(GgmlType::Q6_K, 640, 8), Order::Tiled);
            assert_eq!(order(GgmlType::Q6_K, 640, 7), Order::Lanes);
        }
        assert_eq!(order(GgmlType::Q8_0, 640, 64), Order::Lanes);
    }
}
