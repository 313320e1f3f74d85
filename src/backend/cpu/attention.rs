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

use super::f16_round::{fma_round, scale_round};
use super::parallel::SharedSlice;
use super::pool;
use crate::cpu_features::fma_dispatch;
use crate::kv::{KvPages, KvType, Part};
use half::f16;

/// Where one token of the batch sits: its sequence's block table (of the layer's KV group), its
/// position and the first position it sees (after `window` positions, only the last ones).
#[derive(Clone, Copy)]
pub struct AttnToken<'a> {
    pub block_table: &'a [u32],
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

/// A piece of attention work: some query heads of one KV head group, for a run of tokens.
#[derive(Clone, Debug, PartialEq)]
struct Segment {
    tokens: std::ops::Range<usize>,
    kv_head: usize,
    /// Query heads within the group (`0..rep` for the whole group).
    heads: std::ops::Range<usize>,
}

/// Splits the batch into segments and the segments into units of parallel work.
///
/// A segment is a run of consecutive tokens of one span (up to [`QUERY_CHUNK`] in the tiled
/// path, [`ROW_CHUNK`] in the per-row path) and one KV head, so that each decoded K/V tile
/// serves the whole run. Normally one unit is one segment. When the work is too coarse to
/// spread (one decoding sequence has only `n_head_kv` groups, often fewer than twice the
/// threads), the query heads are instead dealt out in equal contiguous runs, one per thread.
fn plan_units(
    tokens: &[AttnToken<'_>],
    n_head_kv: usize,
    rep: usize,
    threads: usize,
) -> (Vec<Segment>, Vec<std::ops::Range<usize>>) {
    let mut runs = Vec::new();
    let mut t = 0;
    while t < tokens.len() {
        let limit = if tokens[t].tiled {
            QUERY_CHUNK
        } else {
            ROW_CHUNK
        };
        let mut end = t + 1;
        while end < tokens.len()
            && end - t < limit
            && tokens[end].tiled == tokens[t].tiled
            && std::ptr::eq(tokens[end].block_table, tokens[t].block_table)
        {
            end += 1;
        }
        runs.push(t..end);
        t = end;
    }
    // Too few units to spread (one decoding sequence has only `n_head_kv` groups, often fewer
    // than twice the threads): the query heads are dealt out instead.
    let split_heads = threads > 1 && runs.len() * n_head_kv < 2 * threads;
    let mut segments = Vec::new();
    let mut units = Vec::new();
    if !split_heads {
        for run in &runs {
            for kv_head in 0..n_head_kv {
                units.push(segments.len()..segments.len() + 1);
                segments.push(Segment {
                    tokens: run.clone(),
                    kv_head,
                    heads: 0..rep,
                });
            }
        }
        return (segments, units);
    }
    // Flatten (run, query head) and give each thread one contiguous part of it.
    let total = runs.len() * n_head_kv * rep;
    let parts = threads.min(total);
    for part in 0..parts {
        let (lo, hi) = (part * total / parts, (part + 1) * total / parts);
        let first = segments.len();
        let mut f = lo;
        while f < hi {
            let (run, head) = (f / (n_head_kv * rep), f % (n_head_kv * rep));
            let (kv_head, h0) = (head / rep, head % rep);
            let h1 = rep.min(h0 + hi - f);
            segments.push(Segment {
                tokens: runs[run].clone(),
                kv_head,
                heads: h0..h1,
            });
            f += h1 - h0;
        }
        units.push(first..segments.len());
    }
    (segments, units)
}

/// Tokens of one span that share each decoded K/V block in the per-row path (a decoding
/// token and its draft tokens).
const ROW_CHUNK: usize = 16;

/// Queries of one span that share each decoded K/V tile in the tiled path.
const QUERY_CHUNK: usize = 16;

/// One query head's running state of the online softmax.
struct Online {
    max: f32,
    sum: f32,
    acc: Vec<f32>,
}

fma_dispatch! {
/// ggml's per-row attention for a run of tokens of one span (a decoding token and its drafts)
/// and `rep` query heads of one KV head group: an online softmax over the positions in order
/// per (token, head). Each K/V block is decoded once for the whole run; each token's
/// arithmetic is what it would be alone.
#[allow(clippy::too_many_arguments)]
fn attend_rows(
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
    let geom = kv.geometry();
    let kv_type = geom.kv_type;
    let bt = geom.block_size;
    let row_bytes = geom.row_bytes();
    // f16 pages follow ggml's f16 arithmetic (the peer's greedy tokens depend on it);
    // quantized pages have no peer arithmetic to match and run in plain f32.
    let f16_numerics = kv_type == KvType::F16;
    // The AVX-512 form of the f16 block loop, where there is one (`fast_rows` off: the
    // portable form, which tests compare it with).
    let fast_rows = fast_rows && f16_numerics && per_row_block_f16_fits(hd);
    // Each token's query as ggml multiplies it with f16 K: rounded to f16.
    let q: Vec<Vec<f32>> = qs
        .iter()
        .map(|q_g| {
            if f16_numerics {
                q_g.iter().map(|&v| f16::from_f32(v).to_f32()).collect()
            } else {
                q_g.to_vec()
            }
        })
        .collect();
    let mut heads: Vec<Online> = (0..toks.len() * rep)
        .map(|_| Online {
            max: f32::NEG_INFINITY,
            sum: 0.0,
            acc: vec![0.0; hd],
        })
        .collect();
    let mut k_tile = vec![0f32; bt * hd];
    let mut v_tile = vec![0f32; bt * hd];
    let mut scores = vec![0f32; bt];
    let mut factors = vec![(0f32, 0f32); bt];
    let first = toks.iter().map(|t| t.first).min().unwrap_or(0);
    let n_ctx = toks.iter().map(|t| t.pos + 1).max().unwrap_or(0);
    for bi in first / bt..n_ctx.div_ceil(bt) {
        let block = toks[0].block_table[bi] as usize;
        let k_rows = kv.head_rows(layer, block, Part::K, kv_head);
        let v_rows = kv.head_rows(layer, block, Part::V, kv_head);
        // The block's rows lo..hi are seen by some token of the run (a window may start
        // inside the first block): they are decoded once, into tile rows 0..hi - lo.
        let lo = first.saturating_sub(bi * bt);
        let hi = (n_ctx - bi * bt).min(bt);
        // A head's rows of one block are contiguous in its page, and rows are whole blocks of
        // the format: the block's rows convert in one call each for K and V.
        let (k_rows, v_rows) = (&k_rows[lo * row_bytes..], &v_rows[lo * row_bytes..]);
        kv_type.decode_row(&k_rows[..(hi - lo) * row_bytes], &mut k_tile[..(hi - lo) * hd]);
        kv_type.decode_row(&v_rows[..(hi - lo) * row_bytes], &mut v_tile[..(hi - lo) * hd]);
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
/// AVX-512 with the accumulator in registers (`attention_avx512::per_row_block_f16`); only
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
        use super::attention_avx512::{per_row_block_f16 as block, RowState};
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

/// A dot product in eight independent partial sums (so it vectorises without reassociation
/// being needed).
fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xc.zip(yc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

fma_dispatch! {
/// ggml's tiled flash attention for a chunk of consecutive query tokens of one span and one
/// KV head group. Each query's arithmetic is exactly what it would be alone (its own tiles of
/// `TILE` positions from 0, its own masking past its position); the chunk only shares the
/// decoding of each K/V tile.
#[allow(clippy::too_many_arguments)]
fn attend_chunk_tiled(
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
) {
    let head = HeadRows {
        kv,
        layer,
        kv_head,
        block_table: toks[0].block_table,
    };
    let max_ctx = toks.iter().map(|t| t.pos + 1).max().unwrap_or(0);
    // No query of the chunk sees a position before `lo` (and its block may be gone): tiles
    // start at the one holding it, and earlier rows of that tile are never read.
    let lo = toks.iter().map(|t| t.first).min().unwrap_or(0);
    // K transposed ([dim][position]) so K·Q runs across positions: each position is its own
    // sequential FMA chain over dimensions, as in ggml's simd_gemm, and the lanes vectorise.
    // The tiles come from a per-thread scratch, not fresh zeroed vectors (48 KiB zeroed a
    // call, thousands of calls a prompt); no row is read before this call writes it.
    let mut scratch = TILE_SCRATCH.take();
    scratch.resize(3 * TILE * hd, 0.0);
    let (k_tile_t, rest) = scratch.split_at_mut(TILE * hd);
    let (k_rows, v_tile) = rest.split_at_mut(TILE * hd);
    let mut kq = [[0f32; TILE]; HEADS_AT_ONCE];
    let n_q = toks.len();
    let mut max = vec![f32::NEG_INFINITY; n_q * rep];
    let mut sum = vec![0f32; n_q * rep];
    outs.iter_mut().for_each(|o| o.fill(0.0));
    for start in (lo - lo % TILE..max_ctx).step_by(TILE) {
        let tile_len = (max_ctx - start).min(TILE);
        // Rows before `lo` are never read (their block may be gone).
        let first_row = lo.saturating_sub(start);
        head.decode_tile(start, first_row..tile_len, hd, k_rows, v_tile);
        transpose_rows(k_rows, first_row..tile_len, hd, k_tile_t);
        for (j, tok) in toks.iter().enumerate() {
            let n_ctx = tok.pos + 1;
            if n_ctx <= start || tok.first >= start + TILE {
                continue;
            }
            let len = (n_ctx - start).min(TILE);
            // Tile rows before the token's window are masked like those past its position.
            let seen = tok.first.saturating_sub(start)..len;
            // K·Q for the group's heads together (each K value loaded once for all of them),
            // every position its own chain over the dimensions in order.
            for r0 in (0..rep).step_by(HEADS_AT_ONCE) {
                let heads = (rep - r0).min(HEADS_AT_ONCE);
                let rows = &mut kq[..heads];
                let mut q_heads: [&[f32]; HEADS_AT_ONCE] = [&[]; HEADS_AT_ONCE];
                for (h, q) in q_heads[..heads].iter_mut().enumerate() {
                    *q = &qs[j][(r0 + h) * hd..(r0 + h + 1) * hd];
                }
                kq_tile(k_tile_t, &q_heads[..heads], hd, len, rows);
                for (h, row) in rows.iter_mut().enumerate() {
                    let r = r0 + h;
                    softmax_tile(
                        row,
                        &seen,
                        scale,
                        &mut max[j * rep + r],
                        &mut sum[j * rep + r],
                        &mut outs[j][r * hd..(r + 1) * hd],
                    );
                }
                // V: each output dimension its own chain over the positions in order, the
                // heads together (each V value loaded once for all of them).
                let acc = &mut outs[j][r0 * hd..(r0 + heads) * hd];
                accumulate_v(rows, seen.start..len, v_tile, hd, acc);
            }
        }
    }
    if let Some(sinks) = sinks {
        for (j, out) in outs.iter_mut().enumerate() {
            for r in 0..rep {
                let (acc_scale, s) = with_sink(max[j * rep + r], sum[j * rep + r], sinks[r]);
                out[r * hd..(r + 1) * hd].iter_mut().for_each(|a| *a *= acc_scale);
                sum[j * rep + r] = s;
            }
        }
    }
    normalize(outs, &sum, rep, hd);
    TILE_SCRATCH.set(scratch);
}
}

thread_local! {
    /// [`attend_chunk_tiled`]'s K and V tiles (reused, never shrunk).
    static TILE_SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One KV head's rows of one layer, through a sequence's block table.
struct HeadRows<'a> {
    kv: &'a KvPages,
    layer: usize,
    kv_head: usize,
    block_table: &'a [u32],
}

impl HeadRows<'_> {
    /// Decodes the K and V rows `rows` of the tile that starts at position `start` into
    /// `k_rows` and `v_tile`, a block's run of them at a time (a head's rows of one block are
    /// contiguous in its page, and whole blocks of the format).
    #[inline(always)]
    fn decode_tile(
        &self,
        start: usize,
        rows: std::ops::Range<usize>,
        hd: usize,
        k_rows: &mut [f32],
        v_tile: &mut [f32],
    ) {
        let geom = self.kv.geometry();
        let bt = geom.block_size;
        let row_bytes = geom.row_bytes();
        let mut i = rows.start;
        while i < rows.end {
            let p = start + i;
            let (block, s) = (self.block_table[p / bt] as usize, p % bt);
            let run = (bt - s).min(rows.end - i);
            for (part, dst) in [(Part::K, &mut *k_rows), (Part::V, &mut *v_tile)] {
                let page = self.kv.head_rows(self.layer, block, part, self.kv_head);
                let src = &page[s * row_bytes..(s + run) * row_bytes];
                geom.kv_type
                    .decode_row(src, &mut dst[i * hd..(i + run) * hd]);
            }
            i += run;
        }
    }
}

/// One query head's K·Q scores of a tile into its online softmax (ggml's): the scores outside
/// `seen` masked and the rest scaled, the running `max` and `sum` updated (`acc`, the head's
/// output so far, rescaled when the maximum grows), and `row` turned into the tile's weights.
#[inline(always)]
fn softmax_tile(
    row: &mut [f32; TILE],
    seen: &std::ops::Range<usize>,
    scale: f32,
    max: &mut f32,
    sum: &mut f32,
    acc: &mut [f32],
) {
    for (i, slot) in row.iter_mut().enumerate() {
        *slot = if seen.contains(&i) {
            *slot * scale
        } else {
            f32::NEG_INFINITY
        };
    }
    let m_new = max.max(tile_max(row));
    if m_new > *max {
        let ms = (*max - m_new).exp();
        acc.iter_mut().for_each(|a| *a *= ms);
        *sum *= ms;
    }
    *max = m_new;
    // ggml_vec_soft_max_f32: exp in place, 16-lane partial sums added in f64.
    let mut tile_sum = 0f64;
    for lanes in row.chunks_exact_mut(16) {
        for p in lanes.iter_mut() {
            *p = super::ops::expf_v(*p - m_new);
        }
        tile_sum += reduce_add_16(lanes) as f64;
    }
    *sum = (*sum as f64 + tile_sum) as f32;
}

/// The largest of a tile's scores (NaNs passed over, as `f32::max` does): sixteen lane
/// maxima, then halves. A maximum is the same in any order, and this one vectorises where a
/// fold over the tile is a chain of 64 dependent steps.
#[inline(always)]
fn tile_max(row: &[f32; TILE]) -> f32 {
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut m = [f32::NEG_INFINITY; 16];
    for lanes in row.chunks_exact(16) {
        for (m, &v) in m.iter_mut().zip(lanes) {
            *m = larger(*m, v);
        }
    }
    let mut width = 8;
    while width > 0 {
        for l in 0..width {
            m[l] = larger(m[l], m[l + width]);
        }
        width /= 2;
    }
    m[0]
}

/// Divides each query head's output by its softmax sum (a head that saw nothing stays 0).
#[inline(always)]
fn normalize(outs: &mut [&mut [f32]], sum: &[f32], rep: usize, hd: usize) {
    for (j, out) in outs.iter_mut().enumerate() {
        for r in 0..rep {
            let s = sum[j * rep + r];
            let inv = if s == 0.0 { 0.0 } else { 1.0 / s };
            out[r * hd..(r + 1) * hd].iter_mut().for_each(|a| *a *= inv);
        }
    }
}

/// `kt[d * TILE + i] = rows[i * hd + d]` for the rows `range` of a tile: K transposed for
/// [`kq_tile`] (16 × 16 blocks in AVX-512 registers where the CPU has it, 8 × 8 in AVX2 ones).
fn transpose_rows(rows: &[f32], range: std::ops::Range<usize>, hd: usize, kt: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    let done = if crate::cpu_features::avx512() && hd.is_multiple_of(16) {
        // SAFETY: AVX-512F was detected; the bounds are checked inside.
        unsafe { super::attention_avx512::transpose_rows(rows, range.clone(), hd, kt) }
    } else if crate::cpu_features::avx2() && hd.is_multiple_of(8) {
        // SAFETY: AVX2 was detected; the bounds are checked inside.
        unsafe { super::attention_avx2::transpose_rows(rows, range.clone(), hd, kt) }
    } else {
        range.start
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = range.start;
    for i in done..range.end {
        for d in 0..hd {
            kt[d * TILE + i] = rows[i * hd + d];
        }
    }
}

/// Query heads of a group scored together in the tiled path.
const HEADS_AT_ONCE: usize = 4;

/// `rows[h][i] = Σ_d q[h][d] · kt[d * TILE + i]`: each position's chain over the dimensions in
/// order, from 0 (ggml's `simd_gemm`), for up to [`HEADS_AT_ONCE`] query heads at once (each
/// K value loaded once for all of them): AVX-512 or AVX2 registers where the CPU has them.
/// Only the first `positions` scores are asked for (a diagonal tile's later ones are masked):
/// the forms compute them rounded up to sixteen, and leave the later lanes as they were.
fn kq_tile(kt: &[f32], q: &[&[f32]], hd: usize, positions: usize, rows: &mut [[f32; TILE]]) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx512() {
        // SAFETY: AVX-512F was detected; the shapes are the tiled path's (checked inside).
        return unsafe { super::attention_avx512::kq_tile(kt, q, hd, positions, rows) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: AVX2 and FMA were detected; the shapes are the tiled path's (checked inside).
        return unsafe { super::attention_avx2::kq_tile(kt, q, hd, positions, rows) };
    }
    kq_tile_portable(kt, q, hd, positions, rows)
}

fma_dispatch! {
fn kq_tile_portable(
    kt: &[f32],
    q: &[&[f32]],
    hd: usize,
    positions: usize,
    rows: &mut [[f32; TILE]],
) {
    let n = positions.div_ceil(16) * 16;
    let rows = &mut rows[..q.len()];
    rows.iter_mut().for_each(|row| row[..n].fill(0.0));
    for d in 0..hd {
        let kt = &kt[d * TILE..d * TILE + n];
        for (row, q) in rows.iter_mut().zip(q) {
            let qd = q[d];
            for (slot, &k) in row.iter_mut().zip(kt) {
                *slot = qd.mul_add(k, *slot);
            }
        }
    }
}
}

/// For each head `h` (a row of `p`, and `hd` values of `acc`):
/// `acc[h][d] = p[h][i] · v[i * hd + d] + acc[h][d]` over the positions `range` in order, each
/// output dimension its own chain.
fn accumulate_v(
    p: &[[f32; TILE]],
    range: std::ops::Range<usize>,
    v: &[f32],
    hd: usize,
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx512() {
        // SAFETY: AVX-512F was detected; the bounds are checked inside.
        return unsafe { super::attention_avx512::accumulate_v(p, range, v, hd, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: AVX2 and FMA were detected; the bounds are checked inside.
        return unsafe { super::attention_avx2::accumulate_v(p, range, v, hd, acc) };
    }
    accumulate_v_portable(p, range, v, hd, acc)
}

fma_dispatch! {
fn accumulate_v_portable(
    p: &[[f32; TILE]],
    range: std::ops::Range<usize>,
    v: &[f32],
    hd: usize,
    acc: &mut [f32],
) {
    for (p, acc) in p.iter().zip(acc.chunks_exact_mut(hd)) {
        for i in range.clone() {
            let pi = p[i];
            for (a, &x) in acc.iter_mut().zip(&v[i * hd..(i + 1) * hd]) {
                *a = pi.mul_add(x, *a);
            }
        }
    }
}
}

/// GCC's `_mm512_reduce_add_ps` order: halves, quarters, then pairs.
#[inline(always)]
fn reduce_add_16(v: &[f32]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|l| v[l + 8] + v[l]);
    let t4: [f32; 4] = std::array::from_fn(|l| t8[l + 4] + t8[l]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// Dot product of two f16-valued rows in ggml's AVX-512 order: four accumulators of 16
/// lanes fed 64 values at a time, folded pairwise, then the lanes reduced as GCC's
/// `_mm512_reduce_add_ps` does; a tail beyond whole 64s is added in f64.
#[inline(always)]
fn dot_f16_ggml(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { dot_f16_ggml_avx2(x, y) };
    }
    dot_f16_ggml_scalar(x, y)
}

/// The portable form of [`dot_f16_ggml`], written lane by lane.
fn dot_f16_ggml_scalar(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let main = n - n % 64;
    let mut acc = [[0f32; 16]; 4];
    for (xc, yc) in x[..main].chunks_exact(64).zip(y[..main].chunks_exact(64)) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                *lane = xc[j * 16 + l].mul_add(yc[j * 16 + l], *lane);
            }
        }
    }
    let v: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let head = if main > 0 {
        reduce_add_16(&v) as f64
    } else {
        0.0
    };
    dot_tail(head, &x[main..], &y[main..])
}

/// Adds the products past the whole 64s in f64, as ggml does.
#[inline(always)]
fn dot_tail(mut sum: f64, x: &[f32], y: &[f32]) -> f32 {
    for (&a, &b) in x.iter().zip(y) {
        sum += (a * b) as f64;
    }
    sum as f32
}

/// [`dot_f16_ggml`] in AVX2: each 16-lane accumulator is two 8-lane registers, so every lane
/// sees the same FMA chain and the reduction the same additions as the scalar form. (LLVM
/// does not vectorise the scalar form: it unrolls the 16 lanes into scalar FMAs.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f16_ggml_avx2(x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len());
    let main = n - n % 64;
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut base = 0;
    while base < main {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: base + 8k + 8 <= main <= both lengths.
            let (xv, yv) = unsafe {
                (
                    _mm256_loadu_ps(xp.add(base + 8 * k)),
                    _mm256_loadu_ps(yp.add(base + 8 * k)),
                )
            };
            *a = _mm256_fmadd_ps(xv, yv, *a);
        }
        base += 64;
    }
    // acc[2j] holds lanes 0..8 of accumulator j, acc[2j + 1] lanes 8..16.
    let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    let t8 = _mm256_add_ps(hi, lo);
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let mut l = [0f32; 4];
    // SAFETY: `l` holds four f32.
    unsafe { _mm_storeu_ps(l.as_mut_ptr(), t4) };
    let head = if main > 0 {
        ((l[0] + l[2]) + (l[1] + l[3])) as f64
    } else {
        0.0
    };
    dot_tail(head, &x[main..n], &y[main..n])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiled path's inner loops on this CPU (AVX-512 where it has it), and their AVX2
    /// forms where the CPU has AVX2, against their portable forms, bit for bit, on ragged
    /// shapes.
    #[test]
    fn tile_loops_match_their_portable_forms_bit_for_bit() {
        // The AVX2 forms join on x86-64 only.
        #[allow(unused_mut)]
        let mut forms: Vec<(&str, KqTile, AccumulateV)> =
            vec![("dispatched", kq_tile, accumulate_v)];
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_features::avx2() {
            use super::super::attention_avx2 as avx2;
            // SAFETY (both): AVX2 and FMA were detected.
            forms.push((
                "avx2",
                |kt, q, hd, positions, rows| unsafe { avx2::kq_tile(kt, q, hd, positions, rows) },
                |p, range, v, hd, acc| unsafe { avx2::accumulate_v(p, range, v, hd, acc) },
            ));
        }
        for (form, kq_tile, accumulate_v) in forms {
            tile_loops_match(form, kq_tile, accumulate_v);
        }
    }

    /// The tile maximum in lanes is the fold's, masked lanes and NaNs included.
    #[test]
    fn tile_max_is_the_folds_maximum() {
        let mut x = 0x1234_5678u32;
        for case in 0..200 {
            let row: [f32; TILE] = std::array::from_fn(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match (case % 4, x % 7) {
                    (1, 0) => f32::NEG_INFINITY,
                    (2, 0) => f32::NAN,
                    (3, _) if i != (x as usize) % TILE => f32::NEG_INFINITY,
                    _ => (x % 20001) as f32 / 100.0 - 100.0,
                }
            });
            let want = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(tile_max(&row).to_bits(), want.to_bits(), "case {case}");
        }
    }

    type KqTile = fn(&[f32], &[&[f32]], usize, usize, &mut [[f32; TILE]]);
    type AccumulateV = fn(&[[f32; TILE]], std::ops::Range<usize>, &[f32], usize, &mut [f32]);

    fn tile_loops_match(form: &str, kq_tile: KqTile, accumulate_v: AccumulateV) {
        let mut x = 0x2545_f491u32;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x % 2001) as f32 / 1000.0 - 1.0
        };
        for hd in [64, 72, 80, 128, 256] {
            let kt: Vec<f32> = (0..hd * TILE).map(|_| rnd()).collect();
            let q: Vec<Vec<f32>> = (0..HEADS_AT_ONCE)
                .map(|_| (0..hd).map(|_| rnd()).collect())
                .collect();
            for heads in 1..=HEADS_AT_ONCE {
                let qr: Vec<&[f32]> = q[..heads].iter().map(|v| &v[..]).collect();
                let (mut got, mut want) =
                    ([[0f32; TILE]; HEADS_AT_ONCE], [[0f32; TILE]; HEADS_AT_ONCE]);
                for positions in [TILE, 1, 16, 17, 40, 63] {
                    kq_tile(&kt, &qr, hd, positions, &mut got);
                    kq_tile_portable(&kt, &qr, hd, positions, &mut want);
                    let bits = |r: &[[f32; TILE]]| {
                        r.iter()
                            .flat_map(|r| &r[..positions])
                            .map(|v| v.to_bits())
                            .collect::<Vec<_>>()
                    };
                    assert_eq!(
                        bits(&got[..heads]),
                        bits(&want[..heads]),
                        "{form}: hd {hd}, {heads} heads, {positions} positions"
                    );
                }
            }
            let v: Vec<f32> = (0..TILE * hd).map(|_| rnd()).collect();
            let p: Vec<[f32; TILE]> = (0..HEADS_AT_ONCE)
                .map(|_| std::array::from_fn(|_| rnd()))
                .collect();
            for (range, heads) in [(0..TILE, 4), (3..40, 1), (5..6, 3), (7..7, 2), (0..63, 2)] {
                let start: Vec<f32> = (0..heads * hd).map(|_| rnd()).collect();
                let (mut got, mut want) = (start.clone(), start);
                accumulate_v(&p[..heads], range.clone(), &v, hd, &mut got);
                accumulate_v_portable(&p[..heads], range, &v, hd, &mut want);
                assert_eq!(
                    got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{form}: hd {hd}, {heads} heads"
                );
            }
        }
    }
    use crate::kv::{KvType, PageGeometry};

    fn val(p: usize, h: usize, d: usize, part: usize) -> f32 {
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

    #[test]
    fn tile_transpose_puts_every_value_in_its_column() {
        type Transpose = fn(&[f32], std::ops::Range<usize>, usize, &mut [f32]);
        // The AVX2 forms join on x86-64 only.
        #[allow(unused_mut)]
        let mut forms: Vec<(&str, Transpose)> = vec![("dispatched", transpose_rows)];
        #[cfg(target_arch = "x86_64")]
        if crate::cpu_features::avx2() {
            forms.push(("avx2", |rows, range, hd, kt| {
                // SAFETY: AVX2 was detected. Rows it leaves stay as they were.
                let done = unsafe {
                    super::super::attention_avx2::transpose_rows(rows, range.clone(), hd, kt)
                };
                for i in done..range.end {
                    for d in 0..hd {
                        kt[d * TILE + i] = rows[i * hd + d];
                    }
                }
            }));
        }
        for (form, transpose_rows) in forms {
            transpose_puts_every_value_in_its_column(form, transpose_rows);
        }
    }

    fn transpose_puts_every_value_in_its_column(
        form: &str,
        transpose_rows: fn(&[f32], std::ops::Range<usize>, usize, &mut [f32]),
    ) {
        for hd in [16, 64, 80, 256] {
            let rows: Vec<f32> = (0..TILE * hd).map(|i| i as f32).collect();
            for range in [0..TILE, 5..37, 16..32, 3..3] {
                let mut kt = vec![-1f32; hd * TILE];
                transpose_rows(&rows, range.clone(), hd, &mut kt);
                for d in 0..hd {
                    for i in 0..TILE {
                        let want = if range.contains(&i) {
                            rows[i * hd + d]
                        } else {
                            -1.0
                        };
                        assert_eq!(
                            kt[d * TILE + i],
                            want,
                            "{form}: hd {hd} {range:?} ({d}, {i})"
                        );
                    }
                }
            }
        }
    }

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

    /// A chunk of queries sharing K/V tiles gives each query the bits it gets alone.
    #[test]
    fn chunked_tiled_queries_match_single_queries_bit_for_bit() {
        let geom = PageGeometry {
            layers: 1,
            kv_heads: 1,
            head_dim: 64,
            block_size: 16,
            kv_type: KvType::F16,
        };
        let mut kv = KvPages::new(geom, 16).unwrap();
        let table: Vec<u32> = (0..16).rev().collect();
        let n = 150;
        for p in 0..n {
            let slot = table[p / 16] as usize * 16 + p % 16;
            for (part, which) in [(0, Part::K), (1, Part::V)] {
                let row: Vec<f32> = (0..64).map(|d| val(p, 0, d, part)).collect();
                kv.write_row(0, slot, which, 0, &row);
            }
        }
        let shape = AttnShape {
            n_head: 2,
            n_head_kv: 1,
            head_dim: 64,
            scale: 0.125,
        };
        let toks: Vec<AttnToken<'_>> = (40..n)
            .map(|pos| AttnToken {
                block_table: &table,
                pos,
                first: 0,
                tiled: true,
            })
            .collect();
        let q: Vec<f32> = (0..toks.len() * 128)
            .map(|i| ((i * 7 % 23) as f32 - 11.0) / 5.0)
            .collect();
        let mut together = vec![0f32; q.len()];
        paged_attention(&kv, 0, &shape, &toks, &q, None, &mut together);
        for (i, tok) in toks.iter().enumerate() {
            let mut alone = vec![0f32; 128];
            let one = [AttnToken { ..*tok }];
            paged_attention(
                &kv,
                0,
                &shape,
                &one,
                &q[i * 128..(i + 1) * 128],
                None,
                &mut alone,
            );
            for (a, b) in alone.iter().zip(&together[i * 128..(i + 1) * 128]) {
                assert_eq!(a.to_bits(), b.to_bits(), "query at position {}", tok.pos);
            }
        }
    }

    #[test]
    fn one_decoding_token_splits_its_heads_evenly_across_threads() {
        let table = [0u32];
        let tok = [AttnToken {
            block_table: &table,
            pos: 3,
            first: 0,
            tiled: false,
        }];
        let (segs, units) = plan_units(&tok, 3, 3, 2);
        assert_eq!(units.len(), 2);
        let heads = |u: &std::ops::Range<usize>| -> usize {
            segs[u.clone()].iter().map(|s| s.heads.len()).sum()
        };
        assert_eq!((heads(&units[0]), heads(&units[1])), (4, 5));
        // Every (KV head, query head) exactly once.
        let mut seen: Vec<(usize, usize)> = segs
            .iter()
            .flat_map(|s| s.heads.clone().map(move |h| (s.kv_head, h)))
            .collect();
        seen.sort();
        let want: Vec<(usize, usize)> = (0..3).flat_map(|g| (0..3).map(move |h| (g, h))).collect();
        assert_eq!(seen, want);
        // Plenty of groups (four sequences): one unit per (token, KV head), whole groups.
        let tables = [[0u32], [1], [2], [3]];
        let many: Vec<AttnToken> = tables
            .iter()
            .map(|t| AttnToken {
                block_table: t,
                pos: 3,
                first: 0,
                tiled: false,
            })
            .collect();
        let (segs, units) = plan_units(&many, 3, 3, 2);
        assert_eq!(units.len(), 12);
        assert!(segs
            .iter()
            .all(|s| s.heads == (0..3) && s.tokens.len() == 1));
        // One sequence's token and its drafts: one run, whose heads are split as above.
        let span: Vec<AttnToken> = (0..4)
            .map(|p| AttnToken {
                block_table: &table,
                pos: p,
                first: 0,
                tiled: false,
            })
            .collect();
        let (segs, units) = plan_units(&span, 3, 3, 2);
        assert_eq!(units.len(), 2);
        assert!(segs.iter().all(|s| s.tokens == (0..4)));
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

    #[test]
    fn f16_dot_simd_matches_scalar_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0).to_f32()
        };
        for n in [1, 7, 63, 64, 65, 100, 128, 130, 256] {
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            let y: Vec<f32> = (0..n).map(|_| next()).collect();
            let want = dot_f16_ggml_scalar(&x, &y);
            assert_eq!(dot_f16_ggml(&x, &y).to_bits(), want.to_bits(), "n = {n}");
        }
    }

    #[test]
    fn f16_dot_order_is_a_dot_product() {
        let x: Vec<f32> = (0..200).map(|i| (i % 13) as f32 * 0.25).collect();
        let y: Vec<f32> = (0..200).map(|i| 1.0 - (i % 7) as f32 * 0.125).collect();
        let want: f64 = x.iter().zip(&y).map(|(a, b)| (a * b) as f64).sum();
        assert!((dot_f16_ggml(&x, &y) as f64 - want).abs() < 1e-3);
    }
}
