//! What runs the engine's steps: the CPU forward pass over the KV pages in RAM, or (feature
//! `cuda`) the CUDA executor with its own pool in device memory. The smallest seam that lets
//! the engine stay backend-agnostic: the scheduler's block ids and tables mean the same in
//! both, and a step is "copy these blocks, run this batch, give me logits (or tokens)".

use crate::backend::cpu::step::CpuBuffers;
use crate::backend::select::Backend;
use crate::engine::sampler::{Sampler, SamplingParams};
use crate::kv::{snapshot_count, KvPages, PageGeometry, StateSlots};
use crate::model::{BatchMeta, Model};
use anyhow::Result;
use std::ops::Range;
use std::sync::Arc;

pub enum Executor {
    Cpu(Box<CpuExec>),
    #[cfg(feature = "cuda")]
    Cuda(Box<crate::backend::cuda::CudaExecutor>),
}

/// The CPU's pool in RAM and the step buffers it reuses (no step allocates once they grew).
pub struct CpuExec {
    pages: KvPages,
    bufs: CpuBuffers,
}

/// What [`Executor::start`] needs beyond the model.
#[derive(Clone, Copy, Debug)]
pub struct ExecutorPlan {
    pub backend: Backend,
    pub geom: PageGeometry,
    /// Blocks of the CPU pool (the CUDA pool sizes itself from free device memory).
    pub cpu_blocks: usize,
    pub max_tokens: usize,
    pub max_seqs: usize,
    pub context: usize,
    /// Device memory the CUDA pool leaves free.
    pub gpu_reserve_bytes: usize,
    /// A hybrid's prefix cache: bytes of recurrent-state snapshots.
    pub state_snapshot_bytes: usize,
}

impl ExecutorPlan {
    /// A hybrid's recurrent-state slots (of `floats` values each), on either backend: one
    /// per sequence that may run at once, then the prefix cache's snapshots.
    pub fn state_slots(&self, floats: usize) -> usize {
        self.max_seqs.max(1) + snapshot_count(self.state_snapshot_bytes, floats * 4)
    }
}

impl Executor {
    /// The executor for `plan.backend`. A CUDA start-up that fails (no usable device, a weight
    /// type without kernels, too little memory...) falls back to the CPU with one log line.
    pub fn start(model: &Arc<Model>, plan: &ExecutorPlan) -> Result<Executor> {
        if plan.backend == Backend::Cuda {
            if let Some(x) = start_cuda(model, plan) {
                return Ok(x);
            }
        }
        // Packed now, not on the first request.
        model.cpu_packed();
        let mut pages = KvPages::new(plan.geom, plan.cpu_blocks)?;
        let floats = model.config.state_floats();
        if floats > 0 {
            pages.states = StateSlots::new(plan.state_slots(floats), floats)?;
        }
        Ok(Executor::Cpu(Box::new(CpuExec {
            pages,
            bufs: CpuBuffers::default(),
        })))
    }

    pub fn is_cuda(&self) -> bool {
        !matches!(self, Executor::Cpu(_))
    }

