//! The model's forward pass on the GPU: src/model/forward.rs step for step (the same ops in the
//! same order, the same Hadamard rotation of quantized pages, RoPE angles from the same host
//! function, GQA through the attention kernel), reading and writing K/V in the device pool
//! through the scheduler's block tables.
//!
//! [`CudaExecutor`] owns everything on the device: the opened device, one stream, the weights,
//! the KV pool, the workspace and the decode graphs. It is built once at start-up; a step only
//! uploads its metadata, launches (or replays) kernels and downloads what the caller asked for:
//! logits rows, or only the sampled token ids.

use super::device::CudaDevice;
use super::graphs::{bucket, DecodeGraphs};
use super::kv_pool::{KvBudget, KvPool};
use super::launch::SampleRow;
use super::mem::{download, upload};
use super::ops::Ops;
use super::step_meta::{build_cs, build_ints, is_plain_decode, Padding};
use super::weights::{check_supported, DeviceWeights};
use super::workspace::{Caps, Workspace};
use crate::kv::{KvType, PageGeometry};
use crate::model::{BatchMeta, Model, RopeLayout};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::CudaStream;
use std::sync::Arc;
use std::time::Instant;

/// What the executor is built for.
#[derive(Clone, Copy, Debug)]
pub struct ExecutorConfig {
    pub kv_type: KvType,
    pub block_tokens: usize,
    /// Tokens one step carries at most (the engine's max_batched_tokens).
    pub max_tokens: usize,
    pub max_seqs: usize,
    /// Longest sequence, in tokens.
    pub context: usize,
    pub kv: KvBudget,
    /// Capture decode steps as CUDA graphs.
    pub graphs: bool,
}

/// What a step returns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Want<'a> {
    /// `logits_for.len()` rows of logits.
    Logits,
    /// The argmax of each logits row.
    Greedy,
    /// A token drawn per logits row with these parameters.
    Sample(&'a [SampleRow]),
}

/// The output of a step.
#[derive(Debug, PartialEq)]
pub enum StepOut {
    Logits(Vec<f32>),
    Tokens(Vec<u32>),
}

pub struct CudaExecutor {
    // Dropped first: graphs refer to the kernels and buffers below.
    graphs: DecodeGraphs,
    ops: Ops,
    ws: Workspace,
    pool: KvPool,
    weights: DeviceWeights,
    stream: Arc<CudaStream>,
    model: Arc<Model>,
    cfg: ExecutorConfig,
    /// Host scratch, reused between steps.
    ints: Vec<i32>,
    cs: Vec<f32>,
    pairs: Vec<(f32, f32)>,
    // Dropped last: the context and modules everything above lives in.
    dev: CudaDevice,
}

impl CudaExecutor {
    /// Opens device `ordinal`, checks that `model` runs on the kernels, puts the weights on the
    /// device, allocates the workspace and then the KV pool. Every failure is one sentence.
    pub fn new(
        ordinal: usize,
        model: Arc<Model>,
        cfg: ExecutorConfig,
    ) -> Result<CudaExecutor, String> {
        let start = Instant::now();
        check_supported(&model)?;
        let mc = &model.config;
        if cfg.kv_type.row_bytes(mc.head_dim).is_none() || cfg.block_tokens == 0 {
            return Err(format!(
                "KV pages of {} in blocks of {} tokens do not fit head_dim {}",
                cfg.kv_type, cfg.block_tokens, mc.head_dim
            ));
        }
        let dev = CudaDevice::open(ordinal)?;
        let ctx = dev.ctx.clone();
        ctx.bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
        let stream = ctx
            .new_stream()
            .map_err(|e| format!("cannot create a CUDA stream: {e:?}"))?;
        let ops = Ops::new(&dev, cfg.kv_type, mc.head_dim)?;
        let caps = Caps::new(cfg.max_tokens, cfg.max_seqs, cfg.context, cfg.block_tokens);
        let weights = DeviceWeights::new(&ctx, &model, dev.info.integrated, caps.tokens)?;
        let ws = Workspace::new(&ctx, mc, caps)?;
        let geom = mc.page_geometry(cfg.kv_type, cfg.block_tokens);
        let pool = KvPool::new(&ctx, geom, cfg.kv)?;
        log::info!(
            "CUDA: forward pass on {}: weights {} ({} MiB on the device), workspace {} MiB for \
             {} tokens, KV pool {} blocks ({} MiB, {}), decode graphs {}; ready in {:.2} s",
            dev.info.summary(),
            if weights.zero_copy {
                "read in place"
            } else {
                "copied"
            },
            weights.device_bytes >> 20,
            ws.bytes() >> 20,
            caps.tokens,
            pool.blocks(),
            pool.total_bytes() >> 20,
            cfg.kv_type,
            if cfg.graphs { "on" } else { "off" },
            start.elapsed().as_secs_f64()
        );
        Ok(CudaExecutor {
            graphs: if cfg.graphs {
                DecodeGraphs::default()
            } else {
                DecodeGraphs::disabled()
            },
            ops,
            ws,
            pool,
            weights,
            stream,
            model,
            cfg,
            ints: Vec::new(),
            cs: Vec::new(),
            pairs: Vec::new(),
            dev,
        })
    }

    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Blocks of the KV pool the scheduler may hand out.
    pub fn blocks(&self) -> usize {
        self.pool.blocks()
    }

