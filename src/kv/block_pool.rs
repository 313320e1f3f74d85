//! Block bookkeeping: which blocks are free, and how many block tables reference each.
//!
//! Pure bookkeeping over block ids; the bytes live in [`super::KvPages`].

#[derive(Debug)]
pub struct BlockPool {
    refcount: Vec<u32>,
    free: Vec<u32>,
    block_tokens: usize,
}

impl BlockPool {
    pub fn new(blocks: usize, block_tokens: usize) -> BlockPool {
        BlockPool {
            refcount: vec![0; blocks],
            // Pop from the end: hand out low ids first (nicer to read in logs and tests).
            free: (0..blocks as u32).rev().collect(),
            block_tokens,
        }
    }

    pub fn total(&self) -> usize {
        self.refcount.len()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn used(&self) -> usize {
        self.total() - self.free_count()
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    pub fn refcount(&self, block: u32) -> u32 {
        self.refcount[block as usize]
    }

    /// Takes a free block (refcount 1), or `None` when the pool is exhausted.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.free.pop()?;
        debug_assert_eq!(self.refcount[b as usize], 0);
        self.refcount[b as usize] = 1;
        Some(b)
    }

    /// Drops one reference; the block returns to the free list at zero.
    pub fn release(&mut self, block: u32) {
        let rc = &mut self.refcount[block as usize];
        assert!(*rc > 0, "block {block} released more often than referenced");
        *rc -= 1;
        if *rc == 0 {
            self.free.push(block);
        }
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
