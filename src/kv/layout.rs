//! Which layers share a block table: KV cache groups (vLLM's hybrid allocator).
//!
//! A layer with an attention window only ever reads the last `window` positions, so the blocks
//! behind its window can go back to the pool. Layers are grouped by window; every group has the
//! same number of layers (so every block has the same size and all groups draw from one pool),
//! and each sequence keeps one block table per group. A model without windows is one group of
//! every layer, which is the plain paged cache.
//!
//! Gemma 3 270M: 15 local layers (window 512) and 3 global ones make 6 groups of 3 layers,
//! 5 of them windowed: a long sequence holds its global blocks in full and about 33 blocks in
//! each windowed group.

use serde::Serialize;

/// A block-table entry for a block a windowed group no longer holds (or never held).
pub const NO_BLOCK: u32 = u32::MAX;

/// The `layer_slot` of a layer that keeps no KV (no group, no index).
pub const NO_SLOT: (usize, usize) = (usize::MAX, usize::MAX);

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvGroup {
    /// The model layers in this group, in order; layer `layers[i]` is the group's layer `i`.
    pub layers: Vec<usize>,
    /// Positions a query sees, itself included (`None`: all of them).
    pub window: Option<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct KvLayout {
    pub groups: Vec<KvGroup>,
    /// For each model layer: (group, index within the group).
    #[serde(skip)]
    pub layer_slot: Vec<(usize, usize)>,
}

impl KvLayout {
    /// Groups layers by their window (`windows[layer]`): as few groups as possible with the
    /// same number of layers each.
    pub fn new(windows: &[Option<usize>]) -> KvLayout {
        KvLayout::of_layers(&windows.iter().map(|&w| Some(w)).collect::<Vec<_>>())
    }

    /// [`KvLayout::new`] over the layers that attend: `layers[l]` is layer l's window, or
    /// `None` for a layer that keeps no KV (a hybrid's recurrent layers), which no group holds
    /// and whose `layer_slot` is [`NO_SLOT`].
    pub fn of_layers(layers: &[Option<Option<usize>>]) -> KvLayout {
        let mut classes: Vec<(Option<usize>, Vec<usize>)> = Vec::new();
        for (layer, w) in layers.iter().enumerate() {
            let Some(w) = *w else { continue };
            match classes.iter_mut().find(|(cw, _)| *cw == w) {
                Some((_, layers)) => layers.push(layer),
                None => classes.push((w, vec![layer])),
            }
        }
        let size = classes.iter().fold(0, |g, (_, l)| gcd(g, l.len())).max(1);
        let mut groups = Vec::new();
        for (window, layers) in classes {
            for chunk in layers.chunks(size) {
                groups.push(KvGroup {
                    layers: chunk.to_vec(),
                    window,
                });
            }
        }
        let mut layer_slot = vec![NO_SLOT; layers.len()];
        for (g, group) in groups.iter().enumerate() {
            for (i, &layer) in group.layers.iter().enumerate() {
                layer_slot[layer] = (g, i);
            }
        }
        KvLayout { groups, layer_slot }
    }

    /// One group of `layers` layers and no window: the plain paged cache.
    pub fn full(layers: usize) -> KvLayout {
        KvLayout::new(&vec![None; layers])
    }

    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Layers of each group (the layers a block holds).
    pub fn layers_per_group(&self) -> usize {
        self.groups.first().map_or(0, |g| g.layers.len())
    }

    pub fn window(&self, group: usize) -> Option<usize> {
        self.groups[group].window
    }

    /// Whether any group has a window (some blocks are released as a sequence grows).
    pub fn has_windows(&self) -> bool {
        self.groups.iter().any(|g| g.window.is_some())
    }

    /// The first position a query at `pos` reads in `group`.
    pub fn first_visible(&self, group: usize, pos: usize) -> usize {
        match self.groups[group].window {
            Some(w) => (pos + 1).saturating_sub(w),
            None => 0,
        }
    }

    /// The first block of `group` that computing position `pos` (or any later one) needs:
    /// blocks before it can be released.
    pub fn first_needed_block(&self, group: usize, pos: usize, block_size: usize) -> usize {
        self.first_visible(group, pos) / block_size
    }

    /// Blocks one sequence of `tokens` tokens holds once it decodes (windowed groups keep the
    /// blocks that the next position still reads).
    pub fn blocks_for_sequence(&self, tokens: usize, block_size: usize) -> usize {
        let total = tokens.div_ceil(block_size);
        (0..self.num_groups())
            .map(|g| total - self.first_needed_block(g, tokens, block_size).min(total))
            .sum()
    }

    /// Blocks a sequence holds at most while its prompt of `tokens` is prefilled in chunks of
    /// `chunk` tokens (a chunk's first token still reads a whole window behind it).
    pub fn peak_blocks(&self, tokens: usize, chunk: usize, block_size: usize) -> usize {
        let total = tokens.div_ceil(block_size);
        (0..self.num_groups())
            .map(|g| {
                let held = match self.groups[g].window {
                    None => total,
                    Some(w) => (w + chunk.max(1)).div_ceil(block_size) + 1,
                };
                held.min(total)
            })
            .sum()
    }

    /// The longest sequence whose blocks fit in `pool_blocks` (prefilled in chunks of `chunk`).
    pub fn max_tokens(&self, pool_blocks: usize, chunk: usize, block_size: usize) -> usize {
        // peak_blocks grows with tokens: binary search over whole blocks.
        let (mut lo, mut hi) = (
            0usize,
            pool_blocks.saturating_mul(block_size).saturating_add(1),
        );
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if self.peak_blocks(mid, chunk, block_size) <= pool_blocks {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma 3's pattern: five local layers, then a global one.
    fn gemma(layers: usize) -> Vec<Option<usize>> {
        (0..layers).map(|l| (l % 6 != 5).then_some(512)).collect()
    }

    #[test]
    fn gemma_270m_makes_six_groups_of_three() {
        let l = KvLayout::new(&gemma(18));
        assert_eq!(l.num_groups(), 6);
        assert_eq!(l.layers_per_group(), 3);
        assert_eq!(l.groups.iter().filter(|g| g.window.is_some()).count(), 5);
        assert_eq!(l.layer_slot[5], (5, 0), "the first global layer");
        assert_eq!(l.layer_slot[11], (5, 1));
        assert_eq!(l.layer_slot[3], (1, 0));
        for (layer, &(g, i)) in l.layer_slot.iter().enumerate() {
            assert_eq!(l.groups[g].layers[i], layer);
        }
    }

    /// LFM2's pattern: attention on a few layers, short convolutions elsewhere.
    #[test]
    fn layers_without_kv_are_in_no_group() {
        let layers: Vec<Option<Option<usize>>> =
            (0..6).map(|l| (l % 3 == 2).then_some(None)).collect();
        let l = KvLayout::of_layers(&layers);
        assert_eq!((l.num_groups(), l.layers_per_group()), (1, 2));
        assert_eq!(l.groups[0].layers, [2, 5]);
        assert_eq!(l.layer_slot[5], (0, 1));
        assert_eq!(l.layer_slot[0], NO_SLOT);
    }

    #[test]
    fn uneven_counts_fall_back_to_smaller_groups() {
        // Gemma 3 4B: 34 layers, 5 global, 29 local: groups of one layer.
        let l = KvLayout::new(&gemma(34));
        assert_eq!(l.layers_per_group(), 1);
        assert_eq!(l.num_groups(), 34);
        let plain = KvLayout::full(30);
        assert_eq!((plain.num_groups(), plain.layers_per_group()), (1, 30));
        assert!(!plain.has_windows());
    }

    #[test]
    fn windows_bound_what_a_long_sequence_holds() {
        let l = KvLayout::new(&gemma(18));
        let bt = 16;
        let full = KvLayout::full(18);
        let ctx = 32768;
        // Per block, the windowed layout's block is a sixth of the full one's.
        let windowed = l.blocks_for_sequence(ctx, bt) as f64 / 6.0;
        let dense = full.blocks_for_sequence(ctx, bt) as f64;
        assert!(windowed / dense < 0.2, "{windowed} / {dense}");
        // A short sequence is within every window: it holds everything.
        assert_eq!(l.blocks_for_sequence(100, bt), 6 * 7);
        assert_eq!(l.first_needed_block(0, 600, bt), (601 - 512) / bt);
        assert_eq!(l.first_needed_block(5, 600, bt), 0);
        let max = l.max_tokens(1000, 512, bt);
        assert!(l.peak_blocks(max, 512, bt) <= 1000 && l.peak_blocks(max + 1, 512, bt) > 1000);
    }
}
