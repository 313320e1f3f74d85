//! ggml's per-row path (spans shorter than [`TILE`](super::TILE): decode, short prompts): an
//! online softmax over the positions in order per (token, query head), each K/V block decoded
//! once for the run of tokens that shares it.

use super::dot::{dot_f16_ggml, dot_f32};
use super::{with_sink, AttnToken, HeadRows};
use crate::backend::cpu::f16_round::{fma_round, scale_round};
use crate::cpu_features::fma_dispatch;
use crate::kv::{KvPages, KvType};
use half::f16;

/// One query head's running state of the online softmax.
struct Online {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

impl Online {
    /// A head that has seen no position yet.
    fn new(hd: usize) -> Online {
        Online {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc: vec![0.0; hd],
        }
    }
}

fma_dispatch! {
/// ggml's per-row attention for a run of tokens of one span (a decoding token and its drafts)
/// and `rep` query heads of one KV head group: an online softmax over the positions in order
/// per (token, head). Each K/V block is decoded once for the whole run; each token's
/// arithmetic is what it would be alone.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_rows(
    kv: &KvPages,
    layer: usize,
    kv_head: usize,
    toks: &[AttnToken<'_>],
    qs: &[&[f32]],
    rep: usize,
    hd: usize,
    scale: f32,
    sinks: Option<&[f32]>,
    outs: &mut [&mut [f32]],
    fast_rows: bool,
) {
    let bt = kv.geometry().block_size;
    // f16 pages follow ggml's f16 arithmetic (the peer's greedy tokens depend on it);
    // quantized pages have no peer arithmetic to match and run in plain f32.
    let f16_numerics = kv.geometry().kv_type == KvType::F16;
    // The AVX-512 form of the f16 block loop, where there is one (`fast_rows` off: the
    // portable form, which tests compare it with).
    let fast_rows = fast_rows && f16_numerics && per_row_block_f16_fits(hd);
    let q = rounded_queries(qs, f16_numerics);
    let mut heads: Vec<Online> = (0..toks.len() * rep).map(|_| Online::new(hd)).collect();
    let head = HeadRows {
        kv,
        layer,
        kv_head,
        block_table: toks[0].block_table,
    };
    let mut k_tile = vec![0f32; bt * hd];
    let mut v_tile = vec![0f32; bt * hd];
    let mut scores = vec![0f32; bt];
    let mut factors = vec![(0f32, 0f32); bt];
    let first = toks.iter().map(|t| t.first).min().unwrap_or(0);
    let n_ctx = toks.iter().map(|t| t.pos + 1).max().unwrap_or(0);
    for bi in first / bt..n_ctx.div_ceil(bt) {
        // The block's rows lo..hi are seen by some token of the run (a window may start
        // inside the first block): they are decoded once, into tile rows 0..hi - lo.
        let lo = first.saturating_sub(bi * bt);
        let hi = (n_ctx - bi * bt).min(bt);
        head.decode_rows(bi * bt + lo, 0..hi - lo, hd, &mut k_tile, &mut v_tile);
        for (j, tok) in toks.iter().enumerate() {
            // This token's rows of the block, in tile rows.
            let start = tok.first.saturating_sub(bi * bt).max(lo);
            let end = (tok.pos + 1).saturating_sub(bi * bt).min(bt);
            if start >= end {
                continue;
            }
            let seen = start - lo..end - lo;
            for r in 0..rep {
                let (q, h) = (&q[j][r * hd..(r + 1) * hd], &mut heads[j * rep + r]);
                if fast_rows {
                    per_row_block_f16(&k_tile, &v_tile, seen.clone(), q, scale, &mut scores, h);
                } else {
                    let tiles = (&k_tile[..], &v_tile[..]);
                    let (sc, fa) = (&mut scores[..], &mut factors[..]);
                    per_row_block(tiles, seen.clone(), q, scale, f16_numerics, sc, fa, h);
                }
            }
        }
    }
    write_outputs(&heads, sinks, rep, hd, outs);
}
}

/// Each token's query as ggml multiplies it with f16 K: rounded to f16 (`f16_numerics`), or
/// as it is.
#[inline(always)]
fn rounded_queries(qs: &[&[f32]], f16_numerics: bool) -> Vec<Vec<f32>> {
    qs.iter()
        .map(|q| match f16_numerics {
            true => q.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
            false => q.to_vec(),
        })
        .collect()
}

/// Each (token, head)'s output: its accumulator over its softmax sum, with the head's sink
/// (`sinks`, one per head of the group) joined to the sum; a head that saw nothing writes 0.
#[inline(always)]
fn write_outputs(
    heads: &[Online],
    sinks: Option<&[f32]>,
    rep: usize,
    hd: usize,
    outs: &mut [&mut [f32]],
) {
    for (j, out) in outs.iter_mut().enumerate() {
        for r in 0..rep {
            let h = &heads[j * rep + r];
            let (acc_scale, sum) = match sinks {
                Some(s) => with_sink(h.max, h.sum, s[r]),
                None => (1.0, h.sum),
            };
            let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            for (o, &a) in out[r * hd..(r + 1) * hd].iter_mut().zip(&h.acc) {
                *o = a * acc_scale * inv;
            }
        }
    }
}

/// The per-row path's work for one block and one (token, head): the rows `seen` of the K and
/// V tiles, in three passes that each keep the arithmetic of the one-position loop: every
/// score (independent dot products), then the softmax factors (a running maximum, then exps
/// that no longer wait on each other), then the accumulator updates in position order.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn per_row_block(
    (k_tile, v_tile): (&[f32], &[f32]),
    seen: std::ops::Range<usize>,
    q: &[f32],
    scale: f32,
    f16_numerics: bool,
    scores: &mut [f32],
    factors: &mut [(f32, f32)],
    h: &mut Online,
) {
    let hd = q.len();
    for p in seen.clone() {
        let k = &k_tile[p * hd..(p + 1) * hd];
        scores[p] = if f16_numerics {
            dot_f16_ggml(k, q) * scale
        } else {
            dot_f32(k, q) * scale
        };
    }
    // (ms, vs) per position: a new maximum rescales what came before by ms and adds the value
    // at weight 1; otherwise the value is added at weight vs.
    let mut max = h.max;
    for p in seen.clone() {
        let sc = scores[p];
        factors[p] = if sc > max {
            let ms = (max - sc).exp();
            max = sc;
            (ms, 1.0)
        } else {
            (1.0, (sc - max).exp())
        };
    }
    h.max = max;
    for p in seen {
        let ((ms, vs), v) = (factors[p], &v_tile[p * hd..(p + 1) * hd]);
        if f16_numerics {
            if ms != 1.0 {
                scale_round(&mut h.acc, ms);
            }
            fma_round(&mut h.acc, v, vs);
            h.sum = h.sum.mul_add(ms, vs);
        } else {
            if ms != 1.0 {
                h.acc.iter_mut().for_each(|a| *a *= ms);
            }
            for (a, &x) in h.acc.iter_mut().zip(v) {
                *a += x * vs;
            }
            h.sum = h.sum * ms + vs;
        }
    }
}

