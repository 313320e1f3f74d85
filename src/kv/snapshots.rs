//! The prefix cache's recurrent-state snapshots (a hybrid model's): the state a sequence had
//! after a cached prefix, kept in state slots of their own beside the running sequences'
//! slots, so that a prompt starting with that prefix resumes there instead of from position 0
//! (a recurrent state cannot be rebuilt from the K/V pages). Keyed by the chained hash of the
//! prefix's last block, as the K/V blocks are; the least recently used snapshot goes first
//! when a new one needs its slot. This is the index only: the scheduler plans the copies
//! (save after a step, restore before one) and the executor makes them.

use super::lru::LruList;
use std::collections::HashMap;

/// Snapshots are taken where a sequence's computed tokens reach a multiple of this (and at
/// its prompt's last full block): denser points let more of a shared prefix be reused, at
/// more snapshots per prompt. A prompt chunk of a hybrid is cut to end at such a point.
pub const SNAPSHOT_STRIDE_TOKENS: usize = 64;

/// The most snapshots kept, whatever the memory budget (a model with a tiny state would
/// otherwise get a map of millions).
pub const MAX_SNAPSHOTS: usize = 4096;

/// How many snapshots of `state_bytes` each a budget of `budget_bytes` holds.
pub fn snapshot_count(budget_bytes: usize, state_bytes: usize) -> usize {
    budget_bytes
        .checked_div(state_bytes)
        .unwrap_or(0)
        .min(MAX_SNAPSHOTS)
}

#[derive(Debug)]
pub struct StateSnapshots {
    /// The state slot of snapshot 0 (snapshot slots follow the running sequences' slots).
    first_slot: u32,
    by_hash: HashMap<u64, u32>,
    /// Per snapshot, the hash it is kept under (when it is kept).
    hash_of: Vec<Option<u64>>,
    /// Kept snapshots, least recently used first.
    lru: LruList,
    /// Snapshots neither kept nor reserved.
    free: Vec<u32>,
}

impl StateSnapshots {
    /// `count` snapshots in state slots `first_slot..first_slot + count`.
    pub fn new(first_slot: u32, count: usize) -> StateSnapshots {
        StateSnapshots {
            first_slot,
            by_hash: HashMap::new(),
            hash_of: vec![None; count],
            lru: LruList::new(count),
            free: (0..count as u32).rev().collect(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.hash_of.len()
    }

    /// Snapshots kept.
    pub fn len(&self) -> usize {
        self.lru.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lru.len() == 0
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.by_hash.contains_key(&hash)
    }

    /// The state slot holding the snapshot kept under `hash`, now the most recently used.
    pub fn take_hit(&mut self, hash: u64) -> Option<u32> {
        let &i = self.by_hash.get(&hash)?;
        self.lru.remove(i);
        self.lru.push_back(i);
        Some(self.first_slot + i)
    }

    /// A state slot for a snapshot about to be saved: a free one, or the least recently used
    /// snapshot's (forgotten now). `None` when every snapshot is reserved.
    pub fn reserve(&mut self) -> Option<u32> {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                let i = self.lru.pop_front()?;
                let hash = self.hash_of[i as usize].take().expect("kept under a hash");
                self.by_hash.remove(&hash);
                i
            }
        };
        Some(self.first_slot + i)
    }

    /// The reserved `slot` now holds the state after the prefix whose last block hashes to
    /// `hash` (if another snapshot got that hash meanwhile, the slot goes back instead).
    pub fn keep(&mut self, slot: u32, hash: u64) {
        let i = slot - self.first_slot;
        if self.by_hash.contains_key(&hash) {
            self.free.push(i);
            return;
        }
        self.by_hash.insert(hash, i);
        self.hash_of[i as usize] = Some(hash);
        self.lru.push_back(i);
    }

    /// A reserved `slot` whose save did not happen (the step failed or its sequence left).
    pub fn unreserve(&mut self, slot: u32) {
        self.free.push(slot - self.first_slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshots_are_kept_by_hash_and_the_least_recently_used_goes_first() {
        let mut s = StateSnapshots::new(4, 2);
        assert_eq!(snapshot_count(10 << 20, 1 << 20), 10);
        assert_eq!(snapshot_count(1 << 40, 1), MAX_SNAPSHOTS);
        assert_eq!(snapshot_count(1 << 20, 0), 0);
        let a = s.reserve().unwrap();
        s.keep(a, 100);
        let b = s.reserve().unwrap();
        s.keep(b, 200);
        assert!((4..6).contains(&a) && (4..6).contains(&b) && a != b);
        // 100 is used again, so 200 is the one a third snapshot replaces.
        assert_eq!(s.take_hit(100), Some(a));
        assert_eq!(s.reserve(), Some(b));
        assert!(!s.contains(200) && s.contains(100));
        assert_eq!(s.len(), 1);
        // Both reserved or kept: a reservation takes the kept one; a failed save frees it.
        let c = s.reserve().unwrap();
        assert_eq!(c, a);
        assert_eq!(s.reserve(), None);
        s.unreserve(c);
        s.keep(b, 300);
        // A second snapshot under a kept hash is not kept twice.
        let d = s.reserve().unwrap();
        s.keep(d, 300);
        assert_eq!((s.len(), s.take_hit(300)), (1, Some(b)));
        assert_eq!(s.take_hit(100), None);
    }
}
