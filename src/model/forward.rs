//! THE forward pass: the layer sequence of every supported family, written once against the
//! op set a backend provides (`backend::ops::Ops`). The CPU runs it through `CpuStep`, CUDA
//! through its executor's ops; what differs between families is data (`ModelConfig`,
//! `Weights`), read here as switches: which norms exist, Q/K norms, biases, RoPE per layer,
//! windows, the activation, the scales.

use super::weights::{AttentionWeights, DenseFfn, EncoderInput, Ffn, LayerWeights, MixerWeights};
use super::{BatchMeta, Model};
use crate::backend::cpu::step::{CpuBuffers, CpuStep, CpuWeights};
use crate::backend::ops::{Attention, Buf, Experts, LayerNorm, Mat, Network, Ops, Shape, VecRef};
use crate::gguf::GgufFile;
use crate::kv::{KvLayout, KvPages};
use anyhow::{bail, Result};
use std::ops::Range;
use std::sync::Arc;

impl Model {
    /// Runs `batch` on the CPU over `kv`; its `batch.logits_for.len()` rows of logits are left
    /// in `bufs` (`CpuBuffers::logits`), and its `batch.hidden_for.len()` hidden rows beside
    /// them (`CpuBuffers::take_hidden`).
    pub fn forward(
        &self,
        batch: &BatchMeta,
        kv: &mut KvPages,
        bufs: &mut CpuBuffers,
    ) -> Result<()> {
        let rotated = self.rotated(kv);
        let mut step = self.cpu_step(batch, kv, bufs)?;
        if !batch.is_empty() {
            self.run_blocks(&mut step, rotated)?;
        }
        // The hidden rows first: the head then gathers its own rows into the same buffer.
        if !batch.hidden_for.is_empty() {
            self.run_final_norm(&mut step, &batch.hidden_for)?;
            step.keep_hidden();
        }
        self.run_head(&mut step, &batch.logits_for)
    }

    /// Runs `batch` through `layers` only (an image whose positions see each other, a few
    /// layers per engine step): from its embeddings where `layers` starts at 0, else from
    /// `residual`, the rows the layers before it left; leaves the rows after `layers` in
    /// `residual`. Each layer writes its K/V into the pages as [`Model::forward`] does, so the
    /// slices of a pass leave the pages as one pass would.
    pub fn forward_layers(
        &self,
        batch: &BatchMeta,
        kv: &mut KvPages,
        bufs: &mut CpuBuffers,
        layers: Range<usize>,
        residual: &mut Vec<f32>,
    ) -> Result<()> {
        let rotated = self.rotated(kv);
        if layers.end > self.weights.layers.len() {
            bail!(
                "layers {layers:?} of a model of {}",
                self.weights.layers.len()
            );
        }
        let mut step = self.cpu_step(batch, kv, bufs)?;
        if layers.start == 0 {
            self.run_input(&mut step)?;
        } else {
            let x = step.residual();
            if residual.len() != x.len() {
                bail!(
                    "a residual of {} values for {} ({} rows)",
                    residual.len(),
                    x.len(),
                    batch.len()
                );
            }
            x.copy_from_slice(residual);
        }
        self.run_layers(&mut step, layers, rotated)?;
        residual.clear();
        residual.extend_from_slice(step.residual());
        Ok(())
    }

    /// Whether the pages of `kv` hold K and V rotated (`KvType::rotated`).
    fn rotated(&self, kv: &KvPages) -> bool {
        kv.geometry().kv_type.rotated(self.config.head_dim)
    }

