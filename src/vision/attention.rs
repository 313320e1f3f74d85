//! The ViT's bidirectional multi-head attention over all of an image's patches, as two dense
//! products per (head, block of queries): scores `Q·Kᵀ` and outputs `softmax·V`, both through
//! the tiled GEMM's panels ([`crate::backend::cpu::gemm`]), with a vectorised softmax between.
//! Everything in f32; a block's scores stay in a per-thread scratch (64 queries × patches).

use crate::backend::cpu::gemm::{
    pack_columns_f32, pack_rows_f32, packed_len, panel_product, PanelRef, PANEL,
};
use crate::backend::cpu::ops::expf_v;
use crate::backend::cpu::parallel::SharedSlice;
use crate::backend::cpu::pool;
use crate::cpu_features::fma_dispatch;
use std::cell::Cell;

/// Queries a task scores at once: their scores fit in L2 for thousands of patches.
const QUERY_BLOCK: usize = 128;

thread_local! {
    /// A task's scores, kept per thread: fresh ones cost their pages' zeroing every task.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `out` (n × heads·hd) = each head's softmax(q·kᵀ / √hd)·v, over every row of `q`, `k`, `v`
/// (n × heads·hd each).
pub fn attend(q: &[f32], k: &[f32], v: &[f32], heads: usize, hd: usize, out: &mut [f32]) {
    let width = heads * hd;
    let n = q.len() / width;
    assert!(q.len() == n * width && k.len() == q.len() && v.len() == q.len());
    assert!(out.len() == q.len());
    let scale = 1.0 / (hd as f32).sqrt();
    // Each head's keys and values packed once, for all its blocks of queries.
    let (key_len, value_len) = (packed_len(n, hd), packed_len(hd, n));
    let mut packed = vec![0f32; heads * (key_len + value_len)];
    let shared = SharedSlice::new(&mut packed);
    pool::parallel_for(heads, |head| {
        // SAFETY: each head's part of `packed` is its task's alone.
        let part = unsafe { shared.slice_mut(head * (key_len + value_len), key_len + value_len) };
        let (keys, values) = part.split_at_mut(key_len);
        pack_rows_f32(&k[head * hd..], width, n, hd, keys);
        pack_columns_f32(&v[head * hd..], width, n, hd, values);
    });
    let blocks = n.div_ceil(QUERY_BLOCK);
    let shared = SharedSlice::new(out);
    pool::parallel_for(heads * blocks, |task| {
        let (head, block) = (task / blocks, task % blocks);
        let q0 = block * QUERY_BLOCK;
        let rows = (n - q0).min(QUERY_BLOCK);
        let (keys, values) =
            packed[head * (key_len + value_len)..][..key_len + value_len].split_at(key_len);
        let mut scores = SCORES.take();
        scores.resize(QUERY_BLOCK * n, 0.0);
        let queries = &q[q0 * width + head * hd..];
        let queries = &queries[..(rows - 1) * width + hd];
        for p in 0..n.div_ceil(PANEL) {
            let panel = PanelRef::F32 {
                values: &keys[p * hd * PANEL..][..hd * PANEL],
                stride: PANEL,
            };
            let cols = (n - p * PANEL).min(PANEL);
            // SAFETY: each score row holds n values; this panel writes its own columns.
            unsafe {
                panel_product(
                    queries,
                    width,
                    hd,
                    panel,
                    scores[p * PANEL..].as_mut_ptr(),
                    n,
                    cols,
                )
            };
        }
        let mut sums = [0f32; QUERY_BLOCK];
        softmax_rows(&mut scores[..rows * n], n, scale, &mut sums[..rows]);
        let at = shared.span_ptr(q0 * width + head * hd, (rows - 1) * width + hd);
        for p in 0..hd.div_ceil(PANEL) {
            let panel = PanelRef::F32 {
                values: &values[p * n * PANEL..][..n * PANEL],
                stride: PANEL,
            };
            let cols = (hd - p * PANEL).min(PANEL);
            // SAFETY: rows q0.. of this head's columns belong to this task alone.
            unsafe {
                panel_product(
                    &scores[..rows * n],
                    n,
                    n,
                    panel,
                    at.add(p * PANEL),
                    width,
                    cols,
                )
            };
        }
        for (r, &sum) in sums[..rows].iter().enumerate() {
            // SAFETY: as above: this task's row r of its head.
            let o = unsafe { std::slice::from_raw_parts_mut(at.add(r * width), hd) };
            o.iter_mut().for_each(|v| *v /= sum);
        }
        SCORES.set(scores);
    });
}

fma_dispatch! {
/// Each row of `scores` (rows of `n`) to `exp((s - max)·scale)`, its sum in `sums`: the
/// normalisation is left to the outputs, `hd` wide where a row is `n`.
fn softmax_rows(scores: &mut [f32], n: usize, scale: f32, sums: &mut [f32]) {
    for (row, sum) in scores.chunks_exact_mut(n).zip(sums.iter_mut()) {
        let mut lanes = [f32::NEG_INFINITY; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            lanes.iter_mut().zip(c).for_each(|(m, &s)| *m = m.max(s));
        }
        let max = chunks.remainder().iter().chain(&lanes).fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let mut lanes = [0f32; 16];
        let mut chunks = row.chunks_exact_mut(16);
        for c in &mut chunks {
            lanes.iter_mut().zip(c).for_each(|(a, s)| {
                *s = expf_v((*s - max) * scale);
                *a += *s;
            });
        }
        let tail = chunks.into_remainder();
        tail.iter_mut().for_each(|s| *s = expf_v((*s - max) * scale));
        *sum = tail.iter().sum::<f32>() + lanes.iter().sum::<f32>();
    }
}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The textbook form in f64.
    fn reference(q: &[f32], k: &[f32], v: &[f32], heads: usize, hd: usize) -> Vec<f32> {
        let width = heads * hd;
        let n = q.len() / width;
        let mut out = vec![0f32; q.len()];
        for h in 0..heads {
            for i in 0..n {
                let row = |m: &[f32], j: usize| m[j * width + h * hd..][..hd].to_vec();
                let s: Vec<f64> = (0..n)
                    .map(|j| {
                        let d: f64 = row(q, i)
                            .iter()
                            .zip(row(k, j))
                            .map(|(&a, b)| f64::from(a) * f64::from(b))
                            .sum();
                        d / (hd as f64).sqrt()
                    })
                    .collect();
                let max = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let sum: f64 = e.iter().sum();
                for d in 0..hd {
                    let o: f64 = (0..n)
                        .map(|j| e[j] * f64::from(v[j * width + h * hd + d]))
                        .sum();
                    out[i * width + h * hd + d] = (o / sum) as f32;
                }
            }
        }
        out
    }

    #[test]
    fn blocks_of_queries_and_ragged_heads_match_the_textbook_form() {
        // 70 patches: a second, partial block of queries; hd 40: a partial panel of values.
        let (heads, hd, n) = (3, 40, 70);
        let m = |seed: u32| -> Vec<f32> {
            (0..n * heads * hd)
                .map(|i| {
                    ((i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8) as f32
                        / (1u32 << 24) as f32
                        * 4.0
                        - 2.0
                })
                .collect()
        };
        let (q, k, v) = (m(1), m(2), m(3));
        let mut out = vec![f32::NAN; q.len()];
        attend(&q, &k, &v, heads, hd, &mut out);
        let want = reference(&q, &k, &v, heads, hd);
        let worst = out
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-5, "largest difference {worst}");
    }
}
