//! The engine thread: owns the model, the KV pages, the scheduler and every sequence. Other
//! threads talk to it only through channels (`EngineHandle`). One step is nano-vllm's four
//! lines: schedule → run → postprocess → emit.

use super::executor::{Executor, ExecutorPlan};
use super::handle::{Command, EngineHandle, EngineLimits};
use super::metrics::{EngineStats, SharedStats};
use super::pacer::PrefillPacer;
use super::prompt_lookup;
use super::request::{Event, FinishReason, GenParams, Request, RequestId, TokenLogprob};
use super::sampler::{argmax, logprobs_of, Sampler, SamplingParams};
use super::scheduler::{ScheduledBatch, Scheduler, SchedulerConfig};
use super::sequence::{SeqId, Sequence};
use crate::backend::batch::StepOutput;
use crate::backend::select::Backend;
use crate::grammar::{Constraint, Mask};
use crate::kv::plan::KvPlan;
use crate::kv::{BlockPool, KvType};
use crate::model::{BatchMeta, Logits, Model};
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Prompt tokens a paced step carries at least, so a long prompt always progresses (at long
/// context one token of prefill can cost as much as a whole decode step on a small CPU).
const PACED_MIN_CHUNK: usize = 4;

/// The default for [`EngineConfig::prefill_pacing`].
pub const DEFAULT_PREFILL_PACING: f64 = 2.0;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub kv_type: KvType,
    pub block_size: usize,
    /// Bytes of KV memory to preallocate.
    pub kv_memory_bytes: usize,
    pub max_seqs: usize,
    pub max_batched_tokens: usize,
    /// Context limit (0: the model's own).
    pub max_context: usize,
    /// While sequences decode, a step carrying prefill may take at most this many times a
    /// decode-only step (see `pacer`); 0 or 1: prefill takes the whole step budget.
    pub prefill_pacing: f64,
    /// What runs the steps (`select::resolve`); CUDA falls back to the CPU if it cannot start.
    pub backend: Backend,
    /// CUDA: device memory the KV pool leaves free (its size is everything else; the CPU pool
    /// is `kv_memory_bytes`).
    pub gpu_reserve_bytes: usize,
    /// Prompt lookup: draft tokens a decode step may verify for a request that asks for it
    /// (`GenParams::prompt_lookup`); 0: off.
    pub prompt_lookup: usize,
}

/// The default for [`EngineConfig::gpu_reserve_bytes`].
pub const DEFAULT_GPU_RESERVE_MIB: usize = 512;

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            kv_type: KvType::F16,
            block_size: 16,
            kv_memory_bytes: 256 << 20,
            max_seqs: 16,
            max_batched_tokens: 512,
            max_context: 0,
            prefill_pacing: DEFAULT_PREFILL_PACING,
            backend: Backend::Cpu,
            gpu_reserve_bytes: DEFAULT_GPU_RESERVE_MIB << 20,
            prompt_lookup: 0,
        }
    }
}

struct RequestState {
    events: Sender<Event>,
    params: GenParams,
    prompt_len: usize,
    seqs: Vec<SeqId>,
    live: usize,
    arrived: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    prompt_logprobs: Vec<Option<TokenLogprob>>,
}

pub struct Engine {
    model: Arc<Model>,
    exec: Executor,
    sched: Scheduler,
    requests: HashMap<RequestId, RequestState>,
    seq_request: HashMap<SeqId, RequestId>,
    samplers: HashMap<SeqId, Sampler>,
    /// Each constrained sequence's grammar state (requests with a response format or tools).
    constraints: HashMap<SeqId, Constraint>,
    /// Masks computed beside this step's forward pass, for the sequences that sample in it.
    ready_masks: HashMap<SeqId, Result<Mask, String>>,
    /// Scratch logits row a constraint masks (no vocab-sized allocation per step).
    masked: Vec<f32>,
    eog: Vec<u32>,
    context: usize,
    next_seq: SeqId,
    arrivals: u64,
    stats: SharedStats,
    local: EngineStats,
    pacer: PrefillPacer,
    /// `EngineConfig::prompt_lookup`.
    prompt_lookup: usize,
}

