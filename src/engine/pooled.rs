//! An embedding request's pooled hidden state, built up over its prompt's chunks: the sum of
//! the rows its pooling reads (`Pooling::rows`: every row for mean, one for cls or last) and
//! their count, then the mean, through the model's projections of a pooled vector
//! (`Model::project_pooled`: gemma-embedding's dense layers) and L2-normalised as llama.cpp's
//! `llama-embedding` does by default (`--embd-normalize 2`).

#[derive(Clone, Debug, Default)]
pub struct Pooled {
    sum: Vec<f32>,
    rows: usize,
}

impl Pooled {
    /// Adds `rows` (each `width` wide). A chunk at the prompt's start resets the sum first:
    /// a preempted prompt is computed again from position 0, and its rows count once.
    pub fn add(&mut self, rows: &[f32], width: usize, from_start: bool) {
        if from_start || self.sum.len() != width {
            self.sum.clear();
            self.sum.resize(width, 0.0);
            self.rows = 0;
        }
        for row in rows.chunks_exact(width) {
            for (s, &x) in self.sum.iter_mut().zip(row) {
                *s += x;
            }
            self.rows += 1;
        }
    }

    /// The mean of the rows added, through `project` (the model's projections of a pooled
    /// vector), scaled to unit length (a zero vector stays zero).
    pub fn finish(&self, project: impl FnOnce(Vec<f32>) -> Vec<f32>) -> Vec<f32> {
        let n = self.rows.max(1) as f32;
        let mut v = project(self.sum.iter().map(|&s| s / n).collect());
        l2_normalize(&mut v);
        v
    }
}

/// Scales `v` to unit Euclidean length, in f64 as llama.cpp's `common_embd_normalize` sums.
pub fn l2_normalize(v: &mut [f32]) {
    let norm = v
        .iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        let inv = (1.0 / norm) as f32;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_over_chunks_then_unit_length() {
        let mut p = Pooled::default();
        p.add(&[1.0, 0.0, 3.0, 0.0], 2, true);
        p.add(&[2.0, 4.0], 2, false);
        // Mean (2, 4/3), normalised.
        let v = p.finish(|v| v);
        let n = (4.0f32 + 16.0 / 9.0).sqrt();
        assert!((v[0] - 2.0 / n).abs() < 1e-6 && (v[1] - 4.0 / 3.0 / n).abs() < 1e-6);
    }

    #[test]
    fn a_recomputed_prompt_counts_once() {
        let mut p = Pooled::default();
        p.add(&[5.0, 5.0], 2, true);
        p.add(&[1.0, 0.0], 2, true);
        assert_eq!(p.finish(|v| v), vec![1.0, 0.0]);
    }

    #[test]
    fn the_projection_comes_before_the_normalisation() {
        let mut p = Pooled::default();
        p.add(&[3.0, 0.0], 2, true);
        // Swapped: (0, 3), then unit length.
        assert_eq!(p.finish(|v| vec![v[1], v[0]]), vec![0.0, 1.0]);
    }

    #[test]
    fn zero_stays_zero() {
        let mut v = vec![0.0; 3];
        l2_normalize(&mut v);
        assert_eq!(v, vec![0.0; 3]);
    }
}
