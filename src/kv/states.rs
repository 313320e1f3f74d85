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
    }
}