    pub fn geometry(&self) -> &PageGeometry {
        self.pool.geometry()
    }

    /// Device bytes of the KV pool.
    pub fn kv_bytes(&self) -> usize {
        self.pool.total_bytes()
    }

    pub fn weights_zero_copy(&self) -> bool {
        self.weights.zero_copy
    }

    /// Decode graphs captured so far.
    pub fn graphs_captured(&self) -> usize {
        self.graphs.captured()
    }

    /// Copy-on-write of a shared block (queued; ordered before the next step's kernels).
    pub fn copy_block(&mut self, src: usize, dst: usize) -> Result<(), String> {
        let g = *self.pool.geometry();
        let span = 2 * g.kv_heads * g.block_tokens * g.row_bytes();
        self.bind()?;
        self.ops.kv_copy_block(
            &self.stream,
            self.pool.ptr(),
            g.layers,
            self.pool.allocated_blocks(),
            span,
            src,
            dst,
        )
    }

    /// Runs `batch` and returns what `want` asks for.
    pub fn forward(&mut self, batch: &BatchMeta, want: Want<'_>) -> Result<StepOut, String> {
        let model = self.model.clone();
        let mc = &model.config;
        batch
            .validate(
                self.cfg.block_tokens,
                self.pool.blocks(),
                mc.vocab_size,
                mc.context_length.max(1) * 64,
            )
            .map_err(|e| format!("{e:#}"))?;
        let n = batch.len();
        if n == 0 {
            return Ok(match want {
                Want::Logits => StepOut::Logits(Vec::new()),
                _ => StepOut::Tokens(Vec::new()),
            });
        }
        let m = batch.logits_for.len();
        if !matches!(want, Want::Logits) && m > self.ws.caps.logit_rows {
            return Err(format!(
                "{m} rows to sample exceed the workspace's {}",
                self.ws.caps.logit_rows
            ));
        }
        if let Want::Sample(rows) = want {
            if rows.len() != m {
                return Err(format!("{} sampling rows for {m} logits rows", rows.len()));
            }
        }
        self.bind()?;
        let bucket_max = self.cfg.max_seqs.max(1).next_power_of_two();
        let graph_bucket = (self.graphs.enabled() && is_plain_decode(batch, bucket_max))
            .then(|| bucket(n, bucket_max))
            .flatten()
            .filter(|&b| b <= self.ws.caps.logit_rows);
        let total = graph_bucket.unwrap_or(n);
        let pad = graph_bucket.map(|b| Padding {
            to: b,
            block: self.pool.pad_block(),
        });
        build_ints(
            batch,
            self.cfg.block_tokens,
            &self.ws.caps,
            pad,
            &mut self.ints,
        )?;
        build_cs(
            batch,
            mc,
            model.weights.rope_freqs.as_deref(),
            total,
            &mut self.pairs,
            &mut self.cs,
        );
        let s = self.stream.cu_stream();
        // SAFETY: both images fit their buffers (build_ints checked against the caps; cs is
        // total x n_rot floats, total <= caps.tokens).
        unsafe {
            upload(s, self.ws.meta_buf.ptr(), &self.ints)?;
            upload(s, self.ws.cs.ptr(), &self.cs)?;
        }

        let mut launched = false;
        if let Some(b) = graph_bucket {
            let Self {
                graphs,
                ops,
                ws,
                pool,
                weights,
                stream,
                model,
                cfg,
                ..
            } = self;
            let (ops, ws, pool, weights, stream, model, cfg) =
                (&*ops, &*ws, &*pool, &*weights, &*stream, &*model, *cfg);
            launched = graphs.launch(stream, b, || {
                Self::enqueue_layers_of(ops, ws, pool, weights, model, stream, cfg, b)?;
                Self::enqueue_head_of(ops, ws, weights, model, stream, ws.x.ptr(), b)
            })?;
        }
        if launched {
            return self.finish(0, n, want);
        }
        self.enqueue_layers(n)?;
        // The logits rows, a workspace's worth at a time.
        let e = mc.n_embd;
        let vocab = mc.vocab_size;
        let cap = self.ws.caps.logit_rows;
        let mut logits = Vec::new();
        let mut tokens = Vec::new();
        for (c, rows) in batch.logits_for.chunks(cap).enumerate() {
            let first = rows[0];
            let contiguous = rows.iter().enumerate().all(|(j, &r)| r == first + j);
            let src = if contiguous {
                self.ws.x.ptr() + (first * e * 4) as u64
            } else {
                for (j, &r) in rows.iter().enumerate() {
                    // SAFETY: rows r < n and j < cap <= tokens, both inside x and proj.
                    unsafe {
                        cudarc::driver::result::memcpy_dtod_async(
                            self.ws.proj.ptr() + (j * e * 4) as u64,
                            self.ws.x.ptr() + (r * e * 4) as u64,
                            e * 4,
                            s,
                        )
                    }
                    .map_err(|e| format!("device copy failed: {e:?}"))?;
                }
                self.ws.proj.ptr()
            };
            self.enqueue_head(src, rows.len())?;
            match self.finish(c * cap, rows.len(), want)? {
                StepOut::Logits(l) => {
                    if logits.is_empty() {
                        logits.reserve(m * vocab);
                    }
                    logits.extend_from_slice(&l)
                }
                StepOut::Tokens(t) => tokens.extend(t),
            }
        }
        Ok(match want {
            Want::Logits => StepOut::Logits(logits),
            _ => StepOut::Tokens(tokens),
        })
    }

