//! Blocks a prompt can copy the start of: every cached full block, and the partly filled last
//! block a finished (or preempted) sequence left behind, indexed by what precedes them (the
//! chained hash of the full blocks before, and the KV group). A prompt whose cached full
//! blocks end inside its last block copies the longest matching start of one of these into a
//! fresh block instead of computing those positions again (SGLang's token-level reuse, on
//! vLLM's blocks): a repeated prompt then computes only its last token.
//!
//! Each source keeps one key per filled position: the token, or for an image's position the
//! image's key and the position's offset in it (the placeholder tokens are the same for every
//! image). Pure bookkeeping: [`super::BlockPool`] evicts a source when it hands its block out.

use std::collections::HashMap;

/// What precedes a block: the chained hash of the full blocks before it (`None` for a
/// sequence's first block) and its KV group.
pub type SourceAt = (Option<u64>, usize);

#[derive(Clone, Debug, Default)]
pub struct PrefixSources {
    by_place: HashMap<SourceAt, Vec<(u32, Vec<u64>)>>,
}

impl PrefixSources {
    /// Records that `block` at `at` holds the positions `keys` describe.
    pub fn insert(&mut self, at: SourceAt, block: u32, keys: Vec<u64>) {
        self.by_place.entry(at).or_default().push((block, keys));
    }

    /// Forgets `block` at `at` (its block was handed out for new data).
    pub fn remove(&mut self, at: SourceAt, block: u32) {
        if let Some(list) = self.by_place.get_mut(&at) {
            list.retain(|&(b, _)| b != block);
            if list.is_empty() {
                self.by_place.remove(&at);
            }
        }
    }

    /// The source at `at` whose filled positions match the longest start of `keys`, and that
    /// length (at least one position).
    pub fn longest_match(&self, at: SourceAt, keys: &[u64]) -> Option<(u32, usize)> {
        let common = |held: &[u64]| held.iter().zip(keys).take_while(|(a, b)| a == b).count();
        self.by_place
            .get(&at)?
            .iter()
            .map(|(b, held)| (*b, common(held)))
            .filter(|&(_, n)| n > 0)
            .max_by_key(|&(_, n)| n)
    }

    /// Whether `block` is recorded at `at` (invariant checks).
    pub fn holds(&self, at: SourceAt, block: u32) -> bool {
        self.by_place
            .get(&at)
            .is_some_and(|list| list.iter().any(|&(b, _)| b == block))
    }

    /// Every recorded (place, block) (invariant checks).
    pub fn entries(&self) -> impl Iterator<Item = (SourceAt, u32)> + '_ {
        self.by_place
            .iter()
            .flat_map(|(&at, list)| list.iter().map(move |&(b, _)| (at, b)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_start_wins_and_removed_sources_are_gone() {
        let mut s = PrefixSources::default();
        let at = (Some(7), 0);
        s.insert(at, 1, vec![5, 6, 7]);
        s.insert(at, 2, vec![5, 6, 9, 9, 9]);
        s.insert((Some(8), 0), 3, vec![5, 6, 7, 8]);
        assert_eq!(s.longest_match(at, &[5, 6, 7, 8]), Some((1, 3)));
        assert_eq!(s.longest_match(at, &[5, 6, 9, 9]), Some((2, 4)));
        assert_eq!(s.longest_match(at, &[4]), None, "nothing in common");
        assert_eq!(s.longest_match((Some(7), 1), &[5]), None, "another group");
        s.remove(at, 2);
        assert_eq!(s.longest_match(at, &[5, 6, 9]), Some((1, 2)));
        assert!(s.holds(at, 1) && !s.holds(at, 2));
        assert_eq!(s.entries().count(), 2);
    }
}
