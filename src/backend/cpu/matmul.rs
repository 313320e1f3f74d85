//! Quantized matrix multiply: `out[t][r] = dot(W[r], x[t])` for all tokens t and rows r.
//!
//! Activations are quantized once per token row to the weight type's dot format (as ggml
//! does), then every weight row is dotted with every token: the weights are streamed from
//! memory once per call however many tokens the batch holds.

use super::parallel::SharedSlice;
use super::pool;
use crate::quant::{self, GgmlType};

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

/// `w` is `rows` rows of type `ty`, each `cols` wide; `x` is n_tok × cols; `out` n_tok × rows.
pub fn matmul(w: &[u8], ty: GgmlType, rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    let n_tok = x.len() / cols;
    debug_assert_eq!(out.len(), n_tok * rows);
    XQ.with_borrow_mut(|xq| {
        quantize_activations(ty, x, cols, xq);
        matmul_quantized(w, ty, rows, cols, xq, n_tok, out)
    })
}

thread_local! {
    /// Per-thread scratch for the quantized activations (reused, never shrunk).
    static XQ: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn matmul_quantized(
    w: &[u8],
    ty: GgmlType,
    rows: usize,
    cols: usize,
    xq: &[u8],
    n_tok: usize,
    out: &mut [f32],
) {
    let w_row = ty.row_bytes(cols as u64).expect("checked at load") as usize;
    assert!(w.len() >= rows * w_row, "weight buffer too short");

    // Tasks are panels of rows × all tokens: a panel's weights stay in cache while every
    // token passes over them. Enough panels for load balance, few enough to keep overhead low.
    let threads = pool::threads();
    let chunk_rows = (rows / (threads * 16)).clamp(4, 64).next_multiple_of(4);
    let shared = SharedSlice::new(out);
    pool::parallel_for(rows.div_ceil(chunk_rows), |c| {
        let r0 = c * chunk_rows;
        let r1 = (r0 + chunk_rows).min(rows);
        let w_panel = &w[r0 * w_row..r1 * w_row];
        if n_tok == 1 {
            // One token: the panel is a contiguous run of the output.
            // SAFETY: rows r0..r1 belong to this task alone.
            let dst = unsafe { shared.slice_mut(r0, r1 - r0) };
            quant::gemm(ty, cols, w_panel, r1 - r0, xq, 1, dst);
            return;
        }
        PANEL.with_borrow_mut(|panel| {
            panel.resize((r1 - r0) * n_tok, 0.0);
            quant::gemm(ty, cols, w_panel, r1 - r0, xq, n_tok, panel);
            for t in 0..n_tok {
                // SAFETY: rows r0..r1 of every token belong to this task alone.
                let dst = unsafe { shared.slice_mut(t * rows + r0, r1 - r0) };
                dst.copy_from_slice(&panel[t * (r1 - r0)..(t + 1) * (r1 - r0)]);
            }
        });
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

#[cfg(test)]
mod tests {
    use super::*;

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
