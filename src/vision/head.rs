//! The projector proper: the ViT's rows to rows of the text model's width, per type.

use super::config::VisionConfig;
use super::encoder::merge_order;
use super::weights::{Head, VisionWeights};
use super::workspace::Workspace;
use crate::backend::cpu::ops::rmsnorm_in_place;
use crate::gguf::GgufFile;

/// A view's ViT rows (`work.x`: one row of `n_embd` per patch, as
/// [`super::encoder::VitRun::finish`] orders them) and its DeepStack rows as the text model's
/// rows ([`VisionConfig::row_width`] wide); `work.h` is scratch.
pub fn project(
    cfg: &VisionConfig,
    w: &VisionWeights,
    file: &GgufFile,
    work: &mut Workspace,
) -> Vec<f32> {
    let (vit, deepstack, scratch) = (&work.x, &work.deepstack, &mut work.h);
    let merged = cfg.n_merge * cfg.n_merge;
    let rows = vit.len() / cfg.n_embd / merged;
    let mut out = vec![0.0; rows * cfg.projection_dim];
    let side = || {
        let side = (vit.len() / cfg.n_embd).isqrt();
        assert_eq!(side * side * cfg.n_embd, vit.len(), "a square view");
        side
    };
    match &w.head {
        Head::Gemma3 {
            norm, projection, ..
        } => {
            let mut pooled = average_pool(vit, side(), cfg.n_merge, cfg.n_embd);
            let norm = norm.of(&w.arena);
            pooled
                .chunks_exact_mut(cfg.n_embd)
                .for_each(|row| rmsnorm_in_place(row, norm, cfg.eps));
            projection.matmul(&pooled, &mut out);
        }
        Head::Idefics3 { fc } => {
            pixel_shuffle(vit, side(), cfg.n_merge, cfg.n_embd, scratch);
            fc.apply(file, &w.arena, scratch, &mut out);
        }
        // The ViT's rows come by merged square: each square's are a run, one wide row.
        Head::Merger { mlp } => {
            scratch.resize(vit.len(), 0.0);
            mlp.apply(file, &w.arena, vit, scratch, &mut out);
        }
    }
    beside(out, deepstack, cfg.projection_dim)
}

/// Each row of `main` with the same row of each of `extra` after it (rows of `width`).
pub fn beside(main: Vec<f32>, extra: &[Vec<f32>], width: usize) -> Vec<f32> {
    if extra.is_empty() {
        return main;
    }
    let mut out = Vec::with_capacity(main.len() * (1 + extra.len()));
    for (i, row) in main.chunks_exact(width).enumerate() {
        out.extend_from_slice(row);
        for e in extra {
            out.extend_from_slice(&e[i * width..(i + 1) * width]);
        }
    }
    out
}

/// Each `k` × `k` square of patches (of a `side` × `side` grid) as one row of its patches'
/// rows side by side, row-major within the square: llama.cpp's `build_patch_merge_permute`
/// (Idefics3's `pixel_shuffle`), into `out`.
fn pixel_shuffle(rows: &[f32], side: usize, k: usize, width: usize, out: &mut Vec<f32>) {
    out.clear();
    for i in merge_order((side, side), k) {
        out.extend_from_slice(&rows[i * width..(i + 1) * width]);
    }
}

/// Each `k` × `k` square of patches (of a `side` × `side` grid) averaged into one row:
/// ggml's `pool_2d` (the sum over the kernel's rows then columns, divided by k²).
fn average_pool(rows: &[f32], side: usize, k: usize, width: usize) -> Vec<f32> {
    let out_side = side / k;
    let mut out = vec![0.0; out_side * out_side * width];
    for oy in 0..out_side {
        for ox in 0..out_side {
            let o = &mut out[(oy * out_side + ox) * width..][..width];
            for ky in 0..k {
                for kx in 0..k {
                    let r = &rows[((oy * k + ky) * side + ox * k + kx) * width..][..width];
                    o.iter_mut().zip(r).for_each(|(o, &v)| *o += v);
                }
            }
            o.iter_mut().for_each(|v| *v /= (k * k) as f32);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepstack_rows_go_beside_each_row() {
        let out = beside(vec![1.0, 2.0], &[vec![3.0, 4.0], vec![5.0, 6.0]], 1);
        assert_eq!(out, vec![1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
    }

    #[test]
    fn pooling_averages_each_square_of_patches() {
        // A 4 × 4 grid of one-value rows, numbered by position, pooled 2 × 2.
        let rows: Vec<f32> = (0..16).map(|v| v as f32).collect();
        assert_eq!(average_pool(&rows, 4, 2, 1), vec![2.5, 4.5, 10.5, 12.5]);
    }

    #[test]
    fn pixel_shuffle_puts_each_squares_patches_side_by_side() {
        // A 4 × 4 grid of one-value rows, numbered by position, shuffled 2 × 2.
        let rows: Vec<f32> = (0..16).map(|v| v as f32).collect();
        let out: Vec<f32> = [0, 1, 4, 5, 2, 3, 6, 7, 8, 9, 12, 13, 10, 11, 14, 15]
            .iter()
            .map(|&v| v as f32)
            .collect();
        let mut shuffled = vec![f32::NAN; 3];
        pixel_shuffle(&rows, 4, 2, 1, &mut shuffled);
        assert_eq!(shuffled, out);
    }
}
