//! A single sequence over the paged pool: the CLI's `run` and `perplexity` path, and the
//! simplest user of `Model::forward` (the scheduler drives many sequences the same way).

use crate::kv::{BlockPool, KvPages, KvType};
use crate::model::{BatchMeta, Logits, Model};
use anyhow::{bail, Result};

pub struct Session<'m> {
    model: &'m Model,
    pages: KvPages,
    pool: BlockPool,
    block_table: Vec<u32>,
    len: usize,
}

impl<'m> Session<'m> {
    /// Preallocates a pool able to hold `max_tokens` tokens of one sequence.
    pub fn new(
        model: &'m Model,
        max_tokens: usize,
        kv_type: KvType,
        block_tokens: usize,
    ) -> Result<Self> {
        let cfg = &model.config;
        let geom = cfg.page_geometry(kv_type, block_tokens);
        let blocks = max_tokens.div_ceil(block_tokens).max(1);
        Ok(Session {
            model,
            pages: KvPages::new(geom, blocks)?,
            pool: BlockPool::new(blocks, block_tokens),
            block_table: Vec::new(),
            len: 0,
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
        self.pool.total() * self.pool.block_tokens()
    }

    /// Appends `tokens` (run in chunks of at most `chunk`), returning the logits asked for:
    /// the last token's row, or every token's row.
    pub fn extend(&mut self, tokens: &[u32], want: Logits, chunk: usize) -> Result<Vec<f32>> {
        if self.len + tokens.len() > self.capacity() {
            bail!(
                "sequence of {} tokens exceeds the KV capacity of {}",
                self.len + tokens.len(),
                self.capacity()
            );
        }
        let mut out = Vec::new();
        for (ci, part) in tokens.chunks(chunk.max(1)).enumerate() {
            let last_chunk = (ci + 1) * chunk.max(1) >= tokens.len();
            while self.block_table.len() * self.pool.block_tokens() < self.len + part.len() {
                let b = self.pool.allocate().expect("capacity checked above");
                self.block_table.push(b);
            }
            let mut batch = BatchMeta::default();
            let w = match want {
                Logits::All => Logits::All,
                Logits::Last if last_chunk => Logits::Last,
                _ => Logits::None,
            };
            batch.push_span(part, self.len, self.block_table.clone(), w);
            let logits = self.model.forward(&batch, &mut self.pages)?;
            out.extend_from_slice(&logits);
            self.len += part.len();
        }
        Ok(out)
    }

    /// Frees every block: the session can start a new sequence.
    pub fn reset(&mut self) {
        for b in self.block_table.drain(..) {
            self.pool.release(b);
        }
        self.len = 0;
    }
}
