//! The rows an image's ViT works in, kept by its projector from one image to the next, as
//! ggml keeps its compute buffer: fresh ones would fault in and zero their pages for every
//! image (a tenth of a small ViT's time). They grow to the largest image seen, which the
//! projector's memory plan (`Projector::memory_bytes`, by [`Workspace::most_values`]) counts.

use super::config::VisionConfig;
use super::weights::{Qkv, VisionWeights};

/// An image's working rows. Their values carry over from the image before: every row is
/// written before it is read.
#[derive(Default)]
pub struct Workspace {
    /// Each patch's pixels (the patch convolution's input).
    pub patches: Vec<f32>,
    /// Each patch's learned position row (empty where the ViT has none).
    pub positions: Vec<f32>,
    /// Qwen-VL: each patch row's rotary turns (cos, sin), `head_dim / 2` pairs a row.
    pub turns: Vec<(f32, f32)>,
    /// The residual stream: one row of `n_embd` per patch.
    pub x: Vec<f32>,
    pub h: Vec<f32>,
    /// A fused projection's Q, K and V side by side (empty where they are apart).
    pub qkv: Vec<f32>,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub proj: Vec<f32>,
    pub up: Vec<f32>,
    /// A SwiGLU FFN's gate rows (empty for GELU's).
    pub gate: Vec<f32>,
    /// The keys and values of the attention under way, packed (`attention::KeysValues`).
    pub packed: Vec<f32>,
    /// Qwen3-VL: each DeepStack block's merged rows, in block order.
    pub deepstack: Vec<Vec<f32>>,
    spare_deepstack: Vec<Vec<f32>>,
}

impl Workspace {
    /// Sizes the rows for a view of `n` patches.
    pub fn fit(&mut self, n: usize, cfg: &VisionConfig, w: &VisionWeights) {
        let e = cfg.n_embd;
        let (fused, gated) = fused_and_gated(w);
        for rows in [
            &mut self.x,
            &mut self.h,
            &mut self.q,
            &mut self.k,
            &mut self.v,
            &mut self.proj,
        ] {
            rows.resize(n * e, 0.0);
        }
        self.qkv.resize(if fused { 3 * n * e } else { 0 }, 0.0);
        self.up.resize(n * cfg.n_ff, 0.0);
        self.gate.resize(if gated { n * cfg.n_ff } else { 0 }, 0.0);
        self.spare_deepstack.append(&mut self.deepstack);
    }

    /// The values the rows of a view of `n` patches take at most (the DeepStack rows aside,
    /// a quarter of a row each).
    pub fn most_values(n: usize, cfg: &VisionConfig, w: &VisionWeights) -> usize {
        let (e, p) = (cfg.n_embd, cfg.patch_size);
        let (fused, gated) = fused_and_gated(w);
        // positions, x, h, q, k, v, proj and the packed keys and values (two rows).
        let rows = 9 * e + if fused { 3 * e } else { 0 };
        let ffn = cfg.n_ff * if gated { 2 } else { 1 };
        n * (3 * p * p + rows + cfg.head_dim + ffn)
    }

    /// Makes a DeepStack block's rows (`len` values) the last, after those of the blocks
    /// before.
    pub fn next_deepstack(&mut self, len: usize) {
        let mut rows = self.spare_deepstack.pop().unwrap_or_default();
        rows.resize(len, 0.0);
        self.deepstack.push(rows);
    }
}

/// Whether any block's Q, K and V come from one fused matrix (rows for the fused output), and
/// whether any FFN is gated (rows for the gate).
pub fn fused_and_gated(w: &VisionWeights) -> (bool, bool) {
    let fused = w.layers.iter().any(|l| matches!(l.qkv, Qkv::Fused(_)));
    let gated = w.layers.iter().any(|l| l.ffn.gate.is_some());
    (fused, gated)
}
