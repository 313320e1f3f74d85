//! A hybrid model's recurrent state, as the scheduler hands it out: one state slot per
//! running sequence (a sequence that finds none free waits), the parent's state copied for a
//! fork, and the prefix cache's state snapshots (`kv::StateSnapshots`). A snapshot is written
//! by the forward pass where a span passes a snapshot point, and restored into a sequence's
//! slot before the step that resumes after its cached prefix.

use super::{ScheduledBatch, Scheduler};
use crate::engine::sequence::{SeqId, Sequence};
use crate::kv::{StateSnapshots, SNAPSHOT_STRIDE_TOKENS};

/// Which recurrent-state slots are free, the fork copies the next step must make first, and
/// the snapshots kept in the slots after the running sequences'.
#[derive(Debug)]
pub(super) struct StateSlotPool {
    total: usize,
    free: Vec<u32>,
    pub(super) copies: Vec<(u32, u32)>,
    snapshots: StateSnapshots,
}

/// In the step, sequence `seq`'s state after the first `after` tokens of its span goes into
/// snapshot slot `to`: the state after the prefix whose last block hashes to `hash`.
#[derive(Clone, Debug, PartialEq)]
pub struct StateSave {
    pub seq: SeqId,
    pub after: usize,
    pub to: u32,
    pub hash: u64,
}

impl Scheduler {
    /// For a hybrid model: `n` recurrent-state slots, one per running sequence, then
    /// `snapshots` slots for the prefix cache's state snapshots (slots `n..n + snapshots`).
    /// Without snapshots such a model's sequences never start from cached prefix blocks.
    pub fn with_state_slots(mut self, n: usize, snapshots: usize) -> Scheduler {
        self.slots = (n > 0).then(|| StateSlotPool {
            total: n,
            free: (0..n as u32).rev().collect(),
            copies: Vec::new(),
            snapshots: StateSnapshots::new(n as u32, snapshots),
        });
        self
    }

    /// Whether sequences hold recurrent-state slots (a hybrid model).
    pub fn has_state_slots(&self) -> bool {
        self.slots.is_some()
    }

    /// (slots in use, slots in all); (0, 0) for a model without recurrent state.
    pub fn state_slot_usage(&self) -> (usize, usize) {
        self.slots
            .as_ref()
            .map_or((0, 0), |p| (p.total - p.free.len(), p.total))
    }

    /// (snapshots kept, snapshots the budget holds).
    pub fn snapshot_usage(&self) -> (usize, usize) {
        self.slots
            .as_ref()
            .map_or((0, 0), |p| (p.snapshots.len(), p.snapshots.capacity()))
    }

    /// Gives `id` a state slot if it needs one and has none; false when none is free.
    pub(super) fn take_slot(&mut self, id: SeqId) -> bool {
        let Some(pool) = self.slots.as_mut() else {
            return true;
        };
        let s = self.seqs.get_mut(&id).expect("seq exists");
        if s.state_slot.is_some() {
            return true;
        }
        match pool.free.pop() {
            Some(slot) => {
                s.state_slot = Some(slot);
                true
            }
            None => false,
        }
    }

    /// Hands `seq`'s state slot back.
    pub(super) fn release_slot(slots: &mut Option<StateSlotPool>, seq: &mut Sequence) {
        if let (Some(pool), Some(slot)) = (slots.as_mut(), seq.state_slot.take()) {
            pool.free.push(slot);
        }
    }

    /// A free slot for a fork, its parent's state to be copied there before the next step;
    /// `None` when none is free (or the model has no state: `Some(None)`).
    pub(super) fn fork_slot(&mut self, parent: SeqId) -> Option<Option<u32>> {
        let Some(pool) = self.slots.as_mut() else {
            return Some(None);
        };
        let slot = pool.free.pop()?;
        let from = self.seqs[&parent]
            .state_slot
            .expect("a running hybrid sequence has a slot");
        pool.copies.push((from, slot));
        Some(Some(slot))
    }

