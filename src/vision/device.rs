//! The ViT and the projector's head on a CUDA device (feature `cuda`): what `encoder` and
//! `head` compute on the CPU, op for op in the same order, on the device's ops
//! (`backend::cuda::EncoderOps`), each view whole (a device encodes a view in milliseconds: it
//! is not cut in pieces between engine steps). A view's inputs (patches, positions, rotary
//! turns, windows) are prepared on the host by the CPU's own `encoder::plan_view`; DeepStack
//! rows go beside the head's rows on the host, as `head::project` puts them. The projector
//! keeps its device encoder, if it has one, and encodes there while the device works.

use super::config::VisionConfig;
use super::encoder::{grid_order, merge_order, plan_view};
use super::head::beside;
use super::preprocess::Pixels;
use super::weights::{transposed, Head, Linear, Mlp, Norm, Qkv, VisionWeights, VitLayer};
use super::workspace::{fused_and_gated, Workspace};
use super::{Prepared, Projector, Slicer};
use crate::backend::cuda::{
    CudaDevice, DeviceIndex, DeviceMatrix, DeviceRows, EncoderOps, Rows, VIT_MAX_HEAD_DIM,
};
use crate::backend::ops::LayerNorm;
use crate::gguf::GgufFile;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::MutexGuard;

impl Projector {
    /// Encodes on `dev` from now on: its views whole, each in one slice. Refused (and the
    /// CPU keeps encoding) where the device's ops do not take this projector.
    pub fn encode_on(&self, dev: &CudaDevice) -> anyhow::Result<()> {
        let (cfg, w) = (&self.config, &self.weights);
        let encoder = DeviceEncoder::new(dev, &self.file, (w, cfg), cfg.max_view_patches())
            .map_err(|e| anyhow::anyhow!("the {} projector on CUDA: {e}", cfg.kind.name()))?;
        *self.device() = Some(encoder);
        Ok(())
    }

    /// The device encoder, if there is one.
    pub(super) fn device(&self) -> MutexGuard<'_, Option<DeviceEncoder>> {
        self.device.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Each view encoded on the device, if the projector has one; None where it has none, or
    /// where it failed (logged, and the device given up: the CPU encodes from then on).
    pub(super) fn encode_on_device(
        &self,
        views: &Prepared,
        slice: &mut Slicer<'_>,
    ) -> Option<Vec<Vec<f32>>> {
        let mut device = self.device();
        let encoder = device.as_mut()?;
        let (cfg, w) = (&self.config, &self.weights);
        let mut out = Vec::new();
        for pixels in &views.0 {
            let mut done = None;
            while done.is_none() {
                slice(&mut || {
                    done = Some(encoder.encode(w, cfg, pixels));
                    false
                });
            }
            match done.expect("run above") {
                Ok(rows) => out.push(rows),
                Err(e) => {
                    log::error!("the image encoder failed on the CUDA device ({e}): encoding on the CPU from now on");
                    *device = None;
                    return None;
                }
            }
        }
        Some(out)
    }
}

/// A projector's weights on a device and the rows its views are encoded in.
pub struct DeviceEncoder {
    ops: EncoderOps,
    /// The projector's vectors (norms, biases, positions), at the CPU arena's offsets.
    arena: DeviceRows,
    /// Each matrix by its tensor's index in the file (a Qwen-VL patch kernel: the sum).
    matrices: HashMap<usize, DeviceMatrix>,
    rows: Option<Buffers>,
    /// The host's side of a view: its patches, positions and turns before they go over.
    host: Workspace,
}

/// A view's rows on the device, for up to `n` patches.
struct Buffers {
    n: usize,
    patches: DeviceRows,
    positions: DeviceRows,
    turns: DeviceRows,
    x: DeviceRows,
    h: DeviceRows,
    q: DeviceRows,
    k: DeviceRows,
    v: DeviceRows,
    proj: DeviceRows,
    up: DeviceRows,
    gate: DeviceRows,
    /// The head's rows, and a DeepStack block's.
    out: DeviceRows,
}

