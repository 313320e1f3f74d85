//! The scheduler: pure bookkeeping over sequences and the block pool, no tensors.
//!
//! Every step it fills a token budget: first one token for each running sequence that is
//! decoding (so decodes never wait behind a long prompt), then prefill chunks — running
//! sequences that are part-way through their prompt, then waiting ones admitted first come
//! first served, in two lanes: long prompts and the rest (see `Lanes`). When a block cannot
//! be had, the newest running sequence is preempted by recompute: its blocks are released
//! (they stay in the prefix cache) and it is re-queued at the front. Only after a step is
//! planned does the engine run it and `commit` the result.

mod layer_pass;
mod state_slots;

use super::sequence::{SeqId, Sequence};
use crate::kv::{BlockPool, KvLayout, SeqBlocks};
use crate::model::Logits;
pub use layer_pass::PassSlice;
pub use state_slots::StateSave;
use state_slots::StateSlotPool;
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Running sequences at most.
    pub max_seqs: usize,
    /// Tokens one forward pass may process at most (decodes plus prefill chunks).
    pub max_batched_tokens: usize,
}

/// A prompt with more than this many steps' worth of tokens left is long (see `Lanes`).
pub const LONG_PROMPT_STEPS: usize = 4;

impl SchedulerConfig {
    /// Prompts with more tokens than this left to compute take the long lane.
    pub fn long_prompt_tokens(&self) -> usize {
        LONG_PROMPT_STEPS * self.max_batched_tokens
    }
}

/// Prefill in two lanes, each first come first served: prompts longer than
/// `long_prompt_tokens` (by their whole length, so a long prompt stays in its lane to the end),
/// and the rest. When both have work, steps alternate between them: the long lane's turn gives
/// it the whole prefill budget, the short lane's turn gives the short prompts what they need
/// and the long lane the rest. So a burst of 4,000-token prompts slows a short request to about
/// half speed instead of holding it for the whole burst (tens of seconds on a small CPU), a
/// long prompt is never starved, and its chunks stay as large as the budget allows (each chunk
/// re-reads the prompt's whole cache in attention: halving the chunks would cost more).
struct Lanes {
    short_left: usize,
    long_left: usize,
    /// Both lanes had work (the turn passes to the other lane).
    contended: bool,
}

impl Lanes {
    /// `candidates`: (long?, tokens pending) of every prompt that may get a chunk this step;
    /// `long_turn`: whose turn it is when both lanes have work.
    fn new(
        budget: usize,
        long_turn: bool,
        candidates: impl Iterator<Item = (bool, usize)>,
    ) -> Lanes {
        let (mut short, mut any_long) = (0usize, false);
        for (long, pending) in candidates {
            if long {
                any_long = true;
            } else {
                short += pending;
            }
        }
        let contended = any_long && short > 0;
        let short_left = if contended && long_turn {
            0
        } else {
            short.min(budget)
        };
        Lanes {
            short_left,
            long_left: budget - short_left,
            contended,
        }
    }

    fn lane(&mut self, long: bool) -> &mut usize {
        if long {
            &mut self.long_left
        } else {
            &mut self.short_left
        }
    }

    fn has_room(&mut self, long: bool) -> bool {
        *self.lane(long) > 0
    }

    /// Tokens a prompt with `pending` left may take now.
    fn allow(&mut self, long: bool, pending: usize) -> usize {
        pending.min(*self.lane(long))
    }

    fn take(&mut self, long: bool, len: usize) {
        *self.lane(long) -= len;
    }
}

/// One sequence's share of a step.
#[derive(Clone, Debug, PartialEq)]
pub struct ScheduledSpan {
    pub seq: SeqId,
    pub start: usize,
    /// Tokens run: those of `tokens[start..]`, then `draft` of the sequence's draft tokens.
    pub len: usize,
    pub logits: Logits,
    /// Draft tokens at the end of the span (a speculative decode step: the pending token
    /// and its draft, a logits row for each).
    pub draft: usize,
}

impl ScheduledSpan {
    /// A decode step: the one pending token, with its draft if it has one.
    pub fn is_decode(&self) -> bool {
        self.len - self.draft == 1 && (self.draft > 0 || self.logits == Logits::Last)
    }
}

#[derive(Clone, Debug, Default)]
pub struct ScheduledBatch {
    pub spans: Vec<ScheduledSpan>,
    /// Copy-on-write: copy every layer of block `.0` into block `.1` before the forward.
    pub copies: Vec<(u32, u32)>,
    /// A hybrid's recurrent state: copy state slot `.0` into slot `.1` before the forward (a
    /// fork's parent state, a cached prefix's snapshot).
    pub state_copies: Vec<(u32, u32)>,
    /// A hybrid's states to snapshot after the forward.
    pub state_saves: Vec<StateSave>,
    /// Images going through the model a few layers per step (see `layer_pass`).
    pub layer_passes: Vec<PassSlice>,
    pub preempted: Vec<SeqId>,
}

impl ScheduledBatch {
    pub fn num_tokens(&self) -> usize {
        self.spans.iter().map(|s| s.len).sum()
    }

    /// Whether the step runs nothing.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty() && self.layer_passes.is_empty()
    }

    /// What its layer-pass slices are worth in prompt tokens (`PassSlice::work`).
    pub fn layer_pass_work(&self) -> usize {
        self.layer_passes.iter().map(|p| p.work()).sum()
    }
}

/// Counters the server exports.
#[derive(Clone, Debug, Default)]
pub struct SchedulerCounters {
    pub prefix_queried_tokens: u64,
    pub prefix_hit_tokens: u64,
    pub preemptions: u64,
}

pub struct Scheduler {
    pub config: SchedulerConfig,
    pub pool: BlockPool,
    /// The model's KV groups (one table per group per sequence; windows release blocks).
    layout: KvLayout,
    seqs: HashMap<SeqId, Sequence>,
    waiting: VecDeque<SeqId>,
    /// In admission order.
    running: Vec<SeqId>,
    /// Whether the long prefill lane has the next contended step (see `Lanes`).
    long_turn: bool,
    pub counters: SchedulerCounters,
    /// A hybrid model's recurrent-state slots (`kv::StateSlots`): each running sequence holds
    /// one. `None` for a model that only attends.
    slots: Option<StateSlotPool>,
    /// The model's layers, where images whose positions see each other may go through them a
    /// few per step (`layer_pass`); 0 where they are computed whole.
    pass_layers: usize,
}

