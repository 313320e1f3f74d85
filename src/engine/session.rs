//! A single sequence over the paged pool, on any executor: the CLI's `perplexity` path, the
//! tests' reference path, and the simplest user of the forward pass (the scheduler drives many
//! sequences the same way).

use super::executor::{Executor, ExecutorPlan};
use super::request::{rope_positions, row_inputs, uncut_chunk, PromptImage};
use crate::backend::adapter::{Adapter, ADAPTERS_NEED_CPU};
use crate::backend::select::Backend;
use crate::kv::{BlockPool, KvType, SeqBlocks};
use crate::model::{BatchMeta, Logits, Model};
use anyhow::{bail, Result};
use std::ops::Range;
use std::sync::Arc;

/// How a session is set up.
#[derive(Clone, Copy, Debug)]
pub struct SessionConfig {
    pub kv_type: KvType,
    pub block_size: usize,
    /// The longest sequence it must hold.
    pub max_tokens: usize,
    /// The largest chunk `extend` runs at once.
    pub chunk: usize,
    pub backend: Backend,
    /// CUDA: device memory the pool leaves free.
    pub gpu_reserve_bytes: usize,
}

impl SessionConfig {
    /// A CPU session for sequences of `max_tokens`, run in chunks of up to `chunk`.
    pub fn cpu(kv_type: KvType, block_size: usize, max_tokens: usize, chunk: usize) -> Self {
        SessionConfig {
            kv_type,
            block_size,
            max_tokens,
            chunk,
            backend: Backend::Cpu,
            gpu_reserve_bytes: 512 << 20,
        }
    }
}

pub struct Session {
    model: Arc<Model>,
    exec: Executor,
    pool: BlockPool,
    blocks: SeqBlocks,
    chunk: usize,
    len: usize,
    /// The longest sequence the pool holds.
    capacity: usize,
    /// The images the sequence holds so far (the text after an M-RoPE image turns by
    /// positions they moved).
    images: Vec<PromptImage>,
    /// The LoRA adapter its rows take (`None`: the base model).
    adapter: Option<Arc<Adapter>>,
}

impl Session {
    pub fn new(model: Arc<Model>, cfg: SessionConfig) -> Result<Session> {
        let chunk = cfg.chunk.max(1);
        let layout = &model.layout;
        let geom = model.config.page_geometry(cfg.kv_type, cfg.block_size);
        let want = layout
            .peak_blocks(cfg.max_tokens, chunk, cfg.block_size)
            .max(1);
        let exec = Executor::start(
            &model,
            &ExecutorPlan {
                backend: cfg.backend,
                geom,
                cpu_blocks: want,
                max_tokens: chunk,
                max_seqs: 1,
                context: cfg.max_tokens,
                gpu_reserve_bytes: cfg.gpu_reserve_bytes,
                // One sequence, no prefix cache.
                state_snapshot_bytes: 0,
            },
        )?;
        // The CUDA pool sizes itself from free device memory.
        let blocks = exec.blocks();
        Ok(Session {
            pool: BlockPool::new(blocks, cfg.block_size),
            blocks: SeqBlocks::new(layout.num_groups()),
            capacity: layout.max_tokens(blocks, chunk, cfg.block_size),
            model,
            exec,
            chunk,
            len: 0,
            images: Vec::new(),
            adapter: None,
        })
    }

    /// Tokens held so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Runs the sequence with `adapter`'s updates from here on (set it before the first
    /// tokens: the K/V already in the pages stay as they were computed).
    pub fn set_adapter(&mut self, adapter: Option<Arc<Adapter>>) -> Result<()> {
        if adapter.is_some() && self.is_cuda() {
            bail!("{ADAPTERS_NEED_CPU}");
        }
        self.adapter = adapter;
        Ok(())
    }

    pub fn is_cuda(&self) -> bool {
        self.exec.is_cuda()
    }

    /// Appends `tokens` (run in chunks of the session's chunk size), returning the logits
    /// asked for: the last token's row, or every token's row.
    pub fn extend(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        self.append(tokens, &[], want, false)
    }

    /// [`Session::extend`] for tokens some runs of which are given as rows (`images`, placed
    /// at positions counted from the session's start): no chunk cuts an image whose positions
    /// see each other.
    pub fn extend_with_images(
        &mut self,
        tokens: &[u32],
        images: &[PromptImage],
        want: Logits,
    ) -> Result<Vec<f32>> {
        self.append(tokens, images, want, false)
    }

    /// [`Session::extend`] with tokens the model generated: they take the arithmetic the
    /// engine gives generated tokens (`BatchMeta::generated`), not a prompt's.
    pub fn extend_generated(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>> {
        self.append(tokens, &[], want, true)
    }

    /// `tokens` in chunks of at most the session's chunk size, none cutting a bidirectional
    /// image: each chunk's range of `tokens`.
    fn chunks(&self, tokens: usize, images: &[PromptImage]) -> Result<Vec<Range<usize>>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < tokens {
            let len = (tokens - at).min(self.chunk);
            let len = match uncut_chunk(images, self.len + at, len) {
                0 => bail!(
                    "an image is longer than the session's chunk of {}",
                    self.chunk
                ),
                n => n,
            };
            out.push(at..at + len);
            at += len;
        }
        Ok(out)
    }

    fn append(
        &mut self,
        tokens: &[u32],
        images: &[PromptImage],
        want: Logits,
        generated: bool,
    ) -> Result<Vec<f32>> {
        if self.len + tokens.len() > self.capacity() {
            bail!(
                "sequence of {} tokens exceeds the KV capacity of {}",
                self.len + tokens.len(),
                self.capacity()
            );
        }
        self.images.extend_from_slice(images);
        let layout = &self.model.layout;
        let mut out = Vec::new();
        let chunks = self.chunks(tokens.len(), &self.images)?;
        let parts = chunks.len();
        for (ci, range) in chunks.into_iter().enumerate() {
            let part = &tokens[range];
            let need = self
                .blocks
                .blocks_needed(&self.pool, layout, self.len, part.len());
            if need > self.pool.free_count() {
                bail!("the KV pool is out of blocks");
            }
            let mut copies = Vec::new();
            self.blocks
                .grow(&mut self.pool, layout, self.len, part.len(), &mut copies);
            for (src, dst) in copies {
                self.exec.copy_block(src as usize, dst as usize)?;
            }
            let w = match want {
                Logits::All => Logits::All,
                Logits::Last if ci + 1 == parts => Logits::Last,
                _ => Logits::None,
            };
            let mut batch = BatchMeta::default();
            batch.push_span(part, self.len, self.blocks.tables().to_vec(), w);
            let range = self.len..self.len + part.len();
            batch.set_rope_positions(0, &rope_positions(&self.images, range.clone()));
            batch.inputs = row_inputs(&self.images, range, 0);
            batch.set_adapter(self.adapter.clone());
            // A session's one sequence has the pool's one state slot (a hybrid's; a model that
            // only attends has none, and the device refuses a slot outside its pool).
            if self.exec.state_slots() > 0 {
                batch.set_state_slot(0);
            }
            if generated {
                batch.mark_generated_from(self.len);
            }
            let logits = self.exec.forward(&self.model, &batch)?;
            out.extend_from_slice(&logits);
            self.exec.recycle(logits);
            self.len += part.len();
        }
        Ok(out)
    }

    /// Frees every block: the session can start a new sequence.
    pub fn reset(&mut self) {
        self.blocks.release_all(&mut self.pool);
        self.len = 0;
        self.images.clear();
    }
}
