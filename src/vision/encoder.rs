//! The ViT, as llama.cpp's `build_vit` computes it for SigLIP: each patch's pixels to a row
//! (the patch convolution as one matmul), its learned position row added, then blocks of
//! layer-normed bidirectional attention and GELU FFN, and a last layer norm. The matrices go
//! through the dense GEMM (mmproj files are mostly F16) or the quantized matmul. It runs a
//! piece at a time, so that an image can be encoded in slices between engine steps.

use super::attention::KeysValues;
use super::config::VisionConfig;
use super::preprocess::Pixels;
use super::weights::{VisionWeights, VitLayer};
use crate::backend::cpu::ops::{activate, add_in_place, layernorm_in_place};
use crate::backend::cpu::parallel::for_row_chunks;
use crate::backend::ops::{Activation, LayerNorm};
use crate::gguf::GgufFile;

/// Patch rows a piece of row-wise work takes (a multiple of every GEMM tile's rows): small
/// enough that a piece of a large ViT is a few milliseconds, so that an encoder run in slices
/// between engine steps keeps them short.
const ROWS_PER_PIECE: usize = 96;

/// Queries a piece of attention takes.
const QUERIES_PER_PIECE: usize = 128;

/// One image's ViT, run a piece at a time ([`VitRun::piece`]): the patch embedding and each
/// block's row-wise parts by runs of rows, its attention by runs of queries. Every row's
/// arithmetic is the same however the pieces fall.
pub struct VitRun<'a> {
    file: &'a GgufFile,
    w: &'a VisionWeights,
    cfg: &'a VisionConfig,
    patches: Vec<f32>,
    x: Vec<f32>,
    b: Buffers,
    n: usize,
    at: Stage,
    kv: Option<KeysValues>,
}

/// Where a run is: the next piece starts at `row`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stage {
    Embed {
        row: usize,
    },
    Block {
        layer: usize,
        part: Part,
        row: usize,
    },
    Done,
}

/// A block's parts: the rows' norm and Q, K, V; attention (once all rows have their K and V);
/// the rows' output projection, norm and FFN.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Part {
    Qkv,
    Attention,
    Ffn,
}

