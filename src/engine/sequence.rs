//! One sequence, the engine's one record of it: its tokens, how many have KV in the pool and
//! where (what the scheduler reads), and how its next token is chosen (what the engine reads).
//! The scheduler holds every live sequence in one map; the engine reaches them through it.

use super::pooled::Pooled;
use super::request::{rope_positions, row_inputs, uncut_chunk, PromptImage, RequestId};
use super::sampler::{Sampler, SamplingParams};
use crate::backend::adapter::Adapter;
use crate::backend::batch::RowInput;
use crate::grammar::{Constraint, Mask};
use crate::kv::{block_hash, SeqBlocks};
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

pub type SeqId = u64;

#[derive(Clone)]
pub struct Sequence {
    pub id: SeqId,
    /// The request the sequence is one completion of (a request with `n > 1` owns several).
    pub request: RequestId,
    /// Which of the request's `n` completions this is.
    pub index: usize,
    /// Arrival order (FCFS admission; the newest is preempted first).
    pub arrival: u64,
    /// Prompt then generated tokens.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose K/V are in the pool (a prefix of `tokens`).
    pub num_computed: usize,
    /// Prompt tokens that came from the prefix cache at first admission.
    pub cached_tokens: usize,
    /// Where its KV lives: a block table per KV group.
    pub blocks: SeqBlocks,
    /// A hybrid model's recurrent-state slot, held while it runs.
    pub state_slot: Option<u32>,
    /// Chained hashes of the leading full blocks computed so far (`block_hashes[i]` is block i).
    pub block_hashes: Vec<u64>,
    /// Tokens this sequence may reach (prompt + max_tokens, within the context).
    pub max_len: usize,
    /// Logits for every prompt position are wanted (scoring), so no prefix-cache reuse.
    pub want_prompt_logits: bool,
    /// An embedding request's: prefilled only, its hidden rows pooled, removed once its
    /// prompt is done. Every prompt row is computed (no prefix-cache reuse: mean pooling
    /// reads them all).
    pub embed: bool,
    /// Its prompt is computed in one span, never in chunks: an encoder's input, whose
    /// attention is bidirectional (every token sees every other one of its step).
    pub whole: bool,
    /// Completions to fork from this one when its prompt is done (n - 1).
    pub forks_pending: usize,
    pub preemptions: u32,
    /// Computed tokens since the last preemption (the thrash bound needs progress first).
    pub progress_since_preempt: usize,
    /// When the request came in.
    pub arrived: Instant,
    /// When the scheduler first found it decoding (about its first token).
    pub decoding_since: Option<Instant>,
    /// Tokens proposed to follow the pending one (prompt lookup), verified in its next decode
    /// step; never part of `tokens` until the model agrees with them.
    pub draft: Vec<u32>,
    /// How its tokens are drawn from a logits row.
    pub sampler: Sampler,
    /// The grammar state of a constrained sequence (a request with a response format or
    /// tools). A step takes it out while it computes the mask beside the forward pass.
    pub constraint: Option<Constraint>,
    /// The mask computed beside this step's forward pass, for a constrained sequence that
    /// samples in it (an error: the grammar gave up).
    pub mask: Option<Result<Mask, String>>,
    /// The longest prompt-lookup draft to propose next (0: not yet speculated): it grows
    /// while drafts are accepted whole and shrinks to what was accepted when they are not,
    /// because verifying a draft token costs a share of a decode step whether or not it is
    /// kept.
    pub draft_cap: usize,
    /// An embedding sequence's hidden rows pooled so far.
    pub pooled: Option<Pooled>,
    /// Runs of its prompt given as rows (images), in order.
    pub images: Vec<PromptImage>,
    /// The LoRA adapter its rows take (`None`: the base model).
    pub adapter: Option<Arc<Adapter>>,
    /// The image at `num_computed` part-way through the model, a few layers per step
    /// (`scheduler::layer_pass`).
    pub layer_pass: Option<LayerPass>,
}

/// A bidirectional image on its way through the model a few layers per step: its blocks are
/// held, its K/V written for the layers done, and its residual stream kept for the next ones.
#[derive(Clone, Debug, Default)]
pub struct LayerPass {
    /// Layers run so far.
    pub done: usize,
    /// The image positions' residual stream after those layers (rows × n_embd).
    pub residual: Vec<f32>,
}