impl Engine {
    /// Allocates the KV pool once and starts the engine thread.
    pub fn start(
        model: Arc<Model>,
        eog: Vec<u32>,
        config: EngineConfig,
    ) -> Result<(EngineHandle, std::thread::JoinHandle<()>)> {
        let cfg = &model.config;
        let geom = cfg.page_geometry(config.kv_type, config.block_size);
        if config.block_size == 0 {
            bail!("block size must be at least 1 token");
        }
        if config.kv_type.row_bytes(cfg.head_dim).is_none() {
            bail!(
                "KV type {} needs head_dim to be a multiple of 32 (it is {})",
                config.kv_type,
                cfg.head_dim
            );
        }
        let blocks = config.kv_memory_bytes / geom.block_bytes();
        if blocks == 0 {
            bail!(
                "KV memory of {} bytes holds no block of {} bytes",
                config.kv_memory_bytes,
                geom.block_bytes()
            );
        }
        let context = match config.max_context {
            0 => cfg.context_length,
            c => c.min(cfg.context_length),
        };
        let exec = Executor::start(
            &model,
            &ExecutorPlan {
                backend: config.backend,
                geom,
                cpu_blocks: blocks,
                max_tokens: config.max_batched_tokens,
                max_seqs: config.max_seqs,
                context,
                gpu_reserve_bytes: config.gpu_reserve_bytes,
            },
        )?;
        // The CUDA pool sizes itself from the device's free memory.
        let blocks = exec.blocks();
        let plan = KvPlan::new(
            &geom,
            &model.layout,
            cfg.n_head,
            exec.kv_bytes(),
            context,
            512,
        );
        log::info!(
            "KV pool{}: {} blocks of {} tokens, {} bytes per block ({} KiB per token... {} B/token), {} MiB in all, {}",
            if exec.is_cuda() { " (device memory)" } else { "" },
            blocks,
            config.block_size,
            geom.block_bytes(),
            plan.kv_bytes_per_token / 1024,
            plan.kv_bytes_per_token,
            exec.kv_bytes() >> 20,
            config.kv_type
        );
        log::info!(
            "KV pool holds at once: {} sequences of 512 tokens, {} of 2048, {} of {} (the full context)",
            plan.seqs_at(512),
            plan.seqs_at(2048),
            plan.seqs_at(context),
            context
        );
        let sched = Scheduler::new(
            SchedulerConfig {
                max_seqs: config.max_seqs,
                max_batched_tokens: config.max_batched_tokens,
            },
            BlockPool::new(blocks, config.block_size),
            model.layout.clone(),
        );
        let limits = EngineLimits {
            context,
            capacity_tokens: sched.capacity_tokens(),
            vocab_size: cfg.vocab_size,
            max_n: config.max_seqs.max(1),
        };
        let stats: SharedStats = Arc::new(Mutex::new(EngineStats::default()));
        let (tx, rx) = mpsc::channel();
        let mut engine = Engine {
            model,
            exec,
            sched,
            requests: HashMap::new(),
            seq_request: HashMap::new(),
            samplers: HashMap::new(),
            constraints: HashMap::new(),
            ready_masks: HashMap::new(),
            masked: Vec::new(),
            eog,
            context,
            next_seq: 0,
            arrivals: 0,
            stats: stats.clone(),
            local: EngineStats::default(),
            pacer: PrefillPacer::new(config.prefill_pacing, PACED_MIN_CHUNK),
            prompt_lookup: config.prompt_lookup,
        };
        engine.local.kv_pool_bytes = engine.exec.kv_bytes();
        engine.local.block_size = config.block_size;
        engine.local.weight_bytes = engine.model.file_bytes();
        engine.local.backend = engine.exec.backend_name();
        engine.publish();
        let handle = EngineHandle::new(tx, stats, limits, plan);
        let thread = std::thread::Builder::new()
            .name("edgelm-engine".into())
            .spawn(move || {
                // The engine thread computes too (it is one of the pool's threads).
                crate::backend::cpu::pool::lower_thread_priority();
                engine.serve(rx)
            })?;
        Ok((handle, thread))
    }