impl DeviceEncoder {
    /// Copies the projector's weights to `dev` and makes the rows of a view of up to `most`
    /// patches; refused where its matrices or heads are of a kind the device's ops do not take
    /// (the CPU then encodes).
    pub fn new(
        dev: &CudaDevice,
        file: &GgufFile,
        (w, cfg): (&VisionWeights, &VisionConfig),
        most: usize,
    ) -> Result<DeviceEncoder, String> {
        if cfg.head_dim > VIT_MAX_HEAD_DIM {
            return Err(format!(
                "heads of {} (the device's attention takes at most {VIT_MAX_HEAD_DIM})",
                cfg.head_dim
            ));
        }
        let ops = EncoderOps::new(dev)?;
        let arena = ops.copy_of(&w.arena)?;
        let mut matrices = HashMap::new();
        for l in w.linears() {
            let (ty, rows) = l.rows(file);
            let m = ops.matrix(ty, &rows, l.mat.rows, l.mat.cols);
            matrices.insert(l.mat.tensor, m.map_err(|e| format!("{}: {e}", l.mat.name))?);
        }
        if let Head::Gemma3 { stored, .. } = &w.head {
            let (ty, rows) = transposed(file, stored).map_err(|e| format!("{e:#}"))?;
            let m = ops.matrix(ty, &rows, stored.cols, stored.rows)?;
            matrices.insert(stored.tensor, m);
        }
        let mut encoder = DeviceEncoder {
            ops,
            arena,
            matrices,
            rows: None,
            host: Workspace::default(),
        };
        encoder.fit(most, cfg, w)?;
        Ok(encoder)
    }

    /// One view's rows as the text model reads them (`head::project`'s).
    pub fn encode(
        &mut self,
        w: &VisionWeights,
        cfg: &VisionConfig,
        pixels: &Pixels,
    ) -> Result<Vec<f32>, String> {
        self.ops.bind()?;
        let plan = plan_view(w, cfg, pixels, &mut self.host);
        let n = plan.n;
        self.fit(n, cfg, w)?;
        self.embed(w, cfg, n)?;
        let spans = |runs: &[Range<usize>]| {
            let ends: Vec<usize> = (runs.iter())
                .flat_map(|r| r.clone().flat_map(|_| [r.start, r.end]))
                .collect();
            self.ops.index(&ends)
        };
        let whole = spans(std::slice::from_ref(&(0..n)))?;
        let windowed = spans(&plan.windows)?;
        let mut deepstack = Vec::new();
        for (i, l) in w.layers.iter().enumerate() {
            let within = cfg.windows.is_some_and(|win| win.applies_to(i));
            self.block(l, cfg, n, if within { &windowed } else { &whole })?;
            if let Some((ln, mlp)) = &l.deepstack {
                deepstack.push(self.deepstack(ln, mlp, cfg, n)?);
            }
        }
        let b = self.buffers();
        let (x, e) = (b.x.first(n * cfg.n_embd), cfg.n_embd);
        if let Some(norm) = w.post_norm {
            self.norm(norm, x, x, cfg.eps)?;
        }
        let vit = match plan.square_order.is_empty() {
            true => x,
            // The squares back in the grid's order (the merger's rows are the grid's).
            false => {
                let squares = self.ops.index(&grid_order(&plan.square_order))?;
                let k = cfg.n_merge;
                self.ops.gather(b.h.first(n * e), x, &squares, k * k * e)?;
                b.h.first(n * e)
            }
        };
        let out = self.head(w, cfg, vit, n)?;
        Ok(beside(out, &deepstack, cfg.projection_dim))
    }

    fn buffers(&self) -> &Buffers {
        self.rows.as_ref().expect("sized by fit")
    }

