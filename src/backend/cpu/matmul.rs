//! Quantized matrix multiply: `out[t][r] = dot(W[r], x[t])` for all tokens t and rows r.
//!
//! Activations are quantized once per token row to the weight type's dot format (as ggml
//! does), then every weight row is dotted with every token: the weights are streamed from
//! memory once per call however many tokens the batch holds.

use super::parallel::SharedSlice;
use super::pool;
use crate::quant::packed::GROUP;
use crate::quant::{self, GgmlType};
use std::sync::atomic::{AtomicU64, Ordering};

/// Quantizes `n_tok` rows of `cols` activations into `ty`'s dot format.
pub fn quantize_activations(ty: GgmlType, x: &[f32], cols: usize, buf: &mut Vec<u8>) -> usize {
    let dot_ty = ty.vec_dot_type();
    let row_bytes = dot_ty
        .row_bytes(cols as u64)
        .expect("cols fit the dot format") as usize;
    let n_tok = x.len() / cols;
    buf.clear();
    buf.resize(row_bytes * n_tok, 0);
    let shared = SharedSlice::new(buf);
    // Rows are independent; a few per task keeps the claiming overhead small.
    const ROWS_PER_TASK: usize = 8;
    pool::parallel_for(n_tok.div_ceil(ROWS_PER_TASK), |task| {
        for t in task * ROWS_PER_TASK..((task + 1) * ROWS_PER_TASK).min(n_tok) {
            // SAFETY: each row's byte range is written by the one task that owns row t.
            let dst = unsafe { shared.slice_mut(t * row_bytes, row_bytes) };
            quant::quantize_row(dot_ty, &x[t * cols..(t + 1) * cols], dst);
        }
    });
    row_bytes
}

/// One weight matrix of a (fused) matmul: `rows` rows of type `ty`, each `cols` wide, part of
/// a file tensor `height` rows high (the peer picks its kernel by that height: see
/// `quant::order`). `w` holds the rows as the file does, or `packed` in groups
/// (`quant::packed`).
#[derive(Clone, Copy)]
pub struct WeightRef<'a> {
    pub w: &'a [u8],
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub height: usize,
    pub packed: bool,
}

impl WeightRef<'_> {
    /// Checks that the buffer holds the whole matrix (the kernels index it unchecked past
    /// that), and counts its bytes as read ([`weight_bytes_read`]).
    fn count_read(&self) {
        let bytes = if self.packed {
            quant::packed::packed_bytes(self.ty, self.rows, self.cols)
        } else {
            self.rows
                * self
                    .ty
                    .row_bytes(self.cols as u64)
                    .expect("checked at load") as usize
        };
        assert!(self.w.len() >= bytes, "weight buffer too short");
        WEIGHT_BYTES_READ.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Rows per unit of work: a packed matrix is computed a group at a time.
    fn granule(&self) -> usize {
        if self.packed {
            GROUP
        } else {
            1
        }
    }
}

/// Weight bytes the matmuls have streamed since the process started (each matrix once per
/// call, however many tokens the call has): what `edgelm bench` divides by the tokens decoded
/// to show that a mixture of experts reads only the experts its tokens pick.
static WEIGHT_BYTES_READ: AtomicU64 = AtomicU64::new(0);

pub fn weight_bytes_read() -> u64 {
    WEIGHT_BYTES_READ.load(Ordering::Relaxed)
}

/// `w` is `rows` rows of type `ty`, each `cols` wide; `x` is n_tok × cols; `out` n_tok × rows.
pub fn matmul(w: &[u8], ty: GgmlType, rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    let m = WeightRef {
        w,
        ty,
        rows,
        cols,
        height: rows,
        packed: false,
    };
    matmul_fused(&[m], x, &mut [out], &[]);
}

