//! Postprocess, the step's third phase: each row that came back becomes a token (a draw
//! from its logits, a constrained draw, or the token the executor already chose), verified
//! drafts are kept or dropped, `n > 1` requests fork, and every token is emitted to its
//! request with the stops and limits applied one token at a time.

use super::{Engine, Readout};
use crate::backend::batch::StepOutput;
use crate::engine::prompt_lookup;
use crate::engine::request::{Event, FinishReason, RequestId, TokenLogprob};
use crate::engine::sampler::{argmax, logprobs_of, Sampler};
use crate::engine::scheduler::ScheduledBatch;
use crate::engine::sequence::{SeqId, Sequence};
use crate::model::Logits;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

impl Engine {
    /// The step ran: its planned KV changes take effect, and each row's token is chosen (and
    /// sent to its request).
    pub(super) fn postprocess(
        &mut self,
        batch: &ScheduledBatch,
        out: StepOutput,
        readout: &Readout,
    ) {
        self.sched.commit(batch);
        self.local.steps += 1;
        self.pool_hidden(batch);
        match out {
            StepOutput::Logits(logits) => {
                self.postprocess_logits(batch, &logits);
                self.exec.recycle(logits);
            }
            StepOutput::Tokens(tokens) => {
                let drawn = matches!(readout, Readout::DeviceSampled(_));
                self.postprocess_tokens(batch, &tokens, drawn);
            }
        }
    }

    /// [`Self::postprocess`] for a step whose rows came back as token ids: greedy, or `drawn`
    /// on the device from each sampler's generator state (which then moves on by that draw).
    fn postprocess_tokens(&mut self, batch: &ScheduledBatch, tokens: &[u32], drawn: bool) {
        let mut row = 0;
        for span in &batch.spans {
            if span.logits == Logits::None {
                continue;
            }
            if span.draft > 0 {
                self.verify_draft(span.seq, &tokens[row..row + span.len]);
                row += span.len;
                continue;
            }
            let token = tokens[row];
            row += 1;
            let Some(s) = self.sched.get_mut(span.seq) else {
                continue;
            };
            if s.num_computed != s.tokens.len() {
                continue;
            }
            if drawn {
                s.sampler.skip_draw();
            }
            self.sample_for(span.seq, Pick::Token(token));
        }
    }