    /// After the head has run over `rows` rows (row `offset` onwards of the request): the
    /// logits, or the tokens sampled from them, back on the host.
    fn finish(&mut self, offset: usize, rows: usize, want: Want<'_>) -> Result<StepOut, String> {
        let vocab = self.model.config.vocab_size;
        let s = self.stream.cu_stream();
        match want {
            Want::Logits => {
                let mut out = vec![0f32; rows * vocab];
                // SAFETY: the logits buffer holds logit_rows >= rows rows.
                unsafe { download(s, &mut out, self.ws.logits.ptr())? };
                Ok(StepOut::Logits(out))
            }
            Want::Greedy => {
                self.ops.argmax(
                    &self.stream,
                    self.ws.logits.ptr(),
                    vocab,
                    self.ws.sampled.ptr(),
                    rows,
                )?;
                let mut out = vec![0u32; rows];
                // SAFETY: `sampled` holds logit_rows >= rows ids.
                unsafe { download(s, &mut out, self.ws.sampled.ptr())? };
                Ok(StepOut::Tokens(out))
            }
            Want::Sample(params) => {
                let bytes = SampleRow::encode(&params[offset..offset + rows]);
                // SAFETY: sample_params holds logit_rows >= rows SampleRows.
                unsafe { upload(s, self.ws.sample_params.ptr(), &bytes)? };
                self.ops.sample(
                    &self.stream,
                    self.ws.logits.ptr(),
                    vocab,
                    self.ws.sample_params.ptr(),
                    self.ws.sampled.ptr(),
                    rows,
                )?;
                let mut out = vec![0u32; rows];
                // SAFETY: as above (the upload was staged before it returned, and the download
                // waits for the kernel).
                unsafe { download(s, &mut out, self.ws.sampled.ptr())? };
                Ok(StepOut::Tokens(out))
            }
        }
    }

    fn bind(&self) -> Result<(), String> {
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {e:?}"))
    }

    fn enqueue_layers(&self, n: usize) -> Result<(), String> {
        Self::enqueue_layers_of(
            &self.ops,
            &self.ws,
            &self.pool,
            &self.weights,
            &self.model,
            &self.stream,
            self.cfg,
            n,
        )
    }

    fn enqueue_head(&self, src: CUdeviceptr, rows: usize) -> Result<(), String> {
        Self::enqueue_head_of(
            &self.ops,
            &self.ws,
            &self.weights,
            &self.model,
            &self.stream,
            src,
            rows,
        )
    }

