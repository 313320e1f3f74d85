//! Causal attention over the paged KV pool, reading pages in place.
//!
//! Each (token, KV head) pair is one unit of work: the query heads that share the KV head
//! (GQA) are scored together, so every K/V row is decoded from its page format once and used
//! `n_head / n_head_kv` times. No contiguous copy of the cache is ever made.
//!
//! The arithmetic follows ggml's CPU flash attention, which the peer engine runs, because this
//! model family is sensitive enough to rounding that matching its greedy tokens needs it:
//! - a span of fewer than 64 query tokens (decode, short prompts) takes ggml's per-row path:
//!   an online softmax over positions in order, the query rounded to f16, K·Q summed in
//!   ggml's lane order and the output accumulated in f16;
//! - a span of 64 or more (prefill chunks) takes ggml's tiled path: f32 query, K·Q and V
//!   accumulated in f32 as sequential FMA chains, the softmax updated once per tile of 64
//!   positions with ggml's vectorised exp.
//!
//! Quantized pages (q8_0, q4_0) have no peer arithmetic to match: in the per-row path each
//! block's K and V rows are dequantized (one call per block) and scored and accumulated in
//! plain f32, without f16's rounding steps. (Quantizing the query to q8_0 for an integer K·Q,
//! as ggml does, was faster but flipped confident tokens against f16 pages.) In the tiled
//! path they are dequantized row by row as they are read and go through f16's arithmetic.
//!
//! Here: the entry point, and what both paths share. `plan.rs` cuts a batch into units of
//! parallel work, `per_row.rs` and `tiled.rs` are the two paths, `dot.rs` the dot products
//! that score, `avx512.rs` and `avx2.rs` the register forms of the hot loops.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod dot;
mod per_row;
mod plan;
mod tiled;

pub use dot::dot_f32;

use self::per_row::attend_rows;
use self::plan::plan_units;
use self::tiled::attend_chunk_tiled;
use super::parallel::SharedSlice;
use super::pool;
use crate::kv::{KvPages, Part};

/// Where one token of the batch sits: its sequence's block table (of the layer's KV group), the
/// last position it sees and the first (after `window` positions, only the last ones).
#[derive(Clone, Copy)]
pub struct AttnToken<'a> {
    pub block_table: &'a [u32],
    /// Its own position; past it where its attention is bidirectional (an encoder's span, an
    /// image's positions).
    pub pos: usize,
    /// The first position attended to (0 without a window); the blocks before it may be gone.
    pub first: usize,
    /// Part of a span of at least [`TILE`] tokens (ggml's tiled path).
    pub tiled: bool,
}

/// ggml's flash-attention tile: spans this long take the tiled path, which steps through
/// positions this many at a time.
pub const TILE: usize = 64;

pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplies Q·K before the softmax.
    pub scale: f32,
}