    /// The backend that runs, after any fallback (the status page shows it).
    pub fn backend_name(&self) -> &'static str {
        if self.is_cuda() {
            "cuda"
        } else {
            "cpu"
        }
    }

    /// Recurrent-state slots of the pool (a hybrid model's; 0 otherwise).
    pub fn state_slots(&self) -> usize {
        match self {
            Executor::Cpu(c) => c.pages.states.count(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => x.state_slots(),
        }
    }

    /// Blocks the scheduler may hand out.
    pub fn blocks(&self) -> usize {
        match self {
            Executor::Cpu(c) => c.pages.blocks(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => x.blocks(),
        }
    }

    /// Bytes of the KV pool (RAM or device memory).
    pub fn kv_bytes(&self) -> usize {
        match self {
            Executor::Cpu(c) => c.pages.total_bytes(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => x.kv_bytes(),
        }
    }

    /// Copy-on-write of a shared, partly filled block.
    pub fn copy_block(&mut self, src: usize, dst: usize) -> Result<()> {
        match self {
            Executor::Cpu(c) => {
                c.pages.copy_block(src, dst);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => x.copy_block(src, dst).map_err(anyhow::Error::msg),
        }
    }

    /// Copies a sequence's recurrent state into another's slot (a fork).
    pub fn copy_state(&mut self, src: usize, dst: usize) -> Result<()> {
        match self {
            Executor::Cpu(c) => {
                c.pages.states.copy(src, dst);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => x.copy_state(src, dst).map_err(anyhow::Error::msg),
        }
    }

    /// Drops the CPU's step buffers (they grow to the largest step: about 13 MiB for a
    /// 512-token prefill of the reference model) so that an idle engine holds only the weights
    /// and the KV pool. The next step grows them again, at a few page faults' cost.
    pub fn release_step_buffers(&mut self) {
        match self {
            Executor::Cpu(c) => c.bufs = CpuBuffers::default(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) => {}
        }
    }

    /// Returns a logits vector from [`Executor::forward`] for reuse.
    pub fn recycle(&mut self, logits: Vec<f32>) {
        match self {
            Executor::Cpu(c) => c.bufs.recycle_logits(logits),
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) => {}
        }
    }

    /// The hidden rows (`BatchMeta::hidden_for`) of the last forward pass, rows × n_embd.
    pub fn take_hidden(&mut self) -> Vec<f32> {
        match self {
            Executor::Cpu(c) => c.bufs.take_hidden(),
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => x.take_hidden(),
        }
    }

    /// `batch.logits_for.len()` rows of logits. The vector is the executor's own buffer: hand
    /// it back with [`Executor::recycle`] so the next step need not allocate one.
    pub fn forward(&mut self, model: &Model, batch: &BatchMeta) -> Result<Vec<f32>> {
        match self {
            Executor::Cpu(c) => {
                model.forward(batch, &mut c.pages, &mut c.bufs)?;
                Ok(c.bufs.take_logits())
            }
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => {
                match x.forward(model, batch, crate::backend::cuda::Want::Logits) {
                    Ok(crate::backend::batch::StepOutput::Logits(l)) => Ok(l),
                    Ok(_) => anyhow::bail!("the CUDA executor returned tokens for logits"),
                    Err(e) => anyhow::bail!("CUDA forward pass failed: {e}"),
                }
            }
        }
    }

    /// One token per logits row, drawn with `rows[i]` = (parameters without penalties, the
    /// row's sampler's `rng_state`): the draw that sampler would make next. On the GPU only
    /// the token ids come back (kernels/sample.cu `sample_rows`).
    pub fn forward_sample(
        &mut self,
        model: &Model,
        batch: &BatchMeta,
        rows: &[(SamplingParams, u64)],
    ) -> Result<Vec<u32>> {
        match self {
            // A fresh sampler seeded with the state draws what the row's own would next.
            Executor::Cpu(c) => cpu_tokens(model, batch, c, rows, |l, (params, state)| {
                let params = SamplingParams {
                    seed: Some(*state),
                    ..params.clone()
                };
                Sampler::new(params).sample(l, &[])
            }),
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => {
                use crate::backend::cuda::launch::SampleRow;
                let rows: Vec<SampleRow> = rows
                    .iter()
                    .map(|(p, state)| SampleRow::new(p, *state, 0))
                    .collect::<Option<_>>()
                    .ok_or_else(|| anyhow::anyhow!("penalties cannot be applied on the device"))?;
                cuda_tokens(x, model, batch, crate::backend::cuda::Want::Sample(&rows))
            }
        }
    }

    /// `batch` through `layers` only, from and into `residual` ([`Model::forward_layers`]):
    /// the CPU's; the CUDA executor runs whole passes.
    pub fn forward_layers(
        &mut self,
        model: &Model,
        batch: &BatchMeta,
        layers: Range<usize>,
        residual: &mut Vec<f32>,
    ) -> Result<()> {
        match self {
            Executor::Cpu(c) => {
                model.forward_layers(batch, &mut c.pages, &mut c.bufs, layers, residual)
            }
            #[cfg(feature = "cuda")]
            Executor::Cuda(_) => anyhow::bail!("the CUDA executor runs whole passes only"),
        }
    }

    /// The argmax of every logits row, computed where the logits are (on the GPU only the
    /// token ids come back).
    pub fn forward_greedy(&mut self, model: &Model, batch: &BatchMeta) -> Result<Vec<u32>> {
        match self {
            Executor::Cpu(c) => cpu_tokens(model, batch, c, std::iter::repeat(()), |l, ()| {
                super::sampler::argmax(l)
            }),
            #[cfg(feature = "cuda")]
            Executor::Cuda(x) => cuda_tokens(x, model, batch, crate::backend::cuda::Want::Greedy),
        }
    }
}

/// What the engine's steps ask of whatever runs them: [`ModelExecutor`] in service; the
/// engine's unit tests run a fake (so they need no model file). The methods are
/// [`Executor`]'s, with the model bound in.
pub trait StepExecutor: Send {
    fn is_cuda(&self) -> bool;
    fn backend_name(&self) -> &'static str;
    /// Blocks of its KV pool.
    fn blocks(&self) -> usize;
    fn kv_bytes(&self) -> usize;
    fn copy_block(&mut self, src: usize, dst: usize) -> Result<()>;
    /// Recurrent-state slots of its pool (a hybrid model's; 0 otherwise).
    fn state_slots(&self) -> usize;
    fn copy_state(&mut self, src: usize, dst: usize) -> Result<()>;
    fn release_step_buffers(&mut self);
    fn recycle(&mut self, logits: Vec<f32>);
    fn forward(&mut self, batch: &BatchMeta) -> Result<Vec<f32>>;
    fn forward_sample(
        &mut self,
        batch: &BatchMeta,
        rows: &[(SamplingParams, u64)],
    ) -> Result<Vec<u32>>;
    fn forward_greedy(&mut self, batch: &BatchMeta) -> Result<Vec<u32>>;
    /// The last forward pass's hidden rows (`BatchMeta::hidden_for`), rows × n_embd.
    fn take_hidden(&mut self) -> Vec<f32>;
    /// The model's layers where a pass may stop between them and go on in a later step
    /// ([`StepExecutor::forward_layers`]); 0 where passes run whole.
    fn pass_layers(&self) -> usize {
        0
    }
    /// Runs `batch` through `layers` only: from `residual` (the rows the layers before left;
    /// from the embeddings where `layers` starts at 0), leaving the rows after them there.
    fn forward_layers(
        &mut self,
        _batch: &BatchMeta,
        _layers: Range<usize>,
        _residual: &mut Vec<f32>,
    ) -> Result<()> {
        anyhow::bail!("this executor runs whole passes only")
    }
    /// A pooled embedding through the model's projections (`Model::project_pooled`), on the
    /// host whatever the backend.
    fn project_pooled(&self, pooled: Vec<f32>) -> Vec<f32> {
        pooled
    }
    /// Block `block`'s pages as bytes (`KvPages::block_image`), for the prefix cache on disk;
    /// `None` where the pool is not kept there (the CUDA pool, a hybrid's states).
    fn block_image(&self, _block: usize) -> Option<Vec<u8>> {
        None
    }
    /// Puts back what [`StepExecutor::block_image`] gave; false where it cannot.
    fn set_block_image(&mut self, _block: usize, _image: &[u8]) -> bool {
        false
    }
}

/// An [`Executor`] with the model it runs.
pub struct ModelExecutor {
    pub model: Arc<Model>,
    pub exec: Executor,
}

impl StepExecutor for ModelExecutor {
    fn is_cuda(&self) -> bool {
        self.exec.is_cuda()
    }

    fn project_pooled(&self, pooled: Vec<f32>) -> Vec<f32> {
        self.model.project_pooled(pooled)
    }

    fn block_image(&self, block: usize) -> Option<Vec<u8>> {
        match &self.exec {
            Executor::Cpu(c) if c.pages.states.count() == 0 && block < c.pages.blocks() => {
                Some(c.pages.block_image(block))
            }
            _ => None,
        }
    }

    fn set_block_image(&mut self, block: usize, image: &[u8]) -> bool {
        match &mut self.exec {
            Executor::Cpu(c) if c.pages.states.count() == 0 && block < c.pages.blocks() => {
                c.pages.set_block_image(block, image);
                true
            }
            _ => false,
        }
    }

    fn backend_name(&self) -> &'static str {
        self.exec.backend_name()
    }

    fn blocks(&self) -> usize {
        self.exec.blocks()
    }

    fn kv_bytes(&self) -> usize {
        self.exec.kv_bytes()
    }

    fn copy_block(&mut self, src: usize, dst: usize) -> Result<()> {
        self.exec.copy_block(src, dst)
    }

    fn state_slots(&self) -> usize {
        self.exec.state_slots()
    }

    fn copy_state(&mut self, src: usize, dst: usize) -> Result<()> {
        self.exec.copy_state(src, dst)
    }

    fn release_step_buffers(&mut self) {
        self.exec.release_step_buffers()
    }

    fn recycle(&mut self, logits: Vec<f32>) {
        self.exec.recycle(logits)
    }

    fn forward(&mut self, batch: &BatchMeta) -> Result<Vec<f32>> {
        self.exec.forward(&self.model, batch)
    }

    fn forward_sample(
        &mut self,
        batch: &BatchMeta,
        rows: &[(SamplingParams, u64)],
    ) -> Result<Vec<u32>> {
        self.exec.forward_sample(&self.model, batch, rows)
    }

    fn forward_greedy(&mut self, batch: &BatchMeta) -> Result<Vec<u32>> {
        self.exec.forward_greedy(&self.model, batch)
    }

    fn take_hidden(&mut self) -> Vec<f32> {
        self.exec.take_hidden()
    }

    /// A model with recurrent state runs whole passes: its state would move on a layer at a
    /// time.
    fn pass_layers(&self) -> usize {
        match self.exec.is_cuda() || self.model.config.state_floats() > 0 {
            true => 0,
            false => self.model.config.n_layers,
        }
    }

    fn forward_layers(
        &mut self,
        batch: &BatchMeta,
        layers: Range<usize>,
        residual: &mut Vec<f32>,
    ) -> Result<()> {
        self.exec
            .forward_layers(&self.model, batch, layers, residual)
    }
}

/// The CPU forward pass, then `pick(logits row, its item of per_row)` for each logits row
/// (as many as both have).
fn cpu_tokens<T>(
    model: &Model,
    batch: &BatchMeta,
    c: &mut CpuExec,
    per_row: impl IntoIterator<Item = T>,
    mut pick: impl FnMut(&[f32], T) -> u32,
) -> Result<Vec<u32>> {
    let vocab = model.config.vocab_size;
    model.forward(batch, &mut c.pages, &mut c.bufs)?;
    Ok(c.bufs
        .logits()
        .chunks_exact(vocab)
        .zip(per_row)
        .map(|(l, item)| pick(l, item))
        .collect())
}

/// A CUDA step that returns token ids (`want` is Greedy or Sample).
#[cfg(feature = "cuda")]
fn cuda_tokens(
    x: &mut crate::backend::cuda::CudaExecutor,
    model: &Model,
    batch: &BatchMeta,
    want: crate::backend::cuda::Want<'_>,
) -> Result<Vec<u32>> {
    match x.forward(model, batch, want) {
        Ok(crate::backend::batch::StepOutput::Tokens(t)) => Ok(t),
        Ok(_) => anyhow::bail!("the CUDA executor returned logits for tokens"),
        Err(e) => anyhow::bail!("CUDA forward pass failed: {e}"),
    }
}

/// The CUDA executor, or `None` (and one log line) when it cannot start.
#[cfg(feature = "cuda")]
fn start_cuda(model: &Arc<Model>, plan: &ExecutorPlan) -> Option<Executor> {
    use crate::backend::cuda::{CudaExecutor, ExecutorConfig, KvBudget};
    let cfg = ExecutorConfig {
        kv_type: plan.geom.kv_type,
        block_size: plan.geom.block_size,
        max_tokens: plan.max_tokens,
        max_seqs: plan.max_seqs,
        context: plan.context,
        kv: KvBudget::AllBut(plan.gpu_reserve_bytes),
        // EDGELM_CUDA_GRAPHS=0: every step launches its kernels one by one (for comparing).
        graphs: std::env::var_os("EDGELM_CUDA_GRAPHS").is_none_or(|v| v != "0"),
        state_slots: plan.state_slots(model.config.state_floats()),
    };
    match CudaExecutor::new(0, model.as_ref(), cfg) {
        Ok(x) => Some(Executor::Cuda(Box::new(x))),
        Err(e) => {
            log::warn!("CUDA start-up failed ({e}): the engine runs on the CPU");
            None
        }
    }
}

/// Without the `cuda` feature `select::resolve` never answers CUDA.
#[cfg(not(feature = "cuda"))]
fn start_cuda(_model: &Arc<Model>, _plan: &ExecutorPlan) -> Option<Executor> {
    None
}
