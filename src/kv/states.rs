//! The pool's recurrent-state slots: fixed-size f32 records, one per running sequence of a
//! hybrid model (the rows a short convolution needs from earlier positions), allocated once at
//! start-up beside the KV pages so that no step allocates. A slot is handed out and returned
//! like a block; its contents are only meaningful up to the sequence's computed position, and
//! a span that starts at position 0 starts from an empty state whatever the slot held.

use anyhow::{bail, Result};

#[derive(Debug, Default)]
pub struct StateSlots {
    /// f32 values per slot.
    floats: usize,
    data: Vec<f32>,
}

impl StateSlots {
    /// `slots` slots of `floats` values each, zeroed; fails instead of aborting when memory
    /// is short.
    pub fn new(slots: usize, floats: usize) -> Result<StateSlots> {
        let Some(n) = slots.checked_mul(floats) else {
            bail!("{slots} state slots of {floats} values overflow");
        };
        let mut data = Vec::new();
        if data.try_reserve_exact(n).is_err() {
            bail!("cannot allocate {} bytes for the state slots", n * 4);
        }
        data.resize(n, 0.0);
        Ok(StateSlots { floats, data })
    }

    pub fn count(&self) -> usize {
        self.data.len().checked_div(self.floats).unwrap_or(0)
    }

    /// f32 values of one slot.
    pub fn floats(&self) -> usize {
        self.floats
    }

    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    pub fn slot_mut(&mut self, slot: usize) -> &mut [f32] {
        &mut self.data[slot * self.floats..(slot + 1) * self.floats]
    }

    /// Slot `slot` and slots `others` (snapshots a step writes beside it), all at once; `None`
    /// when two are the same or one is not in the pool.
    pub fn several_mut(
        &mut self,
        slot: usize,
        others: &[usize],
    ) -> Option<(&mut [f32], Vec<&mut [f32]>)> {
        let f = self.floats;
        let mut order: Vec<(usize, usize)> = std::iter::once(slot)
            .chain(others.iter().copied())
            .enumerate()
            .map(|(i, s)| (s, i))
            .collect();
        order.sort_unstable();
        let count = self.count();
        if order.windows(2).any(|w| w[0].0 == w[1].0) || order.iter().any(|w| w.0 >= count) {
            return None;
        }
        let mut found: Vec<Option<&mut [f32]>> = (0..order.len()).map(|_| None).collect();
        let (mut rest, mut base) = (&mut self.data[..], 0);
        for (s, i) in order {
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((s - base) * f);
            let (this, tail) = tail.split_at_mut(f);
            found[i] = Some(this);
            (rest, base) = (tail, s + 1);
        }
        let mut found = found.into_iter().map(|s| s.expect("every slot was found"));
        let first = found.next().expect("slot itself");
        Some((first, found.collect()))
    }

    /// A fork's state: the parent's, copied.
    pub fn copy(&mut self, src: usize, dst: usize) {
        let f = self.floats;
        self.data.copy_within(src * f..(src + 1) * f, dst * f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_apart_and_copies_land_in_their_own() {
        let mut s = StateSlots::new(3, 4).unwrap();
        assert_eq!((s.count(), s.floats(), s.bytes()), (3, 4, 48));
        s.slot_mut(1).copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        s.copy(1, 2);
        assert_eq!(s.slot_mut(2), [1.0, 2.0, 3.0, 4.0]);
        assert!(s.slot_mut(0).iter().all(|&v| v == 0.0));
        assert_eq!(StateSlots::default().count(), 0);
        let (one, mut others) = s.several_mut(1, &[2, 0]).unwrap();
        one[0] = 7.0;
        others[1][0] = 8.0;
        others[0][3] = 9.0;
        assert_eq!(
            (s.slot_mut(1)[0], s.slot_mut(0)[0], s.slot_mut(2)[3]),
            (7.0, 8.0, 9.0)
        );
        assert!(s.several_mut(1, &[1]).is_none() && s.several_mut(0, &[3]).is_none());
    }
}