    /// A CPU step over `batch`, once the pool and the batch are checked against the model.
    fn cpu_step<'a>(
        &'a self,
        batch: &'a BatchMeta,
        kv: &'a mut KvPages,
        bufs: &'a mut CpuBuffers,
    ) -> Result<CpuStep<'a>> {
        let cfg = &self.config;
        let geom = *kv.geometry();
        if geom != cfg.page_geometry(geom.kv_type, geom.block_size) {
            bail!("KV pool geometry {geom:?} does not fit the model");
        }
        batch.validate(
            geom.block_size,
            kv.blocks(),
            cfg.vocab_size,
            self.max_position(),
            &self.layout,
        )?;
        let w = CpuWeights {
            file: &self.file,
            arena: &self.weights.arena,
            packed: self.cpu_packed(),
        };
        Ok(CpuStep::new(w, kv, &self.layout, &self.shape, batch, bufs))
    }

    /// The step's input rows in X: the token embeddings (and an image's rows in place of
    /// its positions'), with an encoder's input terms.
    fn run_input<O: Ops>(&self, ops: &mut O) -> Result<()> {
        let w = &self.weights;
        ops.embed(&w.token_embd, self.config.embed_scale)?;
        if let Some(enc) = &w.encoder {
            self.encoder_input(ops, enc)?;
        }
        Ok(())
    }

    /// Blocks `layers` over the residual stream in X.
    fn run_layers<O: Ops>(&self, ops: &mut O, layers: Range<usize>, rotated: bool) -> Result<()> {
        for li in layers {
            self.block(ops, li, &self.weights.layers[li], rotated)?;
            // Qwen3-VL's DeepStack: layer li's output takes an image position's row li + 1.
            if li < self.config.deepstack_layers {
                ops.add_deepstack(li + 1)?;
            }
        }
        Ok(())
    }

    /// One layer's attention, from its input (the normed residual in H, or an encoder's
    /// residual X itself) to its projection in Proj: Q/K/V (+ biases), per-head Q/K norms,
    /// RoPE, attention over the pages, output (+ bias).
    fn attention_block<O: Ops>(
        &self,
        ops: &mut O,
        input: Buf,
        li: usize,
        a: &AttentionWeights,
        rotated: bool,
    ) -> Result<()> {
        let c = &self.config;
        let rope = c.layers[li].rope;
        let norm = |ops: &mut O, buf, n| opt_norm(ops, buf, n, c.rms_eps);
        // A query that packs an output gate goes through Mix, which keeps the gate.
        let q_out = if a.output_gate { Buf::Mix } else { Buf::Q };
        ops.matmul(input, &[(&a.wq, q_out), (&a.wk, Buf::K), (&a.wv, Buf::V)])?;
        if a.output_gate {
            ops.split_query_gate()?;
        }
        opt_bias(ops, Buf::Q, a.bq)?;
        opt_bias(ops, Buf::K, a.bk)?;
        opt_bias(ops, Buf::V, a.bv)?;
        norm(ops, Buf::Q, a.q_norm)?;
        norm(ops, Buf::K, a.k_norm)?;
        if let Some(table) = rope {
            ops.rope(Buf::Q, table)?;
            ops.rope(Buf::K, table)?;
        }
        if c.query_scale != 1.0 {
            ops.scale(Buf::Q, c.query_scale)?;
        }
        // Quantized pages hold K and V rotated; Q follows K's rotation and the output is
        // rotated back.
        if rotated {
            ops.hadamard(Buf::Q)?;
            ops.hadamard(Buf::K)?;
            ops.hadamard(Buf::V)?;
        }
        ops.attention(Attention {
            layer: li,
            window: c.layers[li].window,
            scale: c.attn_scale,
            sinks: a.sinks,
            causal: c.family.causal(),
        })?;
        if rotated {
            ops.hadamard(Buf::Attn)?;
        }
        if a.output_gate {
            ops.output_gate()?;
        }
        ops.matmul(Buf::Attn, &[(&a.wo, Buf::Proj)])?;
        opt_bias(ops, Buf::Proj, a.bo)
    }

    /// A block's mixer, from `input` to its output in Proj.
    fn mixer<O: Ops>(&self, ops: &mut O, input: Buf, li: usize, rotated: bool) -> Result<()> {
        match &self.weights.layers[li].mixer {
            MixerWeights::Attention(a) => self.attention_block(ops, input, li, a, rotated),
            MixerWeights::ShortConv(sc) => {
                // B, C and x into three n_embd-wide buffers (the loader checked that Q and
                // Attn are that wide), then Attn = C ⊙ conv(B ⊙ x).
                ops.matmul(
                    input,
                    &[(&sc.b, Buf::Q), (&sc.c, Buf::Attn), (&sc.x, Buf::Proj)],
                )?;
                ops.short_conv(sc.conv)?;
                ops.matmul(Buf::Attn, &[(&sc.out, Buf::Proj)])
            }
            MixerWeights::DeltaNet(d) => {
                let outs = [
                    (&d.qkv, Buf::Mix),
                    (&d.z, Buf::Z),
                    (&d.beta, Buf::Beta),
                    (&d.alpha, Buf::Alpha),
                ];
                ops.matmul(input, &outs)?;
                ops.delta_conv(&d.op)?;
                ops.delta_rule(&d.op)?;
                ops.matmul(Buf::Z, &[(&d.out, Buf::Proj)])
            }
        }
    }

    /// A block's FFN, from `input` to its output in Proj: gated activation (or an encoder's
    /// ungated one), down (+ biases); or the experts the router picks.
    fn ffn<O: Ops>(&self, ops: &mut O, input: Buf, li: usize) -> Result<()> {
        let c = &self.config;
        match (&self.weights.layers[li].ffn, &c.moe) {
            (Ffn::Dense(d), _) => self.dense_ffn(ops, input, d),
            (Ffn::Experts(x), Some(moe)) => ops.moe(x, moe.routing, c.activation),
            (Ffn::Experts(_), None) => bail!("layer {li} has experts but no routing"),
        }
    }

    fn dense_ffn<O: Ops>(&self, ops: &mut O, input: Buf, d: &DenseFfn) -> Result<()> {
        let act = self.config.activation;
        match &d.gate {
            Some(gate) => {
                ops.matmul(input, &[(gate, Buf::Gate), (&d.up, Buf::Up)])?;
                opt_bias(ops, Buf::Gate, d.b_gate)?;
                opt_bias(ops, Buf::Up, d.b_up)?;
                ops.glu(act)?;
            }
            None => {
                ops.matmul(input, &[(&d.up, Buf::Gate)])?;
                opt_bias(ops, Buf::Gate, d.b_up)?;
                ops.activate(Buf::Gate, act)?;
            }
        }
        ops.matmul(Buf::Gate, &[(&d.down, Buf::Proj)])?;
        opt_bias(ops, Buf::Proj, d.b_down)
    }

    /// An encoder's input: the token-type row and the position rows (where it has them)
    /// added to the token embeddings in X, then their layer norm.
    fn encoder_input<O: Ops>(&self, ops: &mut O, enc: &EncoderInput) -> Result<()> {
        opt_bias(ops, Buf::X, enc.token_type)?;
        if let Some(positions) = &enc.positions {
            ops.add_positions(positions)?;
        }
        ops.layernorm(Buf::X, enc.norm, self.config.rms_eps)
    }

    /// One block: mixer and FFN, each from its pre-norm (decoders) and added to the residual
    /// (scaled, post-normed where the family says), then layer-normed (encoders).
    fn block<O: Ops>(
        &self,
        ops: &mut O,
        li: usize,
        lw: &LayerWeights,
        rotated: bool,
    ) -> Result<()> {
        let c = &self.config;
        let eps = c.rms_eps;
        let input = pre_norm(ops, lw.attn_norm, eps)?;
        self.mixer(ops, input, li, rotated)?;
        opt_norm(ops, Buf::Proj, lw.post_attn_norm, eps)?;
        ops.add_scaled(Buf::X, Buf::Proj, c.residual_scale)?;
        opt_layernorm(ops, lw.attn_out_norm, eps)?;

        let input = pre_norm(ops, lw.ffn_norm, eps)?;
        self.ffn(ops, input, li)?;
        opt_norm(ops, Buf::Proj, lw.post_ffn_norm, eps)?;
        ops.add_scaled(Buf::X, Buf::Proj, c.residual_scale)?;
        opt_layernorm(ops, lw.out_norm, eps)
    }

    /// [`Model::forward`] into a fresh vector (tests and tools; the engine reuses its buffers).
    pub fn forward_logits(&self, batch: &BatchMeta, kv: &mut KvPages) -> Result<Vec<f32>> {
        let mut bufs = CpuBuffers::default();
        self.forward(batch, kv, &mut bufs)?;
        Ok(bufs.logits().to_vec())
    }
}

