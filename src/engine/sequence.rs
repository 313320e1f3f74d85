//! One sequence, the engine's one record of it: its tokens, how many have KV in the pool and
//! where (what the scheduler reads), and how its next token is chosen (what the engine reads).
//! The scheduler holds every live sequence in one map; the engine reaches them through it.

use super::pooled::Pooled;
use super::request::RequestId;
use super::sampler::{Sampler, SamplingParams};
use crate::grammar::{Constraint, Mask};
use crate::kv::{block_hash, SeqBlocks};
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
