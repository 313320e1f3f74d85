//! What one forward pass computes: spans of tokens from several sequences, with the block
//! tables that say where each sequence's KV lives.

use anyhow::{bail, Result};

#[derive(Clone, Debug, Default)]
pub struct BatchMeta {
    /// Token ids, all sequences' spans one after another.
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<usize>,
    /// For each token, the index of its sequence in `block_tables`.
    pub seq_of: Vec<usize>,
    /// Per sequence, the blocks holding positions 0.. in order.
    pub block_tables: Vec<Vec<u32>>,
    /// Indices (into `tokens`) whose logits the caller wants, in this order.
    pub logits_for: Vec<usize>,
}

impl BatchMeta {
    /// Adds a span of `tokens` at positions `start..` for a sequence with `block_table`.
    /// `want_logits`: `Last` for sampling, `All` for scoring every position.
    pub fn push_span(&mut self, tokens: &[u32], start: usize, block_table: Vec<u32>, want: Logits) {
        let seq = self.block_tables.len();
        self.block_tables.push(block_table);
        let first = self.tokens.len();
        for (i, &t) in tokens.iter().enumerate() {
            self.tokens.push(t);
            self.positions.push(start + i);
            self.seq_of.push(seq);
        }
        match want {
            Logits::None => {}
            Logits::Last => {
                if !tokens.is_empty() {
                    self.logits_for.push(first + tokens.len() - 1)
                }
            }
            Logits::All => self.logits_for.extend(first..first + tokens.len()),
        }
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Number of tokens each sequence contributes to this batch.
    pub fn span_lengths(&self) -> Vec<usize> {
        let mut lens = vec![0; self.block_tables.len()];
        for &s in &self.seq_of {
            lens[s] += 1;
        }
        lens
    }

    /// KV slot (block · block_tokens + offset) of token `i`.
    pub fn slot(&self, i: usize, block_tokens: usize) -> usize {
        let pos = self.positions[i];
        self.block_tables[self.seq_of[i]][pos / block_tokens] as usize * block_tokens
            + pos % block_tokens
    }

    /// Checks that every token has a block for its position and ids are in range, so the
    /// forward pass itself cannot index out of bounds.
    pub fn validate(
        &self,
        block_tokens: usize,
        pool_blocks: usize,
        vocab: usize,
        max_pos: usize,
    ) -> Result<()> {
        for i in 0..self.tokens.len() {
            if self.tokens[i] as usize >= vocab {
                bail!(
                    "token id {} is outside the vocabulary ({vocab})",
                    self.tokens[i]
                );
            }
            let pos = self.positions[i];
            if pos >= max_pos {
                bail!("position {pos} is beyond the context length {max_pos}");
            }
            let table = &self.block_tables[self.seq_of[i]];
            if pos / block_tokens >= table.len() {
                bail!(
                    "position {pos} has no KV block (table has {} blocks)",
                    table.len()
                );
            }
        }
        for table in &self.block_tables {
            if let Some(b) = table.iter().find(|&&b| b as usize >= pool_blocks) {
                bail!("block id {b} is outside the pool ({pool_blocks} blocks)");
            }
        }
        if let Some(&i) = self.logits_for.iter().find(|&&i| i >= self.tokens.len()) {
            bail!(
                "logits requested for token {i} of a batch of {}",
                self.tokens.len()
            );
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    None,
    Last,
    All,
}
