//! Block bookkeeping with automatic prefix caching (vLLM's design).
//!
//! - Every block has a reference count: the number of block tables holding it.
//! - A full block can carry a hash chained over (parent block's hash, its tokens); a map from
//!   (hash, KV group) to block lets a new prompt reuse blocks an earlier one computed. A hit is
//!   checked against the block's stored tokens and group, so a hash collision can never serve
//!   wrong KV. (Each KV group of a model with attention windows has its own blocks for the same
//!   tokens: see `layout`.)
//! - Free blocks (refcount 0) sit in an LRU queue. A freed block keeps its hash and can still
//!   be hit; it is only evicted, lazily, when the queue hands it out for new data.
//!
//! Pure bookkeeping over block ids: the bytes live in [`super::KvPages`].

use super::layout::NO_BLOCK;
use super::lru::LruList;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    refcount: u32,
    /// Set while the block is registered in the prefix cache.
    hash: Option<u64>,
    /// The tokens a cached block holds and its KV group (to re-check hits).
    tokens: Vec<u32>,
    group: usize,
}

#[derive(Debug, Clone)]
pub struct BlockPool {
    blocks: Vec<BlockMeta>,
    free: LruList,
    /// (chained hash, group) → block.
    cached: HashMap<(u64, usize), u32>,
    block_size: usize,
}