    /// [`Self::postprocess`] for a step whose rows came back as logits.
    fn postprocess_logits(&mut self, batch: &ScheduledBatch, logits: &[f32]) {
        let vocab = self.vocab_size;
        let mut row = 0;
        for span in &batch.spans {
            let rows = match span.logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => span.len,
            };
            let span_logits = &logits[row * vocab..(row + rows) * vocab];
            row += rows;
            if span.draft > 0 {
                let argmax: Vec<u32> = span_logits.chunks_exact(vocab).map(argmax).collect();
                self.verify_draft(span.seq, &argmax);
                continue;
            }
            if span.logits == Logits::All {
                self.collect_prompt_logprobs(span.seq, span.start, span.len, span_logits);
            }
            let Some(s) = self.sched.get(span.seq) else {
                continue;
            };
            if rows == 0 || s.num_computed != s.tokens.len() {
                continue;
            }
            let last = &span_logits[(rows - 1) * vocab..rows * vocab];
            self.on_logits(span.seq, last);
        }
    }

    /// A speculative decode step ran: `argmax[j]` is the model's choice after the pending
    /// token and the first `j` draft tokens. Draft tokens are taken while they match it (their
    /// K/V is already computed), then the model's own choice where they stop matching (or
    /// after the whole draft): every token goes through `sample_for`, as a plain step's would,
    /// so stops and length limits apply one token at a time.
    fn verify_draft(&mut self, seq: SeqId, argmax: &[u32]) {
        let Some(s) = self.sched.get_mut(seq) else {
            return;
        };
        let draft = std::mem::take(&mut s.draft);
        debug_assert_eq!(argmax.len(), draft.len() + 1);
        self.local.draft_tokens += draft.len() as u64;
        let mut accepted = 0;
        for (j, &token) in argmax.iter().enumerate() {
            self.sample_for(seq, Pick::Token(token));
            let live = self.sched.get(seq).is_some();
            if !live || draft.get(j) != Some(&token) {
                break;
            }
            accepted += 1;
            self.sched.accept_computed(seq, 1);
        }
        self.local.accepted_draft_tokens += accepted as u64;
        if let Some(s) = self.sched.get_mut(seq) {
            s.draft_cap = prompt_lookup::next_cap(draft.len(), accepted, self.prompt_lookup);
        }
    }

    fn collect_prompt_logprobs(&mut self, seq: SeqId, start: usize, len: usize, rows: &[f32]) {
        let vocab = self.vocab_size;
        let Some(s) = self.sched.get(seq) else { return };
        let st = self
            .requests
            .get_mut(&s.request)
            .expect("request of a live seq");
        let top_n = st.params.prompt_logprobs.unwrap_or(0);
        if start == 0 {
            st.prompt_logprobs = vec![None];
        }
        for j in 0..len {
            let pos = start + j + 1; // row j predicts the token at start+j+1
            if pos >= st.prompt_len {
                break;
            }
            st.prompt_logprobs.push(Some(token_logprob(
                &rows[j * vocab..(j + 1) * vocab],
                s.tokens[pos],
                top_n,
            )));
        }
        if st.prompt_logprobs.len() == st.prompt_len {
            let lp = std::mem::take(&mut st.prompt_logprobs);
            let _ = st.events.send(Event::PromptLogprobs(lp));
        }
    }

    /// The sequence's last position has logits: fork if asked, then sample.
    fn on_logits(&mut self, seq: SeqId, logits: &[f32]) {
        let parent = self.sched.get_mut(seq).expect("live");
        let rid = parent.request;
        let forks = std::mem::take(&mut parent.forks_pending);
        let mut targets = vec![seq];
        if forks > 0 {
            let params = self.requests[&rid].params.sampling.clone();
            for i in 1..=forks {
                let id = self.next_seq;
                self.next_seq += 1;
                let mut p = params.clone();
                p.seed = p.seed.map(|s| s.wrapping_add(i as u64));
                // The forks start where the parent stands: at the end of the prompt.
                let child = self
                    .sched
                    .get(seq)
                    .expect("live")
                    .fork(id, i, Sampler::new(p));
                self.sched.add_fork(seq, child);
                let st = self.requests.get_mut(&rid).expect("live");
                st.seqs.push(id);
                st.live += 1;
            }
            targets.extend(self.requests[&rid].seqs[1..].iter().copied());
        }
        for id in targets {
            self.sample_for(id, Pick::Logits(logits));
        }
    }

    /// Chooses `seq`'s next token from `pick` and emits it; a stop token, a complete grammar
    /// or a length limit then ends the sequence.
    fn sample_for(&mut self, seq: SeqId, pick: Pick<'_>) {
        let rid = self.sched.get(seq).expect("live").request;
        let now = Instant::now();
        if self.requests[&rid].budget == 0 {
            // Scoring only (echo with max_tokens 0): the prompt logprobs were the answer.
            self.finish_seq(seq, FinishReason::Length);
            return;
        }
        let pick = match self.constrain(seq, rid, pick) {
            Ok(pick) => pick,
            Err(e) => return self.fail_grammar(seq, &e),
        };
        let token = self.draw(seq, pick);
        self.note_token_time(rid, now);
        let p = &self.requests[&rid].params;
        let is_stop = !p.ignore_eos && self.eog.contains(&token) || p.stop_tokens.contains(&token);
        if is_stop {
            self.finish_seq(seq, FinishReason::Stop);
            return;
        }
        let logprob = p.logprobs.and_then(|n| match pick {
            Pick::Logits(logits) => Some(token_logprob(logits, token, n)),
            Pick::Masked => Some(token_logprob(&self.masked, token, n)),
            Pick::Token(_) => None,
        });
        // The grammar follows the token; a complete output ends the sequence.
        let mut grammar_done = false;
        if let Some(c) = self.sched.get_mut(seq).and_then(|s| s.constraint.as_mut()) {
            if let Err(e) = c.accept(token) {
                return self.fail_grammar(seq, &e);
            }
            grammar_done = c.is_finished();
        }
        let st = &self.requests[&rid];
        let s = self.sched.get_mut(seq).expect("live");
        let _ = st.events.send(Event::Token {
            index: s.index,
            token,
            logprob,
        });
        let at_limit = s.generated() + 1 >= st.budget || s.tokens.len() + 1 >= s.max_len;
        s.tokens.push(token);
        if grammar_done {
            self.finish_seq(seq, FinishReason::Stop);
        } else if at_limit {
            self.finish_seq(seq, FinishReason::Length);
        }
    }

    /// A constrained sequence chooses from its masked row, or takes the one token its grammar
    /// allows (logprobs then describe what it could choose from); other picks pass through.
    fn constrain<'a>(
        &mut self,
        seq: SeqId,
        rid: RequestId,
        pick: Pick<'a>,
    ) -> Result<Pick<'a>, String> {
        let Pick::Logits(logits) = pick else {
            return Ok(pick);
        };
        let wants_logprobs = self.requests[&rid].params.logprobs.is_some();
        let Sequence {
            constraint: Some(c),
            mask,
            ..
        } = self.sched.get_mut(seq).expect("live")
        else {
            return Ok(pick);
        };
        let mask = mask.take().unwrap_or_else(|| {
            // A fork, or a row the step did not foresee: computed here.
            let started = Instant::now();
            let m = c.mask();
            self.local.grammar_mask_seconds += started.elapsed().as_secs_f64();
            m
        })?;
        // A forced token needs no sampling (unless its logprob is asked for).
        if let Some(t) = mask.forced().filter(|_| !wants_logprobs) {
            return Ok(Pick::Token(t));
        }
        self.masked.clear();
        self.masked.extend_from_slice(logits);
        mask.apply(&mut self.masked, &self.eog);
        Ok(Pick::Masked)
    }

    /// The token `pick` stands for: drawn by the sequence's sampler, or already chosen.
    fn draw(&mut self, seq: SeqId, pick: Pick<'_>) -> u32 {
        let s = self.sched.get_mut(seq).expect("live");
        let history = &s.tokens[s.prompt_len..];
        match pick {
            Pick::Logits(logits) => s.sampler.sample(logits, history),
            Pick::Masked => s.sampler.sample(&self.masked, history),
            // Greedy without penalties: the CPU sampler would have taken the argmax and drawn
            // nothing from its generator, so skipping it leaves it where it would be.
            Pick::Token(t) => t,
        }
    }

    /// A token of request `rid` came out at `now`: its time to first token, or the time
    /// since its last one.
    fn note_token_time(&mut self, rid: RequestId, now: Instant) {
        let st = self.requests.get_mut(&rid).expect("live");
        if st.first_token.is_none() {
            st.first_token = Some(now);
            let ttft = now.duration_since(st.arrived).as_secs_f64();
            self.local.record_ttft(unix_now(), ttft);
        } else if let Some(prev) = st.last_token {
            self.local
                .tpot
                .observe(now.duration_since(prev).as_secs_f64());
        }
        st.last_token = Some(now);
        self.local.record_tokens(unix_now() as u64, 1);
    }

    /// A constrained sequence's grammar failed (a per-step limit): its request ends with the
    /// error; the engine goes on.
    fn fail_grammar(&mut self, seq: SeqId, e: &str) {
        if let Some(st) = self
            .sched
            .get(seq)
            .and_then(|s| self.requests.get(&s.request))
        {
            let _ = st
                .events
                .send(Event::Error(format!("the grammar failed: {e}")));
        }
        self.finish_seq(seq, FinishReason::Cancelled);
    }
}

/// How the next token of a sequence is chosen: by its sampler from logits, or already chosen.
#[derive(Clone, Copy)]
enum Pick<'a> {
    Logits(&'a [f32]),
    /// From the engine's masked copy of the row (a constrained sequence).
    Masked,
    Token(u32),
}

fn token_logprob(logits: &[f32], token: u32, top_n: usize) -> TokenLogprob {
    let (logprob, top) = logprobs_of(logits, token, top_n);
    TokenLogprob {
        token,
        logprob,
        top,
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}