enum Grow {
    Ok,
    /// No block could be had (the caller decides whom to preempt).
    NoBlock,
}

impl Scheduler {
    pub fn new(config: SchedulerConfig, pool: BlockPool, layout: KvLayout) -> Scheduler {
        assert!(config.max_seqs > 0 && config.max_batched_tokens > 0);
        Scheduler {
            config,
            pool,
            layout,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            long_turn: false,
            counters: SchedulerCounters::default(),
            slots: None,
            pass_layers: 0,
        }
    }

    /// The longest sequence the whole pool can hold (a request past this can never run).
    pub fn capacity_tokens(&self) -> usize {
        self.layout.max_tokens(
            self.pool.total(),
            self.config.max_batched_tokens,
            self.pool.block_size(),
        )
    }

    pub fn add(&mut self, mut seq: Sequence) {
        seq.blocks = SeqBlocks::new(self.layout.num_groups());
        self.waiting.push_back(seq.id);
        self.seqs.insert(seq.id, seq);
    }

    pub fn get(&self, id: SeqId) -> Option<&Sequence> {
        self.seqs.get(&id)
    }

    pub fn get_mut(&mut self, id: SeqId) -> Option<&mut Sequence> {
        self.seqs.get_mut(&id)
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    pub fn sequences(&self) -> impl Iterator<Item = &Sequence> {
        self.seqs.values()
    }

    /// Removes a sequence wherever it is and returns every block it held.
    pub fn remove(&mut self, id: SeqId) -> Option<Sequence> {
        let seq = self.seqs.remove(&id)?;
        self.running.retain(|&s| s != id);
        self.waiting.retain(|&s| s != id);
        let mut seq = seq;
        seq.blocks.release_all(&mut self.pool);
        Self::release_slot(&mut self.slots, &mut seq);
        Some(seq)
    }

    /// Adds an already computed copy of a running sequence (a fork sharing its blocks).
    ///
    /// A hybrid model's fork also needs the parent's recurrent state: copied into a slot of its
    /// own before the next step; with no slot free, it waits and computes its prompt again.
    pub fn add_fork(&mut self, parent: SeqId, mut child: Sequence) {
        let Some(slot) = self.fork_slot(parent) else {
            child.state_slot = None;
            child.blocks = SeqBlocks::new(self.layout.num_groups());
            child.num_computed = 0;
            self.waiting.push_back(child.id);
            self.seqs.insert(child.id, child);
            return;
        };
        child.state_slot = slot;
        child.blocks = self.seqs[&parent].blocks.share(&mut self.pool);
        self.running.push(child.id);
        self.seqs.insert(child.id, child);
    }

    /// Plans the next step with the whole token budget open to prefill.
    pub fn schedule(&mut self) -> ScheduledBatch {
        self.schedule_paced(|_, left| left)
    }

    /// Plans the next step; `prefill_budget(decodes, left)` caps the prompt tokens it carries
    /// once `decodes` one-token spans are in and `left` tokens of the budget remain. `decodes`
    /// is 0 when the prefill is no new work for the decoders (see `prefill_is_new_work`).
    pub fn schedule_paced(
        &mut self,
        prefill_budget: impl FnOnce(usize, usize) -> usize,
    ) -> ScheduledBatch {
        let mut batch = ScheduledBatch::default();
        if let Some(pool) = self.slots.as_mut() {
            batch.state_copies = std::mem::take(&mut pool.copies);
        }
        let mut budget = self.config.max_batched_tokens;
        let decoders = self.schedule_decodes(&mut budget, &mut batch);

        // Prefill chunks for running sequences part-way through their tokens, then for the
        // waiting sequences admitted, in two lanes (see `Lanes`).
        let prefilling = self.prefilling(&batch);
        let room = self.config.max_seqs.saturating_sub(self.running.len());
        let admissible: Vec<SeqId> = self
            .waiting
            .iter()
            .copied()
            .filter(|&id| !self.waits_for_prefix(id))
            .take(room)
            .collect();
        let candidates = || prefilling.iter().chain(&admissible).copied();
        let protected = if self.prefill_is_new_work(&decoders, candidates()) {
            batch.spans.len()
        } else {
            0
        };
        let left = budget;
        budget = prefill_budget(protected, left).min(left);
        budget = self.schedule_layer_passes(&prefilling, budget, &mut batch);
        let prefilling: Vec<SeqId> = (prefilling.into_iter())
            .filter(|id| self.seqs[id].layer_pass.is_none())
            .collect();
        let candidates = || prefilling.iter().chain(&admissible).copied();
        // An input computed whole is never cut, so a paced budget smaller than the oldest
        // such input would leave it waiting for as long as streams decode: the budget grows
        // to hold it, as a paced chunk never shrinks below its minimum.
        if let Some(id) = candidates().find(|id| self.seqs[id].whole) {
            budget = budget.max(self.seqs[&id].pending().min(left));
        }
        // The same for an image whose positions see each other, computed in one step.
        if let Some(need) = candidates().map(|id| self.seqs[&id].image_need()).max() {
            budget = budget.max(need.min(left));
        }
        let mut lanes = Lanes::new(
            budget,
            self.long_turn,
            candidates().map(|id| (self.is_long(id), self.seqs[&id].pending())),
        );
        self.schedule_prefills(prefilling, &mut lanes, &mut batch);
        self.admit_waiting(&mut lanes, &mut batch);
        if lanes.contended {
            self.long_turn = !self.long_turn;
        }
        self.ensure_progress(&mut batch);
        self.plan_state_saves(&mut batch);
        batch
    }

    /// Decodes, oldest first: one token each (with its draft, if it has one), while `budget`
    /// lasts. Returns the sequences that were decoding.
    fn schedule_decodes(&mut self, budget: &mut usize, batch: &mut ScheduledBatch) -> Vec<SeqId> {
        let decoders: Vec<SeqId> = self
            .running
            .iter()
            .copied()
            .filter(|id| self.seqs[id].is_decoding())
            .collect();
        for &id in &decoders {
            if *budget == 0 {
                break;
            }
            let draft = self.fit_draft(id, *budget);
            while self.running.contains(&id) {
                match self.grow(id, 1 + draft, batch) {
                    Grow::Ok => {
                        let start = self.seqs[&id].num_computed;
                        batch.spans.push(ScheduledSpan {
                            seq: id,
                            start,
                            len: 1 + draft,
                            logits: if draft > 0 { Logits::All } else { Logits::Last },
                            draft,
                        });
                        *budget -= 1 + draft;
                        break;
                    }
                    // Out of blocks: preempt the newest (maybe this one) and retry, or, if
                    // nobody may be preempted, let this one wait a step.
                    Grow::NoBlock => {
                        if !self.preempt_newest(id, batch) {
                            break;
                        }
                    }
                }
            }
        }
        decoders
    }

    /// Running sequences part-way through their tokens with no span in `batch` yet, oldest
    /// first.
    fn prefilling(&self, batch: &ScheduledBatch) -> Vec<SeqId> {
        self.running
            .iter()
            .copied()
            .filter(|id| {
                let s = &self.seqs[id];
                !s.is_decoding() && s.pending() > 0 && !batch.spans.iter().any(|sp| sp.seq == *id)
            })
            .collect()
    }

    /// A prefill chunk for each of `prefilling` that its lane has room for.
    fn schedule_prefills(
        &mut self,
        prefilling: Vec<SeqId>,
        lanes: &mut Lanes,
        batch: &mut ScheduledBatch,
    ) {
        for id in prefilling {
            let long = self.is_long(id);
            let len = lanes.allow(long, self.seqs[&id].pending());
            if len == 0 || self.cut_short(id, len) {
                continue;
            }
            let len = self.seqs[&id].uncut_chunk(len);
            if let Grow::Ok = self.grow(id, len, batch) {
                batch.spans.push(self.prefill_span(id, len));
                lanes.take(long, len);
            }
        }
    }

    /// Admits waiting sequences, first come first served within each lane: a short prompt is
    /// never held up behind a long one that cannot start yet, nor the reverse.
    fn admit_waiting(&mut self, lanes: &mut Lanes, batch: &mut ScheduledBatch) {
        let mut lane_closed = [false; 2];
        let mut i = 0;
        while i < self.waiting.len()
            && self.running.len() < self.config.max_seqs
            && !(lane_closed[0] && lane_closed[1])
        {
            let id = self.waiting[i];
            let long = self.is_long(id);
            if lane_closed[usize::from(long)] {
                i += 1;
                continue;
            }
            let pending = self.seqs[&id].pending();
            if !lanes.has_room(long)
                || self.waits_for_prefix(id)
                || self.cut_short(id, lanes.allow(long, pending))
            {
                lane_closed[usize::from(long)] = true;
                i += 1;
                continue;
            }
            if !self.take_slot(id) {
                break;
            }
            let restores = batch.state_copies.len();
            self.attach_cached_prefix(id, batch);
            let len = self.seqs[&id].uncut_chunk(lanes.allow(long, self.seqs[&id].pending()));
            match (len > 0).then(|| self.grow(id, len, batch)) {
                Some(Grow::Ok) => {
                    self.waiting.remove(i);
                    self.running.push(id);
                    batch.spans.push(self.prefill_span(id, len));
                    lanes.take(long, len);
                }
                _ => {
                    // Give the cache hits back until blocks free up (or, where the hits end
                    // at an image this lane cannot hold whole, until it can).
                    let s = self.seqs.get_mut(&id).expect("waiting seq exists");
                    s.num_computed = 0;
                    s.cached_tokens = 0;
                    s.blocks.release_all(&mut self.pool);
                    Self::release_slot(&mut self.slots, s);
                    batch.state_copies.truncate(restores);
                    break;
                }
            }
        }
    }

    /// Whether a chunk of `len` tokens would cut sequence `id`'s prompt that must be computed
    /// whole (`Sequence::whole`), or leave no chunk that does not cut an image
    /// (`Sequence::uncut_chunk`): it waits for a step with room for all of it.
    fn cut_short(&self, id: SeqId, len: usize) -> bool {
        let s = &self.seqs[&id];
        (s.whole && len < s.pending()) || s.uncut_chunk(len) == 0
    }

    /// Liveness: if nothing at all could run while sequences hold blocks, forces the newest
    /// out (the thrash bound yields to making progress).
    fn ensure_progress(&mut self, batch: &mut ScheduledBatch) {
        if batch.is_empty() && !self.running.is_empty() {
            if let Some(&victim) = self.running.iter().max_by_key(|&&s| self.seqs[&s].arrival) {
                if self.running.len() > 1 || !self.waiting.is_empty() {
                    self.preempt(victim, batch);
                }
            }
        }
    }

    /// Whether the prefill this step may carry (`candidates`: the prompts that may get a chunk)
    /// is work that came in after some stream began: a prompt that arrived after the earliest
    /// of `decoders` started decoding, a long prompt, or a preempted sequence's recompute.
    /// Only then is the prefill share paced: the prompts of a burst of requests that arrived
    /// together with the decoders (clients sending a batch at once) are prefilled at the full
    /// budget, so the burst decodes as one batch instead of being staggered by pacing into
    /// small, slow ones (the 16-sequence benchmark lost about 45% of its throughput that way).
    fn prefill_is_new_work(
        &self,
        decoders: &[SeqId],
        mut candidates: impl Iterator<Item = SeqId>,
    ) -> bool {
        let Some(first_decode) = decoders
            .iter()
            .filter_map(|id| self.seqs[id].decoding_since)
            .min()
        else {
            return false;
        };
        candidates.any(|id| {
            let s = &self.seqs[&id];
            self.is_long(id) || s.preemptions > 0 || s.arrived > first_decode
        })
    }

    /// Whether `id`'s prompt takes the long lane (see `Lanes`).
    fn is_long(&self, id: SeqId) -> bool {
        self.seqs[&id].prompt_len > self.config.long_prompt_tokens()
    }

    /// Whether waiting sequence `id` starts with whole blocks that a running sequence is still
    /// prefilling: then it waits until they reach the prefix cache rather than compute them a
    /// second time (requests sharing a long system prompt).
    fn waits_for_prefix(&self, id: SeqId) -> bool {
        let bt = self.pool.block_size();
        let s = &self.seqs[&id];
        // A hybrid resumes only where a snapshot of its state is kept, which the running
        // sequence's chunks may not reach: it does not wait.
        if s.num_computed > 0 || !s.blocks.is_empty() || !s.reuses_prefix() || self.slots.is_some()
        {
            return false;
        }
        self.running.iter().any(|r| {
            let r = &self.seqs[r];
            if r.is_decoding() || r.pending() == 0 {
                return false;
            }
            let shared = r
                .tokens
                .iter()
                .zip(&s.tokens)
                .take_while(|(a, b)| a == b)
                .count();
            // The last token is always computed anew, so only blocks before it count.
            let usable = shared.min(s.tokens.len().saturating_sub(1)) / bt;
            usable > r.num_computed / bt
        })
    }

    fn prefill_span(&self, id: SeqId, len: usize) -> ScheduledSpan {
        let s = &self.seqs[&id];
        let reaches_end = s.num_computed + len == s.tokens.len();
        let logits = if s.want_prompt_logits && s.num_computed < s.prompt_len {
            Logits::All
        } else if reaches_end && !s.embed {
            Logits::Last
        } else {
            Logits::None
        };
        ScheduledSpan {
            seq: id,
            start: s.num_computed,
            len,
            logits,
            draft: 0,
        }
    }

    /// How many of decoding sequence `id`'s draft tokens this step verifies: as many as the
    /// token budget after its own token and the free blocks allow (a draft never preempts
    /// anyone: without room it waits, and the step decodes one token). The rest are dropped.
    fn fit_draft(&mut self, id: SeqId, budget: usize) -> usize {
        let s = self.seqs.get_mut(&id).expect("seq exists");
        let mut k = s.draft.len().min(budget.saturating_sub(1));
        if k > 0
            && self.pool.free_count()
                < s.blocks
                    .blocks_needed(&self.pool, &self.layout, s.num_computed, 1 + k)
        {
            k = 0;
        }
        s.draft.truncate(k);
        k
    }

    /// Decoding sequence `id`'s next `n` tokens (already in its `tokens`) had their K/V
    /// computed in the step that verified them as its draft: they count as computed, and
    /// blocks they fill join the prefix cache.
    pub fn accept_computed(&mut self, id: SeqId, n: usize) {
        if let Some(s) = self.seqs.get_mut(&id) {
            let to = (s.num_computed + n).min(s.tokens.len());
            mark_computed(&mut self.pool, s, to);
        }
    }

    /// On first admission, reuse cached full blocks of the prompt (always leaving at least the
    /// last token to compute, so there are logits to sample from): as many leading blocks as
    /// every KV group still holds what resuming there needs (`SeqBlocks::attach_prefix`), and
    /// for a hybrid, only as many as end where a snapshot of its state is kept (restored into
    /// its slot before the step).
    fn attach_cached_prefix(&mut self, id: SeqId, batch: &mut ScheduledBatch) {
        let bt = self.pool.block_size();
        let s = self.seqs.get_mut(&id).expect("seq exists");
        if s.num_computed > 0 || !s.blocks.is_empty() || !s.reuses_prefix() {
            return;
        }
        let usable = (s.tokens.len() - 1) / bt;
        s.hashes_up_to(usable, bt);
        if !self.caches_prefixes() {
            return;
        }
        let s = &self.seqs[&id];
        let resumable: Vec<bool> = (0..=usable)
            .map(|k| k > 0 && self.resumable(s, k))
            .collect();
        let s = self.seqs.get_mut(&id).expect("seq exists");
        let blocks = s.blocks.attach_prefix(
            &mut self.pool,
            &self.layout,
            &s.block_hashes,
            &s.tokens,
            usable,
            |k| resumable[k],
        );
        let hits = bt * blocks;
        s.num_computed = hits;
        if s.preemptions == 0 {
            s.cached_tokens = hits.min(s.prompt_len);
            self.counters.prefix_queried_tokens += s.prompt_len as u64;
            self.counters.prefix_hit_tokens += hits.min(s.prompt_len) as u64;
        }
        self.restore_state(id, blocks, batch);
    }

    /// Makes room for `len` more tokens at `num_computed..` (`SeqBlocks::grow`: new blocks,
    /// copy-on-write of a shared partly filled block, windows' old blocks released).
    fn grow(&mut self, id: SeqId, len: usize, batch: &mut ScheduledBatch) -> Grow {
        let s = self.seqs.get_mut(&id).expect("seq exists");
        let start = s.num_computed;
        if self.pool.free_count() < s.blocks.blocks_needed(&self.pool, &self.layout, start, len) {
            return Grow::NoBlock;
        }
        s.blocks
            .grow(&mut self.pool, &self.layout, start, len, &mut batch.copies);
        Grow::Ok
    }

    /// Preempts the newest running sequence that may be preempted (it made progress since
    /// its last preemption). Returns false if none may.
    fn preempt_newest(&mut self, requester: SeqId, batch: &mut ScheduledBatch) -> bool {
        let victim = self
            .running
            .iter()
            .copied()
            .filter(|id| !batch.spans.iter().any(|sp| sp.seq == *id))
            .filter(|id| !batch.layer_passes.iter().any(|p| p.seq == *id))
            .filter(|id| {
                let s = &self.seqs[id];
                *id == requester || s.preemptions == 0 || s.progress_since_preempt > 0
            })
            .max_by_key(|id| self.seqs[id].arrival);
        match victim {
            Some(v) => {
                self.preempt(v, batch);
                true
            }
            None => false,
        }
    }

    fn preempt(&mut self, id: SeqId, batch: &mut ScheduledBatch) {
        self.running.retain(|&s| s != id);
        let s = self.seqs.get_mut(&id).expect("running seq exists");
        s.blocks.release_all(&mut self.pool);
        Self::release_slot(&mut self.slots, s);
        s.num_computed = 0;
        s.layer_pass = None;
        s.draft.clear();
        s.preemptions += 1;
        s.progress_since_preempt = 0;
        // Its spans planned earlier in this step must not run.
        batch.spans.retain(|sp| sp.seq != id);
        batch.layer_passes.retain(|p| p.seq != id);
        self.waiting.push_front(id);
        batch.preempted.push(id);
        self.counters.preemptions += 1;
    }

    /// Records that the step ran: computed counts advance, newly full blocks join the prefix
    /// cache, and so do a hybrid's saved states, as snapshots.
    pub fn commit(&mut self, batch: &ScheduledBatch) {
        self.keep_state_saves(batch);
        self.commit_layer_passes(batch);
        for span in &batch.spans {
            let Some(s) = self.seqs.get_mut(&span.seq) else {
                continue;
            };
            // Draft tokens count only once verified (`accept_computed`).
            mark_computed(&mut self.pool, s, span.start + span.len - span.draft);
            if s.num_computed >= s.prompt_len {
                // The prompt is done: its first token comes out of this step.
                s.decoding_since.get_or_insert_with(Instant::now);
            }
        }
    }

    /// Every live block table, every group's (for invariant checks).
    pub fn block_tables(&self) -> Vec<&[u32]> {
        self.seqs
            .values()
            .flat_map(|s| s.blocks.tables().iter().map(|t| t.as_slice()))
            .collect()
    }
}

/// `s`'s K/V now holds its tokens up to `to` (exclusive; at or past `num_computed`): they count
/// as computed and as progress, and blocks they fill join the prefix cache.
fn mark_computed(pool: &mut BlockPool, s: &mut Sequence, to: usize) {
    let bt = pool.block_size();
    let before = s.num_computed / bt;
    s.progress_since_preempt += to.saturating_sub(s.num_computed);
    s.num_computed = to;
    let full = to / bt;
    s.hashes_up_to(full, bt);
    s.blocks
        .register_full(pool, before..full, &s.block_hashes, &s.tokens);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sched(blocks: usize, budget: usize) -> Scheduler {
        Scheduler::new(
            SchedulerConfig {
                max_seqs: 16,
                max_batched_tokens: budget,
            },
            BlockPool::new(blocks, 16),
            KvLayout::full(1),
        )
    }

    /// An encoder's input of `len` tokens: embedded, computed whole.
    fn whole(id: SeqId, len: usize) -> Sequence {
        let mut seq = Sequence::new(id, id, id, vec![7; len], len);
        seq.embed = true;
        seq.whole = true;
        seq
    }

    #[test]
    fn a_whole_input_waits_for_a_step_with_room_for_all_of_it() {
        let mut s = sched(64, 100);
        s.add(whole(1, 60));
        s.add(whole(2, 60));
        s.add(whole(3, 30));
        // The first fits; the second would be cut: it waits, and so does the third behind it
        // in its lane (first come, first served).
        let b = s.schedule();
        assert_eq!(b.spans.len(), 1);
        assert_eq!(
            (b.spans[0].seq, b.spans[0].start, b.spans[0].len),
            (1, 0, 60)
        );
        s.commit(&b);
        s.remove(1);
        let b = s.schedule();
        let spans: Vec<_> = b
            .spans
            .iter()
            .map(|sp| (sp.seq, sp.start, sp.len))
            .collect();
        assert_eq!(spans, [(2, 0, 60), (3, 0, 30)]);
    }

    /// However small the paced prefill budget (another model's streams decoding), the oldest
    /// whole input gets a step with room for all of it.
    #[test]
    fn a_paced_budget_grows_to_hold_a_whole_input() {
        let mut s = sched(64, 100);
        s.add(whole(1, 60));
        s.add(whole(2, 30));
        let b = s.schedule_paced(|_, _| 4);
        let spans: Vec<_> = b.spans.iter().map(|sp| (sp.seq, sp.len)).collect();
        assert_eq!(
            spans,
            [(1, 60)],
            "the first whole, the second waits its turn"
        );
    }

    /// Runs a step without a model: commit it and give every sequence that reached its end a
    /// next token (as sampling would).
    fn step(s: &mut Scheduler, next_token: u32) -> ScheduledBatch {
        let b = s.schedule();
        s.commit(&b);
        for span in &b.spans {
            let seq = s.get_mut(span.seq).unwrap();
            if seq.num_computed == seq.tokens.len() {
                seq.tokens.push(next_token);
            }
        }
        s.pool.check_invariants(s.block_tables()).unwrap();
        b
    }

    #[test]
    fn a_draft_is_verified_in_one_span_and_only_accepted_tokens_count_as_computed() {
        let mut s = sched(8, 64);
        s.add(Sequence::new(1, 1, 1, (0..15).collect(), 100));
        step(&mut s, 100); // the prompt, then its first token
        s.get_mut(1).unwrap().draft = vec![7, 8, 9, 10];
        let b = s.schedule();
        assert_eq!(
            b.spans,
            vec![ScheduledSpan {
                seq: 1,
                start: 15,
                len: 5,
                logits: Logits::All,
                draft: 4,
            }]
        );
        assert!(b.spans[0].is_decode());
        s.commit(&b);
        let seq = s.get(1).unwrap();
        assert_eq!(
            seq.num_computed, 16,
            "drafts are not computed until verified"
        );
        assert_eq!(s.pool.used(), 2, "blocks for the whole span");
        // The model agreed with 7 and 8: they join the tokens and count as computed, and the
        // first block (16 tokens) is full now.
        s.get_mut(1).unwrap().draft.clear();
        for t in [7, 8] {
            s.get_mut(1).unwrap().tokens.push(t);
            s.accept_computed(1, 1);
        }
        s.get_mut(1).unwrap().tokens.push(42); // the model's own next token
        let seq = s.get(1).unwrap();
        assert_eq!((seq.num_computed, seq.pending()), (18, 1));
        assert_eq!(seq.block_hashes.len(), 1);
        // The next step decodes one token at position 18, in the block the draft took.
        let b = step(&mut s, 43);
        assert_eq!((b.spans[0].start, b.spans[0].len), (18, 1));
        assert_eq!(s.pool.used(), 2);
        s.remove(1);
        assert_eq!(s.pool.used(), 0);
    }

    #[test]
    fn a_draft_is_cut_to_the_budget_and_dropped_without_free_blocks() {
        let mut s = sched(2, 4);
        s.add(Sequence::new(1, 1, 1, (0..4).collect(), 100));
        step(&mut s, 100);
        s.get_mut(1).unwrap().draft = vec![1, 2, 3, 4, 5, 6];
        let b = s.schedule();
        assert_eq!(
            (b.spans[0].len, b.spans[0].draft),
            (4, 3),
            "budget of 4 tokens"
        );
        assert_eq!(s.get(1).unwrap().draft, vec![1, 2, 3]);
        s.commit(&b);
        s.get_mut(1).unwrap().draft.clear();
        s.get_mut(1).unwrap().tokens.push(9);
        while s.get(1).unwrap().tokens.len() < 31 {
            step(&mut s, 5);
        }
        // Position 30 decodes in the second (last) block; its draft would need a third.
        s.get_mut(1).unwrap().draft = vec![1, 2, 3];
        let b = s.schedule();
        assert_eq!((b.spans[0].len, b.spans[0].draft), (1, 0));
        assert_eq!(b.spans[0].logits, Logits::Last);
        assert!(s.get(1).unwrap().draft.is_empty());
        assert!(b.preempted.is_empty(), "a draft never preempts");
    }

    /// A prompt of 100 tokens whose positions 10..50 are a bidirectional image.
    pub(super) fn with_image(id: SeqId) -> Sequence {
        let mut seq = Sequence::new(id, id, id, vec![3; 100], 200);
        seq.images.push(crate::engine::PromptImage {
            at: 10,
            rows: std::sync::Arc::new(crate::backend::batch::Embedded {
                rows: vec![0.0; 40 * 2],
                width: 2,
                key: 9,
                bidirectional: true,
                grid: None,
            }),
        });
        seq
    }

    #[test]
    fn chunks_never_cut_an_image_whose_positions_see_each_other() {
        let mut s = sched(64, 48);
        s.add(with_image(1));
        let mut chunks = Vec::new();
        while !s.get(1).unwrap().is_decoding() {
            let b = step(&mut s, 7);
            chunks.extend(b.spans.iter().map(|sp| (sp.start, sp.len)));
        }
        assert_eq!(
            chunks,
            [(0, 10), (10, 48), (58, 42)],
            "stops before the image, then takes all of it"
        );
        // The same prompt again reuses the cached blocks, image and all (the key matches);
        // only whole blocks are cached, so it resumes at 96 and computes the rest.
        s.add(with_image(2));
        let b = step(&mut s, 7);
        let second: Vec<(usize, usize)> = (b.spans.iter())
            .filter(|sp| sp.seq == 2)
            .map(|sp| (sp.start, sp.len))
            .collect();
        assert_eq!(second, [(96, 4)]);
    }

    #[test]
    fn long_prompt_is_chunked_while_every_decode_gets_a_token_each_step() {
        let budget = 256;
        let mut s = sched(4096, budget);
        for i in 0..8u64 {
            s.add(Sequence::new(i, i, i, vec![i as u32 + 1; 20], 4000));
        }
        // Let the 8 short prompts prefill and start decoding.
        while (0..8).any(|i| !s.get(i).unwrap().is_decoding()) {
            step(&mut s, 7);
        }
        s.add(Sequence::new(
            100,
            100,
            100,
            (0..4500).map(|t| t % 1000).collect(),
            5000,
        ));
        let mut steps_with_prefill = 0;
        while !s.get(100).unwrap().is_decoding() {
            let b = step(&mut s, 7);
            assert!(
                b.num_tokens() <= budget,
                "step of {} tokens",
                b.num_tokens()
            );
            for i in 0..8 {
                let n = b.spans.iter().filter(|sp| sp.seq == i).count();
                assert_eq!(n, 1, "decoding sequence {i} got no token in a step");
            }
            steps_with_prefill += 1;
        }
        assert!(
            steps_with_prefill >= 4500 / budget,
            "the prompt was chunked"
        );
        for id in (0..8).chain([100]) {
            s.remove(id);
        }
        assert_eq!(s.pool.used(), 0);
    }

    #[test]
    fn a_long_prompt_takes_turns_with_the_prompts_behind_it() {
        let budget = 256;
        let mut s = sched(4096, budget);
        s.add(Sequence::new(
            0,
            0,
            0,
            (0..4000).map(|t| t % 900).collect(),
            4100,
        ));
        step(&mut s, 7);
        // A short prompt arrives behind it: the lanes take turns, whole steps each.
        s.add(Sequence::new(1, 1, 1, vec![5; 300], 400));
        let len_of =
            |b: &ScheduledBatch, id| b.spans.iter().find(|sp| sp.seq == id).map(|sp| sp.len);
        let (mut short_steps, mut long_steps) = (0, 0);
        while !s.get(1).unwrap().is_decoding() {
            let b = step(&mut s, 7);
            match (len_of(&b, 0), len_of(&b, 1)) {
                (Some(l), None) => {
                    assert_eq!(l, budget, "the long lane's turn: the whole budget");
                    long_steps += 1;
                }
                (long, Some(short)) => {
                    assert_eq!(
                        short + long.unwrap_or(0),
                        budget,
                        "what the short one leaves goes to the long one"
                    );
                    short_steps += 1;
                }
                other => panic!("a step with {other:?}"),
            }
        }
        assert_eq!(short_steps, 2, "300 tokens in two short-lane turns");
        assert!(
            long_steps <= 2,
            "the long one had {long_steps} turns meanwhile"
        );
        // Alone again, the long prompt takes whole steps.
        let b = step(&mut s, 7);
        assert_eq!(
            len_of(&b, 0),
            Some(budget - 1),
            "the short one decodes one token"
        );

        // One that starts like the long prompt waits for its blocks to be cached instead.
        let mut s = sched(4096, budget);
        let long: Vec<u32> = (0..4000).map(|t| t % 900).collect();
        s.add(Sequence::new(0, 0, 0, long.clone(), 4100));
        step(&mut s, 7);
        s.add(Sequence::new(1, 1, 1, long[..300].to_vec(), 400));
        let b = step(&mut s, 7);
        assert_eq!(len_of(&b, 0), Some(budget));
        assert_eq!(len_of(&b, 1), None);
        // Its 18 whole blocks are cached now: it computes only the rest.
        let b = step(&mut s, 7);
        assert_eq!(len_of(&b, 1), Some(300 - 18 * 16));
        assert_eq!(s.get(1).unwrap().cached_tokens, 18 * 16);
    }

    #[test]
    fn a_short_prompt_is_not_queued_behind_long_ones_that_cannot_start() {
        let budget = 256;
        let mut s = sched(8192, budget);
        for i in 0..3u64 {
            let tokens = (0..4000).map(|t| (t * (i as u32 + 2)) % 900 + 1).collect();
            s.add(Sequence::new(i, i, i, tokens, 4100));
        }
        step(&mut s, 7);
        assert_eq!(s.num_waiting(), 2, "the first long prompt fills the step");
        s.add(Sequence::new(9, 9, 9, vec![5; 40], 100));
        let mut steps = 0;
        while !s.get(9).unwrap().is_decoding() {
            step(&mut s, 7);
            steps += 1;
        }
        assert!(steps <= 2, "the short prompt took {steps} steps to prefill");
        assert!(
            s.num_waiting() >= 1,
            "long ones still queue behind the first, in their lane"
        );
    }

    #[test]
    fn paced_prefill_is_capped_only_while_sequences_decode() {
        let mut s = sched(4096, 512);
        s.add(Sequence::new(0, 0, 0, vec![1; 20], 4000));
        let pace = |decodes: usize, left: usize| if decodes > 0 { 24 } else { left };
        // Nobody decodes yet: the first prompt takes the whole budget.
        let b = s.schedule_paced(pace);
        assert_eq!(b.num_tokens(), 20);
        s.commit(&b);
        s.get_mut(0).unwrap().tokens.push(5);
        s.add(Sequence::new(1, 1, 1, vec![2; 1000], 4000));
        let b = s.schedule_paced(|decodes, left| {
            assert_eq!((decodes, left), (1, 511));
            pace(decodes, left)
        });
        assert_eq!(
            b.num_tokens(),
            1 + 24,
            "one decode and a paced prefill chunk"
        );
        s.commit(&b);
    }

    #[test]
    fn a_burst_is_prefilled_at_full_budget_and_later_arrivals_are_paced() {
        let mut s = sched(4096, 512);
        // 12 requests of 128 tokens at once (a client sending a batch).
        for i in 0..12 {
            s.add(Sequence::new(i, i, i, vec![i as u32 + 1; 128], 1000));
        }
        let pace = |decodes: usize, left: usize| if decodes > 0 { 8 } else { left };
        let mut steps = 0;
        while s.seqs.values().any(|q| !q.is_decoding()) {
            let b = s.schedule_paced(pace);
            s.commit(&b);
            for span in &b.spans {
                let q = s.get_mut(span.seq).unwrap();
                if q.num_computed == q.tokens.len() {
                    q.tokens.push(7);
                }
            }
            steps += 1;
            assert!(steps <= 4, "the burst is staggered by pacing");
        }
        // 1,536 prompt tokens in steps of 512, less the decodes that go first.
        assert_eq!(steps, 4);
        // A request that comes in once they stream is new work for them: paced.
        s.add(Sequence::new(12, 12, 12, vec![99; 300], 1000));
        let b = s.schedule_paced(|decodes, left| {
            assert_eq!(decodes, 12);
            pace(decodes, left)
        });
        assert_eq!(b.num_tokens(), 12 + 8);
    }

    #[test]
    fn prefix_hits_skip_computation_but_keep_the_last_token() {
        let mut s = sched(64, 512);
        let prompt: Vec<u32> = (0..40).collect();
        s.add(Sequence::new(1, 1, 1, prompt.clone(), 100));
        step(&mut s, 999);
        s.remove(1);
        assert_eq!(s.pool.used(), 0);
        assert_eq!(s.pool.cached_count(), 2, "two full blocks of 16 cached");
        // Same 32-token prefix, different tail.
        let mut p2 = prompt[..32].to_vec();
        p2.extend([7, 7, 7]);
        s.add(Sequence::new(2, 2, 2, p2, 100));
        let b = step(&mut s, 1);
        assert_eq!(b.spans[0].start, 32);
        assert_eq!(b.spans[0].len, 3);
        assert_eq!(s.counters.prefix_hit_tokens, 32);
        // Exactly a cached prompt: the last block is recomputed for its logits.
        s.add(Sequence::new(3, 3, 3, prompt[..32].to_vec(), 100));
        let b = step(&mut s, 1);
        let sp = b.spans.iter().find(|sp| sp.seq == 3).unwrap();
        assert_eq!((sp.start, sp.len), (16, 16));
    }

    #[test]
    fn preemption_frees_the_newest_and_everyone_finishes() {
        // 6 blocks of 16 tokens: not enough for three sequences growing to 40 tokens each.
        let mut s = sched(6, 64);
        for i in 0..3u64 {
            s.add(Sequence::new(i, i, i, vec![1; 10], 40));
        }
        let mut done = Vec::new();
        for _ in 0..500 {
            step(&mut s, 5);
            for i in 0..3u64 {
                if !done.contains(&i) && s.get(i).is_some_and(|q| q.tokens.len() >= 40) {
                    s.remove(i);
                    done.push(i);
                }
            }
            if done.len() == 3 {
                break;
            }
        }
        assert_eq!(done.len(), 3, "every sequence finished");
        assert!(s.counters.preemptions > 0);
        assert_eq!(s.pool.used(), 0);
    }

    #[test]
    fn forks_share_blocks_and_copy_the_partial_one_on_write() {
        let mut s = sched(16, 64);
        s.add(Sequence::new(1, 1, 1, vec![3; 20], 64));
        step(&mut s, 9); // prompt done: tokens = 20 + 1
        let mut child = s.get(1).unwrap().clone();
        child.id = 2;
        child.tokens.pop();
        child.tokens.push(8);
        s.add_fork(1, child);
        let table = |s: &Scheduler, id| s.get(id).unwrap().blocks.tables()[0].clone();
        let shared = table(&s, 1)[1];
        assert_eq!(s.pool.refcount(shared), 2);
        let b = step(&mut s, 4);
        assert_eq!(
            b.copies.len(),
            1,
            "one copy-on-write of the partly filled block"
        );
        assert_eq!(b.copies[0].0, shared);
        assert_ne!(table(&s, 1)[1], table(&s, 2)[1]);
        assert_eq!(table(&s, 1)[0], table(&s, 2)[0], "full block still shared");
        s.remove(1);
        s.remove(2);
        assert_eq!(s.pool.used(), 0);
    }

    /// A hybrid's sequences each hold a state slot while they run: with two slots a third
    /// prompt waits; a preempted or finished sequence hands its slot back; without snapshots,
    /// cached prefix blocks are never attached (they hold no state); a fork gets the parent's state copied into a
    /// slot of its own, or, with none free, waits to compute its prompt again.
    #[test]
    fn hybrid_sequences_hold_state_slots_while_they_run() {
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_seqs: 4,
                max_batched_tokens: 64,
            },
            BlockPool::new(32, 16),
            KvLayout::full(1),
        )
        .with_state_slots(2, 0);
        for i in 0..3u64 {
            s.add(Sequence::new(i, i, i, vec![7; 20], 64));
        }
        step(&mut s, 9);
        assert_eq!(
            (s.num_running(), s.num_waiting()),
            (2, 1),
            "two slots, two runners"
        );
        assert_eq!(s.state_slot_usage(), (2, 2));
        let slots: Vec<_> = (0..2)
            .map(|i| s.get(i).unwrap().state_slot.unwrap())
            .collect();
        assert_ne!(slots[0], slots[1]);

