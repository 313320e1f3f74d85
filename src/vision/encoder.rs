//! The ViT, as llama.cpp's `build_vit` computes it for SigLIP: each patch's pixels to a row
//! (the patch convolution as one matmul), its learned position row added, then blocks of
//! layer-normed bidirectional attention and GELU FFN, and a last layer norm. The matrices go
//! through the CPU's matmul kernels (mmproj files are mostly F16).

use super::config::VisionConfig;
use super::preprocess::Pixels;
use super::weights::{VisionWeights, VitLayer};
use crate::backend::cpu::attention::dot_f32;
use crate::backend::cpu::matmul::matmul;
use crate::backend::cpu::ops::{activate, add_bias, add_in_place, layernorm_in_place};
use crate::backend::cpu::parallel::{for_row_chunks, SharedSlice};
use crate::backend::cpu::pool;
use crate::backend::ops::{Activation, LayerNorm, Mat, VecRef};
use crate::gguf::GgufFile;

/// The ViT's output for one image: one row of `n_embd` per patch, row-major by patch row.
pub fn run_vit(
    file: &GgufFile,
    w: &VisionWeights,
    cfg: &VisionConfig,
    pixels: &Pixels,
) -> Vec<f32> {
    let e = cfg.n_embd;
    let patches = im2col(pixels, cfg.patch_size);
    let n = patches.len() / (3 * cfg.patch_size * cfg.patch_size);
    let mut x = vec![0.0; n * e];
    matmul_biased(file, &w.arena, (&w.patch, w.patch_bias), &patches, &mut x);
    add_in_place(&mut x, w.positions.of(&w.arena));
    if let Some(norm) = w.pre_norm {
        layer_norm(&mut x, &w.arena, norm, cfg.eps);
    }
    for layer in &w.layers {
        block(file, &w.arena, cfg, layer, &mut x);
    }
    if let Some(norm) = w.post_norm {
        layer_norm(&mut x, &w.arena, norm, cfg.eps);
    }
    x
}

/// One block: `x += attn(ln1(x))`, then `x += ffn(ln2(x))`.
fn block(file: &GgufFile, arena: &[f32], cfg: &VisionConfig, l: &VitLayer, x: &mut [f32]) {
    let e = cfg.n_embd;
    let n = x.len() / e;
    let mut h = x.to_vec();
    layer_norm(&mut h, arena, l.ln1, cfg.eps);
    let [mut q, mut k, mut v] = [0; 3].map(|_| vec![0.0; n * e]);
    for (m, out) in [(&l.q, &mut q), (&l.k, &mut k), (&l.v, &mut v)] {
        matmul_biased(file, arena, (&m.0, m.1), &h, out);
    }
    attend(&q, &k, &v, cfg.n_head, cfg.head_dim, &mut h);
    let mut proj = vec![0.0; n * e];
    matmul_biased(file, arena, (&l.out.0, l.out.1), &h, &mut proj);
    add_in_place(x, &proj);

    h.copy_from_slice(x);
    layer_norm(&mut h, arena, l.ln2, cfg.eps);
    let mut up = vec![0.0; n * cfg.n_ff];
    matmul_biased(file, arena, (&l.up.0, l.up.1), &h, &mut up);
    for_row_chunks(&mut up, cfg.n_ff, |_, rows| {
        activate(Activation::GeluTanh, rows).expect("GELU has an ungated form")
    });
    matmul_biased(file, arena, (&l.down.0, l.down.1), &up, &mut proj);
    add_in_place(x, &proj);
}

/// `out = x · mᵀ + bias`, row by row.
fn matmul_biased(
    file: &GgufFile,
    arena: &[f32],
    (m, bias): (&Mat, VecRef),
    x: &[f32],
    out: &mut [f32],
) {
    matmul(m.data(file), m.ty, m.rows, m.cols, x, out);
    let bias = bias.of(arena);
    for_row_chunks(out, m.rows, |_, rows| {
        rows.chunks_exact_mut(bias.len())
            .for_each(|r| add_bias(r, bias))
    });
}

fn layer_norm(x: &mut [f32], arena: &[f32], norm: LayerNorm, eps: f32) {
    let (w, b) = (norm.weight.of(arena), norm.bias.of(arena));
    for_row_chunks(x, w.len(), |_, rows| layernorm_in_place(rows, w, b, eps));
}

/// Each patch's pixels as one row, in the order of the convolution kernel's values: channel,
/// then row, then column within the patch (ggml's `im2col`).
fn im2col(pixels: &Pixels, p: usize) -> Vec<f32> {
    let side = pixels.size / p;
    let mut rows = Vec::with_capacity(side * side * 3 * p * p);
    for py in 0..side {
        for px in 0..side {
            for c in 0..3 {
                for ky in 0..p {
                    let y = py * p + ky;
                    rows.extend((0..p).map(|kx| pixels.at(px * p + kx, y, c)));
                }
            }
        }
    }
    rows
}

/// Bidirectional multi-head attention over every row: `out` (n × heads·hd) is each head's
/// softmax(q·kᵀ / √hd)·v, in f32.
fn attend(q: &[f32], k: &[f32], v: &[f32], heads: usize, hd: usize, out: &mut [f32]) {
    let width = heads * hd;
    let n = q.len() / width;
    let scale = 1.0 / (hd as f32).sqrt();
    // Tasks of (head, a run of queries): each writes its own queries' slice of its head.
    let per_task = n.div_ceil(pool::threads() * 2).clamp(1, 64);
    let runs = n.div_ceil(per_task);
    let shared = SharedSlice::new(out);
    pool::parallel_for(heads * runs, |task| {
        let (head, run) = (task / runs, task % runs);
        let mut scores = vec![0.0f32; n];
        let mut acc = vec![0.0f32; hd];
        for i in run * per_task..((run + 1) * per_task).min(n) {
            let qi = &q[i * width + head * hd..][..hd];
            let mut max = f32::NEG_INFINITY;
            for (j, s) in scores.iter_mut().enumerate() {
                let kj = &k[j * width + head * hd..][..hd];
                *s = dot_f32(qi, kj) * scale;
                max = max.max(*s);
            }
            let mut sum = 0.0;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            acc.fill(0.0);
            for (j, &s) in scores.iter().enumerate() {
                let vj = &v[j * width + head * hd..][..hd];
                acc.iter_mut().zip(vj).for_each(|(a, &b)| *a += s * b);
            }
            // SAFETY: query i's slice of this head belongs to this task alone.
            let o = unsafe { shared.slice_mut(i * width + head * hd, hd) };
            o.iter_mut().zip(&acc).for_each(|(o, &a)| *o = a / sum);
        }
    });
}
