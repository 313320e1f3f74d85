//! gemma-embedding's dense projections of the pooled vector (`dense_2.weight`,
//! `dense_3.weight`), bound as llama.cpp's loader creates them and applied on the host: they
//! run once per input, on one vector, so they are dequantized to f32 once at load.

use super::{Binder, DenseOut};
use crate::backend::ops::VecRef;
use crate::model::config::ModelConfig;
use anyhow::{bail, Result};

const DENSE_2: &str = "dense_2.weight";
const DENSE_3: &str = "dense_3.weight";

impl Binder<'_> {
    /// Both projections, or neither: one without the other, or tensors without the widths
    /// the header gives them (or the reverse), are refused.
    pub(super) fn dense_out(&mut self, cfg: &ModelConfig) -> Result<Option<DenseOut>> {
        // Another family's file with them is refused as having tensors nothing uses.
        if !cfg.family.dense_out() {
            return Ok(None);
        }
        let e = cfg.n_embd;
        let (two, three) = (self.index(DENSE_2).is_some(), self.index(DENSE_3).is_some());
        match (cfg.dense_out, two, three) {
            (None, false, false) => Ok(None),
            (Some(s), true, true) => Ok(Some(DenseOut {
                hidden: s.hidden,
                dense_2: self.matrix(DENSE_2, e, s.hidden)?,
                dense_3: self.matrix(DENSE_3, s.hidden, e)?,
            })),
            (_, true, false) | (_, false, true) => bail!(
                "the file has one of '{DENSE_2}' and '{DENSE_3}' but not the other: the \
                 dense projections come as a pair"
            ),
            (None, true, true) => bail!(
                "'{DENSE_2}' and '{DENSE_3}' are there but not their widths \
                 ({}.dense_2_feat_in/out, dense_3_feat_in/out)",
                cfg.arch
            ),
            (Some(_), false, false) => bail!(
                "{}.dense_2_feat_out and the other widths are given but the file has neither \
                 '{DENSE_2}' nor '{DENSE_3}'",
                cfg.arch
            ),
        }
    }

    /// A matrix of `rows` rows of `cols` values (ggml's dims [cols, rows]), dequantized into
    /// the arena row by row.
    fn matrix(&mut self, name: &str, cols: usize, rows: usize) -> Result<VecRef> {
        let Some(idx) = self.index(name) else {
            bail!("model has no tensor '{name}'");
        };
        let dims = &self.file.tensors()[idx].dims;
        let want = [cols as u64, rows as u64];
        if dims.len() < 2 || dims[2..].iter().any(|&d| d != 1) || dims[..2] != want {
            bail!("tensor '{name}' has dims {dims:?}, expected {want:?}");
        }
        self.vector(name, cols * rows)
    }
}

impl DenseOut {
    /// `dense_3 · (dense_2 · pooled)`: the pooled vector as the model hands it out, before
    /// it is normalised. Sums run in f64 (ggml's f32 dot products are as close to the exact
    /// sum as its order allows).
    pub fn apply(&self, arena: &[f32], pooled: &[f32]) -> Vec<f32> {
        let mid = mat_vec(self.dense_2.of(arena), pooled);
        mat_vec(self.dense_3.of(arena), &mid)
    }
}

/// `m · x` for a row-major `m` of `x.len()` columns.
fn mat_vec(m: &[f32], x: &[f32]) -> Vec<f32> {
    m.chunks_exact(x.len())
        .map(|row| {
            let dot: f64 = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
            dot as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dense_2_then_dense_3() {
        // dense_2: 3 × 2, dense_3: 2 × 3, one after the other in the arena.
        let arena = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 2.0, 0.0, 0.0, 0.0, 1.0];
        let d = DenseOut {
            hidden: 3,
            dense_2: VecRef { offset: 0, len: 6 },
            dense_3: VecRef { offset: 6, len: 6 },
        };
        // dense_2 · (1, 2) = (1, 2, 3); dense_3 · that = (1 + 4, 3).
        assert_eq!(d.apply(&arena, &[1.0, 2.0]), vec![5.0, 3.0]);
    }
}
