//! What one forward pass computes: spans of tokens from several sequences, with the block
//! tables (one per KV group) that say where each sequence's KV lives.

use super::adapter::Adapter;
use crate::kv::{KvLayout, NO_BLOCK};
use anyhow::{bail, Result};
use std::sync::Arc;

/// What a forward pass hands back: the logits rows the batch asked for, or (where the backend
/// reduced them itself: greedy argmax, device sampling) one token id per row.
#[derive(Debug, PartialEq)]
pub enum StepOutput {
    Logits(Vec<f32>),
    Tokens(Vec<u32>),
}

#[derive(Clone, Debug, Default)]
pub struct BatchMeta {
    /// Token ids, all sequences' spans one after another.
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<usize>,
    /// For each token, the index of its sequence in `block_tables`.
    pub seq_of: Vec<usize>,
    /// Per sequence, per KV group, the blocks holding positions 0.. in order ([`NO_BLOCK`]
    /// where a windowed group holds nothing any more).
    pub block_tables: Vec<Vec<Vec<u32>>>,
    /// Indices (into `tokens`) whose logits the caller wants, in this order.
    pub logits_for: Vec<usize>,
    /// Indices (into `tokens`) whose final-normed hidden state (the output norm's, before the
    /// LM head: what an embedding model pools) the caller wants, in this order.
    pub hidden_for: Vec<usize>,
    /// Per token, whether the model generated it (a decode step's token, its drafts, or a
    /// generated token recomputed after preemption) rather than read it from a prompt. Prompt
    /// tokens' attention follows the peer's arithmetic for short spans (`quant::prompt_order`
    /// says which matmul order they take); generated tokens take arithmetic
    /// (`quant::packed_order`, the tiled attention path) that gives a token the same bits
    /// whatever the batch, so recomputing one changes nothing.
    pub generated: Vec<bool>,
    /// Per sequence, its recurrent-state slot in the pool (`kv::StateSlots`), for a hybrid
    /// model; `None` for a model that only attends.
    pub state_slots: Vec<Option<u32>>,
    /// A hybrid's prefix-cache snapshots to write in this pass (`kv::StateSnapshots`).
    pub state_saves: Vec<StateSaveAt>,
    /// Tokens whose input is a row given here instead of their embedding (an image's
    /// positions), in token order.
    pub inputs: Vec<RowInput>,
    /// Per token, the three-part position (temporal, row, column) its RoPE turns by, where
    /// a sequence's images take M-RoPE positions (Qwen3-VL); empty where every token turns
    /// by its position. `positions` still place each token in its pages.
    pub rope_positions: Vec<[usize; 3]>,
    /// Per sequence, the LoRA adapter whose updates its rows take (`None`: the base model).
    pub adapters: Vec<Option<Arc<Adapter>>>,
}

/// Rows that stand for a run of prompt positions in place of their tokens' embeddings: an
/// image's, as its projector made them (`vision::Projector::encode`).
#[derive(Debug, PartialEq)]
pub struct Embedded {
    /// `len()` rows of `width` values, in position order.
    pub rows: Vec<f32>,
    pub width: usize,
    /// Identifies what the rows were made from (a hash of the image's pixels and the
    /// projector): the prefix cache keys their positions by it.
    pub key: u64,
    /// Each position attends to all of the rows (Gemma 3's images), not only to those
    /// before it.
    pub bidirectional: bool,
    /// The rows' grid (columns, rows), where they take M-RoPE positions (Qwen3-VL's
    /// images): row `i` turns by the image's start, its grid row and its column, and the
    /// image advances the positions after it by its longer side only.
    pub grid: Option<(usize, usize)>,
}

impl Embedded {
    pub fn len(&self) -> usize {
        self.rows.len() / self.width.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.rows[i * self.width..(i + 1) * self.width]
    }
}

/// Token `token` of the batch takes row `row` of `rows` as its input; it attends through
/// position `through` (its own where causal; the image's last where bidirectional).
#[derive(Clone, Debug)]
pub struct RowInput {
    pub token: usize,
    pub rows: std::sync::Arc<Embedded>,
    pub row: usize,
    pub through: usize,
}

/// Sequence `seq`'s (an index into `block_tables`) recurrent state after the first `after`
/// tokens of its span goes into state slot `slot` too: every op that keeps state writes its
/// part of the slot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StateSaveAt {
    pub seq: usize,
    pub after: usize,
    pub slot: u32,
}

