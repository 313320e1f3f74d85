//! The engine's side of an image going through the model a few layers per step
//! (`scheduler::layer_pass`): each slice runs after the step's other spans, from and into the
//! residual its sequence keeps between steps.

use super::Engine;
use crate::engine::scheduler::{PassSlice, ScheduledBatch};
use crate::engine::sequence::LayerPass;
use crate::model::{BatchMeta, Logits};
use anyhow::Result;

impl Engine {
    /// Runs the step's layer-pass slices (a finished pass's residual goes with it when the
    /// step is committed).
    pub(super) fn run_layer_passes(&mut self, batch: &ScheduledBatch) -> Result<()> {
        for slice in &batch.layer_passes {
            let meta = self.pass_meta(slice);
            let residual = &mut self.pass_of(slice).residual;
            let mut rows = std::mem::take(residual);
            self.exec
                .forward_layers(&meta, slice.layers.clone(), &mut rows)?;
            self.local.layer_pass_slices += 1;
            self.pass_of(slice).residual = rows;
        }
        Ok(())
    }

    /// The pass a slice belongs to.
    fn pass_of(&mut self, slice: &PassSlice) -> &mut LayerPass {
        let s = self.sched.get_mut(slice.seq).expect("scheduled seq exists");
        s.layer_pass
            .as_mut()
            .expect("a slice's sequence is in a pass")
    }

    /// A slice's image positions as the forward pass takes them (no logits: text follows).
    fn pass_meta(&self, slice: &PassSlice) -> BatchMeta {
        let s = self.sched.get(slice.seq).expect("scheduled seq exists");
        let range = slice.start..slice.start + slice.len;
        let mut meta = BatchMeta::default();
        let tables = s.blocks.tables().to_vec();
        meta.push_span(&s.tokens[range.clone()], slice.start, tables, Logits::None);
        meta.set_rope_positions(0, &s.rope_positions(range.clone()));
        meta.inputs.extend(s.row_inputs(range, 0));
        meta.set_adapter(s.adapter.clone());
        meta.mark_generated_from(s.prompt_len);
        meta
    }
}