impl<'a> VitRun<'a> {
    pub fn new(
        file: &'a GgufFile,
        w: &'a VisionWeights,
        cfg: &'a VisionConfig,
        pixels: &Pixels,
    ) -> VitRun<'a> {
        let patches = im2col(pixels, cfg.patch_size);
        let n = patches.len() / (3 * cfg.patch_size * cfg.patch_size);
        VitRun {
            file,
            w,
            cfg,
            patches,
            x: vec![0.0; n * cfg.n_embd],
            b: Buffers::new(n, cfg),
            n,
            at: Stage::Embed { row: 0 },
            kv: None,
        }
    }

    /// Runs the next piece; false once the run is over (then [`VitRun::output`]).
    pub fn piece(&mut self) -> bool {
        let (e, arena) = (self.cfg.n_embd, &self.w.arena);
        let next = match self.at {
            Stage::Embed { row } => {
                let rows = row..(row + ROWS_PER_PIECE).min(self.n);
                let p = 3 * self.cfg.patch_size * self.cfg.patch_size;
                let x = &mut self.x[rows.start * e..rows.end * e];
                let patches = &self.patches[rows.start * p..rows.end * p];
                self.w.patch.apply(self.file, arena, patches, x);
                add_in_place(x, &self.w.positions.of(arena)[rows.start * e..rows.end * e]);
                if let Some(norm) = self.w.pre_norm {
                    layer_norm(x, arena, norm, self.cfg.eps);
                }
                match rows.end == self.n {
                    true => self.block_start(0),
                    false => Stage::Embed { row: rows.end },
                }
            }
            Stage::Block { layer, part, row } => self.block_piece(layer, part, row),
            Stage::Done => return false,
        };
        self.at = next;
        if next == Stage::Done {
            if let Some(norm) = self.w.post_norm {
                layer_norm(&mut self.x, arena, norm, self.cfg.eps);
            }
        }
        next != Stage::Done
    }

    /// One row of `n_embd` per patch, row-major by patch row (the run must be over).
    pub fn output(&self) -> &[f32] {
        assert_eq!(self.at, Stage::Done, "the ViT has pieces left");
        &self.x
    }

    /// The run over again for another view of the same size (a tile after a tile), in the
    /// buffers of this one: a tiled image does not fault in fresh pages for each view.
    pub fn restart(mut self, pixels: &Pixels) -> VitRun<'a> {
        let patches = im2col(pixels, self.cfg.patch_size);
        assert_eq!(patches.len(), self.patches.len(), "views of one size");
        self.patches = patches;
        self.at = Stage::Embed { row: 0 };
        self
    }

    fn block_start(&self, layer: usize) -> Stage {
        match layer == self.w.layers.len() {
            true => Stage::Done,
            false => Stage::Block {
                layer,
                part: Part::Qkv,
                row: 0,
            },
        }
    }

    /// One piece of block `layer`: `x += attn(ln1(x))`, then `x += ffn(ln2(x))`, by rows.
    fn block_piece(&mut self, layer: usize, part: Part, row: usize) -> Stage {
        let (cfg, arena, file) = (self.cfg, &self.w.arena, self.file);
        let l = &self.w.layers[layer];
        let (e, b) = (cfg.n_embd, &mut self.b);
        let step = match part {
            Part::Attention => QUERIES_PER_PIECE,
            _ => ROWS_PER_PIECE,
        };
        let rows = row..(row + step).min(self.n);
        let span = rows.start * e..rows.end * e;
        match part {
            Part::Qkv => {
                let h = &mut b.h[span.clone()];
                h.copy_from_slice(&self.x[span.clone()]);
                layer_norm(h, arena, l.ln1, cfg.eps);
                for (m, out) in [(&l.q, &mut b.q), (&l.k, &mut b.k), (&l.v, &mut b.v)] {
                    m.apply(file, arena, h, &mut out[span.clone()]);
                }
            }
            Part::Attention => {
                let kv = self
                    .kv
                    .get_or_insert_with(|| KeysValues::pack(&b.k, &b.v, cfg.n_head, cfg.head_dim));
                kv.attend(&b.q, rows.clone(), &mut b.h);
            }
            Part::Ffn => ffn_rows(
                file,
                arena,
                cfg,
                l,
                &mut self.x[span.clone()],
                b,
                rows.clone(),
            ),
        }
        if rows.end < self.n {
            return Stage::Block {
                layer,
                part,
                row: rows.end,
            };
        }
        match part {
            Part::Qkv => Stage::Block {
                layer,
                part: Part::Attention,
                row: 0,
            },
            Part::Attention => {
                self.kv = None;
                Stage::Block {
                    layer,
                    part: Part::Ffn,
                    row: 0,
                }
            }
            Part::Ffn => self.block_start(layer + 1),
        }
    }
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

/// Rows `rows` of a block after attention (`x` holds those rows, `b.h` the attention's
/// output): `x += out(h)`, then `x += down(gelu(up(ln2(x))))`.
fn ffn_rows(
    file: &GgufFile,
    arena: &[f32],
    cfg: &VisionConfig,
    l: &VitLayer,
    x: &mut [f32],
    b: &mut Buffers,
    rows: std::ops::Range<usize>,
) {
    let (e, f) = (cfg.n_embd, cfg.n_ff);
    let span = rows.start * e..rows.end * e;
    let proj = &mut b.proj[span.clone()];
    l.out.apply(file, arena, &b.h[span.clone()], proj);
    add_in_place(x, proj);
    let h = &mut b.h[span.clone()];
    h.copy_from_slice(x);
    layer_norm(h, arena, l.ln2, cfg.eps);
    let up = &mut b.up[rows.start * f..rows.end * f];
    l.up.apply(file, arena, h, up);
    for_row_chunks(up, f, |_, rows| {
        activate(Activation::GeluTanh, rows).expect("GELU has an ungated form")
    });
    l.down.apply(file, arena, up, proj);
    add_in_place(x, proj);
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
