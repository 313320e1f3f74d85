//! A step's metadata as the kernels read it, built on the host: token ids, positions, KV
//! slots, per-token offsets into the concatenated block tables, and the tables themselves, in
//! one i32 image (laid out as `workspace::Meta` says), plus the RoPE (cos, sin) table. Pure
//! data, so it is tested without a device.

use super::workspace::Caps;
use crate::backend::cpu::ops::rope_cos_sin;
use crate::model::{BatchMeta, ModelConfig};

/// A decode batch padded up to its graph bucket: the extra tokens read and write only the pool's
/// padding block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Padding {
    pub to: usize,
    pub block: usize,
}

/// Fills `ints` (resized to the used prefix of the image) for `batch`, padded when asked.
/// Fails when the batch does not fit the workspace.
pub fn build_ints(
    batch: &BatchMeta,
    block_tokens: usize,
    caps: &Caps,
    pad: Option<Padding>,
    ints: &mut Vec<i32>,
) -> Result<(), String> {
    let n = batch.len();
    let total = pad.map_or(n, |p| p.to.max(n));
    if total > caps.tokens {
        return Err(format!(
            "a step of {total} tokens exceeds the workspace ({} tokens)",
            caps.tokens
        ));
    }
    let t = caps.tokens;
    let mut tables = Vec::new();
    let mut seq_offset = Vec::with_capacity(batch.block_tables.len());
    for table in &batch.block_tables {
        seq_offset.push(tables.len() as i32);
        tables.extend(table.iter().map(|&b| b as i32));
    }
    let pad_offset = tables.len() as i32;
    if let Some(p) = pad {
        tables.push(p.block as i32);
    }
    if tables.len() > caps.table_entries {
        return Err(format!(
            "block tables of {} entries exceed the workspace ({})",
            tables.len(),
            caps.table_entries
        ));
    }
    ints.clear();
    ints.resize(4 * t + tables.len(), 0);
    for i in 0..total {
        let (tok, pos, slot, off) = if i < n {
            (
                batch.tokens[i] as i32,
                batch.positions[i] as i32,
                batch.slot(i, block_tokens) as i32,
                seq_offset[batch.seq_of[i]],
            )
        } else {
            let p = pad.expect("padding only when asked");
            (0, 0, (p.block * block_tokens) as i32, pad_offset)
        };
        ints[i] = tok;
        ints[t + i] = pos;
        ints[2 * t + i] = slot;
        ints[3 * t + i] = off;
    }
    ints[4 * t..].copy_from_slice(&tables);
    Ok(())
}

/// The (cos, sin) pairs of every token (`total` rows, padding at position 0), flattened as
/// kernels/rope.cu reads them; computed by the CPU's own function so both apply the same angles.
pub fn build_cs(
    batch: &BatchMeta,
    cfg: &ModelConfig,
    freq_factors: Option<&[f32]>,
    total: usize,
    pairs: &mut Vec<(f32, f32)>,
    out: &mut Vec<f32>,
) {
    let half = cfg.n_rot / 2;
    pairs.clear();
    pairs.resize(half, (0.0, 0.0));
    out.clear();
    for i in 0..total {
        let pos = batch.positions.get(i).copied().unwrap_or(0);
        rope_cos_sin(pos, cfg.n_rot, cfg.rope_theta, freq_factors, pairs);
        for &(c, s) in pairs.iter() {
            out.push(c);
            out.push(s);
        }
    }
}

/// Is this a decode step a graph can run: one token per sequence, the logits of every token
/// in order, at most `max` tokens?
pub fn is_plain_decode(batch: &BatchMeta, max: usize) -> bool {
    let n = batch.len();
    n > 0
        && n <= max
        && batch.block_tables.len() == n
        && batch.seq_of.iter().enumerate().all(|(i, &s)| s == i)
        && batch.logits_for.len() == n
        && batch.logits_for.iter().enumerate().all(|(i, &r)| r == i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Logits;

    #[test]
    fn image_layout_and_padding() {
        let caps = Caps::new(8, 4, 64, 4);
        let mut b = BatchMeta::default();
        b.push_span(&[7], 5, vec![3, 1], Logits::Last);
        b.push_span(&[9], 0, vec![2], Logits::Last);
        b.push_span(&[4], 2, vec![0], Logits::Last);
        assert!(is_plain_decode(&b, 4));
        let mut ints = Vec::new();
        let pad = Padding { to: 4, block: 6 };
        build_ints(&b, 4, &caps, Some(pad), &mut ints).unwrap();
        let t = caps.tokens;
        assert_eq!(&ints[..4], &[7, 9, 4, 0]);
        assert_eq!(&ints[t..t + 4], &[5, 0, 2, 0]);
        // slot = block * 4 + pos % 4: token 0 is at position 5 -> block 1 of its table.
        assert_eq!(&ints[2 * t..2 * t + 4], &[4 + 1, 2 * 4, 2, 6 * 4]);
        assert_eq!(&ints[3 * t..3 * t + 4], &[0, 2, 3, 4]);
        assert_eq!(&ints[4 * t..], &[3, 1, 2, 0, 6]);
    }

    #[test]
    fn prefill_is_not_a_graph_step_and_oversize_fails() {
        let caps = Caps::new(4, 2, 64, 4);
        let mut b = BatchMeta::default();
        b.push_span(&[1, 2, 3], 0, vec![0], Logits::Last);
        assert!(!is_plain_decode(&b, 8));
        let mut ints = Vec::new();
        build_ints(&b, 4, &caps, None, &mut ints).unwrap();
        assert_eq!(&ints[3 * caps.tokens..3 * caps.tokens + 3], &[0, 0, 0]);
        b.push_span(&[1, 2], 3, vec![1], Logits::Last);
        assert!(build_ints(&b, 4, &caps, None, &mut ints).is_err());
    }
}
