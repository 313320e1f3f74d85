//! A bidirectional image computed a few layers per step. Its positions attend to each other,
//! so no chunk may cut it; computed whole in a step that streams share, it holds every stream
//! for all of its positions through every layer (a real Gemma 3 image: 256 positions). On
//! such a step the image goes through the model a few layers at a time instead: each step runs
//! its positions through the next layers, writing their K/V into its blocks as one pass would,
//! and keeps their residual stream for the next layers. Its positions count as computed (and
//! its blocks join the prefix cache) once the last layer has run. The positions after the
//! image come in chunks as before.

use super::{Grow, ScheduledBatch, Scheduler};
use crate::engine::sequence::{LayerPass, SeqId};
use std::ops::Range;

/// One step's share of a layer pass: sequence `seq`'s image positions `start..start + len`
/// through `layers` of the model's `n_layers`.
#[derive(Clone, Debug, PartialEq)]
pub struct PassSlice {
    pub seq: SeqId,
    pub start: usize,
    pub len: usize,
    pub layers: Range<usize>,
    pub n_layers: usize,
}

impl PassSlice {
    /// What it is worth in prompt tokens of a whole pass (what the pacer measures steps by):
    /// its positions times its share of the layers, rounded up.
    pub fn work(&self) -> usize {
        (self.len * self.layers.len()).div_ceil(self.n_layers.max(1))
    }

    /// Whether it runs the model's last layer (the image is then computed).
    pub fn finishes(&self) -> bool {
        self.layers.end >= self.n_layers
    }
}

impl Scheduler {
    /// Lets images whose positions see each other go through the model's `n_layers` a few
    /// layers per step (a backend that can stop a pass between layers: the CPU's).
    pub fn with_layer_passes(mut self, n_layers: usize) -> Scheduler {
        self.pass_layers = n_layers;
        self
    }

    /// The step's layer-pass slices within `budget` prompt tokens: the next layers of each
    /// pass under way, then a pass for each of `prefilling` whose next chunk is an image too
    /// long for the budget. Each slice runs as many layers as the budget leaves room for (at
    /// least one). Returns the budget left.
    pub(super) fn schedule_layer_passes(
        &mut self,
        prefilling: &[SeqId],
        mut budget: usize,
        batch: &mut ScheduledBatch,
    ) -> usize {
        if self.pass_layers == 0 {
            return budget;
        }
        for &id in &self.running {
            let s = &self.seqs[&id];
            if let (Some(pass), Some(image)) = (&s.layer_pass, s.image_at_next_chunk()) {
                let (done, start, len) = (pass.done, image.at, image.rows.len());
                budget -= Self::push_slice(self.pass_layers, id, (start, len, done), budget, batch);
            }
        }
        for &id in prefilling {
            let s = &self.seqs[&id];
            let Some(image) = s.image_at_next_chunk() else {
                continue;
            };
            let (start, len) = (image.at, image.rows.len());
            if len <= budget || s.layer_pass.is_some() {
                continue;
            }
            if let Grow::Ok = self.grow(id, len, batch) {
                let s = self.seqs.get_mut(&id).expect("prefilling seq exists");
                s.layer_pass = Some(LayerPass::default());
                budget -= Self::push_slice(self.pass_layers, id, (start, len, 0), budget, batch);
            }
        }
        budget
    }

    /// Adds the slice of `seq`'s pass through `n` layers (its image's `len` positions from
    /// `start`, `done` layers run) that `budget` has room for; returns the budget it takes
    /// (at most `budget`).
    fn push_slice(
        n: usize,
        seq: SeqId,
        (start, len, done): (usize, usize, usize),
        budget: usize,
        batch: &mut ScheduledBatch,
    ) -> usize {
        let layers = (n * budget / len.max(1)).clamp(1, n - done);
        let slice = PassSlice {
            seq,
            start,
            len,
            layers: done..done + layers,
            n_layers: n,
        };
        let work = slice.work().min(budget);
        batch.layer_passes.push(slice);
        work
    }

