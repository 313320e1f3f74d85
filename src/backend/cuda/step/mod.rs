//! The op set (`backend::ops::Ops`) on the device: each op is one or two kernel launches on the
//! executor's stream, over the workspace's buffers, the device weights and the KV pool, for the
//! step whose metadata is already uploaded. Nothing here allocates, copies from the host or
//! synchronises, so a whole pass can be captured into a CUDA graph.

pub(super) mod meta;

use super::kv_pool::KvPool;
use super::mem::DeviceBuf;
use super::ops::{DeltaRuleArgs, Kernels, StateArgs};
use super::weights::DeviceWeights;
use super::workspace::Workspace;
use crate::backend::ops::{
    Activation, Attention, Buf, DeltaNet, Experts, LayerNorm, Mat, Ops, RopeLayout, Routing, Shape,
    ShortConv, VecRef, Window,
};
use crate::kv::{KvLayout, KvType};
use crate::quant::GgmlType;
use anyhow::{anyhow, Result};
use cudarc::driver::CudaStream;

/// One step's view of the device.
pub struct CudaStep<'a> {
    pub kernels: &'a Kernels,
    pub ws: &'a Workspace,
    pub pool: &'a KvPool,
    pub weights: &'a DeviceWeights,
    pub stream: &'a CudaStream,
    pub shape: &'a Shape,
    pub layout: &'a KvLayout,
    pub kv_type: KvType,
    pub block_size: usize,
    /// Tokens of the step (padding included).
    pub tokens: usize,
    /// Sequences of the step (padding included: each padding token is one).
    pub seqs: usize,
    /// Rows the step gives in place of embeddings (an image's), in the workspace's inputs.
    pub inputs: usize,
    /// Rows gathered into Head by the last `gather`.
    pub head_rows: usize,
}

impl CudaStep<'_> {
    fn rows(&self, buf: Buf) -> usize {
        match buf {
            Buf::Head | Buf::Logits => self.head_rows,
            _ => self.tokens,
        }
    }

    fn values(&self, buf: Buf) -> usize {
        self.rows(buf) * self.shape.widths.of(buf)
    }

    fn ptr(&self, buf: Buf) -> u64 {
        self.ws.ptr(buf)
    }

    /// Part `part` of each input row (0: the row the token reads in place of its embedding;
    /// 1..: Qwen3-VL's DeepStack rows, added to the output of the layers before) into `X`.
    fn put_inputs(&self, part: usize) -> Result<()> {
        let Some(inputs) = self.ws.inputs.as_ref().filter(|_| self.inputs > 0) else {
            return Ok(());
        };
        let cols = self.shape.widths.embd;
        let rows = (
            inputs.rows.ptr(),
            cols * (1 + self.shape.deepstack),
            part * cols,
        );
        let x = self.ptr(Buf::X);
        (self.kernels)
            .put_rows(
                self.stream,
                x,
                rows,
                inputs.tokens.ptr(),
                self.inputs,
                cols,
                part > 0,
            )
            .map_err(dev)
    }

    /// A recurrent op's view of the state slots: its `len` values at `offset` in each slot,
    /// checked to fit the pool's slots.
    fn state_args(&self, offset: usize, len: usize) -> Result<StateArgs> {
        let floats = self.pool.state_floats();
        if offset + len > floats {
            return Err(anyhow!(
                "a recurrent layer needs state values {offset}..{}, past the slot's {floats}",
                offset + len
            ));
        }
        let meta = self.ws.meta();
        Ok(StateArgs {
            states: self.pool.states_ptr(),
            slot_floats: floats,
            offset,
            seqs: meta.seqs,
            saves: meta.saves,
            count: self.seqs,
        })
    }
}

/// Why the CUDA kernels run no encoder.
const ENCODERS: &str = "the CUDA backend has no encoder ops (layer norms, bidirectional attention)";
/// Why the CUDA kernels run no symmetric window.
const SYMMETRIC: &str = "the CUDA attention kernel has no symmetric window (gemma-embedding)";

fn dev(e: String) -> anyhow::Error {
    anyhow!(e)
}

