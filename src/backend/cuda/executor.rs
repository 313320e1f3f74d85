//! The forward pass on the GPU. The pass itself is the model's (`backend::ops::Network`, the one
//! layer sequence src/model/forward.rs writes for every backend); this executor gives it the
//! device's op set (`step::CudaStep`), so the device runs the same ops in the same order as the
//! CPU: the same Hadamard rotation of quantized pages, RoPE angles from the same host function,
//! K/V read and written in the device pool through the scheduler's block tables.
//!
//! [`CudaExecutor`] owns everything on the device: the opened device, one stream, the weights,
//! the KV pool, the workspace and the decode graphs. It is built once at start-up; a step only
//! uploads its metadata, launches (or replays) kernels and downloads what the caller asked for:
//! logits rows, or only the sampled token ids.

use super::device::CudaDevice;
use super::graphs::{bucket, DecodeGraphs};
use super::kv_pool::{KvBudget, KvPool, StateShape};
use super::launch::SampleRow;
use super::mem::{download, upload, DeviceBuf};
use super::ops::Kernels;
use super::step::meta::{build_cs, build_ints, is_plain_decode, Padding};
use super::step::CudaStep;
use super::weights::{check_supported, DeviceWeights};
use super::workspace::{Caps, InputRows, Workspace};
use crate::backend::batch::{BatchMeta, StepOutput};
use crate::backend::ops::{Network, Shape};
use crate::kv::{KvType, PageGeometry};
use cudarc::driver::CudaStream;
use std::sync::Arc;
use std::time::Instant;

/// What the executor is built for.
#[derive(Clone, Copy, Debug)]
pub struct ExecutorConfig {
    pub kv_type: KvType,
    pub block_size: usize,
    /// Tokens one step carries at most (the engine's max_batched_tokens).
    pub max_tokens: usize,
    pub max_seqs: usize,
    /// Longest sequence, in tokens.
    pub context: usize,
    pub kv: KvBudget,
    /// Capture decode steps as CUDA graphs.
    pub graphs: bool,
    /// A hybrid model's recurrent-state slots: one per sequence that may run at once, then
    /// the prefix cache's snapshots (ignored for a model without recurrent state).
    pub state_slots: usize,
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

pub struct CudaExecutor {
    // Dropped first: graphs refer to the kernels and buffers below.
    graphs: DecodeGraphs,
    kernels: Kernels,
    ws: Workspace,
    pool: KvPool,
    weights: DeviceWeights,
    stream: Arc<CudaStream>,
    cfg: ExecutorConfig,
    /// Host scratch, reused between steps.
    ints: Vec<i32>,
    input_rows: Vec<f32>,
    input_tokens: Vec<i32>,
    cs: Vec<f32>,
    pairs: Vec<(f32, f32)>,
    /// The last step's hidden rows (`BatchMeta::hidden_for`), final-normed, rows × n_embd.
    hidden: Vec<f32>,
    // Dropped last: the context and modules everything above lives in.
    dev: CudaDevice,
}

impl CudaExecutor {
    /// Opens device `ordinal`, checks that `net` runs on the kernels, puts its weights on the
    /// device, allocates the workspace and then the KV pool. Every failure is one sentence.
    pub fn new(
        ordinal: usize,
        net: &impl Network,
        cfg: ExecutorConfig,
    ) -> Result<CudaExecutor, String> {
        let start = Instant::now();
        check_supported(net)?;
        let shape = net.shape();
        check_pages(&cfg, shape.head_dim)?;
        let dev = CudaDevice::open(ordinal)?;
        let stream = open_stream(&dev)?;
        let ctx = dev.ctx.clone();
        let kernels = Kernels::new(&dev, cfg.kv_type, shape.head_dim)?;
        let layout = net.kv_layout();
        let mut caps = Caps::new(
            cfg.max_tokens,
            cfg.max_seqs,
            cfg.context,
            cfg.block_size,
            layout.num_groups(),
        );
        if shape.state_floats > 0 {
            caps = caps.with_states();
        }
        let weights = DeviceWeights::new(&ctx, net, dev.info.integrated)?;
        let ws = Workspace::new(&ctx, shape, caps)?;
        let geom = PageGeometry {
            layers: layout.layers_per_group(),
            kv_heads: shape.n_head_kv,
            head_dim: shape.head_dim,
            block_size: cfg.block_size,
            kv_type: cfg.kv_type,
        };
        let state = StateShape {
            slots: cfg.state_slots,
            floats: shape.state_floats,
        };
        let pool = KvPool::new(&ctx, geom, cfg.kv, state)?;
        let exec = CudaExecutor {
            graphs: if cfg.graphs {
                DecodeGraphs::default()
            } else {
                DecodeGraphs::disabled()
            },
            kernels,
            ws,
            pool,
            weights,
            stream,
            cfg,
            ints: Vec::new(),
            input_rows: Vec::new(),
            input_tokens: Vec::new(),
            cs: Vec::new(),
            pairs: Vec::new(),
            hidden: Vec::new(),
            dev,
        };
        exec.log_ready(caps.tokens, start);
        Ok(exec)
    }

