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
use std::ops::Range;

/// Queries a task scores at once: their scores fit in L2 for thousands of patches.
pub const QUERY_BLOCK: usize = 128;

thread_local! {
    /// A task's scores, kept per thread: fresh ones cost their pages' zeroing every task.
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// `out` (n × heads·hd) = each head's softmax(q·kᵀ / √hd)·v, over every row of `q`, `k`, `v`
/// (n × heads·hd each).
#[cfg(test)]
pub fn attend(q: &[f32], k: &[f32], v: &[f32], heads: usize, hd: usize, out: &mut [f32]) {
    let kv = KeysValues::pack(k, v, heads, hd, Vec::new());
    kv.attend(q, 0..kv.n, out);
}

/// Every head's keys and values packed once into the GEMM's panels, for all its blocks of
/// queries (which an encoder in slices runs a few at a time).
pub struct KeysValues {
    packed: Vec<f32>,
    n: usize,
    heads: usize,
    hd: usize,
}

impl KeysValues {
    /// `k` and `v`: n × heads·hd each; packed into `storage` (its values overwritten: an
    /// encoder's, kept from one block to the next).
    pub fn pack(k: &[f32], v: &[f32], heads: usize, hd: usize, storage: Vec<f32>) -> KeysValues {
        let width = heads * hd;
        let n = k.len() / width;
        assert!(k.len() == n * width && v.len() == k.len());
        let part = packed_len(n, hd) + packed_len(hd, n);
        let mut packed = storage;
        packed.resize(heads * part, 0.0);
        let shared = SharedSlice::new(&mut packed);
        pool::parallel_for(heads, |head| {
            // SAFETY: each head's part of `packed` is its task's alone.
            let part = unsafe { shared.slice_mut(head * part, part) };
            let (keys, values) = part.split_at_mut(packed_len(n, hd));
            pack_rows_f32(&k[head * hd..], width, n, hd, keys);
            pack_columns_f32(&v[head * hd..], width, n, hd, values);
        });
        KeysValues {
            packed,
            n,
            heads,
            hd,
        }
    }

    /// The storage, for the next [`KeysValues::pack`].
    pub fn into_storage(self) -> Vec<f32> {
        self.packed
    }

    /// Rows `queries` of `out` (n × heads·hd, as `q`): their softmax(q·kᵀ / √hd)·v per head.
    pub fn attend(&self, q: &[f32], queries: Range<usize>, out: &mut [f32]) {
        let (n, width) = (self.n, self.heads * self.hd);
        assert!(q.len() == n * width && out.len() == q.len() && queries.end <= n);
        // Blocks of equal size, so that the tasks are.
        let blocks = queries.len().div_ceil(QUERY_BLOCK);
        let size = queries.len().div_ceil(blocks.max(1));
        let shared = SharedSlice::new(out);
        pool::parallel_for(self.heads * blocks, |task| {
            let (head, block) = (task / blocks, task % blocks);
            let q0 = queries.start + block * size;
            let rows = (queries.end - q0).min(size);
            let at = shared.span_ptr(q0 * width + head * self.hd, (rows - 1) * width + self.hd);
            // SAFETY: rows q0..q0 + rows of this head's columns belong to this task alone.
            unsafe { self.attend_block(q, head, q0, rows, at) };
        });
    }

    /// One head's block of `rows` queries from `q0`, written at `out` (row q0 of the head's
    /// columns, rows `heads·hd` apart).
    ///
    /// # Safety
    /// Those rows of the head's columns are the caller's.
    unsafe fn attend_block(&self, q: &[f32], head: usize, q0: usize, rows: usize, out: *mut f32) {
        let (n, hd, width) = (self.n, self.hd, self.heads * self.hd);
        let part = packed_len(n, hd) + packed_len(hd, n);
        let (keys, values) = self.packed[head * part..][..part].split_at(packed_len(n, hd));
        let mut scores = SCORES.take();
        scores.resize(QUERY_BLOCK * n, 0.0);
        let queries = &q[q0 * width + head * hd..][..(rows - 1) * width + hd];
        for p in 0..n.div_ceil(PANEL) {
            let panel = PanelRef::F32 {
                values: &keys[p * hd * PANEL..][..hd * PANEL],
                stride: PANEL,
            };
            let (at, cols) = (scores[p * PANEL..].as_mut_ptr(), (n - p * PANEL).min(PANEL));
            // SAFETY: each score row holds n values; this panel writes its own columns.
            unsafe { panel_product(queries, width, hd, panel, at, n, cols, None) };
        }
        let mut sums = [0f32; QUERY_BLOCK];
        let scale = 1.0 / (hd as f32).sqrt();
        softmax_rows(&mut scores[..rows * n], n, scale, &mut sums[..rows]);
        for p in 0..hd.div_ceil(PANEL) {
            let panel = PanelRef::F32 {
                values: &values[p * n * PANEL..][..n * PANEL],
                stride: PANEL,
            };
            let cols = (hd - p * PANEL).min(PANEL);
            // SAFETY: the caller's rows; this panel writes its own columns.
            unsafe {
                panel_product(
                    &scores[..rows * n],
                    n,
                    n,
                    panel,
                    out.add(p * PANEL),
                    width,
                    cols,
                    None,
                )
            };
        }
        for (r, &sum) in sums[..rows].iter().enumerate() {
            // SAFETY: as above: the caller's row r of this head.
            let o = unsafe { std::slice::from_raw_parts_mut(out.add(r * width), hd) };
            o.iter_mut().for_each(|v| *v /= sum);
        }
        SCORES.set(scores);
    }
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