    /// The engine thread's loop: take commands, step while there is work, publish stats.
    fn serve(mut self, rx: Receiver<Command>) {
        let mut shutting_down = false;
        // systemd's watchdog is fed from here, so a wedged loop stops the pings.
        let mut watchdog = crate::systemd::Watchdog::from_env();
        // Whether a step ran since the heap was last trimmed.
        let mut worked = false;
        loop {
            if let Some(w) = watchdog.as_mut() {
                w.ping();
            }
            // Idle: block for work (waking to ping the watchdog). Busy: take what arrived,
            // then step.
            if self.sched.is_idle() {
                if shutting_down {
                    break;
                }
                if std::mem::take(&mut worked) {
                    self.exec.release_step_buffers();
                    super::heap::release_free_memory();
                }
                let cmd = match &watchdog {
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(w) => rx.recv_timeout(w.due_in().max(Duration::from_millis(1))),
                };
                match cmd {
                    Ok(cmd) => shutting_down |= self.apply(cmd),
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
            while let Ok(cmd) = rx.try_recv() {
                shutting_down |= self.apply(cmd);
            }
            if !self.sched.is_idle() {
                self.step();
                worked = true;
            }
            self.publish();
        }
        log::info!("engine stopped");
    }

    /// Returns true on shutdown.
    fn apply(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit(req, events) => self.admit(*req, events),
            Command::Cancel(id) => self.finish_request(id, FinishReason::Cancelled),
            Command::Shutdown => return true,
        }
        false
    }

    fn admit(&mut self, mut req: Request, events: Sender<Event>) {
        // The request's compiled constraint moves to its first sequence (forks clone it).
        let constraint = req.params.constraint.take();
        let p = &req.params;
        if p.max_tokens == 0 && p.prompt_logprobs.is_none() {
            for index in 0..p.n {
                let _ = events.send(Event::Finished {
                    index,
                    reason: FinishReason::Length,
                    prompt_tokens: req.prompt.len(),
                    completion_tokens: 0,
                    cached_tokens: 0,
                });
            }
            return;
        }
        let id = self.next_seq;
        self.next_seq += 1;
        self.arrivals += 1;
        let max_len = req
            .prompt
            .len()
            .saturating_add(p.max_tokens)
            .min(self.context);
        let mut seq = Sequence::new(id, req.id, self.arrivals, req.prompt.clone(), max_len);
        seq.arrived = req.submitted;
        seq.want_prompt_logits = p.prompt_logprobs.is_some();
        seq.forks_pending = p.n - 1;
        self.samplers.insert(id, Sampler::new(p.sampling.clone()));
        if let Some(c) = constraint {
            self.constraints.insert(id, c);
            self.local.constrained_requests += 1;
        }
        self.seq_request.insert(id, req.id);
        self.sched.add(seq);
        self.local.prompt_tokens += req.prompt.len() as u64;
        self.requests.insert(
            req.id,
            RequestState {
                events,
                prompt_len: req.prompt.len(),
                params: req.params,
                seqs: vec![id],
                live: 1,
                arrived: Instant::now(),
                first_token: None,
                last_token: None,
                prompt_logprobs: Vec::new(),
            },
        );
    }

    /// One engine step: schedule → run → postprocess, which emits each request's events.
    fn step(&mut self) {
        let Some(batch) = self.schedule() else {
            return;
        };
        let readout = self.readout(&batch);
        match self.run(&batch, &readout) {
            Ok(out) => self.postprocess(&batch, out, &readout),
            Err(e) => self.fail_batch(&batch, &e),
        }
    }

    /// The next batch within the step's token budget, its prefill share paced against the
    /// streams it would delay; `None` when nothing can run.
    fn schedule(&mut self) -> Option<ScheduledBatch> {
        self.propose_drafts();
        let pacer = &self.pacer;
        let batch = self
            .sched
            .schedule_paced(|decodes, left| pacer.prefill_budget(decodes, left));
        (!batch.spans.is_empty()).then_some(batch)
    }

    /// Gives each decoding sequence that may speculate its prompt-lookup draft: greedy (the
    /// draft is then verified against the argmax, so the output is what a plain run gives),
    /// one completion, no grammar, no logprobs; never past its length limit.
    fn propose_drafts(&mut self) {
        if self.prompt_lookup == 0 {
            return;
        }
        let ids: Vec<SeqId> = self
            .sched
            .sequences()
            .filter(|s| s.is_decoding() && self.may_speculate(s.id))
            .map(|s| s.id)
            .collect();
        for id in ids {
            let s = self.sched.get_mut(id).expect("listed");
            // The pending token and the bonus token after the draft are within max_len.
            let room = s.max_len.saturating_sub(s.tokens.len() + 1);
            let cap = match s.draft_cap {
                0 => self.prompt_lookup.min(prompt_lookup::FIRST_CAP),
                c => c,
            };
            s.draft = prompt_lookup::draft(&s.tokens, cap.min(room));
        }
    }

    /// Whether `seq`'s request asked for prompt lookup and reads out as plain greedy.
    fn may_speculate(&self, seq: SeqId) -> bool {
        let (Some(s), Some(st)) = (
            self.sched.get(seq),
            self.seq_request
                .get(&seq)
                .and_then(|r| self.requests.get(r)),
        ) else {
            return false;
        };
        let p = &st.params;
        p.prompt_lookup
            && p.n == 1
            && s.forks_pending == 0
            && p.prompt_logprobs.is_none()
            && self.plain_greedy(seq, p)
    }

    /// Greedy without penalties, no logprobs, no grammar: the argmax is the whole readout.
    fn plain_greedy(&self, seq: SeqId, p: &GenParams) -> bool {
        let sp = &p.sampling;
        !self.constraints.contains_key(&seq)
            && p.logprobs.is_none()
            && sp.temperature <= 0.0
            && sp.repetition_penalty == 1.0
            && sp.presence_penalty == 0.0
            && sp.frequency_penalty == 0.0
    }

    /// Runs `batch` through the model (with the constrained rows' masks computed beside it)
    /// and returns its rows as `readout` asks.
    fn run(&mut self, batch: &ScheduledBatch, readout: &Readout) -> Result<StepOutput> {
        for &(src, dst) in &batch.copies {
            self.exec.copy_block(src as usize, dst as usize)?;
        }
        let meta = self.batch_meta(batch);
        let started = Instant::now();
        // The constrained sequences that sample in this step have their masks computed on
        // another thread while the forward pass runs (a mask depends only on the tokens so far).
        let mut mask_jobs: Vec<(SeqId, Constraint)> = batch
            .spans
            .iter()
            .filter(|sp| {
                sp.logits != Logits::None
                    && self
                        .sched
                        .get(sp.seq)
                        .is_some_and(|s| sp.start + sp.len == s.tokens.len())
            })
            .filter_map(|sp| self.constraints.remove(&sp.seq).map(|c| (sp.seq, c)))
            .collect();
        let (result, masks) = std::thread::scope(|scope| {
            let masking = (!mask_jobs.is_empty()).then(|| {
                scope.spawn(|| {
                    let started = Instant::now();
                    let masks: Vec<(SeqId, Result<Mask, String>)> = mask_jobs
                        .iter_mut()
                        .map(|(id, c)| (*id, c.mask()))
                        .collect();
                    (masks, started.elapsed().as_secs_f64())
                })
            });
            let result = match readout {
                Readout::DeviceSampled(rows) => self
                    .exec
                    .forward_sample(&self.model, &meta, rows)
                    .map(StepOutput::Tokens),
                Readout::Greedy => self
                    .exec
                    .forward_greedy(&self.model, &meta)
                    .map(StepOutput::Tokens),
                Readout::Logits => self
                    .exec
                    .forward(&self.model, &meta)
                    .map(StepOutput::Logits),
            };
            let masks = masking.map(|h| h.join().expect("the mask thread does not panic"));
            (result, masks)
        });
        self.constraints.extend(mask_jobs);
        if let Some((masks, secs)) = masks {
            self.local.grammar_mask_seconds += secs;
            self.ready_masks.extend(masks);
        }
        let decodes = batch.spans.iter().filter(|s| s.is_decode());
        let (decode_spans, decode_tokens) = decodes.fold((0, 0), |(n, t), s| (n + 1, t + s.len));
        self.pacer.observe(
            decode_spans,
            batch.num_tokens() - decode_tokens,
            started.elapsed().as_secs_f64(),
        );
        result
    }

    /// The step's tokens, positions and block tables, as the forward pass takes them.
    fn batch_meta(&self, batch: &ScheduledBatch) -> BatchMeta {
        let mut meta = BatchMeta::default();
        for span in &batch.spans {
            let s = self.sched.get(span.seq).expect("scheduled seq exists");
            let ran = span.start + span.len - span.draft;
            let tokens: Vec<u32> = s.tokens[span.start..ran]
                .iter()
                .chain(&s.draft[..span.draft])
                .copied()
                .collect();
            meta.push_span(&tokens, span.start, s.blocks.tables().to_vec(), span.logits);
            meta.mark_generated_from(s.prompt_len);
        }
        meta
    }

    /// How this step's rows come back. Greedy rows are reduced to their argmax by the
    /// executor: on the GPU only token ids come back; on the CPU it is the argmax the sampler
    /// would take (one path, so the CPU tests exercise it too). On the GPU, other rows without
    /// penalties or logprobs are sampled there too.
    fn readout(&self, batch: &ScheduledBatch) -> Readout {
        if self.all_greedy(batch) {
            return Readout::Greedy;
        }
        match self.exec.is_cuda().then(|| self.device_sample_rows(batch)) {
            Some(Some(rows)) => Readout::DeviceSampled(rows),
            _ => Readout::Logits,
        }
    }

    /// The step ran: its planned KV changes take effect, and each row's token is chosen (and
    /// sent to its request).
    fn postprocess(&mut self, batch: &ScheduledBatch, out: StepOutput, readout: &Readout) {
        self.sched.commit(batch);
        self.local.steps += 1;
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

    /// A step that failed (should be unreachable: everything was validated) ends the requests
    /// it carried with an error; it never takes the engine down.
    fn fail_batch(&mut self, batch: &ScheduledBatch, e: &anyhow::Error) {
        log::error!("forward pass failed: {e:#}");
        let reqs: Vec<RequestId> = batch
            .spans
            .iter()
            .filter_map(|s| self.seq_request.get(&s.seq).copied())
            .collect();
        for r in reqs {
            if let Some(st) = self.requests.get(&r) {
                let _ = st.events.send(Event::Error(format!("internal error: {e}")));
            }
            self.finish_request(r, FinishReason::Cancelled);
        }
    }

    /// Per logits row of `batch`, its sampling parameters and its sampler's generator state,
    /// when every row can be sampled on the device: one row per span, no penalties, no
    /// logprobs, no forks. `None` otherwise (the rows then come back as logits).
    fn device_sample_rows(&self, batch: &ScheduledBatch) -> Option<Vec<(SamplingParams, u64)>> {
        let mut rows = Vec::new();
        for span in &batch.spans {
            if span.logits == Logits::None {
                continue;
            }
            let s = self.sched.get(span.seq)?;
            let st = self.requests.get(self.seq_request.get(&span.seq)?)?;
            let sampler = self.samplers.get(&span.seq)?;
            let p = sampler.params();
            let plain = span.logits == Logits::Last
                && !self.constraints.contains_key(&span.seq)
                && s.forks_pending == 0
                && st.params.logprobs.is_none()
                && p.repetition_penalty == 1.0
                && p.presence_penalty == 0.0
                && p.frequency_penalty == 0.0;
            if !plain {
                return None;
            }
            rows.push((p.clone(), sampler.rng_state()));
        }
        Some(rows)
    }

    /// Can every logits row of `batch` be reduced to its argmax where it was computed: one row
    /// per span (no prompt logprobs), greedy sampling without penalties, no logprobs, no forks?
    fn all_greedy(&self, batch: &ScheduledBatch) -> bool {
        batch.spans.iter().all(|span| {
            if span.logits == Logits::None {
                return true;
            }
            let (Some(s), Some(rid)) = (self.sched.get(span.seq), self.seq_request.get(&span.seq))
            else {
                return false;
            };
            let Some(st) = self.requests.get(rid) else {
                return false;
            };
            (span.logits == Logits::Last || span.draft > 0)
                && s.forks_pending == 0
                && self.plain_greedy(span.seq, &st.params)
        })
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
            let Some(s) = self.sched.get(span.seq) else {
                continue;
            };
            if s.num_computed != s.tokens.len() {
                continue;
            }
            if drawn {
                if let Some(sampler) = self.samplers.get_mut(&span.seq) {
                    sampler.skip_draw();
                }
            }
            self.sample_for(span.seq, Pick::Token(token));
        }
    }

    /// [`Self::postprocess`] for a step whose rows came back as logits.
    fn postprocess_logits(&mut self, batch: &ScheduledBatch, logits: &[f32]) {
        let vocab = self.model.config.vocab_size;
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
        let vocab = self.model.config.vocab_size;
        let Some(&rid) = self.seq_request.get(&seq) else {
            return;
        };
        let Some(s) = self.sched.get(seq) else { return };
        let tokens = s.tokens.clone();
        let st = self.requests.get_mut(&rid).expect("request of a live seq");
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
                tokens[pos],
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
        let rid = self.seq_request[&seq];
        let forks = self.sched.get(seq).map_or(0, |s| s.forks_pending);
        let mut targets = vec![seq];
        if forks > 0 {
            let parent = self.sched.get_mut(seq).expect("live").clone();
            self.sched.get_mut(seq).expect("live").forks_pending = 0;
            let params = self.requests[&rid].params.sampling.clone();
            for i in 1..=forks {
                let id = self.next_seq;
                self.next_seq += 1;
                let child = Sequence {
                    id,
                    index: i,
                    forks_pending: 0,
                    blocks: Default::default(),
                    ..parent.clone()
                };
                self.sched.add_fork(seq, child);
                let mut p = params.clone();
                p.seed = p.seed.map(|s| s.wrapping_add(i as u64));
                self.samplers.insert(id, Sampler::new(p));
                if let Some(c) = self.constraints.get(&seq) {
                    // The fork starts where the parent stands: at the end of the prompt.
                    let c = c.clone();
                    self.constraints.insert(id, c);
                }
                self.seq_request.insert(id, rid);
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

    fn sample_for(&mut self, seq: SeqId, pick: Pick<'_>) {
        let rid = self.seq_request[&seq];
        let (index, generated, prompt_len, max_len, len) = {
            let s = self.sched.get(seq).expect("live");
            (
                s.index,
                s.generated(),
                s.prompt_len,
                s.max_len,
                s.tokens.len(),
            )
        };
        let now = Instant::now();
        let st = self.requests.get_mut(&rid).expect("live");
        if st.params.max_tokens == 0 {
            // Scoring only (echo with max_tokens 0): the prompt logprobs were the answer.
            self.finish_seq(seq, FinishReason::Length);
            return;
        }
        let history = &self.sched.get(seq).expect("live").tokens[prompt_len..];
        // A constrained sequence samples from its masked row (or takes the one token its
        // grammar allows); logprobs then describe what it could choose from.
        let mut pick = pick;
        if let (Pick::Logits(logits), Some(c)) = (pick, self.constraints.get_mut(&seq)) {
            let mask = self.ready_masks.remove(&seq).unwrap_or_else(|| {
                // A fork, or a row the step did not foresee: computed here.
                let started = Instant::now();
                let m = c.mask();
                self.local.grammar_mask_seconds += started.elapsed().as_secs_f64();
                m
            });
            match mask {
                // A forced token needs no sampling (unless its logprob is asked for).
                Ok(mask) => match mask.forced().filter(|_| st.params.logprobs.is_none()) {
                    Some(t) => pick = Pick::Token(t),
                    None => {
                        self.masked.clear();
                        self.masked.extend_from_slice(logits);
                        mask.apply(&mut self.masked, &self.eog);
                        pick = Pick::Masked;
                    }
                },
                Err(e) => return self.fail_grammar(seq, &e),
            }
        }
        let token = match pick {
            Pick::Logits(logits) => self
                .samplers
                .get_mut(&seq)
                .expect("sampler")
                .sample(logits, history),
            Pick::Masked => self
                .samplers
                .get_mut(&seq)
                .expect("sampler")
                .sample(&self.masked, history),
            // Greedy without penalties: the CPU sampler would have taken the argmax and drawn
            // nothing from its generator, so skipping it leaves it where it would be.
            Pick::Token(t) => t,
        };
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
        let is_stop = !st.params.ignore_eos && self.eog.contains(&token)
            || st.params.stop_tokens.contains(&token);
        if is_stop {
            self.finish_seq(seq, FinishReason::Stop);
            return;
        }
        let logprob = match pick {
            Pick::Logits(logits) => st.params.logprobs.map(|n| token_logprob(logits, token, n)),
            Pick::Masked => st
                .params
                .logprobs
                .map(|n| token_logprob(&self.masked, token, n)),
            Pick::Token(_) => None,
        };
        // The grammar follows the token; a complete output ends the sequence.
        let mut grammar_done = false;
        if let Some(c) = self.constraints.get_mut(&seq) {
            if let Err(e) = c.accept(token) {
                return self.fail_grammar(seq, &e);
            }
            grammar_done = c.is_finished();
        }
        let _ = st.events.send(Event::Token {
            index,
            token,
            logprob,
        });
        if grammar_done {
            self.sched.get_mut(seq).expect("live").tokens.push(token);
            self.finish_seq(seq, FinishReason::Stop);
            return;
        }
        if generated + 1 >= st.params.max_tokens || len + 1 >= max_len {
            self.sched.get_mut(seq).expect("live").tokens.push(token);
            self.finish_seq(seq, FinishReason::Length);
            return;
        }
        self.sched.get_mut(seq).expect("live").tokens.push(token);
    }

    /// A constrained sequence's grammar failed (a per-step limit): its request ends with the
    /// error; the engine goes on.
    fn fail_grammar(&mut self, seq: SeqId, e: &str) {
        if let Some(st) = self
            .seq_request
            .get(&seq)
            .and_then(|r| self.requests.get(r))
        {
            let _ = st
                .events
                .send(Event::Error(format!("the grammar failed: {e}")));
        }
        self.finish_seq(seq, FinishReason::Cancelled);
    }

    fn finish_seq(&mut self, seq: SeqId, reason: FinishReason) {
        let Some(s) = self.sched.remove(seq) else {
            return;
        };
        self.samplers.remove(&seq);
        self.constraints.remove(&seq);
        self.ready_masks.remove(&seq);
        self.seq_request.remove(&seq);
        let rid = s.request;
        let Some(st) = self.requests.get_mut(&rid) else {
            return;
        };
        let completion = s.generated() + usize::from(reason == FinishReason::Stop);
        let _ = st.events.send(Event::Finished {
            index: s.index,
            reason,
            prompt_tokens: s.prompt_len,
            completion_tokens: completion,
            cached_tokens: s.cached_tokens,
        });
        st.live -= 1;
        // Forks not yet created (the parent finished before its prompt was done) end too.
        if st.live == 0 {
            let pending_forks = s.forks_pending;
            for index in 1..=pending_forks {
                let _ = st.events.send(Event::Finished {
                    index,
                    reason,
                    prompt_tokens: s.prompt_len,
                    completion_tokens: 0,
                    cached_tokens: 0,
                });
            }
            self.requests.remove(&rid);
            self.local.requests_finished += 1;
        }
    }

    fn finish_request(&mut self, rid: RequestId, reason: FinishReason) {
        let Some(st) = self.requests.get(&rid) else {
            return;
        };
        for seq in st.seqs.clone() {
            self.finish_seq(seq, reason);
        }
    }

    fn publish(&mut self) {
        let c = &self.sched.counters;
        self.local.running = self.sched.num_running();
        self.local.waiting = self.sched.num_waiting();
        self.local.kv_blocks_total = self.sched.pool.total();
        self.local.kv_blocks_used = self.sched.pool.used();
        self.local.kv_blocks_cached = self.sched.pool.cached_count();
        self.local.prefix_queried_tokens = c.prefix_queried_tokens;
        self.local.prefix_hit_tokens = c.prefix_hit_tokens;
        self.local.preemptions = c.preemptions;
        if let Ok(mut s) = self.stats.lock() {
            *s = self.local.clone();
        }
    }
}

/// How a step's rows come back, chosen before it runs.
enum Readout {
    Logits,
    /// Each row's argmax.
    Greedy,
    /// A token per row drawn on the device with (parameters, the row's sampler state).
    DeviceSampled(Vec<(SamplingParams, u64)>),
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