    /// Sizes the rows for a view of `n` patches (grown to the largest view seen).
    fn fit(&mut self, n: usize, cfg: &VisionConfig, w: &VisionWeights) -> Result<(), String> {
        if self.rows.as_ref().is_some_and(|b| b.n >= n) {
            return Ok(());
        }
        // The old rows go first, so that old and new need not fit at once.
        self.rows = None;
        let (e, f, p) = (cfg.n_embd, cfg.n_ff, cfg.patch_size);
        let (_, gated) = fused_and_gated(w);
        let z = |len: usize| self.ops.zeros(len);
        self.rows = Some(Buffers {
            n,
            patches: z(n * 3 * p * p)?,
            positions: z(n * e)?,
            turns: z(n * cfg.head_dim)?,
            x: z(n * e)?,
            h: z(n * e)?,
            q: z(n * e)?,
            k: z(n * e)?,
            v: z(n * e)?,
            proj: z(n * e)?,
            up: z(n * f)?,
            gate: z(if gated { n * f } else { 0 })?,
            out: z(n * cfg.projection_dim)?,
        });
        Ok(())
    }

    /// `x` = the patches through the patch kernel, plus their positions, pre-normed; the
    /// rotary turns sent over.
    fn embed(&self, w: &VisionWeights, cfg: &VisionConfig, n: usize) -> Result<(), String> {
        let (b, host, e) = (self.buffers(), &self.host, cfg.n_embd);
        let patches = b.patches.first(host.patches.len());
        self.ops.write(patches, &host.patches)?;
        let x = b.x.first(n * e);
        self.linear(&w.patch, patches, x, n)?;
        if !host.positions.is_empty() {
            self.ops.write(b.positions.first(n * e), &host.positions)?;
            self.ops.add(x, b.positions.first(n * e))?;
        }
        if let Some(norm) = w.pre_norm {
            self.norm(norm, x, x, cfg.eps)?;
        }
        let turns: Vec<f32> = host.turns.iter().flat_map(|&(c, s)| [c, s]).collect();
        self.ops.write(b.turns.first(turns.len()), &turns)
    }

    /// One block: `x += attn(ln1(x))` within each row's span, then `x += ffn(ln2(x))`.
    fn block(
        &self,
        l: &VitLayer,
        cfg: &VisionConfig,
        n: usize,
        spans: &DeviceIndex,
    ) -> Result<(), String> {
        let (b, e, hd) = (self.buffers(), cfg.n_embd, cfg.head_dim);
        let len = n * e;
        let (x, h, proj) = (b.x.first(len), b.h.first(len), b.proj.first(len));
        let (q, k, v) = (b.q.first(len), b.k.first(len), b.v.first(len));
        self.norm(l.ln1, x, h, cfg.eps)?;
        match &l.qkv {
            Qkv::Separate(m) => {
                for (m, out) in m.iter().zip([q, k, v]) {
                    self.linear(m, h, out, n)?;
                }
            }
            Qkv::Fused(m) => {
                for (i, out) in [q, k, v].into_iter().enumerate() {
                    self.band(m, i * e..(i + 1) * e, h, out, n)?;
                }
            }
        }
        if !self.host.turns.is_empty() {
            let turns = b.turns.first(n * hd);
            self.ops.rotate_halves(q, turns, hd)?;
            self.ops.rotate_halves(k, turns, hd)?;
        }
        self.ops.attention((q, k, v), h, spans, (cfg.n_head, hd))?;
        self.linear(&l.out, h, proj, n)?;
        self.ops.add(x, proj)?;
        self.norm(l.ln2, x, h, cfg.eps)?;
        let up = b.up.first(n * cfg.n_ff);
        match &l.ffn.gate {
            Some(g) => {
                let gate = b.gate.first(n * cfg.n_ff);
                self.linear(g, h, gate, n)?;
                self.linear(&l.ffn.mlp.fc1, h, up, n)?;
                self.ops.silu_mul(gate, up)?;
                self.linear(&l.ffn.mlp.fc2, gate, proj, n)?;
            }
            None => self.mlp(&l.ffn.mlp, h, up, proj, n)?,
        }
        self.ops.add(x, proj)
    }