/// The hash identifying a full block: chained over its parent's hash, so equal tokens at
/// different prefixes never collide into one identity.
pub fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockPool {
    pub fn new(blocks: usize, block_size: usize) -> BlockPool {
        assert!(blocks < u32::MAX as usize, "block ids are u32");
        let mut free = LruList::new(blocks);
        for b in 0..blocks as u32 {
            free.push_back(b);
        }
        BlockPool {
            blocks: vec![BlockMeta::default(); blocks],
            free,
            cached: HashMap::new(),
            block_size,
        }
    }

    pub fn total(&self) -> usize {
        self.blocks.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Blocks referenced by at least one block table.
    pub fn used(&self) -> usize {
        self.total() - self.free_count()
    }

    /// Blocks registered in the prefix cache (in use or free).
    pub fn cached_count(&self) -> usize {
        self.cached.len()
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn refcount(&self, block: u32) -> u32 {
        self.blocks[block as usize].refcount
    }

    /// Takes the least recently freed block for new data (refcount 1), evicting its cached
    /// identity; `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.free.pop_front()?;
        let meta = &mut self.blocks[b as usize];
        debug_assert_eq!(meta.refcount, 0);
        if let Some(h) = meta.hash.take() {
            self.cached.remove(&(h, meta.group));
            meta.tokens.clear();
        }
        meta.refcount = 1;
        Some(b)
    }

    /// Adds a reference (a fork sharing the block).
    pub fn retain(&mut self, block: u32) {
        let meta = &mut self.blocks[block as usize];
        assert!(meta.refcount > 0, "retain of free block {block}");
        meta.refcount += 1;
    }

    /// Drops one reference; at zero the block joins the back of the free queue, keeping its
    /// cached identity until it is reused.
    pub fn release(&mut self, block: u32) {
        let meta = &mut self.blocks[block as usize];
        assert!(
            meta.refcount > 0,
            "block {block} released more often than referenced"
        );
        meta.refcount -= 1;
        if meta.refcount == 0 {
            self.free.push_back(block);
        }
    }

    /// Releases a whole block table, last block first: a sequence's tail is the least likely
    /// to be shared, so it should be evicted first. [`NO_BLOCK`] entries hold nothing.
    pub fn release_all(&mut self, table: &[u32]) {
        for &b in table.iter().rev() {
            if b != NO_BLOCK {
                self.release(b);
            }
        }
    }

    /// The cached block of `group` holding `tokens` under `hash`, if any (no reference taken).
    pub fn peek(&self, hash: u64, group: usize, tokens: &[u32]) -> Option<u32> {
        let &b = self.cached.get(&(hash, group))?;
        let meta = &self.blocks[b as usize];
        // A hash collision: never serve another prompt's KV.
        (meta.tokens == tokens && meta.group == group).then_some(b)
    }

    /// Looks a full block up by hash; on a verified hit the caller gets a reference to it.
    pub fn lookup(&mut self, hash: u64, group: usize, tokens: &[u32]) -> Option<u32> {
        let b = self.peek(hash, group, tokens)?;
        let meta = &mut self.blocks[b as usize];
        if meta.refcount == 0 {
            self.free.remove(b);
        }
        meta.refcount += 1;
        Some(b)
    }

    /// Registers a block of `group` that now holds `tokens` (a full block) under `hash`. If
    /// another block already has that identity, this one simply stays uncached.
    pub fn register(&mut self, block: u32, hash: u64, group: usize, tokens: &[u32]) {
        debug_assert_eq!(tokens.len(), self.block_size);
        let meta = &mut self.blocks[block as usize];
        if meta.hash.is_some() || self.cached.contains_key(&(hash, group)) {
            return;
        }
        meta.hash = Some(hash);
        meta.tokens = tokens.to_vec();
        meta.group = group;
        self.cached.insert((hash, group), block);
    }

    /// The cached blocks, hottest first: those in use, then the free ones from the most
    /// recently freed (the last to be evicted); each with its identity, KV group and tokens.
    pub fn cached_hottest_first(&self) -> Vec<(u32, u64, usize, &[u32])> {
        let in_use = (0..self.total() as u32).filter(|&b| self.refcount(b) > 0);
        let free: Vec<u32> = self.free.iter().collect();
        in_use
            .chain(free.into_iter().rev())
            .filter_map(|b| {
                let m = &self.blocks[b as usize];
                m.hash.map(|h| (b, h, m.group, m.tokens.as_slice()))
            })
            .collect()
    }

    /// Puts a saved block back in the cache: takes a free block, lets `fill` write its pages,
    /// registers it under `hash` and frees it again (the most recently freed). False when its
    /// identity is already cached, no block is free, or `fill` fails.
    pub fn restore(
        &mut self,
        hash: u64,
        group: usize,
        tokens: &[u32],
        fill: impl FnOnce(u32) -> bool,
    ) -> bool {
        if tokens.len() != self.block_size || self.cached.contains_key(&(hash, group)) {
            return false;
        }
        let Some(b) = self.allocate() else {
            return false;
        };
        let filled = fill(b);
        if filled {
            self.register(b, hash, group, tokens);
        }
        self.release(b);
        filled
    }

    /// Checks every structural invariant; `tables` are all live block tables. Used by tests.
    pub fn check_invariants<'a>(
        &self,
        tables: impl IntoIterator<Item = &'a [u32]>,
    ) -> Result<(), String> {
        let mut refs = vec![0u32; self.total()];
        for t in tables {
            for &b in t.iter().filter(|&&b| b != NO_BLOCK) {
                refs[b as usize] += 1;
            }
        }
        for (b, meta) in self.blocks.iter().enumerate() {
            if meta.refcount != refs[b] {
                return Err(format!(
                    "block {b}: refcount {} but {} table references",
                    meta.refcount, refs[b]
                ));
            }
            let in_free = self.free.contains(b as u32);
            if in_free == (meta.refcount > 0) {
                return Err(format!(
                    "block {b}: refcount {} and in free queue = {in_free}",
                    meta.refcount
                ));
            }
            if let Some(h) = meta.hash {
                if self.cached.get(&(h, meta.group)) != Some(&(b as u32)) {
                    return Err(format!("block {b}: hash not mapped back to it"));
                }
                if meta.tokens.len() != self.block_size {
                    return Err(format!(
                        "block {b}: cached with {} tokens",
                        meta.tokens.len()
                    ));
                }
            }
        }
        for (&(h, _), &b) in &self.cached {
            if self.blocks[b as usize].hash != Some(h) {
                return Err(format!("cache entry for block {b} has a stale hash"));
            }
        }
        if self.free.len() + refs.iter().filter(|&&r| r > 0).count() != self.total() {
            return Err("free + used != total".into());
        }
        Ok(())
    }

    /// Whether a cached block's stored tokens hash to its identity given its parent (tests).
    pub fn cached_tokens(&self, block: u32) -> Option<(u64, &[u32])> {
        let m = &self.blocks[block as usize];
        m.hash.map(|h| (h, m.tokens.as_slice()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restored_blocks_are_hits_and_come_back_hottest_first() {
        let mut p = BlockPool::new(4, 2);
        let (a, b) = (block_hash(None, &[1, 2]), block_hash(Some(7), &[3, 4]));
        assert!(p.restore(b, 0, &[3, 4], |_| true));
        assert!(p.restore(a, 0, &[1, 2], |_| true));
        assert!(!p.restore(a, 0, &[1, 2], |_| true), "already cached");
        assert!(!p.restore(9, 0, &[5, 6], |_| false), "not filled");
        assert_eq!(p.cached_count(), 2);
        let order: Vec<u64> = p.cached_hottest_first().iter().map(|c| c.1).collect();
        assert_eq!(order, [a, b]);
        assert!(p.lookup(a, 0, &[1, 2]).is_some());
    }

    #[test]
    fn allocate_until_empty_then_release() {
        let mut p = BlockPool::new(3, 16);
        let ids: Vec<u32> = (0..3).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        assert!(p.allocate().is_none());
        p.release(1);
        assert_eq!(p.used(), 2);
        assert_eq!(p.allocate(), Some(1));
    }

    #[test]
    fn freed_blocks_stay_hittable_until_evicted_lru_first() {
        let mut p = BlockPool::new(2, 2);
        let a = p.allocate().unwrap();
        let b = p.allocate().unwrap();
        let (ha, hb) = (block_hash(None, &[1, 2]), block_hash(Some(7), &[3, 4]));
        p.register(a, ha, 0, &[1, 2]);
        p.register(b, hb, 0, &[3, 4]);
        p.release(a); // a freed first: evicted first
        p.release(b);
        assert_eq!(p.lookup(hb, 0, &[3, 4]), Some(b), "free but still cached");
        assert_eq!(p.lookup(hb, 0, &[9, 9]), None, "tokens re-checked");
        assert_eq!(p.lookup(hb, 1, &[3, 4]), None, "another group's block");
        let c = p.allocate().unwrap();
        assert_eq!(c, a, "LRU: the older free block is reused");
        assert_eq!(p.lookup(ha, 0, &[1, 2]), None, "evicted on reuse");
        p.check_invariants([&[b][..], &[c][..]]).unwrap();
    }

    #[test]
    fn chained_hash_depends_on_parent() {
        assert_ne!(block_hash(None, &[1, 2]), block_hash(Some(1), &[1, 2]));
        assert_eq!(block_hash(Some(5), &[1, 2]), block_hash(Some(5), &[1, 2]));
    }
}
