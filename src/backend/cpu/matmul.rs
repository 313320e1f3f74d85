//! Quantized matrix multiply: `out[t][r] = dot(W[r], x[t])` for all tokens t and rows r.
//!
//! Activations are quantized once per token row to the weight type's dot format (as ggml
//! does), then every weight row is dotted with every token: the weights are streamed from
//! memory once per call however many tokens the batch holds.

use super::parallel::SharedOut;
use crate::quant::{self, GgmlType};
use rayon::prelude::*;

/// Quantizes `n_tok` rows of `cols` activations into `ty`'s dot format.
pub fn quantize_activations(ty: GgmlType, x: &[f32], cols: usize, buf: &mut Vec<u8>) -> usize {
    let dot_ty = ty.vec_dot_type();
    let row_bytes = dot_ty
        .row_bytes(cols as u64)
        .expect("cols fit the dot format") as usize;
    let n_tok = x.len() / cols;
    buf.clear();
    buf.resize(row_bytes * n_tok, 0);
    buf.par_chunks_mut(row_bytes)
        .zip(x.par_chunks(cols))
        .for_each(|(dst, src)| quant::quantize_row(dot_ty, src, dst));
    row_bytes
}

/// `w` is `rows` rows of type `ty`, each `cols` wide; `x` is n_tok × cols; `out` n_tok × rows.
pub fn matmul(w: &[u8], ty: GgmlType, rows: usize, cols: usize, x: &[f32], out: &mut [f32]) {
    let n_tok = x.len() / cols;
    debug_assert_eq!(out.len(), n_tok * rows);
    let mut xq = Vec::new();
    let xq_row = quantize_activations(ty, x, cols, &mut xq);
    let w_row = ty.row_bytes(cols as u64).expect("checked at load") as usize;
    assert!(w.len() >= rows * w_row, "weight buffer too short");

    // Enough chunks for load balance across threads, few enough to keep overhead small.
    let threads = rayon::current_num_threads().max(1);
    let chunk_rows = (rows / (threads * 8)).clamp(4, 256);
    let shared = SharedOut::new(out);
    (0..rows.div_ceil(chunk_rows))
        .into_par_iter()
        .for_each(|c| {
            let r0 = c * chunk_rows;
            let r1 = (r0 + chunk_rows).min(rows);
            for r in r0..r1 {
                let wr = &w[r * w_row..(r + 1) * w_row];
                for t in 0..n_tok {
                    let v = quant::vec_dot(ty, cols, wr, &xq[t * xq_row..(t + 1) * xq_row]);
                    shared.write(t * rows + r, v);
                }
            }
        });
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