    /// A DeepStack block's merged rows: each merged square's rows side by side (one row of
    /// the norm's width), normed, through the MLP.
    fn deepstack(
        &self,
        ln: &LayerNorm,
        mlp: &Mlp,
        cfg: &VisionConfig,
        n: usize,
    ) -> Result<Vec<f32>, String> {
        let (b, e) = (self.buffers(), cfg.n_embd);
        let rows = n / (cfg.n_merge * cfg.n_merge);
        let (x, h) = (b.x.first(n * e), b.h.first(n * e));
        self.norm(Norm::Layer(*ln), x, h, cfg.eps)?;
        let out = b.out.first(rows * cfg.projection_dim);
        self.mlp(mlp, h, b.proj.first(n * e), out, rows)?;
        self.ops.read(out)
    }

    /// The projector proper on the ViT's rows `vit`, as `head::project`.
    fn head(
        &self,
        w: &VisionWeights,
        cfg: &VisionConfig,
        vit: Rows<'_>,
        n: usize,
    ) -> Result<Vec<f32>, String> {
        let (b, e, k) = (self.buffers(), cfg.n_embd, cfg.n_merge);
        let rows = n / (k * k);
        let (scratch, out) = (b.proj.first(n * e), b.out.first(rows * cfg.projection_dim));
        let side = || match n.isqrt() {
            side if side * side == n => Ok(side),
            _ => Err(format!("a view of {n} patches is not square")),
        };
        match &w.head {
            Head::Gemma3 { norm, stored, .. } => {
                let pooled = b.proj.first(rows * e);
                self.ops.pool(pooled, vit, (side()?, k), e)?;
                let norm = self.arena.at(norm.offset, norm.len);
                self.ops.rms_norm(pooled, pooled, norm, cfg.eps)?;
                let m = &self.matrices[&stored.tensor];
                self.ops.linear(m, 0..m.rows, None, pooled, out, rows)?;
            }
            Head::Idefics3 { fc } => {
                let side = side()?;
                let shuffled = self.ops.index(&merge_order((side, side), k))?;
                self.ops.gather(scratch, vit, &shuffled, e)?;
                self.linear(fc, scratch, out, rows)?;
            }
            Head::Merger { mlp } => self.mlp(mlp, vit, scratch, out, rows)?,
        }
        self.ops.read(out)
    }

    /// `out = fc2(gelu(fc1(x)))` over `n` rows (`scratch`: fc1's outputs).
    fn mlp(
        &self,
        m: &Mlp,
        x: Rows<'_>,
        scratch: Rows<'_>,
        out: Rows<'_>,
        n: usize,
    ) -> Result<(), String> {
        let scratch = scratch.first(n * m.fc1.mat.rows);
        self.linear(&m.fc1, x, scratch, n)?;
        self.ops.gelu(scratch)?;
        self.linear(&m.fc2, scratch, out, n)
    }

    fn linear(&self, l: &Linear, x: Rows<'_>, out: Rows<'_>, n: usize) -> Result<(), String> {
        self.band(l, 0..l.mat.rows, x, out, n)
    }

    /// `out = x · matᵀ + bias` over the rows `band` of the matrix (and of its bias).
    fn band(
        &self,
        l: &Linear,
        band: Range<usize>,
        x: Rows<'_>,
        out: Rows<'_>,
        n: usize,
    ) -> Result<(), String> {
        let bias = (l.bias).map(|b| self.arena.at(b.offset + band.start, band.len()));
        let m = &self.matrices[&l.mat.tensor];
        self.ops.linear(m, band, bias, x, out, n)
    }

    fn norm(&self, norm: Norm, x: Rows<'_>, out: Rows<'_>, eps: f32) -> Result<(), String> {
        let at = |v: crate::backend::ops::VecRef| self.arena.at(v.offset, v.len);
        match norm {
            Norm::Layer(n) => self.ops.layer_norm(x, out, (at(n.weight), at(n.bias)), eps),
            Norm::Rms(w) => self.ops.rms_norm(x, out, at(w), eps),
        }
    }
}