impl Network for Model {
    fn shape(&self) -> &Shape {
        &self.shape
    }

    fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }

    fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    fn arena(&self) -> &[f32] {
        &self.weights.arena
    }

    fn embedding(&self) -> &Mat {
        &self.weights.token_embd
    }

    fn matrices(&self) -> Vec<&Mat> {
        self.weights.matrices()
    }

    fn expert_layers(&self) -> Vec<&Experts> {
        self.weights
            .layers
            .iter()
            .filter_map(|l| match &l.ffn {
                Ffn::Experts(x) => Some(x),
                Ffn::Dense(_) => None,
            })
            .collect()
    }

    /// Far beyond any context the model was trained for: only nonsense is refused. An
    /// encoder's positions index its position embeddings (or stay within its trained
    /// context): none past them.
    fn max_position(&self) -> usize {
        match self.weights.encoder {
            Some(_) => self.config.context_length,
            None => self.config.context_length.max(1) * 64,
        }
    }

    /// The embedding and every transformer block for the step's tokens: leaves the residual
    /// stream in X. `rotated`: the KV pages hold K and V rotated (`KvType::rotated`).
    fn run_blocks<O: Ops>(&self, ops: &mut O, rotated: bool) -> Result<()> {
        self.run_input(ops)?;
        self.run_layers(ops, 0..self.weights.layers.len(), rotated)
    }

    /// An encoder has no final norm: its last block ends with one.
    fn run_final_norm<O: Ops>(&self, ops: &mut O, rows: &[usize]) -> Result<()> {
        ops.gather(rows)?;
        opt_norm(
            ops,
            Buf::Head,
            self.weights.output_norm,
            self.config.rms_eps,
        )
    }

    /// The output head for rows `rows` of the residual stream: Logits = their final norm times
    /// the output matrix (+ bias), scaled and soft-capped as the family does.
    fn run_head<O: Ops>(&self, ops: &mut O, rows: &[usize]) -> Result<()> {
        let c = &self.config;
        let w = &self.weights;
        let Some(output) = &w.output else {
            if rows.is_empty() {
                return Ok(());
            }
            bail!(
                "architecture '{}' has no output head: it only embeds",
                c.arch
            );
        };
        self.run_final_norm(ops, rows)?;
        ops.matmul(Buf::Head, &[(output, Buf::Logits)])?;
        if let Some(b) = w.output_bias {
            ops.add_bias(Buf::Logits, b)?;
        }
        if c.logit_scale != 1.0 {
            ops.scale(Buf::Logits, c.logit_scale)?;
        }
        if let Some(cap) = c.final_softcap {
            ops.softcap(Buf::Logits, cap)?;
        }
        Ok(())
    }
}

