//! A step's metadata as the kernels read it, built on the host: token ids, positions and the
//! positions they attend through, then per KV group (`kv::KvLayout`) each token's KV slot and the offset of its block table, then
//! (a hybrid model's) each sequence's span, state slot and snapshot saves, then the
//! concatenated tables themselves, in one i32 image (laid out as `workspace::Meta` says); and
//! the RoPE (cos, sin) tables. Pure data, so it is tested without a device.

use super::super::workspace::{Caps, SAVE_INTS, SEQ_INTS};
use crate::backend::batch::BatchMeta;
use crate::backend::cpu::ops::{rope_cos_sin, token_cos_sin};
use crate::backend::ops::Shape;

/// A decode batch padded up to its graph bucket: the extra tokens read and write only the pool's
/// padding block (in every group) and, in a hybrid model, its padding state slot (each a
/// one-token sequence of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Padding {
    pub to: usize,
    pub block: usize,
    pub state_slot: usize,
}

/// Fills `ints` (resized to the used prefix of the image) for `batch` over `groups` KV groups,
/// padded when asked. Fails when the batch does not fit the workspace.
pub fn build_ints(
    batch: &BatchMeta,
    block_size: usize,
    groups: usize,
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
    // Where each (sequence, group) table starts in the concatenated tables.
    let mut tables = Vec::new();
    let mut offset = vec![vec![0i32; groups]; batch.block_tables.len()];
    for (seq, per_group) in batch.block_tables.iter().enumerate() {
        for (g, table) in per_group.iter().enumerate().take(groups) {
            offset[seq][g] = tables.len() as i32;
            // NO_BLOCK (u32::MAX) becomes -1: an entry behind a window, never read.
            tables.extend(table.iter().map(|&b| b as i32));
        }
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
    let head = caps.meta_head_ints(groups);
    ints.clear();
    ints.resize(head + tables.len(), 0);
    for i in 0..total {
        let (tok, pos) = match batch.tokens.get(i) {
            Some(&tok) => (tok as i32, batch.positions[i] as i32),
            None => (0, 0),
        };
        ints[i] = tok;
        ints[t + i] = pos;
        ints[2 * t + i] = pos;
        for g in 0..groups {
            let (slot, off) = if i < n {
                (
                    batch.slot(i, g, block_size) as i32,
                    offset[batch.seq_of[i]][g],
                )
            } else {
                let p = pad.expect("padding only when asked");
                ((p.block * block_size) as i32, pad_offset)
            };
            ints[(3 + 2 * g) * t + i] = slot;
            ints[(4 + 2 * g) * t + i] = off;
        }
    }
    // An image whose positions see each other: each of its tokens attends through its last.
    for input in &batch.inputs {
        ints[2 * t + input.token] = input.through as i32;
    }
    ints[head..].copy_from_slice(&tables);
    if caps.saves > 0 {
        let section = caps.state_offset(groups);
        fill_states(batch, caps, pad, &mut ints[section..head])?;
    }
    Ok(())
}

/// A hybrid's sequence section (`out`, laid out as kernels/recurrent.cu reads it): per
/// sequence its span's first token and length, its state slot, whether the span starts the
/// sequence (its state then starts at zero), its first save and how many; then per save the
/// span's tokens before it and its slot. Padding tokens are one-token sequences of the pool's
/// padding slot.
fn fill_states(
    batch: &BatchMeta,
    caps: &Caps,
    pad: Option<Padding>,
    out: &mut [i32],
) -> Result<(), String> {
    let (seqs, saves) = out.split_at_mut(SEQ_INTS * caps.tokens);
    let mut next = 0;
    let spans = batch.spans();
    for (s, span) in spans.iter().enumerate() {
        let Some(slot) = batch.state_slots.get(s).copied().flatten() else {
            return Err("a sequence of a hybrid model has no state slot".into());
        };
        let first = next;
        for v in batch.state_saves.iter().filter(|v| v.seq == s) {
            if next == caps.saves || v.after > span.len() {
                return Err(format!(
                    "a snapshot after {} of a span's {} tokens (or more than {} saves)",
                    v.after,
                    span.len(),
                    caps.saves
                ));
            }
            saves[SAVE_INTS * next..SAVE_INTS * (next + 1)]
                .copy_from_slice(&[v.after as i32, v.slot as i32]);
            next += 1;
        }
        let fresh = batch.positions[span.start] == 0;
        seqs[SEQ_INTS * s..SEQ_INTS * (s + 1)].copy_from_slice(&[
            span.start as i32,
            span.len() as i32,
            slot as i32,
            fresh as i32,
            first as i32,
            (next - first) as i32,
        ]);
    }
    if let Some(p) = pad {
        for (s, token) in (spans.len()..).zip(batch.len()..p.to) {
            let pad_seq = [token as i32, 1, p.state_slot as i32, 1, 0, 0];
            seqs[SEQ_INTS * s..SEQ_INTS * (s + 1)].copy_from_slice(&pad_seq);
        }
    }
    Ok(())
}

/// The (cos, sin) pairs of every token for each of the shape's RoPE tables: table k's `total`
/// rows (padding at position 0) start at float `k * caps_tokens * n_rot`, as kernels/rope.cu
/// reads one table. Computed by the CPU's own function so both apply the same angles.
pub fn build_cs(
    batch: &BatchMeta,
    shape: &Shape,
    caps_tokens: usize,
    total: usize,
    pairs: &mut Vec<(f32, f32)>,
    out: &mut Vec<f32>,
) {
    let half = shape.n_rot / 2;
    pairs.clear();
    pairs.resize(half, (0.0, 0.0));
    out.clear();
    let stride = caps_tokens * 2 * half;
    for (k, table) in shape.ropes.iter().enumerate() {
        out.resize(k * stride, 0.0);
        for i in 0..total {
            match i < batch.len() {
                true => token_cos_sin(batch, i, shape, table, pairs),
                false => rope_cos_sin(0, shape.n_rot, table, pairs),
            }
            for &(c, s) in pairs.iter() {
                out.push(c);
                out.push(s);
            }
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
    use crate::backend::batch::Logits;
    use crate::backend::ops::{RopeLayout, RopeTable, Widths};

    #[test]
    fn image_layout_and_padding() {
        let caps = Caps::new(8, 4, 64, 4, 1);
        let mut b = BatchMeta::default();
        b.push_span_single(&[7], 5, vec![3, 1], Logits::Last);
        b.push_span_single(&[9], 0, vec![2], Logits::Last);
        b.push_span_single(&[4], 2, vec![0], Logits::Last);
        assert!(is_plain_decode(&b, 4));
        let mut ints = Vec::new();
        let pad = Padding {
            to: 4,
            block: 6,
            state_slot: 0,
        };
        build_ints(&b, 4, 1, &caps, Some(pad), &mut ints).unwrap();
        let t = caps.tokens;
        assert_eq!(&ints[..4], &[7, 9, 4, 0]);
        assert_eq!(&ints[t..t + 4], &[5, 0, 2, 0]);
        assert_eq!(
            &ints[2 * t..2 * t + 4],
            &[5, 0, 2, 0],
            "each attends through itself"
        );
        // slot = block * 4 + pos % 4: token 0 is at position 5 -> block 1 of its table.
        assert_eq!(&ints[3 * t..3 * t + 4], &[4 + 1, 2 * 4, 2, 6 * 4]);
        assert_eq!(&ints[4 * t..4 * t + 4], &[0, 2, 3, 4]);
        assert_eq!(&ints[5 * t..], &[3, 1, 2, 0, 6]);
    }

    #[test]
    fn every_group_has_its_slots_and_tables() {
        // Two groups: the second (windowed) has dropped its first block.
        let caps = Caps::new(8, 4, 64, 4, 2);
        let mut b = BatchMeta::default();
        let none = crate::kv::NO_BLOCK;
        b.push_span(&[1, 2], 4, vec![vec![0, 1], vec![none, 5]], Logits::Last);
        let mut ints = Vec::new();
        build_ints(&b, 4, 2, &caps, None, &mut ints).unwrap();
        let t = caps.tokens;
        assert_eq!(&ints[3 * t..3 * t + 2], &[4, 5], "group 0 slots: block 1");
        assert_eq!(&ints[4 * t..4 * t + 2], &[0, 0]);
        assert_eq!(&ints[5 * t..5 * t + 2], &[20, 21], "group 1 slots: block 5");
        assert_eq!(&ints[6 * t..6 * t + 2], &[2, 2]);
        assert_eq!(&ints[7 * t..], &[0, 1, -1, 5]);
    }

    #[test]
    fn prefill_is_not_a_graph_step_and_oversize_fails() {
        let caps = Caps::new(4, 2, 64, 4, 1);
        let mut b = BatchMeta::default();
        b.push_span_single(&[1, 2, 3], 0, vec![0], Logits::Last);
        assert!(!is_plain_decode(&b, 8));
        let mut ints = Vec::new();
        build_ints(&b, 4, 1, &caps, None, &mut ints).unwrap();
        assert_eq!(&ints[4 * caps.tokens..4 * caps.tokens + 3], &[0, 0, 0]);
        b.push_span_single(&[1, 2], 3, vec![1], Logits::Last);
        assert!(build_ints(&b, 4, 1, &caps, None, &mut ints).is_err());
    }

    /// A hybrid's sequences: spans, slots, whether each starts its sequence, its saves; and
    /// the padding tokens' one-token sequences of the padding slot.
    #[test]
    fn sequences_carry_their_state_slots_and_saves() {
        let caps = Caps::new(8, 4, 64, 4, 1).with_states();
        let mut b = BatchMeta::default();
        b.push_span_single(&[1, 2, 3], 0, vec![0], Logits::Last);
        b.set_state_slot(2);
        b.save_state_after(2, 5);
        b.save_state_after(3, 6);
        b.push_span_single(&[4], 7, vec![1, 2], Logits::Last);
        b.set_state_slot(0);
        let mut ints = Vec::new();
        let pad = Padding {
            to: 6,
            block: 9,
            state_slot: 7,
        };
        build_ints(&b, 4, 1, &caps, Some(pad), &mut ints).unwrap();
        let (t, at) = (caps.tokens, caps.state_offset(1));
        let seq = |s: usize| &ints[at + SEQ_INTS * s..at + SEQ_INTS * (s + 1)];
        assert_eq!(seq(0), &[0, 3, 2, 1, 0, 2]);
        assert_eq!(seq(1), &[3, 1, 0, 0, 2, 0]);
        assert_eq!(seq(2), &[4, 1, 7, 1, 0, 0]);
        assert_eq!(seq(3), &[5, 1, 7, 1, 0, 0]);
        let saves = at + SEQ_INTS * t;
        assert_eq!(&ints[saves..saves + 4], &[2, 5, 3, 6]);
        assert_eq!(ints.len(), caps.meta_head_ints(1) + 4);

        let mut b = BatchMeta::default();
        b.push_span_single(&[1], 0, vec![0], Logits::Last);
        let why = build_ints(&b, 4, 1, &caps, None, &mut ints).unwrap_err();
        assert!(why.contains("no state slot"), "{why}");
    }

    #[test]
    fn one_cs_table_per_rope_table() {
        let table = |base| RopeTable {
            base,
            freq_scale: 1.0,
            mscale: 1.0,
            factors: None,
        };
        let shape = Shape {
            causal: true,
            widths: Widths {
                embd: 8,
                q: 8,
                kv: 8,
                ff: 8,
                vocab: 8,
                mix: 0,
                inner: 0,
                dt_heads: 0,
            },
            n_head: 2,
            n_head_kv: 2,
            head_dim: 4,
            n_rot: 4,
            rope_layout: RopeLayout::Neox,
            ropes: vec![table(10000.0), table(10.0)],
            experts: None,
            state_floats: 0,
            conv_taps: 0,
            delta_net: None,
            mrope: None,
            deepstack: 0,
        };
        let mut b = BatchMeta::default();
        b.push_span_single(&[1, 2], 3, vec![0], Logits::Last);
        let (mut pairs, mut cs) = (Vec::new(), Vec::new());
        build_cs(&b, &shape, 8, 2, &mut pairs, &mut cs);
        assert_eq!(cs.len(), 8 * 4 + 2 * 4);
        for (k, t) in shape.ropes.iter().enumerate() {
            rope_cos_sin(4, 4, t, &mut pairs);
            let at = k * 8 * 4 + 4; // table k, token 1 (position 4)
            assert_eq!(
                &cs[at..at + 4],
                &[pairs[0].0, pairs[0].1, pairs[1].0, pairs[1].1]
            );
        }
    }
}