/// `q` is n_tok × (n_head·head_dim), already rotated; `out` the same shape. `sinks`: per
/// query head, a logit in the softmax's denominator only (see [`with_sink`]).
pub fn paged_attention(
    kv: &KvPages,
    layer: usize,
    shape: &AttnShape,
    tokens: &[AttnToken<'_>],
    q: &[f32],
    sinks: Option<&[f32]>,
    out: &mut [f32],
) {
    let hd = shape.head_dim;
    let rep = shape.n_head / shape.n_head_kv;
    let q_dim = shape.n_head * hd;
    let (segments, units) = plan_units(tokens, shape.n_head_kv, rep, pool::threads());
    let shared = SharedSlice::new(out);
    pool::parallel_for(units.len(), |unit| {
        for seg in &segments[units[unit].clone()] {
            let heads = seg.heads.clone();
            let head_range = |t: usize| {
                let first = t * q_dim + (seg.kv_head * rep + heads.start) * hd;
                first..first + heads.len() * hd
            };
            let q_g: Vec<&[f32]> = seg.tokens.clone().map(|t| &q[head_range(t)]).collect();
            // SAFETY: this segment alone owns its tokens' output ranges for these heads.
            let mut out_g: Vec<&mut [f32]> = seg
                .tokens
                .clone()
                .map(|t| unsafe { shared.slice_mut(head_range(t).start, heads.len() * hd) })
                .collect();
            let (t0, t1) = (seg.tokens.start, seg.tokens.end);
            let first_head = seg.kv_head * rep + heads.start;
            let sinks_g = sinks.map(|s| &s[first_head..first_head + heads.len()]);
            let (toks, m) = (&tokens[t0..t1], heads.len());
            let scale = shape.scale;
            if tokens[t0].tiled {
                let out = &mut out_g;
                attend_chunk_tiled(
                    kv,
                    layer,
                    seg.kv_head,
                    toks,
                    &q_g,
                    m,
                    hd,
                    scale,
                    sinks_g,
                    out,
                );
            } else {
                let out = &mut out_g;
                attend_rows(
                    kv,
                    layer,
                    seg.kv_head,
                    toks,
                    &q_g,
                    m,
                    hd,
                    scale,
                    sinks_g,
                    out,
                    true,
                );
            }
        }
    });
}

/// A head's softmax with its sink logit `sink` joined to the denominator, as ggml's flash
/// attention does after the last position: when the sink is above the running maximum, the
/// output so far is rescaled to it. Returns (the output's rescale, the new sum).
#[inline(always)]
fn with_sink(max: f32, sum: f32, sink: f32) -> (f32, f32) {
    if sink > max {
        let ms = (max - sink).exp();
        (ms, sum * ms + 1.0)
    } else {
        (1.0, sum + (sink - max).exp())
    }
}

/// One KV head's rows of one layer, through a sequence's block table.
struct HeadRows<'a> {
    kv: &'a KvPages,
    layer: usize,
    kv_head: usize,
    block_table: &'a [u32],
}