/// Several matrices applied to the same input (Q/K/V, gate/up) as one parallel loop: the
/// input is quantized once per dot format, and the threads meet once instead of once per
/// matrix, which matters for one decoding token, where each matrix is only a few µs of work.
/// `outs[i]` is n_tok × `mats[i].rows`. `generated[t]`: whether the model generated token `t`
/// (`BatchMeta::generated`; empty: none did), which packed matrices compute in
/// `quant::packed_order` (prompt tokens in `quant::prompt_order`). Every value of `outs` is
/// written (whatever they held before).
pub fn matmul_fused(
    mats: &[WeightRef<'_>],
    x: &[f32],
    outs: &mut [&mut [f32]],
    generated: &[bool],
) {
    assert_eq!(mats.len(), outs.len());
    let Some(first) = mats.first() else { return };
    let cols = first.cols;
    assert!(
        mats.iter().all(|m| m.cols == cols),
        "fused matrices share their input"
    );
    let n_tok = x.len() / cols;
    for (m, out) in mats.iter().zip(outs.iter()) {
        debug_assert_eq!(out.len(), n_tok * m.rows);
        m.count_read();
    }
    XQ.with_borrow_mut(|xq| {
        // One quantized copy of the input per distinct dot format (usually just one).
        let mut formats: Vec<(GgmlType, usize)> = Vec::new();
        for m in mats {
            let dot_ty = m.ty.vec_dot_type();
            if !formats.iter().any(|&(t, _)| t == dot_ty) {
                let at = formats.len();
                if xq.len() <= at {
                    xq.push(Vec::new());
                }
                quantize_activations(m.ty, x, cols, &mut xq[at]);
                formats.push((dot_ty, at));
            }
        }
        let xq_of = |ty: GgmlType| {
            let at = formats
                .iter()
                .find(|&&(t, _)| t == ty.vec_dot_type())
                .expect("quantized")
                .1;
            &xq[at][..]
        };
        // Tasks are panels of rows × all tokens (a panel's weights stay in cache while every
        // token passes over them), or for a long prompt through packed matrices, tall panels
        // × chunks of tokens (`token_chunks`).
        let rows_per_task = panel_rows(mats, n_tok, pool::threads());
        let chunk = token_chunks(mats, n_tok);
        let rows_of = |i: usize| chunk.map_or(rows_per_task[i], |_| TALL_PANEL_ROWS);
        let tasks: Vec<(usize, usize, usize)> = (0..mats.len())
            .flat_map(|i| (0..mats[i].rows).step_by(rows_of(i)).map(move |r0| (i, r0)))
            .flat_map(|(i, r0)| {
                (0..n_tok)
                    .step_by(chunk.unwrap_or(n_tok.max(1)))
                    .map(move |t0| (i, r0, t0))
            })
            .collect();
        let shared: Vec<SharedSlice<f32>> = outs.iter_mut().map(|o| SharedSlice::new(o)).collect();
        let runs = TokenRuns::of(generated, n_tok);
        pool::parallel_for(tasks.len(), |task| {
            let (i, r0, t0) = tasks[task];
            let m = &mats[i];
            let r1 = (r0 + rows_of(i)).min(m.rows);
            if m.packed {
                let t1 = (t0 + chunk.unwrap_or(n_tok)).min(n_tok);
                run_packed_panel(m, xq_of(m.ty), &runs, r0..r1, t0..t1, shared[i]);
            } else {
                run_panel(m, xq_of(m.ty), n_tok, r0..r1, shared[i]);
            }
        });
    })
}

/// Matrices that each have an input of their own (a mixture's experts, each over the tokens
/// routed to it), in one parallel loop: the threads meet once for all of them, not once per
/// matrix, which is most of the cost of a decoding token's small expert matrices.
/// `xs[i]` is n_i × `mats[i].cols`, `outs[i]` n_i × `mats[i].rows`, and `generated[i]` the
/// kinds of those n_i tokens (as [`matmul_fused`]'s). Inputs given twice (the same slice) are
/// quantized once.
pub fn matmul_each(
    mats: &[WeightRef<'_>],
    xs: &[&[f32]],
    outs: &mut [&mut [f32]],
    generated: &[&[bool]],
) {
    assert!(mats.len() == xs.len() && mats.len() == outs.len() && mats.len() == generated.len());
    let n_of = |i: usize| xs[i].len() / mats[i].cols;
    // Each input quantized once per dot format, on this thread: the inputs are a few rows.
    let mut keys: Vec<(*const f32, usize, GgmlType)> = Vec::new();
    let mut quantized: Vec<Vec<u8>> = Vec::new();
    let mut which = Vec::with_capacity(mats.len());
    for (i, m) in mats.iter().enumerate() {
        debug_assert_eq!(outs[i].len(), n_of(i) * m.rows);
        m.count_read();
        let key = (xs[i].as_ptr(), xs[i].len(), m.ty.vec_dot_type());
        match keys.iter().position(|k| *k == key) {
            Some(at) => which.push(at),
            None => {
                let dot_ty = m.ty.vec_dot_type();
                let row = dot_ty.row_bytes(m.cols as u64).expect("cols fit") as usize;
                let mut buf = vec![0u8; row * n_of(i)];
                for (x, dst) in xs[i].chunks_exact(m.cols).zip(buf.chunks_exact_mut(row)) {
                    quant::quantize_row(dot_ty, x, dst);
                }
                which.push(quantized.len());
                keys.push(key);
                quantized.push(buf);
            }
        }
    }
    let threads = pool::threads();
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (i, m) in mats.iter().enumerate() {
        let step = panel_rows(std::slice::from_ref(m), n_of(i), threads)[0];
        tasks.extend((0..m.rows).step_by(step).map(|r0| (i, r0, step)));
    }
    let runs: Vec<TokenRuns> = (0..mats.len())
        .map(|i| TokenRuns::of(generated[i], n_of(i)))
        .collect();
    let shared: Vec<SharedSlice<f32>> = outs.iter_mut().map(|o| SharedSlice::new(o)).collect();
    pool::parallel_for(tasks.len(), |task| {
        let (i, r0, step) = tasks[task];
        let (m, xq) = (&mats[i], &quantized[which[i]][..]);
        let r1 = (r0 + step).min(m.rows);
        if m.packed {
            run_packed_panel(m, xq, &runs[i], r0..r1, 0..n_of(i), shared[i]);
        } else {
            run_panel(m, xq, n_of(i), r0..r1, shared[i]);
        }
    });
}

/// Rows per task where the tasks are also split by tokens (`token_chunks`): a multiple of
/// every packed granule, a few hundred KiB of weights at most, which the task's token passes
/// find in L2.
const TALL_PANEL_ROWS: usize = 256;

/// Tokens per task for a fused matmul over `n_tok` tokens, where tasks split the tokens too:
/// a long prompt through packed matrices only. A packed kernel prepares its tokens'
/// activation blocks once per call, so panels of a few rows × every token prepared them once
/// per panel (a tenth of a 512-token prefill); tall panels × token chunks prepare them about
/// once per matrix, with as many tasks for the balance (+6% on a 512-token prefill of either
/// real model). Only where every token takes the chain order, whose numbers do not depend on
/// how the tokens are split (the peer's Q4_K GEMM treats a batch's last `n mod 4` tokens
/// apart). `None`: panels of rows × all tokens.
fn token_chunks(mats: &[WeightRef<'_>], n_tok: usize) -> Option<usize> {
    /// Tokens per chunk (four AVX-512 chain passes).
    const CHUNK: usize = 32;
    let tall = mats.iter().all(|m| {
        m.packed
            && TALL_PANEL_ROWS.is_multiple_of(m.granule())
            && quant::prompt_order(m.ty, m.height, n_tok) == quant::Order::Chain
    });
    (tall && n_tok >= 4 * CHUNK).then_some(CHUNK)
}

/// Rows per task for each matrix of a fused matmul over `n_tok` tokens on `threads` threads.
///
/// A prompt's panel is much work whatever its height: up to 64 rows, enough panels for a fine
/// balance. A small batch (decode) is a pass over the weights at memory speed, and a task
/// claimed is a cache line passed between the cores: tasks of about a quarter of a thread's
/// share of the bytes (four per thread to balance a core that falls behind), at least 16 KiB
/// and at most 256 KiB (a 262K-row output head in some 700 tasks, so that none is left long
/// on one core at the end).
fn panel_rows(mats: &[WeightRef<'_>], n_tok: usize, threads: usize) -> Vec<usize> {
    /// Batches this large compute long enough per row that panels are sized by rows.
    const PROMPT_TOKENS: usize = 8;
    let row_bytes = |m: &WeightRef<'_>| m.ty.row_bytes(m.cols as u64).expect("checked") as usize;
    if n_tok >= PROMPT_TOKENS {
        let total_rows: usize = mats.iter().map(|m| m.rows).sum();
        let rows = (total_rows / (threads * 16))
            .clamp(4, 64)
            .next_multiple_of(4);
        return mats
            .iter()
            .map(|m| rows.next_multiple_of(m.granule()))
            .collect();
    }
    let bytes: usize = mats.iter().map(|m| m.rows * row_bytes(m)).sum();
    let per_task = (bytes / (threads * 4)).clamp(16 << 10, 256 << 10);
    mats.iter()
        .map(|m| {
            (per_task / row_bytes(m))
                .max(1)
                .next_multiple_of(m.granule())
        })
        .collect()
}

thread_local! {
    /// Per-thread scratch for the quantized activations, one buffer per dot format in use
    /// (reused, never shrunk).
    static XQ: std::cell::RefCell<Vec<Vec<u8>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Rows `r` of `m` against every token, written into `out` (n_tok × m.rows).
fn run_panel(
    m: &WeightRef<'_>,
    xq: &[u8],
    n_tok: usize,
    r: std::ops::Range<usize>,
    out: SharedSlice<f32>,
) {
    let (r0, r1) = (r.start, r.end);
    let order = quant::order(m.ty, m.height, n_tok);
    let w_row = m.ty.row_bytes(m.cols as u64).expect("checked at load") as usize;
    let w_panel = &m.w[r0 * w_row..r1 * w_row];
    if n_tok == 1 {
        // One token: the panel is a contiguous run of the output.
        // SAFETY: rows r0..r1 belong to this task alone.
        let dst = unsafe { out.slice_mut(r0, r1 - r0) };
        quant::gemm(m.ty, order, m.cols, w_panel, r1 - r0, xq, 1, dst);
        return;
    }
    PANEL.with_borrow_mut(|panel| {
        panel.resize((r1 - r0) * n_tok, 0.0);
        quant::gemm(m.ty, order, m.cols, w_panel, r1 - r0, xq, n_tok, panel);
        for t in 0..n_tok {
            // SAFETY: rows r0..r1 of every token belong to this task alone.
            let dst = unsafe { out.slice_mut(t * m.rows + r0, r1 - r0) };
            dst.copy_from_slice(&panel[t * (r1 - r0)..(t + 1) * (r1 - r0)]);
        }
    });
}

/// A matmul's tokens as runs of consecutive prompt or generated tokens: prompt tokens take
/// `quant::prompt_order` for a batch of the prompt tokens, generated ones
/// `quant::packed_order`.
struct TokenRuns {
    runs: Vec<(std::ops::Range<usize>, bool)>,
    prompt: usize,
    generated: usize,
}

impl TokenRuns {
    fn of(generated: &[bool], n_tok: usize) -> TokenRuns {
        let kind = |t: usize| generated.get(t).copied().unwrap_or(false);
        let mut runs: Vec<(std::ops::Range<usize>, bool)> = Vec::new();
        for t in 0..n_tok {
            match runs.last_mut() {
                Some((r, g)) if *g == kind(t) => r.end = t + 1,
                _ => runs.push((t..t + 1, kind(t))),
            }
        }
        let generated = (0..n_tok).filter(|&t| kind(t)).count();
        TokenRuns {
            runs,
            prompt: n_tok - generated,
            generated,
        }
    }

    fn order(&self, m: &WeightRef<'_>, generated: bool) -> quant::Order {
        if generated {
            quant::packed_order(m.ty, m.height, self.generated)
        } else {
            quant::prompt_order(m.ty, m.height, self.prompt)
        }
    }

    /// The runs within `tokens` with their orders, neighbours of the same order joined: one
    /// kernel call (one preparation of the activations) for a mixed batch whose kinds share an
    /// order.
    fn ordered(
        &self,
        m: &WeightRef<'_>,
        tokens: std::ops::Range<usize>,
    ) -> Vec<(std::ops::Range<usize>, quant::Order)> {
        let mut out: Vec<(std::ops::Range<usize>, quant::Order)> = Vec::new();
        for (run, generated) in &self.runs {
            let span = run.start.max(tokens.start)..run.end.min(tokens.end);
            if span.is_empty() {
                continue;
            }
            let order = self.order(m, *generated);
            match out.last_mut() {
                Some((r, o)) if *o == order => r.end = span.end,
                _ => out.push((span, order)),
            }
        }
        out
    }
}

/// [`run_panel`] for a packed matrix: rows `r` start a group; each run of tokens in its
/// order. Whole groups are written straight into the output; a last group with padding rows
/// past the matrix goes through the scratch, which drops them.
fn run_packed_panel(
    m: &WeightRef<'_>,
    xq: &[u8],
    runs: &TokenRuns,
    r: std::ops::Range<usize>,
    tokens: std::ops::Range<usize>,
    out: SharedSlice<f32>,
) {
    let (r0, r1) = (r.start, r.end);
    debug_assert_eq!(r0 % GROUP, 0);
    let (g0, g1) = (r0 / GROUP, r1.div_ceil(GROUP));
    let gb = quant::packed::group_bytes(m.ty, m.cols);
    let w = &m.w[g0 * gb..g1 * gb];
    let x_row =
        m.ty.vec_dot_type()
            .row_bytes(m.cols as u64)
            .expect("checked") as usize;
    let spans = runs.ordered(m, tokens.clone());
    if (g1 - g0) * GROUP == r1 - r0 {
        for (span, order) in spans {
            let (t0, n) = (span.start, span.len());
            let first = out.span_ptr(t0 * m.rows + r0, (n - 1) * m.rows + r1 - r0);
            let x = &xq[t0 * x_row..span.end * x_row];
            // SAFETY: rows r0..r1 of every token (stride m.rows, inside the span checked
            // above) belong to this task alone.
            unsafe { quant::gemm_packed_to(m.ty, order, m.cols, w, g1 - g0, x, n, first, m.rows) };
        }
        return;
    }
    let width = (g1 - g0) * GROUP;
    let t_first = tokens.start;
    PANEL.with_borrow_mut(|panel| {
        panel.resize(width * tokens.len(), 0.0);
        for (span, order) in spans {
            let x = &xq[span.start * x_row..span.end * x_row];
            let dst = &mut panel[(span.start - t_first) * width..(span.end - t_first) * width];
            quant::gemm_packed(m.ty, order, m.cols, w, g1 - g0, x, span.len(), dst);
        }
        for t in tokens {
            // SAFETY: rows r0..r1 of these tokens belong to this task alone.
            let dst = unsafe { out.slice_mut(t * m.rows + r0, r1 - r0) };
            let at = (t - t_first) * width;
            dst.copy_from_slice(&panel[at..at + (r1 - r0)]);
        }
    });
}

thread_local! {
    /// Per-thread scratch for one task's rows × tokens outputs (reused, never shrunk).
    static PANEL: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Gathers embedding rows for `tokens` into `out` (n_tok × cols).
pub fn embed(w: &[u8], ty: GgmlType, cols: usize, tokens: &[u32], out: &mut [f32]) {
    let w_row = ty.row_bytes(cols as u64).expect("checked at load") as usize;
    for (&tok, dst) in tokens.iter().zip(out.chunks_exact_mut(cols)) {
        let t = tok as usize;
        quant::dequantize_row(ty, &w[t * w_row..(t + 1) * w_row], dst)
            .expect("embedding rows have the type's size");
    }
}

/// [`embed`] from a packed table (`quant::packed`): each row restored, then dequantized.
pub fn embed_packed(packed: &[u8], ty: GgmlType, cols: usize, tokens: &[u32], out: &mut [f32]) {
    let w_row = ty.row_bytes(cols as u64).expect("checked at load") as usize;
    let mut row = vec![0u8; w_row];
    for (&tok, dst) in tokens.iter().zip(out.chunks_exact_mut(cols)) {
        let t = tok as usize;
        quant::packed::unpack_rows(ty, cols, packed, t..t + 1, &mut row);
        quant::dequantize_row(ty, &row, dst).expect("embedding rows have the type's size");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fused_matmul_matches_separate_matmuls_bit_for_bit() {
        let cols = 64;
        let n_tok = 3;
        let x: Vec<f32> = (0..n_tok * cols)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut bytes = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng as u8
                })
                .collect()
        };
        // Q8_0 and Q4_1 take different dot formats (q8_0, q8_1): both get quantized.
        let mut weights = Vec::new();
        for (ty, rows) in [
            (GgmlType::Q8_0, 9),
            (GgmlType::Q4_1, 5),
            (GgmlType::Q8_0, 4),
        ] {
            let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
            let mut w = bytes(rows * row_bytes);
            // Keep every block's f16 scale finite and small.
            let block = ty.block_bytes();
            for b in w.chunks_exact_mut(block) {
                b[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                if ty == GgmlType::Q4_1 {
                    b[2..4].copy_from_slice(&half::f16::from_f32(-0.02).to_le_bytes());
                }
            }
            weights.push((ty, rows, w));
        }
        let mats: Vec<WeightRef> = weights
            .iter()
            .map(|(ty, rows, w)| WeightRef {
                w,
                ty: *ty,
                rows: *rows,
                cols,
                height: *rows,
                packed: false,
            })
            .collect();
        let mut fused: Vec<Vec<f32>> = mats.iter().map(|m| vec![0f32; n_tok * m.rows]).collect();
        let mut refs: Vec<&mut [f32]> = fused.iter_mut().map(|v| &mut v[..]).collect();
        matmul_fused(&mats, &x, &mut refs, &[]);
        for (m, got) in mats.iter().zip(&fused) {
            let mut want = vec![0f32; n_tok * m.rows];
            matmul(m.w, m.ty, m.rows, cols, &x, &mut want);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(got), bits(&want));
            assert!(got.iter().any(|&v| v != 0.0));
        }
    }

    #[test]
    fn f32_matmul_matches_naive() {
        let (rows, cols, n_tok) = (5, 8, 3);
        let w: Vec<f32> = (0..rows * cols).map(|i| (i % 7) as f32 - 3.0).collect();
        let x: Vec<f32> = (0..n_tok * cols).map(|i| (i % 5) as f32 * 0.5).collect();
        let wb: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = vec![0f32; n_tok * rows];
        matmul(&wb, GgmlType::F32, rows, cols, &x, &mut out);
        for t in 0..n_tok {
            for r in 0..rows {
                let want: f32 = (0..cols).map(|c| w[r * cols + c] * x[t * cols + c]).sum();
                assert!((out[t * rows + r] - want).abs() < 1e-4);
            }
        }
    }
}