    /// Records the step's layer-pass slices: a pass that ran its last layer is done, its
    /// positions computed; the others wait for their next layers.
    pub(super) fn commit_layer_passes(&mut self, batch: &ScheduledBatch) {
        for slice in &batch.layer_passes {
            let Some(s) = self.seqs.get_mut(&slice.seq) else {
                continue;
            };
            let Some(pass) = s.layer_pass.as_mut() else {
                continue;
            };
            pass.done = slice.layers.end;
            if slice.finishes() {
                s.layer_pass = None;
                super::mark_computed(&mut self.pool, s, slice.start + slice.len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::with_image;
    use super::super::SchedulerConfig;
    use super::*;
    use crate::kv::{BlockPool, KvLayout};

    /// A scheduler whose images may go through 6 layers a few per step.
    fn sched() -> Scheduler {
        let config = SchedulerConfig {
            max_seqs: 4,
            max_batched_tokens: 64,
        };
        Scheduler::new(config, BlockPool::new(32, 16), KvLayout::full(1)).with_layer_passes(6)
    }

    /// A step paced to `budget` prompt tokens, committed.
    fn paced_step(s: &mut Scheduler, budget: usize) -> ScheduledBatch {
        let b = s.schedule_paced(|_, left| budget.min(left));
        s.commit(&b);
        b
    }

    #[test]
    fn an_image_longer_than_the_paced_budget_goes_through_the_layers_a_few_per_step() {
        let mut s = sched();
        s.add(with_image(1));
        let spans = |b: &ScheduledBatch| -> Vec<(usize, usize)> {
            b.spans.iter().map(|sp| (sp.start, sp.len)).collect()
        };
        assert_eq!(spans(&paced_step(&mut s, 16)), [(0, 10)], "up to the image");
        let mut slices = Vec::new();
        while s.get(1).unwrap().layer_pass.is_some() || slices.is_empty() {
            let b = paced_step(&mut s, 16);
            assert!(b.spans.is_empty(), "nothing else of the prompt meanwhile");
            let [slice] = &b.layer_passes[..] else {
                panic!("one slice a step, got {:?}", b.layer_passes);
            };
            assert_eq!((slice.start, slice.len), (10, 40));
            slices.push(slice.layers.clone());
            let computed = s.get(1).unwrap().num_computed;
            assert_eq!(computed, if slice.finishes() { 50 } else { 10 });
            assert_eq!(
                s.pool.used(),
                4,
                "the image's blocks are held from its first slice"
            );
        }
        // 16 tokens of budget are 2 of the 6 layers of 40 positions.
        assert_eq!(slices, [0..2, 2..4, 4..6]);
        assert_eq!(
            spans(&paced_step(&mut s, 16)),
            [(50, 16)],
            "then the text after it"
        );
    }

    #[test]
    fn an_image_within_the_budget_is_computed_whole() {
        let mut s = sched();
        s.add(with_image(1));
        let b = paced_step(&mut s, 64);
        assert!(b.layer_passes.is_empty());
        assert_eq!((b.spans[0].start, b.spans[0].len), (0, 64));
    }

    #[test]
    fn a_preempted_pass_starts_over() {
        let mut s = sched();
        s.add(with_image(1));
        paced_step(&mut s, 16);
        paced_step(&mut s, 16);
        assert_eq!(s.get(1).unwrap().layer_pass.as_ref().unwrap().done, 2);
        let mut batch = ScheduledBatch::default();
        s.preempt(1, &mut batch);
        assert!(s.get(1).unwrap().layer_pass.is_none());
        assert_eq!(s.pool.used(), 0);
        // Back in: the text before the image again, then the image from its first layer.
        paced_step(&mut s, 16);
        let b = paced_step(&mut s, 16);
        assert_eq!(b.layer_passes[0].layers, 0..2);
    }
}
