//! LoRA updates on the CPU: after a matmul, each adapter in the step adds `scale · B·(A·x)`
//! to the output rows of the sequences that use it. The base product was computed once for
//! every row; an adapter's rows are gathered so that its two small products are dense GEMMs
//! over all of them (a prompt's rows, or one decode row per sequence).

use super::gemm::DenseMatrix;
use crate::backend::adapter::Adapter;
use crate::backend::batch::BatchMeta;
use crate::backend::ops::Mat;
use std::sync::Arc;

/// Adds the updates of every adapter in `batch` to `outs` (each `(matrix, its output rows)`),
/// the products of the rows of `x` (one per token; with `head`, one per `logits_for` entry).
pub fn add_updates(batch: &BatchMeta, head: bool, x: &[f32], outs: &mut [(&Mat, &mut [f32])]) {
    if batch.adapters.iter().all(Option::is_none) {
        return;
    }
    let cols = outs[0].0.cols;
    let seq_of_row = |r: usize| match head {
        true => batch.seq_of[batch.logits_for[r]],
        false => batch.seq_of[r],
    };
    for adapter in distinct(&batch.adapters) {
        if outs.iter().all(|(m, _)| adapter.update(m).is_none()) {
            continue;
        }
        let uses = |r: &usize| {
            let a = batch.adapters[seq_of_row(*r)].as_ref();
            a.is_some_and(|a| Arc::ptr_eq(a, adapter))
        };
        let rows: Vec<usize> = (0..x.len() / cols).filter(uses).collect();
        let gathered: Vec<f32>;
        let xs = match rows.as_slice() {
            [first, .., last] if last - first + 1 == rows.len() => {
                &x[first * cols..(last + 1) * cols]
            }
            [only] => &x[only * cols..(only + 1) * cols],
            _ => {
                gathered = rows
                    .iter()
                    .flat_map(|&r| &x[r * cols..(r + 1) * cols])
                    .copied()
                    .collect();
                &gathered
            }
        };
        for (m, out) in outs.iter_mut() {
            if let Some(u) = adapter.update(m) {
                let delta = low_rank_product(&u.down, &u.up, u.scale, xs);
                for (d, &r) in delta.chunks_exact(m.rows).zip(&rows) {
                    let o = &mut out[r * m.rows..(r + 1) * m.rows];
                    o.iter_mut().zip(d).for_each(|(o, d)| *o += d);
                }
            }
        }
    }
}

/// `scale · up·(down·x)` for each row of `xs`.
fn low_rank_product(down: &DenseMatrix, up: &DenseMatrix, scale: f32, xs: &[f32]) -> Vec<f32> {
    let rows = xs.len() / down.depth;
    let mut t = vec![0f32; rows * down.outputs];
    down.matmul(xs, &mut t);
    t.iter_mut().for_each(|v| *v *= scale);
    let mut delta = vec![0f32; rows * up.outputs];
    up.matmul(&t, &mut delta);
    delta
}

/// Each adapter of the batch's sequences once.
fn distinct(adapters: &[Option<Arc<Adapter>>]) -> Vec<&Arc<Adapter>> {
    let mut out: Vec<&Arc<Adapter>> = Vec::new();
    for a in adapters.iter().flatten() {
        if !out.iter().any(|o| Arc::ptr_eq(o, a)) {
            out.push(a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::adapter::LowRank;
    use crate::backend::batch::Logits;
    use crate::quant::GgmlType;

    fn dense(rows: usize, cols: usize, seed: f32) -> (Vec<f32>, DenseMatrix) {
        let v: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 * 0.37 + seed).sin() * 0.5)
            .collect();
        let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
        let m = DenseMatrix::pack(GgmlType::F32, &bytes, rows, cols).unwrap();
        (v, m)
    }

    fn mat(tensor: usize, rows: usize, cols: usize) -> Mat {
        Mat {
            name: format!("t{tensor}"),
            ty: GgmlType::F32,
            cols,
            rows,
            tensor,
            first_row: 0,
        }
    }

    #[test]
    fn each_row_gets_its_own_sequences_update_and_the_base_rows_none() {
        let (cols, rows, rank) = (40, 24, 4);
        let m = mat(3, rows, cols);
        let (a, down) = dense(rank, cols, 1.0);
        let (b, up) = dense(rows, rank, 2.0);
        let adapter = Arc::new(Adapter::new(
            "a".into(),
            1,
            vec![(
                &m,
                LowRank {
                    down,
                    up,
                    scale: 0.5,
                },
            )],
        ));
        // Three sequences: adapted, base, adapted again (its rows apart from the first's).
        let mut batch = BatchMeta::default();
        for (i, n) in [2usize, 3, 1].into_iter().enumerate() {
            batch.push_span(&vec![1; n], 0, vec![vec![]], Logits::All);
            batch.set_adapter((i != 1).then(|| adapter.clone()));
        }
        let x: Vec<f32> = (0..6 * cols).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut out = vec![1f32; 6 * rows];
        add_updates(&batch, false, &x, &mut [(&m, &mut out[..])]);
        for r in 0..6 {
            let xr = &x[r * cols..(r + 1) * cols];
            let t: Vec<f32> = (0..rank)
                .map(|j| (0..cols).map(|i| a[j * cols + i] * xr[i]).sum::<f32>() * 0.5)
                .collect();
            for c in 0..rows {
                let d: f32 = (0..rank).map(|j| b[c * rank + j] * t[j]).sum();
                let want = if (2..5).contains(&r) { 1.0 } else { 1.0 + d };
                let got = out[r * rows + c];
                assert!(
                    (got - want).abs() < 1e-4,
                    "row {r} col {c}: {got} vs {want}"
                );
            }
        }
    }
}
