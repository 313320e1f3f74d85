//! The ViT, as llama.cpp's `build_vit` computes it for SigLIP: each patch's pixels to a row
//! (the patch convolution as one matmul), its learned position row added, then blocks of
//! layer-normed bidirectional attention and GELU FFN, and a last layer norm. The matrices go
//! through the CPU's matmul kernels (mmproj files are mostly F16).

use super::config::VisionConfig;
use super::preprocess::Pixels;
use super::weights::{Linear, VisionWeights, VitLayer};
use crate::backend::cpu::matmul::matmul;
use crate::backend::cpu::ops::{activate, add_bias, add_in_place, layernorm_in_place};
use crate::backend::cpu::parallel::for_row_chunks;
use crate::backend::ops::{Activation, LayerNorm};
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
    matmul_biased(file, &w.arena, &w.patch, &patches, &mut x);
    add_in_place(&mut x, w.positions.of(&w.arena));
    if let Some(norm) = w.pre_norm {
        layer_norm(&mut x, &w.arena, norm, cfg.eps);
    }
    let mut buffers = Buffers::new(n, cfg);
    for layer in &w.layers {
        block(file, &w.arena, cfg, layer, &mut x, &mut buffers);
    }
    if let Some(norm) = w.post_norm {
        layer_norm(&mut x, &w.arena, norm, cfg.eps);
    }
    x
}

/// A block's intermediate rows, allocated once for all the blocks of an image.
struct Buffers {
    h: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    proj: Vec<f32>,
    up: Vec<f32>,
}

impl Buffers {
    fn new(n: usize, cfg: &VisionConfig) -> Buffers {
        let rows = || vec![0.0; n * cfg.n_embd];
        Buffers {
            h: rows(),
            q: rows(),
            k: rows(),
            v: rows(),
            proj: rows(),
            up: vec![0.0; n * cfg.n_ff],
        }
    }
}

/// One block: `x += attn(ln1(x))`, then `x += ffn(ln2(x))`.
fn block(
    file: &GgufFile,
    arena: &[f32],
    cfg: &VisionConfig,
    l: &VitLayer,
    x: &mut [f32],
    b: &mut Buffers,
) {
    b.h.copy_from_slice(x);
    layer_norm(&mut b.h, arena, l.ln1, cfg.eps);
    for (m, out) in [(&l.q, &mut b.q), (&l.k, &mut b.k), (&l.v, &mut b.v)] {
        matmul_biased(file, arena, m, &b.h, out);
    }
    super::attention::attend(&b.q, &b.k, &b.v, cfg.n_head, cfg.head_dim, &mut b.h);
    matmul_biased(file, arena, &l.out, &b.h, &mut b.proj);
    add_in_place(x, &b.proj);

    b.h.copy_from_slice(x);
    layer_norm(&mut b.h, arena, l.ln2, cfg.eps);
    matmul_biased(file, arena, &l.up, &b.h, &mut b.up);
    for_row_chunks(&mut b.up, cfg.n_ff, |_, rows| {
        activate(Activation::GeluTanh, rows).expect("GELU has an ungated form")
    });
    matmul_biased(file, arena, &l.down, &b.up, &mut b.proj);
    add_in_place(x, &b.proj);
}

/// `out = x · mᵀ + bias`, row by row.
fn matmul_biased(file: &GgufFile, arena: &[f32], l: &Linear, x: &[f32], out: &mut [f32]) {
    let m = &l.mat;
    match &l.dense {
        Some(dense) => dense.matmul(x, out),
        None => matmul(m.data(file), m.ty, m.rows, m.cols, x, out),
    }
    let bias = l.bias.of(arena);
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