impl Sequence {
    /// A fresh sequence for a prompt, not yet admitted, with the default sampler and no
    /// constraint (the engine sets the request's).
    pub fn new(
        id: SeqId,
        request: RequestId,
        arrival: u64,
        prompt: Vec<u32>,
        max_len: usize,
    ) -> Sequence {
        Sequence {
            id,
            request,
            index: 0,
            arrival,
            prompt_len: prompt.len(),
            tokens: prompt,
            num_computed: 0,
            cached_tokens: 0,
            blocks: SeqBlocks::default(),
            state_slot: None,
            block_hashes: Vec::new(),
            max_len,
            want_prompt_logits: false,
            embed: false,
            whole: false,
            forks_pending: 0,
            preemptions: 0,
            progress_since_preempt: 0,
            arrived: Instant::now(),
            decoding_since: None,
            draft: Vec::new(),
            sampler: Sampler::new(SamplingParams::default()),
            constraint: None,
            mask: None,
            draft_cap: 0,
            pooled: None,
            images: Vec::new(),
            adapter: None,
            layer_pass: None,
        }
    }

    /// Completion `index` of the same request, forked from this one where it stands (the end
    /// of its prompt): its tokens and grammar state copied, its KV blocks not yet shared (the
    /// scheduler shares them), drawing with `sampler`.
    pub fn fork(&self, id: SeqId, index: usize, sampler: Sampler) -> Sequence {
        Sequence {
            id,
            index,
            forks_pending: 0,
            blocks: SeqBlocks::default(),
            sampler,
            mask: None,
            draft_cap: 0,
            pooled: None,
            ..self.clone()
        }
    }

    /// Whether the prefix cache may give it leading blocks: not when every prompt row must
    /// be computed (prompt logprobs, embeddings).
    pub fn reuses_prefix(&self) -> bool {
        !self.want_prompt_logits && !self.embed
    }

    pub fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    /// Tokens still to run through the model.
    pub fn pending(&self) -> usize {
        self.tokens.len() - self.num_computed
    }

    /// A decode step: exactly the last sampled token is pending.
    pub fn is_decoding(&self) -> bool {
        self.pending() == 1 && self.tokens.len() > self.prompt_len
    }

    /// Hash of full block `i`, extending the chain as needed (requires the tokens).
    pub fn hash_of_block(&mut self, i: usize, block_size: usize) -> u64 {
        self.hashes_up_to(i + 1, block_size);
        self.block_hashes[i]
    }

    /// The chained hashes of the first `n` full blocks (requires the tokens). A block that
    /// holds image positions is keyed by the images' keys too (vLLM's extra keys): its
    /// placeholder tokens are the same for every image, so the same text with another image
    /// is another block. The chain starts from the adapter's key: the same prompt under
    /// another adapter (or none) holds other K/V.
    pub fn hashes_up_to(&mut self, n: usize, block_size: usize) -> &[u64] {
        while self.block_hashes.len() < n {
            let j = self.block_hashes.len();
            let parent = match j.checked_sub(1) {
                Some(p) => Some(self.block_hashes[p]),
                None => self.adapter.as_ref().map(|a| a.key),
            };
            let range = j * block_size..(j + 1) * block_size;
            let mut h = block_hash(parent, &self.tokens[range.clone()]);
            for image in self
                .images
                .iter()
                .filter(|i| i.at < range.end && i.end() > range.start)
            {
                // The image's key and where it starts relative to the block.
                let offset = (image.at as i64 - range.start as i64) as u64;
                h = block_hash(
                    Some(h ^ image.rows.key),
                    &[offset as u32, (offset >> 32) as u32],
                );
            }
            self.block_hashes.push(h);
        }
        &self.block_hashes[..n]
    }

    /// The image rows that positions `range` (a span of this step) take, for a span whose
    /// first token is token `first` of the batch.
    pub fn row_inputs(&self, range: Range<usize>, first: usize) -> Vec<RowInput> {
        row_inputs(&self.images, range, first)
    }

    /// The three-part RoPE positions of positions `range`, where its images take M-RoPE
    /// positions ([`rope_positions`]; empty where they do not).
    pub fn rope_positions(&self, range: Range<usize>) -> Vec<[usize; 3]> {
        rope_positions(&self.images, range)
    }

    /// The most positions a chunk of its prompt must take at once: the rest of its largest
    /// bidirectional image not yet computed (0 without one).
    pub fn image_need(&self) -> usize {
        self.images
            .iter()
            .filter(|i| i.rows.bidirectional && i.end() > self.num_computed)
            .map(|i| i.end() - i.at.max(self.num_computed))
            .max()
            .unwrap_or(0)
    }