/// Whether [`per_row_block_f16`] runs for heads of `hd` on this CPU.
fn per_row_block_f16_fits(hd: usize) -> bool {
    cfg!(target_arch = "x86_64") && crate::cpu_features::avx512() && matches!(hd, 64 | 128 | 256)
}

/// [`per_row_block`] for f16 pages (the rows `seen` of `k` and `v`) and one query head, in
/// AVX-512 with the accumulator in registers (`avx512::per_row_block_f16`); only
/// where [`per_row_block_f16_fits`].
fn per_row_block_f16(
    k: &[f32],
    v: &[f32],
    seen: std::ops::Range<usize>,
    q: &[f32],
    scale: f32,
    scores: &mut [f32],
    h: &mut Online,
) {
    assert!(per_row_block_f16_fits(q.len()));
    #[cfg(target_arch = "x86_64")]
    {
        use super::avx512::{per_row_block_f16 as block, RowState};
        let state = RowState {
            max: &mut h.max,
            sum: &mut h.sum,
            acc: &mut h.acc,
        };
        // SAFETY: AVX-512 F and F16C were detected (`per_row_block_f16_fits`); the lengths
        // are checked inside.
        unsafe {
            match q.len() {
                64 => block::<4>(k, v, seen, q, scale, scores, state),
                128 => block::<8>(k, v, seen, q, scale, scores, state),
                _ => block::<16>(k, v, seen, q, scale, scores, state),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (k, v, seen, scale, scores, h);
}

#[cfg(test)]
mod tests {
    use super::super::tests::val;
    use super::*;
    use crate::kv::{PageGeometry, Part};

    /// The per-row path's AVX-512 block loop (where this CPU has it) against the portable one,
    /// bit for bit: several blocks, a window starting inside a block, every head size it takes.
    #[test]
    fn per_row_fast_path_matches_the_portable_one_bit_for_bit() {
        for hd in [64, 128, 256] {
            let geom = PageGeometry {
                layers: 1,
                kv_heads: 1,
                head_dim: hd,
                block_size: 16,
                kv_type: KvType::F16,
            };
            let mut kv = KvPages::new(geom, 8).unwrap();
            let table: Vec<u32> = vec![3, 6, 1, 7, 0];
            let n = 70;
            for p in 0..n {
                let slot = table[p / 16] as usize * 16 + p % 16;
                for (part, which) in [(0, Part::K), (1, Part::V)] {
                    let row: Vec<f32> = (0..hd).map(|d| val(p, 0, d, part) * 3.0).collect();
                    kv.write_row(0, slot, which, 0, &row);
                }
            }
            let rep = 3;
            let q: Vec<f32> = (0..rep * hd)
                .map(|i| ((i * 7 % 13) as f32 - 6.0) / 5.0)
                .collect();
            for first in [0, 21] {
                let tok = AttnToken {
                    block_table: &table,
                    pos: n - 1,
                    first,
                    tiled: false,
                };
                let toks = [tok];
                let [fast, portable] = [true, false].map(|fast_path| {
                    let mut out = vec![0f32; rep * hd];
                    let outs: &mut [&mut [f32]] = &mut [&mut out];
                    attend_rows(&kv, 0, 0, &toks, &[&q], rep, hd, 0.3, None, outs, fast_path);
                    out.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                });
                assert_eq!(fast, portable, "hd {hd}, first {first}");
            }
        }
    }
}