    /// What the executor came to (the workspace sized for `tokens` a step), and how long it
    /// took since `start`.
    fn log_ready(&self, tokens: usize, start: Instant) {
        let (weights, pool) = (&self.weights, &self.pool);
        log::info!(
            "CUDA: forward pass on {}: weights {} ({} MiB on the device), workspace {} MiB for \
             {} tokens, KV pool {} blocks ({} MiB, {}), {} state slots ({} MiB), decode \
             graphs {}; ready in {:.2} s",
            self.dev.info.summary(),
            if weights.zero_copy {
                "read in place"
            } else {
                "copied"
            },
            weights.device_bytes >> 20,
            self.ws.bytes() >> 20,
            tokens,
            pool.blocks(),
            pool.total_bytes() >> 20,
            self.cfg.kv_type,
            pool.state_slots(),
            pool.state_bytes() >> 20,
            if self.cfg.graphs { "on" } else { "off" },
            start.elapsed().as_secs_f64()
        );
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
        let span = 2 * g.kv_heads * g.block_size * g.row_bytes();
        self.bind()?;
        self.kernels.kv_copy_block(
            &self.stream,
            self.pool.ptr(),
            g.layers,
            self.pool.allocated_blocks(),
            span,
            src,
            dst,
        )
    }

    /// Recurrent-state slots of the pool (a hybrid model's; 0 otherwise).
    pub fn state_slots(&self) -> usize {
        self.pool.state_slots()
    }

    /// Copies state slot `src` into slot `dst` (a fork, or a prefix-cache snapshot restored):
    /// queued, ordered before the next step's kernels.
    pub fn copy_state(&mut self, src: usize, dst: usize) -> Result<(), String> {
        let slots = self.pool.state_slots();
        if src >= slots || dst >= slots {
            return Err(format!("state slots {src} -> {dst}: the pool has {slots}"));
        }
        let bytes = self.pool.state_floats() * 4;
        let base = self.pool.states_ptr();
        self.bind()?;
        // SAFETY: both slots are inside the state buffer (checked above); a slot does not
        // overlap another, and a copy onto itself is skipped.
        if src != dst {
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(
                    base + (dst * bytes) as u64,
                    base + (src * bytes) as u64,
                    bytes,
                    self.stream.cu_stream(),
                )
            }
            .map_err(|e| format!("device copy of a state slot failed: {e:?}"))?;
        }
        Ok(())
    }

    /// Runs `batch` through `net` (the network this executor was built for) and returns what
    /// `want` asks for.
    pub fn forward<N: Network>(
        &mut self,
        net: &N,
        batch: &BatchMeta,
        want: Want<'_>,
    ) -> Result<StepOutput, String> {
        self.check_step(net, batch, want)?;
        let n = batch.len();
        if n == 0 {
            return Ok(match want {
                Want::Logits => StepOutput::Logits(Vec::new()),
                _ => StepOutput::Tokens(Vec::new()),
            });
        }
        self.bind()?;
        let graph_bucket = self.graph_bucket(batch);
        let total = graph_bucket.unwrap_or(n);
        self.upload_meta(net, batch, total, graph_bucket)?;
        let rotated = self.cfg.kv_type.rotated(net.shape().head_dim);
        if let Some(b) = graph_bucket {
            if self.launch_graph(net, b, rotated)? {
                return self.finish(net.shape().widths.vocab, 0, n, want);
            }
        }
        self.run_plainly(net, batch, total, rotated, want)
    }