    /// Whether prefix-cache hits are possible: always for a model that only attends; for a
    /// hybrid, only with room for snapshots.
    pub(super) fn caches_prefixes(&self) -> bool {
        self.slots
            .as_ref()
            .is_none_or(|p| p.snapshots.capacity() > 0)
    }

    /// Whether the state after `s`'s first `p` tokens is snapshotted: at every multiple of
    /// the stride, and at its last full block before its last token (where a repeat of the
    /// whole prompt resumes).
    fn is_snapshot_point(&self, s: &Sequence, p: usize) -> bool {
        let bt = self.pool.block_size();
        let stride = SNAPSHOT_STRIDE_TOKENS.div_ceil(bt) * bt;
        let last = (s.tokens.len().saturating_sub(1) / bt) * bt;
        p > 0 && p.is_multiple_of(bt) && (p.is_multiple_of(stride) || p == last)
    }

    /// For each snapshot point a span of `batch` passes (or ends at) that is not kept yet, a
    /// slot for the state there (the least recently used snapshot's, if need be): the
    /// forward pass writes it as it goes, so prompt chunks need not end at the points.
    pub(super) fn plan_state_saves(&mut self, batch: &mut ScheduledBatch) {
        if self
            .slots
            .as_ref()
            .is_none_or(|p| p.snapshots.capacity() == 0)
        {
            return;
        }
        let bt = self.pool.block_size();
        for span in &batch.spans {
            let end = span.start + span.len - span.draft;
            for p in (span.start + 1..=end).filter(|p| p.is_multiple_of(bt)) {
                if !self.is_snapshot_point(&self.seqs[&span.seq], p) {
                    continue;
                }
                let s = self.seqs.get_mut(&span.seq).expect("scheduled seq exists");
                let hash = s.hash_of_block(p / bt - 1, bt);
                let pool = self.slots.as_mut().expect("checked above");
                let planned = batch.state_saves.iter().any(|v| v.hash == hash);
                if pool.snapshots.contains(hash) || planned {
                    continue;
                }
                let Some(to) = pool.snapshots.reserve() else {
                    return;
                };
                batch.state_saves.push(StateSave {
                    seq: span.seq,
                    after: p - span.start,
                    to,
                    hash,
                });
            }
        }
    }

    /// The step ran: its saved states are kept as snapshots.
    pub(super) fn keep_state_saves(&mut self, batch: &ScheduledBatch) {
        if let Some(pool) = self.slots.as_mut() {
            for save in &batch.state_saves {
                pool.snapshots.keep(save.to, save.hash);
            }
        }
    }

    /// The step failed: its saves may not have happened, and their slots are free again.
    pub fn abandon_state_saves(&mut self, batch: &ScheduledBatch) {
        if let Some(pool) = self.slots.as_mut() {
            for save in &batch.state_saves {
                pool.snapshots.unreserve(save.to);
            }
        }
    }

    /// Whether a hybrid's sequence `s` may resume after its first `k` blocks: a snapshot of the
    /// state there is kept. Always for a model that only attends.
    pub(super) fn resumable(&self, s: &Sequence, k: usize) -> bool {
        self.slots
            .as_ref()
            .is_none_or(|p| p.snapshots.contains(s.block_hashes[k - 1]))
    }

    /// `id` resumes after `blocks` cached blocks: a hybrid's state there is copied from its
    /// snapshot into the sequence's slot before the step.
    pub(super) fn restore_state(&mut self, id: SeqId, blocks: usize, batch: &mut ScheduledBatch) {
        let (Some(pool), Some(s)) = (self.slots.as_mut(), self.seqs.get(&id)) else {
            return;
        };
        if blocks == 0 {
            return;
        }
        let from = pool
            .snapshots
            .take_hit(s.block_hashes[blocks - 1])
            .expect("attached only where a snapshot is kept");
        let to = s
            .state_slot
            .expect("an admitted hybrid sequence has a slot");
        batch.state_copies.push((from, to));
    }
}
