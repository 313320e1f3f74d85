//! One sequence's bookkeeping: its tokens, how many have KV in the pool, and where.

use super::request::RequestId;
use crate::kv::{block_hash, SeqBlocks};
use std::time::Instant;

pub type SeqId = u64;

#[derive(Clone, Debug)]
pub struct Sequence {
    pub id: SeqId,
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
}

impl Sequence {
    /// A fresh sequence for a prompt, not yet admitted.
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

    /// The chained hashes of the first `n` full blocks (requires the tokens).
    pub fn hashes_up_to(&mut self, n: usize, block_size: usize) -> &[u64] {
        while self.block_hashes.len() < n {
            let j = self.block_hashes.len();
            let parent = j.checked_sub(1).map(|p| self.block_hashes[p]);
            let h = block_hash(parent, &self.tokens[j * block_size..(j + 1) * block_size]);
            self.block_hashes.push(h);
        }
        &self.block_hashes[..n]
    }
}