impl HeadRows<'_> {
    /// Decodes the K and V rows of positions `start + i` for `i` in `rows` into rows `i` of
    /// `k_rows` and `v_rows`, a block's run of them at a time (a head's rows of one block are
    /// contiguous in its page, and whole blocks of the format).
    #[inline(always)]
    fn decode_rows(
        &self,
        start: usize,
        rows: std::ops::Range<usize>,
        hd: usize,
        k_rows: &mut [f32],
        v_rows: &mut [f32],
    ) {
        let geom = self.kv.geometry();
        let bt = geom.block_size;
        let row_bytes = geom.row_bytes();
        let mut i = rows.start;
        while i < rows.end {
            let p = start + i;
            let (block, s) = (self.block_table[p / bt] as usize, p % bt);
            let run = (bt - s).min(rows.end - i);
            for (part, dst) in [(Part::K, &mut *k_rows), (Part::V, &mut *v_rows)] {
                let page = self.kv.head_rows(self.layer, block, part, self.kv_head);
                let src = &page[s * row_bytes..(s + run) * row_bytes];
                geom.kv_type
                    .decode_row(src, &mut dst[i * hd..(i + run) * hd]);
            }
            i += run;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvType, PageGeometry};

    /// A K (`part` 0) or V (1) value of position `p`, KV head `h`, dimension `d` that the
    /// tests write into the pages: a few distinct values, positive and negative.
    pub(super) fn val(p: usize, h: usize, d: usize, part: usize) -> f32 {
        (((p * 31 + h * 7 + d * 3 + part * 11) % 17) as f32 - 8.0) / 8.0
    }

    /// Paged attention against a plain dense computation on the same values, for every
    /// page format (tolerance follows the format's precision).
    #[test]
    fn matches_dense_attention_across_blocks() {
        for (kv_type, tol) in [
            (KvType::F16, 5e-3),
            (KvType::Q8_0, 3e-2),
            (KvType::Q4_0, 0.25),
        ] {
            let geom = PageGeometry {
                layers: 1,
                kv_heads: 2,
                head_dim: 64,
                block_size: 4,
                kv_type,
            };
            let mut kv = KvPages::new(geom, 8).unwrap();
            let table = [5u32, 2, 7]; // scattered blocks
            let n = 10;
            for p in 0..n {
                let slot = table[p / 4] as usize * 4 + p % 4;
                for h in 0..2 {
                    for (part, which) in [(0, Part::K), (1, Part::V)] {
                        let row: Vec<f32> = (0..64).map(|d| val(p, h, d, part)).collect();
                        kv.write_row(0, slot, which, h, &row);
                    }
                }
            }
            let shape = AttnShape {
                n_head: 4,
                n_head_kv: 2,
                head_dim: 64,
                scale: 0.125,
            };
            let q: Vec<f32> = (0..4 * 64).map(|i| ((i % 9) as f32 - 4.0) / 4.0).collect();
            let mut out = vec![0f32; 4 * 64];
            let tok = |tiled| AttnToken {
                block_table: &table,
                pos: n - 1,
                first: 0,
                tiled,
            };
            // Without sinks, then with a sink per head: below, near and far above the scores
            // (the last rescales the output accumulated so far).
            for sinks in [None, Some([-3.0f32, 0.2, 1.5, 12.0])] {
                let sinks = sinks.as_ref().map(|s| &s[..]);
                paged_attention(&kv, 0, &shape, &[tok(false)], &q, sinks, &mut out);
                let mut tiled_out = vec![0f32; 4 * 64];
                paged_attention(&kv, 0, &shape, &[tok(true)], &q, sinks, &mut tiled_out);
                for (a, b) in out.iter().zip(&tiled_out) {
                    assert!((a - b).abs() < tol, "{kv_type}: per-row {a} vs tiled {b}");
                }
                for h in 0..4 {
                    let g = h / 2;
                    let s: Vec<f32> = (0..n)
                        .map(|p| {
                            (0..64)
                                .map(|d| q[h * 64 + d] * val(p, g, d, 0))
                                .sum::<f32>()
                                / 8.0
                        })
                        .collect();
                    let m = s.iter().copied().fold(f32::MIN, f32::max);
                    let sink = sinks.map_or(f32::NEG_INFINITY, |k| k[h]);
                    let m = m.max(sink);
                    let z: f32 = s.iter().map(|v| (v - m).exp()).sum::<f32>() + (sink - m).exp();
                    for d in 0..64 {
                        let want: f32 =
                            (0..n).map(|p| (s[p] - m).exp() / z * val(p, g, d, 1)).sum();
                        let got = out[h * 64 + d];
                        assert!(
                            (got - want).abs() < tol,
                            "{kv_type} h{h} d{d} sinks {sinks:?}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// A window sees only its last positions, in both paths, and never reads the blocks before
    /// it (here they are missing from the table: `NO_BLOCK` would index out of the pool).
    #[test]
    fn a_window_attends_to_its_last_positions_only() {
        let geom = PageGeometry {
            layers: 1,
            kv_heads: 1,
            head_dim: 64,
            block_size: 4,
            kv_type: KvType::F16,
        };
        let mut kv = KvPages::new(geom, 32).unwrap();
        let n: usize = 100;
        let table: Vec<u32> = (0..n.div_ceil(4) as u32).collect();
        for p in 0..n {
            for (part, which) in [(0, Part::K), (1, Part::V)] {
                let row: Vec<f32> = (0..64).map(|d| val(p, 0, d, part)).collect();
                kv.write_row(0, table[p / 4] as usize * 4 + p % 4, which, 0, &row);
            }
        }
        let shape = AttnShape {
            n_head: 1,
            n_head_kv: 1,
            head_dim: 64,
            scale: 0.125,
        };
        let window = 10;
        let q: Vec<f32> = (0..64).map(|i| ((i % 9) as f32 - 4.0) / 4.0).collect();
        // The blocks wholly before the window are gone.
        let pos = n - 1;
        let first = pos + 1 - window;
        let mut holey = table.clone();
        holey[..first / 4].fill(crate::kv::NO_BLOCK);
        for tiled in [false, true] {
            let tok = [AttnToken {
                block_table: &holey,
                pos,
                first,
                tiled,
            }];
            let mut out = vec![0f32; 64];
            paged_attention(&kv, 0, &shape, &tok, &q, None, &mut out);
            let s: Vec<f32> = (first..n)
                .map(|p| (0..64).map(|d| q[d] * val(p, 0, d, 0)).sum::<f32>() * 0.125)
                .collect();
            let m = s.iter().copied().fold(f32::MIN, f32::max);
            let z: f32 = s.iter().map(|v| (v - m).exp()).sum();
            for (d, &got) in out.iter().enumerate() {
                let want: f32 = (first..n)
                    .map(|p| (s[p - first] - m).exp() / z * val(p, 0, d, 1))
                    .sum();
                assert!(
                    (got - want).abs() < 5e-3,
                    "tiled {tiled} d{d}: {got} vs {want}"
                );
            }
        }
    }
}