impl Ops for CudaStep<'_> {
    fn embed(&mut self, table: &Mat, scale: f32) -> Result<()> {
        self.kernels
            .embed(
                self.stream,
                self.weights.mat(table),
                table.ty,
                table.row_bytes(),
                table.cols,
                self.ws.meta().tokens,
                scale,
                self.ptr(Buf::X),
                self.tokens,
            )
            .map_err(dev)?;
        // Rows given in place of embeddings go in as they are (the scale is the tokens').
        self.put_inputs(0)
    }

    fn rmsnorm(&mut self, src: Buf, w: VecRef, eps: f32, dst: Buf) -> Result<()> {
        // A row of `w.len` values: the whole row, or one head (Q/K norms).
        let rows = self.values(src) / w.len;
        self.kernels
            .rmsnorm(
                self.stream,
                self.ptr(src),
                self.weights.vec(w),
                self.ptr(dst),
                rows,
                w.len,
                eps,
            )
            .map_err(dev)
    }

    // An encoder's ops: `check_supported` refuses an encoder before a step is built, so these
    // are never reached.
    fn layernorm(&mut self, _: Buf, _: LayerNorm, _: f32) -> Result<()> {
        Err(anyhow!(ENCODERS))
    }

    fn add_positions(&mut self, _: &Mat) -> Result<()> {
        Err(anyhow!(ENCODERS))
    }

    fn add_deepstack(&mut self, part: usize) -> Result<()> {
        if part == 0 || part > self.shape.deepstack {
            return Err(anyhow!("DeepStack row {part} of {}", self.shape.deepstack));
        }
        self.put_inputs(part)
    }

    fn activate(&mut self, _: Buf, _: Activation) -> Result<()> {
        Err(anyhow!(ENCODERS))
    }

    fn matmul(&mut self, x: Buf, outs: &[(&Mat, Buf)]) -> Result<()> {
        let (rows, cols) = (self.rows(x), self.shape.widths.of(x));
        let act = self.ws.act.ptr();
        // The activations are quantized once for every matrix that reads them.
        self.kernels
            .quantize(self.stream, self.ptr(x), act, rows, cols)
            .map_err(dev)?;
        for &(m, out) in outs {
            if m.ty == GgmlType::F32 {
                // A small f32 matrix (a DeltaNet's β or α): the f32 product over x itself.
                self.kernels
                    .moe_router_f32(
                        self.stream,
                        self.weights.mat(m),
                        self.ptr(x),
                        self.ptr(out),
                        m.rows,
                        m.cols,
                        rows,
                    )
                    .map_err(dev)?;
                continue;
            }
            self.kernels
                .matmul(
                    self.stream,
                    m.ty,
                    self.weights.mat(m),
                    act,
                    self.ptr(out),
                    m.rows,
                    m.cols,
                    rows,
                )
                .map_err(dev)?;
        }
        Ok(())
    }

    fn add_bias(&mut self, buf: Buf, b: VecRef) -> Result<()> {
        self.kernels
            .add_bias(
                self.stream,
                self.ptr(buf),
                self.weights.vec(b),
                self.values(buf),
                b.len,
            )
            .map_err(dev)
    }

    fn rope(&mut self, buf: Buf, table: usize) -> Result<()> {
        let s = self.shape;
        let cs = self.ws.cs.ptr() + (table * self.ws.caps.tokens * s.n_rot * 4) as u64;
        self.kernels
            .rope(
                self.stream,
                self.ptr(buf),
                cs,
                self.tokens,
                s.widths.of(buf) / s.head_dim,
                s.head_dim,
                s.n_rot,
                s.rope_layout == RopeLayout::Neox,
            )
            .map_err(dev)
    }

    fn hadamard(&mut self, buf: Buf) -> Result<()> {
        self.kernels
            .hadamard(self.stream, self.ptr(buf), self.values(buf))
            .map_err(dev)
    }

    fn attention(&mut self, a: Attention) -> Result<()> {
        if !a.causal {
            return Err(anyhow!(ENCODERS));
        }
        // The kernel's window is a trailing one (0: none).
        let window = match a.window {
            None => 0,
            Some(Window::Trailing(n)) => n,
            Some(Window::Symmetric(_)) => return Err(anyhow!(SYMMETRIC)),
        };
        let s = self.shape;
        let (group, layer) = self.layout.layer_slot[a.layer];
        let meta = self.ws.meta();
        let blocks = self.pool.allocated_blocks();
        // This step's K/V first: tokens later in a span attend to earlier ones.
        self.kernels
            .kv_append(
                self.stream,
                self.ptr(Buf::K),
                self.ptr(Buf::V),
                meta.slots(group),
                self.tokens,
                self.pool.ptr(),
                layer,
                blocks,
                s.n_head_kv,
                s.head_dim,
                self.block_size,
                self.kv_type,
            )
            .map_err(dev)?;
        self.kernels
            .attention(
                self.stream,
                self.ptr(Buf::Q),
                self.ptr(Buf::Attn),
                self.pool.ptr(),
                meta.tables,
                meta.table_offsets(group),
                (meta.positions, meta.through),
                self.tokens,
                layer,
                blocks,
                s.n_head,
                s.n_head_kv,
                self.block_size,
                a.scale,
                window,
                a.sinks.map_or(0, |v| self.weights.vec(v)),
            )
            .map_err(dev)
    }

    fn glu(&mut self, act: Activation) -> Result<()> {
        self.kernels
            .glu(
                self.stream,
                act,
                self.ptr(Buf::Gate),
                self.ptr(Buf::Up),
                self.values(Buf::Gate),
            )
            .map_err(dev)
    }

    /// The router's logits and each token's picks (moe.cu), then only the picked experts'
    /// matrices, pair by pair (gemv.cu `moe_gemv_*`), then the weighted sum. Every launch reads
    /// the picks from device memory, so nothing waits on the host and a decode step is still
    /// captured whole. `check_supported` made sure each expert tensor is one band per expert.
    fn moe(&mut self, x: &Experts, routing: Routing, act: Activation) -> Result<()> {
        let b = self
            .ws
            .moe
            .as_ref()
            .ok_or_else(|| anyhow!("the workspace has no expert buffers"))?;
        let (k, s, w) = (self.kernels, self.stream, self.weights);
        let (n, embd) = (self.tokens, self.shape.widths.embd);
        let (count, used, ff) = (x.count(), routing.used, x.gate[0].rows);
        let pairs = n * used;
        let (h, q8) = (self.ptr(Buf::H), self.ws.act.ptr());
        let (logits, ids, wts) = (b.logits.ptr(), b.ids.ptr(), b.wts.ptr());
        // H quantized once: a quantized router's input, and the gate and up matrices'.
        k.quantize(s, h, q8, n, embd).map_err(dev)?;
        if x.router.ty == GgmlType::F32 {
            k.moe_router_f32(s, w.mat(&x.router), h, logits, count, embd, n)
        } else {
            k.matmul(s, x.router.ty, w.mat(&x.router), q8, logits, count, embd, n)
        }
        .map_err(dev)?;
        if let Some(bias) = x.router_bias {
            k.add_bias(s, logits, w.vec(bias), n * count, count)
                .map_err(dev)?;
        }
        k.moe_route(s, logits, count, routing, ids, wts, n)
            .map_err(dev)?;
        // One band of rows per expert: expert e's matrix is e bands past the first. Pair p
        // reads activation row p / act_div.
        let gemv = |m: &[Mat], act_div: usize, out: &DeviceBuf, rows: usize, cols: usize| {
            let stride = m[0].rows * m[0].row_bytes();
            let (ty, first) = (m[0].ty, w.mat(&m[0]));
            k.moe_gemv(
                s,
                ty,
                first,
                stride,
                ids,
                q8,
                act_div,
                out.ptr(),
                rows,
                cols,
                pairs,
            )
            .map_err(dev)
        };
        gemv(&x.gate, used, &b.gate, ff, embd)?;
        gemv(&x.up, used, &b.up, ff, embd)?;
        let biases = x.biases.as_ref().map(|v| v[0]);
        if let Some(bs) = biases {
            k.moe_add_bias(s, b.gate.ptr(), w.vec(bs.gate), ids, pairs, ff)
                .and_then(|_| k.moe_add_bias(s, b.up.ptr(), w.vec(bs.up), ids, pairs, ff))
                .map_err(dev)?;
        }
        k.glu(s, act, b.gate.ptr(), b.up.ptr(), pairs * ff)
            .map_err(dev)?;
        k.quantize(s, b.gate.ptr(), q8, pairs, ff).map_err(dev)?;
        gemv(&x.down, 1, &b.down, embd, ff)?;
        if let Some(bs) = biases {
            k.moe_add_bias(s, b.down.ptr(), w.vec(bs.down), ids, pairs, embd)
                .map_err(dev)?;
        }
        k.moe_combine(s, b.down.ptr(), wts, self.ptr(Buf::Proj), used, embd, n)
            .map_err(dev)
    }

    fn short_conv(&mut self, conv: ShortConv) -> Result<()> {
        let n = self.shape.widths.embd;
        let per_layer = (conv.taps - 1) * n;
        let st = self.state_args(conv.index * per_layer, per_layer)?;
        let bxc = (self.ptr(Buf::Q), self.ptr(Buf::Proj), self.ptr(Buf::Attn));
        let kernel = self.weights.vec(conv.kernel);
        self.kernels
            .short_conv(self.stream, bxc, st, kernel, conv.taps, n)
            .map_err(dev)
    }

    /// Only the queries move: the gates stay in Mix, in the matmul's packed rows, where
    /// `output_gate` reads them (the CPU packs them; nothing else reads them).
    fn split_query_gate(&mut self) -> Result<()> {
        let (hd, q) = (self.shape.head_dim, self.values(Buf::Q));
        let (mix, out) = (self.ptr(Buf::Mix), self.ptr(Buf::Q));
        self.kernels
            .query_gate(self.stream, false, mix, out, hd, q)
            .map_err(dev)
    }

    fn output_gate(&mut self) -> Result<()> {
        let (hd, n) = (self.shape.head_dim, self.values(Buf::Attn));
        let (mix, attn) = (self.ptr(Buf::Mix), self.ptr(Buf::Attn));
        self.kernels
            .query_gate(self.stream, true, mix, attn, hd, n)
            .map_err(dev)
    }

    fn delta_conv(&mut self, d: &DeltaNet) -> Result<()> {
        let st = self.state_args(d.index * d.shape.floats(), d.shape.conv_floats())?;
        let kernel = self.weights.vec(d.kernel);
        let (taps, n) = (d.shape.taps, d.shape.channels());
        self.kernels
            .conv_silu(self.stream, self.ptr(Buf::Mix), st, kernel, taps, n)
            .map_err(dev)
    }

    fn delta_rule(&mut self, d: &DeltaNet) -> Result<()> {
        let sh = d.shape;
        let (hd, mix) = (sh.head_dim, self.ptr(Buf::Mix));
        let heads = (sh.channels(), 2 * sh.k_heads, hd);
        self.kernels
            .l2_norm_heads(self.stream, mix, heads, d.eps, self.tokens)
            .map_err(dev)?;
        let matrices = sh.floats() - sh.conv_floats();
        let st = self.state_args(d.index * sh.floats() + sh.conv_floats(), matrices)?;
        let w = self.weights;
        let args = DeltaRuleArgs {
            mix,
            beta: self.ptr(Buf::Beta),
            alpha: self.ptr(Buf::Alpha),
            z: self.ptr(Buf::Z),
            dt_bias: w.vec(d.dt_bias),
            a: w.vec(d.a),
            norm: w.vec(d.norm),
            eps: d.eps,
            head_dim: hd,
            k_heads: sh.k_heads,
            v_heads: sh.v_heads,
        };
        self.kernels.delta_rule(self.stream, &args, st).map_err(dev)
    }

    fn add_scaled(&mut self, dst: Buf, src: Buf, scale: f32) -> Result<()> {
        self.kernels
            .add_scaled(
                self.stream,
                self.ptr(dst),
                self.ptr(src),
                scale,
                self.values(dst),
            )
            .map_err(dev)
    }

    fn scale(&mut self, buf: Buf, s: f32) -> Result<()> {
        self.kernels
            .scale(self.stream, false, self.ptr(buf), s, self.values(buf))
            .map_err(dev)
    }

    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<()> {
        self.kernels
            .scale(self.stream, true, self.ptr(buf), cap, self.values(buf))
            .map_err(dev)
    }

    fn gather(&mut self, rows: &[usize]) -> Result<()> {
        if rows.len() > self.ws.caps.logit_rows {
            return Err(anyhow!(
                "{} logits rows exceed the workspace's {}",
                rows.len(),
                self.ws.caps.logit_rows
            ));
        }
        self.head_rows = rows.len();
        let bytes = self.shape.widths.embd * 4;
        let (x, head) = (self.ptr(Buf::X), self.ptr(Buf::Head));
        // Runs of consecutive rows are one copy each (a decode step's rows are one run).
        let mut j = 0;
        while j < rows.len() {
            let mut run = 1;
            while j + run < rows.len() && rows[j + run] == rows[j] + run {
                run += 1;
            }
            // SAFETY: rows[j..j + run] < tokens rows of X, and j + run <= logit_rows rows of
            // Head; both buffers are the workspace's, alive for the step.
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    head + (j * bytes) as u64,
                    x + (rows[j] * bytes) as u64,
                    run * bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| anyhow!("device copy failed: {e:?}"))?;
            j += run;
        }
        Ok(())
    }
}
