//! ggml's tiled path (spans of [`TILE`] tokens or more: prefill chunks): f32 queries, K·Q and
//! V accumulated in f32 as sequential FMA chains, the softmax updated once per tile of
//! [`TILE`] positions with ggml's vectorised exp. A chunk of queries shares each decoded tile.

use super::dot::reduce_add_16;
use super::{with_sink, AttnToken, TILE};
use crate::cpu_features::fma_dispatch;
use crate::kv::KvPages;

fma_dispatch! {
/// ggml's tiled flash attention for a chunk of consecutive query tokens of one span and one
/// KV head group. Each query's arithmetic is exactly what it would be alone (its own tiles of
/// `TILE` positions from 0, its own masking past its position); the chunk only shares the
/// decoding of each K/V tile.
#[allow(clippy::too_many_arguments)]
pub(super) fn attend_chunk_tiled(
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
    let head = super::HeadRows {
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
        head.decode_rows(start, first_row..tile_len, hd, k_rows, v_tile);
        transpose_rows(k_rows, first_row..tile_len, hd, k_tile_t);
        for (j, tok) in toks.iter().enumerate() {
            let n_ctx = tok.pos + 1;
            if n_ctx <= start || tok.first >= start + TILE {
                continue;
            }
            // Tile rows before the token's window are masked like those past its position.
            let seen = tok.first.saturating_sub(start)..(n_ctx - start).min(TILE);
            let heads = j * rep..(j + 1) * rep;
            let softmax = (&mut max[heads.clone()], &mut sum[heads]);
            let tile = (&*k_tile_t, &*v_tile);
            attend_tile(tile, qs[j], seen, scale, hd, softmax, outs[j], &mut kq);
        }
    }
    if let Some(sinks) = sinks {
        join_sinks(outs, &max, &mut sum, sinks, hd);
    }
    normalize(outs, &sum, rep, hd);
    TILE_SCRATCH.set(scratch);
}
}

/// One query token's heads of a group against one decoded tile (`k_t` transposed, and `v`),
/// the positions `seen` unmasked: K·Q for up to [`HEADS_AT_ONCE`] heads together (each K
/// value loaded once for all of them), every position its own chain over the dimensions in
/// order; each head's online softmax (`max` and `sum`, one per head); then V into `out` (the
/// heads' outputs, `hd` each), each output dimension its own chain over the positions in
/// order. `kq` is scratch for the scores.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_tile(
    (k_t, v): (&[f32], &[f32]),
    q: &[f32],
    seen: std::ops::Range<usize>,
    scale: f32,
    hd: usize,
    (max, sum): (&mut [f32], &mut [f32]),
    out: &mut [f32],
    kq: &mut [[f32; TILE]; HEADS_AT_ONCE],
) {
    let (rep, len) = (max.len(), seen.end);
    for r0 in (0..rep).step_by(HEADS_AT_ONCE) {
        let heads = (rep - r0).min(HEADS_AT_ONCE);
        let rows = &mut kq[..heads];
        let mut q_heads: [&[f32]; HEADS_AT_ONCE] = [&[]; HEADS_AT_ONCE];
        for (h, q_head) in q_heads[..heads].iter_mut().enumerate() {
            *q_head = &q[(r0 + h) * hd..(r0 + h + 1) * hd];
        }
        kq_tile(k_t, &q_heads[..heads], hd, len, rows);
        for (h, row) in rows.iter_mut().enumerate() {
            let r = r0 + h;
            let acc = &mut out[r * hd..(r + 1) * hd];
            softmax_tile(row, &seen, scale, &mut max[r], &mut sum[r], acc);
        }
        let acc = &mut out[r0 * hd..(r0 + heads) * hd];
        accumulate_v(rows, seen.start..len, v, hd, acc);
    }
}

/// Joins each head's sink logit to its softmax (`sum`, one per (token, head), updated),
/// rescaling the output so far where the sink is above the running maximum.
#[inline(always)]
fn join_sinks(outs: &mut [&mut [f32]], max: &[f32], sum: &mut [f32], sinks: &[f32], hd: usize) {
    let rep = sinks.len();
    for (j, out) in outs.iter_mut().enumerate() {
        for r in 0..rep {
            let (acc_scale, s) = with_sink(max[j * rep + r], sum[j * rep + r], sinks[r]);
            out[r * hd..(r + 1) * hd]
                .iter_mut()
                .for_each(|a| *a *= acc_scale);
            sum[j * rep + r] = s;
        }
    }
}

thread_local! {
    /// [`attend_chunk_tiled`]'s K and V tiles (reused, never shrunk).
    static TILE_SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
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
            *p = crate::backend::cpu::ops::expf_v(*p - m_new);
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
        unsafe { super::avx512::transpose_rows(rows, range.clone(), hd, kt) }
    } else if crate::cpu_features::avx2() && hd.is_multiple_of(8) {
        // SAFETY: AVX2 was detected; the bounds are checked inside.
        unsafe { super::avx2::transpose_rows(rows, range.clone(), hd, kt) }
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
        return unsafe { super::avx512::kq_tile(kt, q, hd, positions, rows) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: AVX2 and FMA were detected; the shapes are the tiled path's (checked inside).
        return unsafe { super::avx2::kq_tile(kt, q, hd, positions, rows) };
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
        return unsafe { super::avx512::accumulate_v(p, range, v, hd, acc) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: AVX2 and FMA were detected; the bounds are checked inside.
        return unsafe { super::avx2::accumulate_v(p, range, v, hd, acc) };
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

#[cfg(test)]
mod tests {
    use super::super::tests::val;
    use super::super::{paged_attention, AttnShape};
    use super::*;
    use crate::kv::{KvType, PageGeometry, Part};

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
            use super::super::avx2;
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
                let done =
                    unsafe { super::super::avx2::transpose_rows(rows, range.clone(), hd, kt) };
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
}
