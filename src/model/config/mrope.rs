//! M-RoPE sections (`rope.dimension_sections`): which of a position's parts (temporal, row,
//! column, extra) turns each rotated pair, as ggml's `ggml_mrope_cache_init` assigns them.
//! Qwen3.5 and Qwen3-VL interleave the parts pair by pair (`GGML_ROPE_TYPE_IMROPE`); Qwen2-VL
//! and Qwen2.5-VL give each part a run of pairs (`GGML_ROPE_TYPE_MROPE`).

use super::Keys;
use anyhow::{bail, Context, Result};

/// Four counts of rotated pairs (temporal, row, column, extra) and how they are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MropeSections {
    pub counts: [usize; 4],
    /// Interleaved (pair i's part from `i mod 3`) rather than in runs.
    pub interleaved: bool,
}

impl MropeSections {
    /// `rope.dimension_sections` (required, as for llama.cpp): four counts, the first three
    /// for the text positions, that fit in the `n_rot / 2` pairs.
    pub(super) fn read(k: &Keys<'_>, n_rot: usize, interleaved: bool) -> Result<MropeSections> {
        let key = k.name("rope.dimension_sections");
        let arr = k
            .file
            .get(&key)
            .and_then(|v| v.as_array())
            .with_context(|| format!("GGUF has no {key} (an array of 4 counts)"))?;
        let counts: Vec<usize> = (0..arr.len())
            .map(|i| arr.get(i).and_then(|x| x.as_u32()).map(|x| x as usize))
            .collect::<Option<_>>()
            .with_context(|| format!("{key} is not an array of unsigned integers"))?;
        let Ok(counts) = <[usize; 4]>::try_from(counts.as_slice()) else {
            bail!("{key} has {} entries, not 4", counts.len());
        };
        let sum: usize = counts.iter().sum();
        if counts[..3].iter().all(|&s| s == 0) || sum > n_rot / 2 {
            bail!(
                "{key} = {counts:?} does not fit the {} rotated pairs",
                n_rot / 2
            );
        }
        Ok(MropeSections {
            counts,
            interleaved,
        })
    }

    /// The part of a position that turns pair `i` (0: temporal, 1: row, 2: column), or
    /// `None` for the extra, fourth part. The sections repeat over the pairs past their sum.
    fn part(&self, i: usize) -> Option<u8> {
        let [t, h, w, _] = self.counts;
        let s = i % self.counts.iter().sum::<usize>();
        match self.interleaved {
            true => match s % 3 {
                0 if s < 3 * t => Some(0),
                1 if s < 3 * h => Some(1),
                2 if s < 3 * w => Some(2),
                _ => None,
            },
            false if s < t => Some(0),
            false if s < t + h => Some(1),
            false if s < t + h + w => Some(2),
            false => None,
        }
    }

    /// Per rotated pair, whether a text token's position turns it. llama.cpp gives a text
    /// token its position thrice and 0 as the extra part, so a pair the extra part turns is
    /// turned by angle 0: not at all.
    pub fn turned_pairs(&self, n_rot: usize) -> Vec<bool> {
        (0..n_rot / 2).map(|i| self.part(i).is_some()).collect()
    }

    /// Per rotated pair, which of an M-RoPE position's three parts turns it; a pair no part
    /// turns gets 0 (the table's divisor keeps its angle at 0).
    pub fn components(&self, n_rot: usize) -> Vec<u8> {
        (0..n_rot / 2).map(|i| self.part(i).unwrap_or(0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sections(counts: [usize; 4], interleaved: bool) -> MropeSections {
        MropeSections {
            counts,
            interleaved,
        }
    }

    /// Qwen3.5's own sections turn all 32 pairs; uneven ones leave the pairs whose section
    /// falls past its interleaved share unturned (ggml's `ggml_mrope_cache_init`).
    #[test]
    fn interleaved_sections_turn_the_pairs_they_cover() {
        assert!(sections([11, 11, 10, 0], true)
            .turned_pairs(64)
            .iter()
            .all(|&t| t));
        let turned = sections([6, 4, 4, 0], true).turned_pairs(32);
        let unturned: Vec<usize> = (0..16).filter(|&i| !turned[i]).collect();
        assert_eq!(unturned, [13]);
        // Fewer pairs in the sections than rotated: the sections repeat over the pairs.
        assert!(sections([2, 1, 1, 0], true)
            .turned_pairs(16)
            .iter()
            .all(|&t| t));
        assert_eq!(sections([2, 1, 1, 0], true).components(8), [0, 1, 2, 0]);
    }

    /// Qwen2.5-VL's sections are runs: the temporal part's pairs, then the row's, then the
    /// column's; the extra part's pairs are not turned for text.
    #[test]
    fn sections_in_runs_give_each_part_its_pairs_in_turn() {
        let s = sections([2, 3, 3, 1], false);
        assert_eq!(s.components(18), [0, 0, 1, 1, 1, 2, 2, 2, 0]);
        let turned = s.turned_pairs(18);
        assert_eq!((0..9).filter(|&i| !turned[i]).collect::<Vec<_>>(), [8]);
    }
}
