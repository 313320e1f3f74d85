//! Embedding requests in the engine: a prompt prefilled by the same scheduler as any other,
//! whose hidden rows (`BatchMeta::hidden_for`) are pooled chunk by chunk as the model says
//! (`Pooling`) and sent as one `Event::Embedding` once its last chunk ran; its sequence then
//! goes at once, so it holds no KV pages after the step.

use super::requests::RequestState;
use super::Engine;
use crate::engine::pooled::Pooled;
use crate::engine::request::{Event, Request};
use crate::engine::scheduler::ScheduledBatch;
use crate::engine::sequence::{SeqId, Sequence};
use crate::model::BatchMeta;
use std::sync::mpsc::Sender;

impl Engine {
    /// Takes in an embedding request: one sequence that computes its prompt and nothing more.
    pub(super) fn admit_embedding(&mut self, req: Request, events: Sender<Event>) {
        if !self.pooling.embeds() {
            let why = format!(
                "the model has no pooling type for embeddings (pooling_type: {})",
                self.pooling.as_str()
            );
            let _ = events.send(Event::Error(why));
            return;
        }
        let len = req.prompt.len();
        let step = self.sched.config.max_batched_tokens;
        if self.encoder && len > step {
            let why = format!("the input is {len} tokens, more than the {step} one step computes (with bidirectional attention an input is computed whole)");
            let _ = events.send(Event::Error(why));
            return;
        }
        let id = self.next_seq;
        self.next_seq += 1;
        self.arrivals += 1;
        let mut seq = Sequence::new(id, req.id, self.arrivals, req.prompt, len);
        seq.arrived = req.submitted;
        seq.embed = true;
        seq.adapter = req.params.adapter.clone();
        seq.whole = self.encoder;
        seq.pooled = Some(Pooled::default());
        self.sched.add(seq);
        self.local.prompt_tokens += len as u64;
        self.requests
            .insert(req.id, RequestState::new(events, req.params, 0, len, id));
    }

    /// Asks for the hidden rows the pooling of an embedding sequence's span reads.
    pub(super) fn want_hidden(&self, meta: &mut BatchMeta, s: &Sequence, start: usize, len: usize) {
        if s.embed {
            meta.want_hidden(self.pooling.rows(start, len, s.prompt_len));
        }
    }

    /// After a step's commit: adds each embedding span's hidden rows to its sequence's pool,
    /// and answers the sequences whose prompt is now done.
    pub(super) fn pool_hidden(&mut self, batch: &ScheduledBatch) {
        let hidden = self.exec.take_hidden();
        let width = self.hidden_width;
        let mut row = 0;
        for span in &batch.spans {
            let Some(s) = self.sched.get_mut(span.seq).filter(|s| s.embed) else {
                continue;
            };
            let rows = self.pooling.rows(span.start, span.len, s.prompt_len).len();
            let done = s.num_computed == s.tokens.len();
            let Some(taken) = hidden.get(row * width..(row + rows) * width) else {
                log::error!("the forward pass returned fewer hidden rows than asked for");
                return;
            };
            row += rows;
            let Some(pooled) = s.pooled.as_mut() else {
                continue;
            };
            pooled.add(taken, width, span.start == 0);
            if done {
                self.finish_embedding(span.seq);
            }
        }
    }

    /// Sends `seq`'s pooled vector and drops the sequence (its blocks go back to the pool)
    /// and its request.
    fn finish_embedding(&mut self, seq: SeqId) {
        let Some(s) = self.sched.remove(seq) else {
            return;
        };
        let Some(st) = self.requests.remove(&s.request) else {
            return;
        };
        let exec = &self.exec;
        let vector = s
            .pooled
            .map(|p| p.finish(|v| exec.project_pooled(v)))
            .unwrap_or_default();
        let _ = st.events.send(Event::Embedding {
            vector,
            prompt_tokens: s.prompt_len,
        });
        self.local.requests_finished += 1;
    }
}