    /// Refuses a batch that does not fit the network, the pool or the workspace, and sampling
    /// rows that do not match the logits rows.
    fn check_step<N: Network>(
        &self,
        net: &N,
        batch: &BatchMeta,
        want: Want<'_>,
    ) -> Result<(), String> {
        batch
            .validate(
                self.cfg.block_size,
                self.pool.blocks(),
                net.shape().widths.vocab,
                net.max_position(),
                net.kv_layout(),
            )
            .map_err(|e| format!("{e:#}"))?;
        self.check_state_slots(batch)?;
        if batch.adapters.iter().any(Option::is_some) {
            return Err(crate::backend::adapter::ADAPTERS_NEED_CPU.into());
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
        Ok(())
    }

    /// Refuses state slots (a sequence's or a snapshot's) outside the pool: the kernels would
    /// write past it.
    fn check_state_slots(&self, batch: &BatchMeta) -> Result<(), String> {
        let slots = self.pool.state_slots();
        let used = batch.state_slots.iter().flatten();
        match used
            .chain(batch.state_saves.iter().map(|v| &v.slot))
            .find(|&&s| s as usize >= slots)
        {
            Some(s) => Err(format!("state slot {s} is not one of the pool's {slots}")),
            None => Ok(()),
        }
    }

    /// The decode graph size a plain decode batch is padded to, when graphs are on and one
    /// fits the workspace.
    fn graph_bucket(&self, batch: &BatchMeta) -> Option<usize> {
        let bucket_max = self.cfg.max_seqs.max(1).next_power_of_two();
        // A step that hands back hidden rows (embeddings) runs plainly: graphs read logits only.
        // So does a step with input rows (a prompt's image).
        let plain = is_plain_decode(batch, bucket_max)
            && batch.hidden_for.is_empty()
            && batch.inputs.is_empty();
        (self.graphs.enabled() && plain)
            .then(|| bucket(batch.len(), bucket_max))
            .flatten()
            .filter(|&b| b <= self.ws.caps.logit_rows)
    }

    /// Builds the step's metadata (block tables, positions, RoPE angles) for `total` rows,
    /// padded to `graph_bucket` when given, and uploads it.
    fn upload_meta<N: Network>(
        &mut self,
        net: &N,
        batch: &BatchMeta,
        total: usize,
        graph_bucket: Option<usize>,
    ) -> Result<(), String> {
        let pad = graph_bucket.map(|b| Padding {
            to: b,
            block: self.pool.pad_block(),
            state_slot: self.pool.pad_state_slot(),
        });
        build_ints(
            batch,
            self.cfg.block_size,
            net.kv_layout().num_groups(),
            &self.ws.caps,
            pad,
            &mut self.ints,
        )?;
        build_cs(
            batch,
            net.shape(),
            self.ws.caps.tokens,
            total,
            &mut self.pairs,
            &mut self.cs,
        );
        let s = self.stream.cu_stream();
        // SAFETY: both images fit their buffers (build_ints checked against the caps; cs is
        // ropes x caps.tokens x n_rot floats at most, total <= caps.tokens).
        unsafe {
            upload(s, self.ws.meta_buf.ptr(), &self.ints)?;
            upload(s, self.ws.cs.ptr(), &self.cs)?;
        }
        self.upload_inputs(net.shape(), batch)
    }

    /// The step's input rows (an image's) and their tokens, into the workspace's input
    /// buffers (made, or grown, to hold them).
    fn upload_inputs(&mut self, shape: &Shape, batch: &BatchMeta) -> Result<(), String> {
        self.input_rows.clear();
        self.input_tokens.clear();
        if batch.inputs.is_empty() {
            return Ok(());
        }
        let width = shape.widths.embd * (1 + shape.deepstack);
        for input in &batch.inputs {
            let row = input.rows.row(input.row);
            if row.len() != width || input.token >= batch.len() {
                return Err(format!(
                    "an input row of {} values for token {}: the model's are {width} wide, the step has {} tokens",
                    row.len(),
                    input.token,
                    batch.len()
                ));
            }
            self.input_rows.extend_from_slice(row);
            self.input_tokens.push(input.token as i32);
        }
        let (rows, tokens) = (&self.input_rows, &self.input_tokens);
        let fits = |b: &DeviceBuf, bytes: usize| b.bytes() >= bytes;
        let ws = &mut self.ws;
        if !(ws.inputs.as_ref())
            .is_some_and(|i| fits(&i.rows, rows.len() * 4) && fits(&i.tokens, tokens.len() * 4))
        {
            let ctx = &self.dev.ctx;
            // The old buffers go first, so that old and new need not fit at once.
            ws.inputs = None;
            ws.inputs = Some(InputRows {
                rows: DeviceBuf::zeroed(ctx, rows.len() * 4)?,
                tokens: DeviceBuf::zeroed(ctx, tokens.len() * 4)?,
            });
        }
        let inputs = ws.inputs.as_ref().expect("made above");
        let s = self.stream.cu_stream();
        // SAFETY: both buffers hold at least as many bytes as their uploads (checked above).
        unsafe {
            upload(s, inputs.rows.ptr(), rows)?;
            upload(s, inputs.tokens.ptr(), tokens)
        }
    }

    /// Launches the decode graph of `b` rows (captured on first use): every block and the
    /// head over all `b` rows. `Ok(false)`: no graph, the step runs plainly.
    fn launch_graph<N: Network>(
        &mut self,
        net: &N,
        b: usize,
        rotated: bool,
    ) -> Result<bool, String> {
        let rows: Vec<usize> = (0..b).collect();
        let Self {
            graphs,
            kernels,
            ws,
            pool,
            weights,
            stream,
            cfg,
            ..
        } = self;
        let mut step = CudaStep {
            kernels,
            ws,
            pool,
            weights,
            stream,
            shape: net.shape(),
            layout: net.kv_layout(),
            kv_type: cfg.kv_type,
            block_size: cfg.block_size,
            tokens: b,
            seqs: b,
            inputs: 0,
            head_rows: 0,
        };
        graphs.launch(stream, b, || {
            net.run_blocks(&mut step, rotated)
                .and_then(|()| net.run_head(&mut step, &rows))
                .map_err(|e| format!("{e:#}"))
        })
    }

    /// The step launched kernel by kernel: the blocks over `total` rows, then the head over
    /// the logits rows, a workspace's worth at a time.
    fn run_plainly<N: Network>(
        &mut self,
        net: &N,
        batch: &BatchMeta,
        total: usize,
        rotated: bool,
        want: Want<'_>,
    ) -> Result<StepOutput, String> {
        // Padding tokens (of a graph that could not be captured) are sequences of their own.
        let seqs = batch.block_tables.len() + total - batch.len();
        net.run_blocks(&mut self.step(net, total, seqs), rotated)
            .map_err(|e| format!("{e:#}"))?;
        self.keep_hidden(net, batch, total, seqs)?;
        let vocab = net.shape().widths.vocab;
        let m = batch.logits_for.len();
        let mut logits = Vec::new();
        let mut tokens = Vec::new();
        for (c, rows) in batch.logits_for.chunks(self.ws.caps.logit_rows).enumerate() {
            net.run_head(&mut self.step(net, total, seqs), rows)
                .map_err(|e| format!("{e:#}"))?;
            match self.finish(vocab, c * self.ws.caps.logit_rows, rows.len(), want)? {
                StepOutput::Logits(l) => {
                    if logits.is_empty() {
                        logits.reserve(m * vocab);
                    }
                    logits.extend_from_slice(&l)
                }
                StepOutput::Tokens(t) => tokens.extend(t),
            }
        }
        Ok(match want {
            Want::Logits => StepOutput::Logits(logits),
            _ => StepOutput::Tokens(tokens),
        })
    }

    /// The op set over this executor's device state, for a step of `tokens` tokens in `seqs`
    /// sequences of `net`.
    fn step<'a, N: Network>(&'a self, net: &'a N, tokens: usize, seqs: usize) -> CudaStep<'a> {
        CudaStep {
            kernels: &self.kernels,
            ws: &self.ws,
            pool: &self.pool,
            weights: &self.weights,
            stream: &self.stream,
            shape: net.shape(),
            layout: net.kv_layout(),
            kv_type: self.cfg.kv_type,
            block_size: self.cfg.block_size,
            tokens,
            seqs,
            inputs: self.input_tokens.len(),
            head_rows: 0,
        }
    }

    /// After the head has run over `rows` rows (row `offset` onwards of the request): the
    /// logits, or the tokens sampled from them, back on the host.
    /// The final-normed hidden rows `batch.hidden_for` asks for, downloaded (a workspace's
    /// head rows at a time) before the head overwrites them.
    fn keep_hidden<N: Network>(
        &mut self,
        net: &N,
        batch: &BatchMeta,
        total: usize,
        seqs: usize,
    ) -> Result<(), String> {
        self.hidden.clear();
        let embd = net.shape().widths.embd;
        for rows in batch.hidden_for.chunks(self.ws.caps.logit_rows) {
            net.run_final_norm(&mut self.step(net, total, seqs), rows)
                .map_err(|e| format!("{e:#}"))?;
            let start = self.hidden.len();
            self.hidden.resize(start + rows.len() * embd, 0.0);
            // SAFETY: the head buffer holds logit_rows >= rows.len() rows of embd floats, and
            // the download waits for the norm that wrote them.
            unsafe {
                download(
                    self.stream.cu_stream(),
                    &mut self.hidden[start..],
                    self.ws.head.ptr(),
                )?
            };
        }
        Ok(())
    }

    /// The last step's hidden rows (`BatchMeta::hidden_for`), rows × n_embd.
    pub fn take_hidden(&mut self) -> Vec<f32> {
        std::mem::take(&mut self.hidden)
    }

    fn finish(
        &mut self,
        vocab: usize,
        offset: usize,
        rows: usize,
        want: Want<'_>,
    ) -> Result<StepOutput, String> {
        let s = self.stream.cu_stream();
        match want {
            Want::Logits => {
                let mut out = vec![0f32; rows * vocab];
                // SAFETY: the logits buffer holds logit_rows >= rows rows.
                unsafe { download(s, &mut out, self.ws.logits.ptr())? };
                return Ok(StepOutput::Logits(out));
            }
            Want::Greedy => self.kernels.argmax(
                &self.stream,
                self.ws.logits.ptr(),
                vocab,
                self.ws.sampled.ptr(),
                rows,
            )?,
            Want::Sample(params) => {
                let bytes = SampleRow::encode(&params[offset..offset + rows]);
                // SAFETY: sample_params holds logit_rows >= rows SampleRows.
                unsafe { upload(s, self.ws.sample_params.ptr(), &bytes)? };
                self.kernels.sample(
                    &self.stream,
                    self.ws.logits.ptr(),
                    vocab,
                    self.ws.sample_params.ptr(),
                    self.ws.sampled.ptr(),
                    rows,
                )?
            }
        }
        // Greedy or sampled: the chosen ids come back.
        let mut out = vec![0u32; rows];
        // SAFETY: `sampled` holds logit_rows >= rows ids (any upload was staged before it
        // returned, and the download waits for the kernel).
        unsafe { download(s, &mut out, self.ws.sampled.ptr())? };
        Ok(StepOutput::Tokens(out))
    }

    fn bind(&self) -> Result<(), String> {
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(|e| format!("cannot use the CUDA context: {e:?}"))
    }
}

/// Why pages of `cfg`'s KV type and block size cannot hold heads of `head_dim`, if they cannot.
fn check_pages(cfg: &ExecutorConfig, head_dim: usize) -> Result<(), String> {
    if cfg.kv_type.row_bytes(head_dim).is_none() || cfg.block_size == 0 {
        return Err(format!(
            "KV pages of {} in blocks of {} tokens do not fit head_dim {}",
            cfg.kv_type, cfg.block_size, head_dim
        ));
    }
    Ok(())
}

/// Binds `dev`'s context to this thread and opens the one stream every launch goes on.
fn open_stream(dev: &CudaDevice) -> Result<Arc<CudaStream>, String> {
    dev.ctx
        .bind_to_thread()
        .map_err(|e| format!("cannot use the CUDA context: {e:?}"))?;
    dev.ctx
        .new_stream()
        .map_err(|e| format!("cannot create a CUDA stream: {e:?}"))
}
