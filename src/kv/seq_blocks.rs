//! One sequence's blocks: a block table per KV group, and the rules for growing, sharing and
//! releasing them. The scheduler and the single-sequence session both go through here, so the
//! window rule (blocks behind a group's window go back to the pool) lives in one place.

use super::layout::{KvLayout, NO_BLOCK};
use super::BlockPool;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeqBlocks {
    /// Per KV group, the blocks holding positions 0.. in order ([`NO_BLOCK`] where a windowed
    /// group holds nothing any more).
    tables: Vec<Vec<u32>>,
}

impl SeqBlocks {
    pub fn new(groups: usize) -> SeqBlocks {
        SeqBlocks {
            tables: vec![Vec::new(); groups],
        }
    }

    pub fn tables(&self) -> &[Vec<u32>] {
        &self.tables
    }

    /// Holds no block table entry at all (never admitted, or released).
    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(|t| t.is_empty())
    }

    /// Blocks [`Self::grow`] would take from the pool to cover positions `start..start + len`.
    pub fn blocks_needed(
        &self,
        pool: &BlockPool,
        layout: &KvLayout,
        start: usize,
        len: usize,
    ) -> usize {
        let bt = pool.block_size();
        let need = (start + len).div_ceil(bt);
        let first = start / bt;
        let mut n = 0;
        for (g, table) in self.tables.iter().enumerate() {
            let keep_from = layout.first_needed_block(g, start, bt);
            n += (table.len()..need).filter(|&b| b >= keep_from).count();
            if first < table.len() && table[first] != NO_BLOCK && pool.refcount(table[first]) > 1 {
                n += 1;
            }
        }
        n
    }

    /// Makes room for positions `start..start + len`: releases the blocks no position from
    /// `start` on reads, gives a shared, partly filled block a private copy (copy-on-write:
    /// `(from, to)` goes to `copies`), and allocates the new blocks. The caller checked that
    /// the pool has [`Self::blocks_needed`] free blocks.
    pub fn grow(
        &mut self,
        pool: &mut BlockPool,
        layout: &KvLayout,
        start: usize,
        len: usize,
        copies: &mut Vec<(u32, u32)>,
    ) {
        let bt = pool.block_size();
        let need = (start + len).div_ceil(bt);
        let first = start / bt;
        for (g, table) in self.tables.iter_mut().enumerate() {
            let keep_from = layout.first_needed_block(g, start, bt);
            for slot in table.iter_mut().take(keep_from) {
                if *slot != NO_BLOCK {
                    pool.release(*slot);
                    *slot = NO_BLOCK;
                }
            }
            if first < table.len() && table[first] != NO_BLOCK && pool.refcount(table[first]) > 1 {
                let old = table[first];
                let fresh = pool.allocate().expect("counted by blocks_needed");
                copies.push((old, fresh));
                pool.release(old);
                table[first] = fresh;
            }
            while table.len() < need {
                let b = if table.len() < keep_from {
                    NO_BLOCK
                } else {
                    pool.allocate().expect("counted by blocks_needed")
                };
                table.push(b);
            }
        }
    }

    /// Returns every block (the sequence keeps nothing).
    pub fn release_all(&mut self, pool: &mut BlockPool) {
        for table in &mut self.tables {
            pool.release_all(table);
            table.clear();
        }
    }

    /// A second owner of the same blocks (a fork): every block gains a reference.
    pub fn share(&self, pool: &mut BlockPool) -> SeqBlocks {
        for &b in self.tables.iter().flatten().filter(|&&b| b != NO_BLOCK) {
            pool.retain(b);
        }
        self.clone()
    }

    /// Reuses cached full blocks for the start of `tokens`: the longest run of `k` leading blocks
    /// (at most `max_blocks`) for which every group has what computing position `k·bt` needs:
    /// all of them in a group without a window, the ones inside the window otherwise.
    /// `hashes[i]` is block i's chained hash; `resumable(k)` says whether a sequence may resume
    /// after `k` blocks at all (a hybrid's only where a state snapshot was kept). Returns `k`;
    /// the tables must be empty.
    pub fn attach_prefix(
        &mut self,
        pool: &mut BlockPool,
        layout: &KvLayout,
        hashes: &[u64],
        tokens: &[u32],
        max_blocks: usize,
        resumable: impl Fn(usize) -> bool,
    ) -> usize {
        debug_assert!(self.is_empty());
        let bt = pool.block_size();
        let max_blocks = max_blocks.min(hashes.len()).min(tokens.len() / bt);
        let block_size = |i: usize| &tokens[i * bt..(i + 1) * bt];
        // missing[g][i]: blocks among the first i that group g does not have cached.
        let missing: Vec<Vec<usize>> = (0..layout.num_groups())
            .map(|g| {
                let mut m = vec![0; max_blocks + 1];
                for i in 0..max_blocks {
                    let absent = pool.peek(hashes[i], g, block_size(i)).is_none();
                    m[i + 1] = m[i] + usize::from(absent);
                }
                m
            })
            .collect();
        let fits = |k: usize| {
            (0..layout.num_groups()).all(|g| {
                let from = layout.first_needed_block(g, k * bt, bt).min(k);
                missing[g][k] == missing[g][from]
            })
        };
        let Some(k) = (1..=max_blocks).rev().find(|&k| resumable(k) && fits(k)) else {
            return 0;
        };
        for (g, table) in self.tables.iter_mut().enumerate() {
            let from = layout.first_needed_block(g, k * bt, bt).min(k);
            table.resize(from, NO_BLOCK);
            for (i, &hash) in hashes.iter().enumerate().take(k).skip(from) {
                let b = pool
                    .lookup(hash, g, block_size(i))
                    .expect("checked present above");
                table.push(b);
            }
        }
        k
    }

    /// Registers blocks `blocks` (now full) in the prefix cache, in every group that holds them.
    pub fn register_full(
        &self,
        pool: &mut BlockPool,
        blocks: std::ops::Range<usize>,
        hashes: &[u64],
        tokens: &[u32],
    ) {
        let bt = pool.block_size();
        for (g, table) in self.tables.iter().enumerate() {
            for i in blocks.clone() {
                if let Some(&b) = table.get(i).filter(|&&b| b != NO_BLOCK) {
                    pool.register(b, hashes[i], g, &tokens[i * bt..(i + 1) * bt]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::block_hash;

    fn windowed() -> KvLayout {
        // Two groups: one full, one with a window of 8 positions.
        KvLayout::new(&[None, Some(8)])
    }

    fn hashes(tokens: &[u32], bt: usize) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for c in tokens.chunks_exact(bt) {
            out.push(block_hash(out.last().copied(), c));
        }
        out
    }

    #[test]
    fn windowed_groups_release_blocks_behind_the_window() {
        let layout = windowed();
        let mut pool = BlockPool::new(64, 4);
        let mut s = SeqBlocks::new(2);
        let mut copies = Vec::new();
        let mut pos = 0;
        for len in [10, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] {
            let need = s.blocks_needed(&pool, &layout, pos, len);
            let used = pool.used();
            s.grow(&mut pool, &layout, pos, len, &mut copies);
            assert!(pool.used() <= used + need, "took more blocks than counted");
            pos += len;
        }
        // 20 positions: the full group holds 5 blocks; the windowed one only those reaching
        // position 20 - 8 + 1 = 13 and on (blocks 3 and 4; blocks 0..3 released).
        assert_eq!(s.tables()[0].len(), 5);
        assert_eq!(&s.tables()[1][..3], &[NO_BLOCK; 3]);
        assert!(s.tables()[1][3..].iter().all(|&b| b != NO_BLOCK));
        pool.check_invariants(s.tables().iter().map(|t| t.as_slice()))
            .unwrap();
        s.release_all(&mut pool);
        assert_eq!(pool.used(), 0);
        assert!(copies.is_empty());
    }

    #[test]
    fn a_cached_prefix_needs_only_the_window_of_a_windowed_group() {
        let layout = windowed();
        let bt = 4;
        // A pool so small that the windowed group's released blocks are soon reused.
        let mut pool = BlockPool::new(12, bt);
        let tokens: Vec<u32> = (0..40).collect();
        let h = hashes(&tokens, bt);
        let mut a = SeqBlocks::new(2);
        let mut copies = Vec::new();
        for i in 0..8 {
            a.grow(&mut pool, &layout, i * bt, bt, &mut copies);
            a.register_full(&mut pool, i..i + 1, &h, &tokens);
        }
        a.release_all(&mut pool);
        // Position 32 reads 25.. (blocks 6 and 7) in the windowed group: those are still
        // cached, so the whole 8-block prefix hits although blocks 0..4 of that group are gone.
        let mut b = SeqBlocks::new(2);
        assert_eq!(
            b.attach_prefix(&mut pool, &layout, &h, &tokens, 8, |_| true),
            8
        );
        assert_eq!(b.tables()[0].len(), 8);
        assert_eq!(&b.tables()[1][..6], &[NO_BLOCK; 6]);
        b.release_all(&mut pool);
        // A prompt that leaves the first one after 3 blocks: the full group would give 3, but
        // the windowed group no longer has the blocks positions 12, 8 or 4 read: no hit.
        let mut other = tokens.clone();
        other[13] = 999;
        let h2 = hashes(&other, bt);
        let mut c = SeqBlocks::new(2);
        assert_eq!(
            c.attach_prefix(&mut pool, &layout, &h2, &other, 8, |_| true),
            0
        );
        assert!(c.is_empty());
        assert_eq!(pool.used(), 0);
    }
}