impl BatchMeta {
    /// Adds a span of `tokens` at positions `start..` for a sequence with `tables` (one per
    /// KV group). `want`: `Last` for sampling, `All` for scoring every position.
    pub fn push_span(&mut self, tokens: &[u32], start: usize, tables: Vec<Vec<u32>>, want: Logits) {
        let seq = self.block_tables.len();
        self.block_tables.push(tables);
        self.state_slots.push(None);
        self.adapters.push(None);
        let first = self.tokens.len();
        for (i, &t) in tokens.iter().enumerate() {
            self.tokens.push(t);
            self.positions.push(start + i);
            if !self.rope_positions.is_empty() {
                self.rope_positions.push([start + i; 3]);
            }
            self.seq_of.push(seq);
            self.generated.push(false);
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

    /// Gives the tokens from `first` on the three-part RoPE positions `parts` (one each); the
    /// tokens before them, and any after, turn by their positions.
    pub fn set_rope_positions(&mut self, first: usize, parts: &[[usize; 3]]) {
        if parts.is_empty() {
            return;
        }
        let plain = self.positions[self.rope_positions.len()..].iter();
        self.rope_positions.extend(plain.map(|&p| [p; 3]));
        self.rope_positions[first..first + parts.len()].copy_from_slice(parts);
    }

    /// Asks for the hidden states of the last span's tokens `rows` (offsets into the span).
    pub fn want_hidden(&mut self, rows: std::ops::Range<usize>) {
        let Some(&seq) = self.seq_of.last() else {
            return;
        };
        let first = self.seq_of.iter().position(|&s| s == seq).unwrap_or(0);
        self.hidden_for.extend(rows.map(|r| first + r));
    }

    /// Gives the last span's sequence its recurrent-state slot.
    pub fn set_state_slot(&mut self, slot: u32) {
        if let Some(s) = self.state_slots.last_mut() {
            *s = Some(slot);
        }
    }

    /// Gives the last span's sequence the adapter its rows take.
    pub fn set_adapter(&mut self, adapter: Option<Arc<Adapter>>) {
        if let Some(a) = self.adapters.last_mut() {
            *a = adapter;
        }
    }

    /// The last span's sequence's state after its first `after` tokens goes into `slot` too.
    pub fn save_state_after(&mut self, after: usize, slot: u32) {
        if let Some(seq) = self.block_tables.len().checked_sub(1) {
            self.state_saves.push(StateSaveAt { seq, after, slot });
        }
    }

    /// The spans of this batch: for each sequence, its tokens' index range (a sequence's
    /// tokens are one run, pushed by one `push_span`).
    pub fn spans(&self) -> Vec<std::ops::Range<usize>> {
        let mut spans: Vec<std::ops::Range<usize>> = Vec::new();
        for (i, &s) in self.seq_of.iter().enumerate() {
            match spans.get_mut(s) {
                Some(r) => r.end = i + 1,
                None => spans.push(i..i + 1),
            }
        }
        spans
    }

    /// Marks the last span's tokens at positions `from` and after as generated (see
    /// [`BatchMeta::generated`]): `from` is the sequence's prompt length.
    pub fn mark_generated_from(&mut self, from: usize) {
        let Some(&seq) = self.seq_of.last() else {
            return;
        };
        let tokens = self
            .generated
            .iter_mut()
            .zip(&self.seq_of)
            .zip(&self.positions);
        for ((g, &s), &p) in tokens.rev() {
            if s != seq {
                break;
            }
            *g = p >= from;
        }
    }

    /// Whether token `i` is one the model generated ([`BatchMeta::generated`]).
    pub fn is_generated(&self, i: usize) -> bool {
        self.generated.get(i).copied().unwrap_or(false)
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// A batch for a model with one KV group (no windows): `table` is the group's.
    pub fn push_span_single(
        &mut self,
        tokens: &[u32],
        start: usize,
        table: Vec<u32>,
        want: Logits,
    ) {
        self.push_span(tokens, start, vec![table], want)
    }

    /// Number of tokens each sequence contributes to this batch.
    pub fn span_lengths(&self) -> Vec<usize> {
        let mut lens = vec![0; self.block_tables.len()];
        for &s in &self.seq_of {
            lens[s] += 1;
        }
        lens
    }

    /// KV slot (block · block_size + offset) of token `i` in KV group `group`.
    pub fn slot(&self, i: usize, group: usize, block_size: usize) -> usize {
        let pos = self.positions[i];
        self.block_tables[self.seq_of[i]][group][pos / block_size] as usize * block_size
            + pos % block_size
    }

    /// Checks that ids are in range and that every token has, in every KV group, a block for
    /// each position it reads (its own included), so the forward pass itself cannot index out
    /// of bounds.
    pub fn validate(
        &self,
        block_size: usize,
        pool_blocks: usize,
        vocab: usize,
        max_pos: usize,
        layout: &KvLayout,
    ) -> Result<()> {
        for i in 0..self.tokens.len() {
            if self.tokens[i] as usize >= vocab {
                bail!(
                    "token id {} is outside the vocabulary ({vocab})",
                    self.tokens[i]
                );
            }
            if self.positions[i] >= max_pos {
                bail!(
                    "position {} is beyond the context length {max_pos}",
                    self.positions[i]
                );
            }
        }
        let rope = self.rope_positions.iter().flatten();
        if !self.rope_positions.is_empty() && self.rope_positions.len() != self.tokens.len()
            || rope.clone().any(|&p| p >= max_pos)
        {
            bail!(
                "{} RoPE positions for {} tokens, or one beyond the context length {max_pos}",
                self.rope_positions.len(),
                self.tokens.len()
            );
        }
        // Each sequence's span of positions, in one pass over the tokens.
        let mut spans: Vec<Option<(usize, usize)>> = vec![None; self.block_tables.len()];
        for (&s, &p) in self.seq_of.iter().zip(&self.positions) {
            let span = spans[s].get_or_insert((p, p));
            *span = (span.0.min(p), span.1.max(p));
        }
        for (seq, tables) in self.block_tables.iter().enumerate() {
            if tables.len() != layout.num_groups() {
                bail!(
                    "sequence {seq} has {} block tables for {} KV groups",
                    tables.len(),
                    layout.num_groups()
                );
            }
            // Every block from the first one its first token reads to the last one it writes
            // must be there.
            let Some((lo, hi)) = spans[seq] else { continue };
            for (g, table) in tables.iter().enumerate() {
                let from = layout.first_needed_block(g, lo, block_size);
                let to = hi / block_size;
                if to >= table.len() {
                    bail!(
                        "position {hi} has no KV block (group {g}'s table has {} blocks)",
                        table.len()
                    );
                }
                if let Some(b) = table[from..=to]
                    .iter()
                    .find(|&&b| b == NO_BLOCK || b as usize >= pool_blocks)
                {
                    bail!("block id {b} of a position still read is outside the pool ({pool_blocks} blocks)");
                }
            }
        }
        if let Some(&i) = self.logits_for.iter().find(|&&i| i >= self.tokens.len()) {
            bail!(
                "logits requested for token {i} of a batch of {}",
                self.tokens.len()
            );
        }
        if let Some(&i) = self.hidden_for.iter().find(|&&i| i >= self.tokens.len()) {
            bail!(
                "a hidden state requested for token {i} of a batch of {}",
                self.tokens.len()
            );
        }
        self.validate_inputs()
    }

    /// Each given row is there, and a token sees past itself only to positions of its own
    /// span (whose K/V this step writes).
    fn validate_inputs(&self) -> Result<()> {
        let spans = self.spans();
        for input in &self.inputs {
            let i = input.token;
            if i >= self.tokens.len() || input.row >= input.rows.len() {
                bail!("input row {} for token {i} is not there", input.row);
            }
            let last = self.positions[spans[self.seq_of[i]].end - 1];
            if input.through < self.positions[i] || input.through > last {
                bail!(
                    "token {i} at position {} would attend through position {} (its span ends at {last})",
                    self.positions[i],
                    input.through
                );
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn three_part_positions_go_to_their_tokens_and_the_others_turn_by_their_positions() {
        let mut b = BatchMeta::default();
        b.push_span(&[1, 2], 5, vec![vec![0]], Logits::Last);
        b.push_span(&[3, 4], 9, vec![vec![1]], Logits::Last);
        b.set_rope_positions(3, &[[2, 3, 4]]);
        b.push_span(&[5], 20, vec![vec![2]], Logits::Last);
        assert_eq!(
            b.rope_positions,
            [[5; 3], [6; 3], [9; 3], [2, 3, 4], [20; 3]]
        );
        // None given: none kept.
        let mut plain = BatchMeta::default();
        plain.push_span(&[1], 0, vec![vec![0]], Logits::Last);
        plain.set_rope_positions(0, &[]);
        assert!(plain.rope_positions.is_empty());
    }
}