        // The same prompt again finds its blocks cached, and computes them anyway.
        s.remove(0);
        s.add(Sequence::new(5, 5, 5, vec![7; 20], 64));
        step(&mut s, 9);
        assert_eq!(s.get(2).unwrap().cached_tokens, 0);
        assert_eq!(s.state_slot_usage(), (2, 2));

        // A fork with no slot free waits, to compute its prompt again.
        let mut child = s.get(1).unwrap().clone();
        child.id = 6;
        s.add_fork(1, child);
        assert_eq!(s.get(6).unwrap().num_computed, 0);
        assert!(s.get(6).unwrap().state_slot.is_none());
        s.remove(2);
        // With one free, the next fork's state is copied before the next step.
        let mut child = s.get(1).unwrap().clone();
        child.id = 7;
        s.add_fork(1, child);
        let from = s.get(1).unwrap().state_slot.unwrap();
        let to = s.get(7).unwrap().state_slot.unwrap();
        let b = step(&mut s, 4);
        assert_eq!(b.state_copies, [(from, to)]);
        for id in [1, 5, 6, 7] {
            s.remove(id);
        }
        assert_eq!(s.state_slot_usage(), (0, 2));
        assert_eq!(s.pool.used(), 0);
    }

    /// A hybrid with snapshots: the state at a prompt's snapshot points (the stride and its
    /// last full block) is saved in the step whose chunk passes them; the same
    /// prompt again resumes after its last snapshot, the state restored into its slot before
    /// the step; a prompt that leaves the shared part earlier resumes at the last stride point
    /// it shares.
    #[test]
    fn a_hybrid_resumes_a_cached_prefix_from_a_state_snapshot() {
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_seqs: 4,
                max_batched_tokens: 100,
            },
            BlockPool::new(64, 16),
            KvLayout::full(1),
        )
        .with_state_slots(2, 16);
        let stride = crate::kv::SNAPSHOT_STRIDE_TOKENS;
        let prompt: Vec<u32> = (0..300).collect();
        s.add(Sequence::new(1, 1, 1, prompt.clone(), 400));
        let mut saves = Vec::new();
        while s.get(1).unwrap().num_computed < 300 {
            let b = step(&mut s, 9);
            let start = b.spans[0].start;
            saves.extend(b.state_saves.iter().map(|v| (start + v.after, v.to)));
        }
        // Chunks of 100; the last full block before token 299 ends at 288.
        let mut points: Vec<usize> = (1..).map(|i| i * stride).take_while(|&p| p < 288).collect();
        points.push(288);
        assert_eq!(saves.iter().map(|v| v.0).collect::<Vec<_>>(), points);
        assert_eq!(s.snapshot_usage(), (points.len(), 16));
        let at_288 = saves.last().unwrap().1;

        s.add(Sequence::new(2, 2, 2, prompt.clone(), 400));
        let b = step(&mut s, 9);
        let seq = s.get(2).unwrap();
        assert_eq!(seq.cached_tokens, 288);
        assert_eq!(b.state_copies, [(at_288, seq.state_slot.unwrap())]);
        assert_eq!(b.spans.iter().find(|sp| sp.seq == 2).unwrap().start, 288);

        // Shares 200 tokens: blocks up to 192 are cached, and resumes at the last stride
        // point of those.
        let mut other = prompt.clone();
        other[200] = 9999;
        s.remove(1);
        s.add(Sequence::new(3, 3, 3, other, 400));
        step(&mut s, 9);
        assert_eq!(s.get(3).unwrap().cached_tokens, 192 / stride * stride);
        for id in [2, 3] {
            s.remove(id);
        }
        assert_eq!((s.state_slot_usage(), s.pool.used()), ((0, 2), 0));
    }
}