    /// Embedding and every transformer block for the first `n` tokens of the uploaded step,
    /// as kernel launches only (capturable). Mirrors src/model/forward.rs line by line.
    #[allow(clippy::too_many_arguments)]
    fn enqueue_layers_of(
        ops: &Ops,
        ws: &Workspace,
        pool: &KvPool,
        dw: &DeviceWeights,
        model: &Model,
        s: &CudaStream,
        cfg: ExecutorConfig,
        n: usize,
    ) -> Result<(), String> {
        let c = &model.config;
        let w = &model.weights;
        let (e, hd, qd, kvd, ff) = (c.n_embd, c.head_dim, c.q_dim(), c.kv_dim(), c.n_ff);
        let meta = ws.meta();
        let (x, h, q, k, v, attn, proj, gate, up, act) = (
            ws.x.ptr(),
            ws.h.ptr(),
            ws.q.ptr(),
            ws.k.ptr(),
            ws.v.ptr(),
            ws.attn.ptr(),
            ws.proj.ptr(),
            ws.gate.ptr(),
            ws.up.ptr(),
            ws.act.ptr(),
        );
        let mm = |m: &crate::model::Mat, input: CUdeviceptr, out: CUdeviceptr| {
            ops.matmul(s, m.ty, dw.ptr(model, m), input, out, m.rows, m.cols, n)
        };
        let te = &w.token_embd;
        ops.embed(
            s,
            dw.ptr(model, te),
            te.ty,
            te.row_bytes(),
            e,
            meta.tokens,
            x,
            n,
        )?;
        // Quantized pages hold K and V rotated; Q follows K's rotation and the attention
        // output is rotated back (as on the CPU).
        let rotate = cfg.kv_type != KvType::F16 && hd % 64 == 0;
        let neox = c.rope_layout == RopeLayout::Neox;
        let scale = 1.0 / (hd as f32).sqrt();
        for (li, lw) in w.layers.iter().enumerate() {
            let lv = &dw.layers[li];
            ops.rmsnorm(s, x, lv.attn_norm.ptr(), h, n, e, c.rms_eps)?;
            ops.quantize(s, h, act, n, e)?;
            mm(&lw.wq, act, q)?;
            mm(&lw.wk, act, k)?;
            mm(&lw.wv, act, v)?;
            for (b, dst, dim) in [(&lv.bq, q, qd), (&lv.bk, k, kvd), (&lv.bv, v, kvd)] {
                if let Some(b) = b {
                    ops.add(s, dst, b.ptr(), n * dim)?;
                }
            }
            ops.rope(s, q, ws.cs.ptr(), n, c.n_head, hd, c.n_rot, neox)?;
            ops.rope(s, k, ws.cs.ptr(), n, c.n_head_kv, hd, c.n_rot, neox)?;
            if rotate {
                ops.hadamard(s, q, n * qd)?;
                ops.hadamard(s, k, n * kvd)?;
                ops.hadamard(s, v, n * kvd)?;
            }
            // This step's K/V first: tokens later in a span attend to earlier ones.
            ops.kv_append(
                s,
                k,
                v,
                meta.slots,
                n,
                pool.ptr(),
                li,
                pool.allocated_blocks(),
                c.n_head_kv,
                hd,
                cfg.block_tokens,
                cfg.kv_type,
            )?;
            ops.attention(
                s,
                q,
                attn,
                pool.ptr(),
                meta.tables,
                meta.table_offsets,
                meta.positions,
                n,
                li,
                pool.allocated_blocks(),
                c.n_head,
                c.n_head_kv,
                cfg.block_tokens,
                scale,
            )?;
            if rotate {
                ops.hadamard(s, attn, n * qd)?;
            }
            ops.quantize(s, attn, act, n, qd)?;
            mm(&lw.wo, act, proj)?;
            ops.add(s, x, proj, n * e)?;

            ops.rmsnorm(s, x, lv.ffn_norm.ptr(), h, n, e, c.rms_eps)?;
            ops.quantize(s, h, act, n, e)?;
            mm(&lw.w_gate, act, gate)?;
            mm(&lw.w_up, act, up)?;
            ops.silu_mul(s, gate, up, n * ff)?;
            ops.quantize(s, gate, act, n, ff)?;
            mm(&lw.w_down, act, proj)?;
            ops.add(s, x, proj, n * e)?;
        }
        Ok(())
    }

    /// Output norm and projection of `rows` rows of the residual stream starting at `src`,
    /// into the logits buffer.
    fn enqueue_head_of(
        ops: &Ops,
        ws: &Workspace,
        dw: &DeviceWeights,
        model: &Model,
        s: &CudaStream,
        src: CUdeviceptr,
        rows: usize,
    ) -> Result<(), String> {
        let c = &model.config;
        let out = &model.weights.output;
        ops.rmsnorm(
            s,
            src,
            dw.output_norm.ptr(),
            ws.h.ptr(),
            rows,
            c.n_embd,
            c.rms_eps,
        )?;
        ops.quantize(s, ws.h.ptr(), ws.act.ptr(), rows, c.n_embd)?;
        ops.matmul(
            s,
            out.ty,
            dw.ptr(model, out),
            ws.act.ptr(),
            ws.logits.ptr(),
            out.rows,
            out.cols,
            rows,
        )
    }
}