/// Adds `b` to `buf`, where the model has that bias.
fn opt_bias<O: Ops>(ops: &mut O, buf: Buf, b: Option<VecRef>) -> Result<()> {
    match b {
        Some(b) => ops.add_bias(buf, b),
        None => Ok(()),
    }
}

/// The input of a block's mixer or FFN: H = the RMS norm of X where the block has that
/// pre-norm, else X itself (an encoder, which norms after the residual add).
fn pre_norm<O: Ops>(ops: &mut O, n: Option<VecRef>, eps: f32) -> Result<Buf> {
    match n {
        Some(n) => {
            ops.rmsnorm(Buf::X, n, eps, Buf::H)?;
            Ok(Buf::H)
        }
        None => Ok(Buf::X),
    }
}

/// Layer-normalises the residual X in place, where the block has that norm (an encoder).
fn opt_layernorm<O: Ops>(ops: &mut O, n: Option<LayerNorm>, eps: f32) -> Result<()> {
    match n {
        Some(n) => ops.layernorm(Buf::X, n, eps),
        None => Ok(()),
    }
}

/// RMS-normalises `buf` in place by `n`, where the model has that norm.
fn opt_norm<O: Ops>(ops: &mut O, buf: Buf, n: Option<VecRef>, eps: f32) -> Result<()> {
    match n {
        Some(n) => ops.rmsnorm(buf, n, eps, buf),
        None => Ok(()),
    }
}
