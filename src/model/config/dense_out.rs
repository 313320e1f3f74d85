//! gemma-embedding's optional dense projections of the pooled vector (sentence-transformers'
//! Dense modules, written by llama.cpp's converter with `--sentence-transformers-dense-modules`):
//! `dense_2` from n_embd to `dense_2_feat_out`, then `dense_3` from `dense_3_feat_in` back to
//! n_embd. Their widths come from `{arch}.dense_2_feat_in/out` and `dense_3_feat_in/out`.

use super::Keys;
use anyhow::{bail, Result};

/// The widths of the two projections: n_embd → `hidden` → n_embd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DenseOutShape {
    /// `dense_2_feat_out`, which is `dense_3_feat_in`.
    pub hidden: usize,
}

/// Wider than any released model's projection: a header asking for more is refused before
/// anything is sized by it.
const MAX_HIDDEN: usize = 1 << 16;

impl DenseOutShape {
    /// The projections' widths, where the file gives all four keys; none of them: `None`.
    /// Anything between, or widths that do not chain from n_embd back to it, is refused
    /// (llama.cpp asserts `dense_2_feat_in` and `dense_3_feat_out` are n_embd).
    pub(super) fn read(k: &Keys<'_>, n_embd: usize) -> Result<Option<DenseOutShape>> {
        const KEYS: [&str; 4] = [
            "dense_2_feat_in",
            "dense_2_feat_out",
            "dense_3_feat_in",
            "dense_3_feat_out",
        ];
        let mut v = [None; 4];
        for (slot, key) in v.iter_mut().zip(KEYS) {
            *slot = k.u32(key)?;
        }
        let [Some(in2), Some(out2), Some(in3), Some(out3)] = v else {
            if let Some(i) = v.iter().position(Option::is_some) {
                let missing = KEYS[v.iter().position(Option::is_none).unwrap_or(0)];
                bail!(
                    "{} is given but {} is not: the dense projections need all four widths",
                    k.name(KEYS[i]),
                    k.name(missing)
                );
            }
            return Ok(None);
        };
        if in2 != n_embd || out3 != n_embd {
            bail!(
                "{} = {in2} and {} = {out3} must both be n_embd ({n_embd})",
                k.name(KEYS[0]),
                k.name(KEYS[3])
            );
        }
        if out2 != in3 || out2 == 0 || out2 > MAX_HIDDEN {
            bail!(
                "{} = {out2} and {} = {in3}: dense_2's output must be dense_3's input, \
                 1 to {MAX_HIDDEN} wide",
                k.name(KEYS[1]),
                k.name(KEYS[2])
            );
        }
        Ok(Some(DenseOutShape { hidden: out2 }))
    }
}