    /// The bidirectional image its next chunk starts with, if one does and prompt tokens
    /// follow it (a pass through the layers computes no logits).
    pub fn image_at_next_chunk(&self) -> Option<&PromptImage> {
        self.images.iter().find(|i| {
            i.rows.bidirectional && i.at == self.num_computed && i.end() < self.prompt_len
        })
    }

    /// The longest prefill chunk of at most `len` pending tokens that does not cut an image
    /// whose positions see each other (see [`uncut_chunk`]).
    pub fn uncut_chunk(&self, len: usize) -> usize {
        uncut_chunk(&self.images, self.num_computed, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::batch::Embedded;

    /// A prompt of 40 placeholder tokens with an image of `len` rows at `at`.
    fn with_image(at: usize, len: usize, key: u64, bidirectional: bool) -> Sequence {
        let mut s = Sequence::new(1, 1, 1, vec![3; 40], 100);
        s.images.push(PromptImage {
            at,
            rows: Arc::new(Embedded {
                rows: vec![0.5; len * 2],
                width: 2,
                key,
                bidirectional,
                grid: None,
            }),
        });
        s
    }

    #[test]
    fn blocks_are_keyed_by_the_adapter_from_the_first() {
        let adapter = |key| Some(Arc::new(Adapter::new("a".into(), key, Vec::new())));
        let hashes = |a: Option<Arc<Adapter>>| {
            let mut s = Sequence::new(1, 1, 1, vec![3; 40], 100);
            s.adapter = a;
            s.hashes_up_to(2, 16).to_vec()
        };
        let (base, one, other) = (hashes(None), hashes(adapter(7)), hashes(adapter(8)));
        for i in 0..2 {
            assert_ne!(base[i], one[i]);
            assert_ne!(one[i], other[i]);
        }
        assert_eq!(one, hashes(adapter(7)));
    }

    #[test]
    fn blocks_holding_an_image_are_keyed_by_it() {
        let (mut a, mut b) = (with_image(10, 12, 7, true), with_image(10, 12, 8, true));
        let mut plain = Sequence::new(1, 1, 1, vec![3; 40], 100);
        let (ha, hb, hp) = (
            a.hashes_up_to(4, 8).to_vec(),
            b.hashes_up_to(4, 8).to_vec(),
            plain.hashes_up_to(4, 8).to_vec(),
        );
        assert_eq!(ha[0], hb[0], "the block before the image is the same text");
        assert_eq!(ha[0], hp[0]);
        for k in 1..4 {
            assert_ne!(ha[k], hb[k], "block {k} holds or follows another image");
            assert_ne!(ha[k], hp[k], "block {k}");
        }
        assert_eq!(
            with_image(10, 12, 7, true).hashes_up_to(4, 8),
            &ha[..],
            "the same image"
        );
        assert_ne!(
            with_image(11, 12, 7, true).hashes_up_to(4, 8)[1],
            ha[1],
            "placed elsewhere"
        );
    }

    #[test]
    fn a_bidirectional_image_is_never_cut_and_its_rows_see_all_of_it() {
        let mut s = with_image(10, 12, 7, true);
        assert_eq!(s.uncut_chunk(5), 5, "text before the image");
        assert_eq!(s.uncut_chunk(15), 10, "stops before the image");
        assert_eq!(s.uncut_chunk(22), 22, "takes all of it");
        assert_eq!(s.image_need(), 12);
        s.num_computed = 10;
        assert_eq!(s.uncut_chunk(11), 0, "the rest of it does not fit");
        assert_eq!(s.uncut_chunk(12), 12);
        let rows = s.row_inputs(10..25, 3);
        assert_eq!(rows.len(), 12);
        assert_eq!((rows[0].token, rows[0].row, rows[0].through), (3, 0, 21));
        assert_eq!(
            (rows[11].token, rows[11].row, rows[11].through),
            (14, 11, 21)
        );
        // A causal image may be cut, and each row sees up to itself.
        let c = with_image(10, 12, 7, false);
        assert_eq!(c.uncut_chunk(15), 15);
        assert_eq!(c.image_need(), 0);
        let rows = c.row_inputs(0..15, 0);
        assert_eq!((rows.len(), rows[4].through), (5, 14));
    }
}
