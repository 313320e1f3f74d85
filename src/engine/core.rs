//! The engine thread: owns the model, the KV pages, the scheduler and every sequence. Other
//! threads talk to it only through channels (`EngineHandle`). One step is nano-vllm's four
//! lines: schedule → run → postprocess → emit.

mod disk_cache;
mod embed;
#[cfg(test)]
mod fake_executor;
mod layer_pass;
mod postprocess;
mod requests;
#[cfg(test)]
mod tests;

use self::disk_cache::DiskCache;
pub use self::disk_cache::{on_disk as cache_on_disk, DiskCacheConfig};
use self::requests::{is_plain, is_plain_greedy, RequestState};
use super::executor::{Executor, ExecutorPlan, ModelExecutor, StepExecutor};
use super::handle::{Command, EngineHandle, EngineLimits};
use super::metrics::{EngineStats, SharedStats};
use super::pacer::PrefillPacer;
use super::prompt_lookup;
use super::request::{Event, FinishReason, Request, RequestId};
use super::sampler::{Sampler, SamplingParams};
use super::scheduler::{ScheduledBatch, Scheduler, SchedulerConfig};
use super::sequence::{SeqId, Sequence};
use super::turns::{StepTurns, TurnSeat};
use crate::backend::adapter::ADAPTERS_NEED_CPU;
use crate::backend::batch::StepOutput;
use crate::backend::select::Backend;
use crate::grammar::{Constraint, Mask};
use crate::kv::plan::KvPlan;
use crate::kv::{BlockPool, KvLayout, KvType, PageGeometry};
use crate::model::{BatchMeta, Logits, Model, ModelConfig, Pooling};
use anyhow::{bail, Result};
use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Prompt tokens a paced step carries at least, so a long prompt always progresses (at long
/// context one token of prefill can cost as much as a whole decode step on a small CPU).
const PACED_MIN_CHUNK: usize = 4;

/// How long an engine stays idle before it gives back its step buffers and the heap's free
/// pages: a client's next request within it finds them mapped, instead of faulting them in
/// again on the engine thread while the pool's other threads wait (2–4% of a 512-token prompt
/// of the reference model, measured back to back).
const RELEASE_AFTER_IDLE: Duration = Duration::from_secs(2);

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
    /// A hybrid's prefix cache: bytes of recurrent-state snapshots (`kv::StateSnapshots`).
    pub state_snapshot_bytes: usize,
    /// Shared with the engines of the other models a process serves (`turns`); `None` for
    /// the only one.
    pub turns: Option<Arc<StepTurns>>,
    /// Where the prefix cache is kept across restarts (`core::disk_cache`); `None`: in
    /// memory only.
    pub disk_cache: Option<DiskCacheConfig>,
}

/// The default for [`EngineConfig::state_snapshot_bytes`], in MiB.
pub const DEFAULT_STATE_SNAPSHOT_MIB: usize = 64;

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
            state_snapshot_bytes: DEFAULT_STATE_SNAPSHOT_MIB << 20,
            turns: None,
            disk_cache: None,
        }
    }
}

/// What an engine takes from its model besides the executor.
struct ModelShape {
    vocab_size: usize,
    layout: KvLayout,
    /// The context the engine runs at (`EngineConfig::max_context` within the model's).
    context: usize,
    /// Bytes of the model file (for the stats).
    weight_bytes: usize,
    /// A hybrid's recurrent state per slot (0 for a model that only attends).
    state_bytes: usize,
    /// How embedding requests pool, and the width of a hidden row (n_embd).
    pooling: Pooling,
    hidden_width: usize,
    /// The width of an image's input rows (the hidden width, and Qwen3-VL's DeepStack rows
    /// beside it).
    input_width: usize,
    /// An encoder: its attention is bidirectional, so each input is computed in one step
    /// (`Sequence::whole`), and it has no output head to generate with.
    encoder: bool,
}

pub struct Engine {
    exec: Box<dyn StepExecutor>,
    sched: Scheduler,
    requests: HashMap<RequestId, RequestState>,
    /// Scratch logits row a constraint masks (no vocab-sized allocation per step).
    masked: Vec<f32>,
    eog: Vec<u32>,
    vocab_size: usize,
    context: usize,
    next_seq: SeqId,
    arrivals: u64,
    stats: SharedStats,
    local: EngineStats,
    pacer: PrefillPacer,
    /// `EngineConfig::prompt_lookup`.
    prompt_lookup: usize,
    /// `ModelShape::pooling` and `ModelShape::hidden_width`.
    pooling: Pooling,
    hidden_width: usize,
    /// This engine's turns beside other models' engines (`EngineConfig::turns`).
    seat: Option<TurnSeat>,
    /// `ModelShape::encoder`.
    encoder: bool,
    /// The prefix cache's file (`EngineConfig::disk_cache`).
    disk_cache: Option<DiskCache>,
}

/// Why an encoder takes no generation request.
const ENCODER_GENERATES: &str =
    "this model only computes embeddings (it has no output head to generate text with)";

impl Engine {
    /// Allocates the KV pool once and starts the engine thread.
    pub fn start(
        model: Arc<Model>,
        eog: Vec<u32>,
        config: EngineConfig,
    ) -> Result<(EngineHandle, std::thread::JoinHandle<()>)> {
        let cfg = &model.config;
        let geom = cfg.page_geometry(config.kv_type, config.block_size);
        let blocks = cpu_pool_blocks(cfg, &geom, &config)?;
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
                state_snapshot_bytes: config.state_snapshot_bytes,
            },
        )?;
        let plan = KvPlan::new(
            &geom,
            &model.layout,
            cfg.n_head,
            exec.kv_bytes(),
            context,
            512,
        )
        .with_state(cfg.state_floats() * 4, config.state_snapshot_bytes);
        log_pool(&exec, &geom, &plan, &config, context);
        let shape = ModelShape {
            vocab_size: cfg.vocab_size,
            layout: model.layout.clone(),
            context,
            weight_bytes: model.file_bytes(),
            state_bytes: cfg.state_floats() * 4,
            pooling: cfg.pooling,
            hidden_width: cfg.n_embd,
            input_width: cfg.n_embd * (1 + cfg.deepstack_layers),
            encoder: !model.generates(),
        };
        let disk_cache = config
            .disk_cache
            .as_ref()
            .map(|c| DiskCache::new(c, &model.file.fingerprint(), &geom));
        let exec = Box::new(ModelExecutor { model, exec });
        let (mut engine, limits) = Engine::new(exec, shape, eog, &config);
        engine.disk_cache = disk_cache;
        engine.restore_cache();
        engine.spawn(limits, plan)
    }

    /// An engine over `exec` (whose pool sizes the scheduler's), not yet serving; and the
    /// limits requests are checked against before they reach it.
    fn new(
        exec: Box<dyn StepExecutor>,
        shape: ModelShape,
        eog: Vec<u32>,
        config: &EngineConfig,
    ) -> (Engine, EngineLimits) {
        let running_slots = running_state_slots(config, exec.state_slots());
        let sched = Scheduler::new(
            SchedulerConfig {
                max_seqs: config.max_seqs,
                max_batched_tokens: config.max_batched_tokens,
            },
            BlockPool::new(exec.blocks(), config.block_size),
            shape.layout,
        )
        .with_state_slots(running_slots, exec.state_slots() - running_slots)
        .with_layer_passes(exec.pass_layers());
        let limits = EngineLimits {
            // An encoder's input is computed whole, in one step: no longer than a step holds.
            context: match shape.encoder {
                true => shape.context.min(config.max_batched_tokens),
                false => shape.context,
            },
            capacity_tokens: sched.capacity_tokens(),
            vocab_size: shape.vocab_size,
            max_n: config.max_seqs.max(1),
            embedding_width: shape.pooling.embeds().then_some(shape.hidden_width),
            generation_refused: shape.encoder.then_some(ENCODER_GENERATES),
            adapters_refused: (exec.backend_name() == "cuda").then_some(ADAPTERS_NEED_CPU),
            step_tokens: config.max_batched_tokens,
            input_width: shape.input_width,
        };
        let local = EngineStats {
            kv_pool_bytes: exec.kv_bytes(),
            state_pool_bytes: exec.state_slots() * shape.state_bytes,
            block_size: config.block_size,
            weight_bytes: shape.weight_bytes,
            backend: exec.backend_name(),
            ..EngineStats::default()
        };
        let engine = Engine {
            exec,
            sched,
            requests: HashMap::new(),
            masked: Vec::new(),
            eog,
            vocab_size: shape.vocab_size,
            context: shape.context,
            next_seq: 0,
            arrivals: 0,
            stats: Arc::new(Mutex::new(EngineStats::default())),
            local,
            pacer: PrefillPacer::new(config.prefill_pacing, PACED_MIN_CHUNK),
            prompt_lookup: config.prompt_lookup,
            pooling: shape.pooling,
            hidden_width: shape.hidden_width,
            seat: config.turns.as_ref().map(|t| t.seat()),
            encoder: shape.encoder,
            disk_cache: None,
        };
        (engine, limits)
    }

    /// Publishes the first stats and runs the engine on a thread of its own.
    fn spawn(
        mut self,
        limits: EngineLimits,
        plan: KvPlan,
    ) -> Result<(EngineHandle, std::thread::JoinHandle<()>)> {
        self.publish();
        let (tx, rx) = mpsc::channel();
        let handle = EngineHandle::new(tx, self.stats.clone(), limits, plan);
        let thread = std::thread::Builder::new()
            .name("edgelm-engine".into())
            .spawn(move || {
                // The engine thread computes too (it is one of the pool's threads).
                crate::backend::cpu::pool::lower_thread_priority();
                self.serve(rx)
            })?;
        Ok((handle, thread))
    }

    /// The engine thread's loop: take commands, step while there is work, publish stats.
    /// Memory a step grew is kept for [`RELEASE_AFTER_IDLE`] after the last one.
    fn serve(mut self, rx: Receiver<Command>) {
        let mut shutting_down = false;
        // systemd's watchdog is fed from here, so a wedged loop stops the pings.
        let mut watchdog = crate::systemd::Watchdog::from_env();
        // When an idle engine gives its step buffers and the heap's free pages back: set by
        // each step, cleared once done.
        let mut release_at: Option<Instant> = None;
        loop {
            if let Some(w) = watchdog.as_mut() {
                w.ping();
            }
            // Idle: block for work (waking to ping the watchdog, or to release memory). Busy:
            // take what arrived, then step.
            if self.sched.is_idle() {
                if shutting_down {
                    break;
                }
                if release_at.is_some_and(|at| Instant::now() >= at) {
                    release_at = None;
                    self.exec.release_step_buffers();
                    super::heap::release_free_memory();
                }
                let save_at = self.disk_cache.as_ref().and_then(|c| c.due);
                if save_at.is_some_and(|at| Instant::now() >= at) {
                    self.save_cache();
                }
                let wake_in = [
                    watchdog.as_ref().map(|w| w.due_in()),
                    release_at.map(|at| at.saturating_duration_since(Instant::now())),
                    save_at.map(|at| at.saturating_duration_since(Instant::now())),
                ]
                .into_iter()
                .flatten()
                .min();
                let cmd = match wake_in {
                    None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                    Some(d) => rx.recv_timeout(d.max(Duration::from_millis(1))),
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
                release_at = Some(Instant::now() + RELEASE_AFTER_IDLE);
                if let Some(c) = self.disk_cache.as_mut() {
                    c.stepped();
                }
            }
            self.publish();
        }
        // A clean shutdown keeps the prefix cache for the next start (an engine a reload
        // replaced leaves the file to the new one's).
        if shutting_down {
            self.save_cache();
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
        if req.params.embed {
            return self.admit_embedding(req, events);
        }
        if self.encoder {
            let _ = events.send(Event::Error(ENCODER_GENERATES.into()));
            return;
        }
        // The request's compiled constraint moves to its first sequence (forks clone it).
        let constraint = req.params.constraint.take();
        let p = &req.params;
        if req.budget == 0 && p.prompt_logprobs.is_none() {
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
        if constraint.is_some() {
            self.local.constrained_requests += 1;
        }
        let max_len = req
            .prompt
            .len()
            .saturating_add(req.budget)
            .min(self.context);
        let mut seq = Sequence::new(id, req.id, self.arrivals, req.prompt.clone(), max_len);
        seq.arrived = req.submitted;
        seq.images = req.images.clone();
        seq.adapter = p.adapter.clone();
        seq.want_prompt_logits = p.prompt_logprobs.is_some();
        seq.forks_pending = p.n - 1;
        seq.sampler = Sampler::new(p.sampling.clone());
        seq.constraint = constraint;
        self.sched.add(seq);
        self.local.prompt_tokens += req.prompt.len() as u64;
        self.requests.insert(
            req.id,
            RequestState::new(events, req.params, req.budget, req.prompt.len(), id),
        );
    }

    /// One engine step: schedule → run → postprocess, which emits each request's events.
    fn step(&mut self) {
        // Beside other models' engines, the step waits for its turn (see `turns`).
        let turn = self.seat.as_ref().map(|s| s.take());
        if let Some(batch) = self.schedule() {
            self.run_batch(&batch);
        }
        if let Some(s) = &self.seat {
            let decoding = self.sched.sequences().filter(|s| s.is_decoding()).count();
            s.publish(decoding, self.pacer.decode_step_s());
        }
        drop(turn);
    }

    /// Runs a scheduled batch and postprocesses it, or fails the requests it carried.
    fn run_batch(&mut self, batch: &ScheduledBatch) {
        let readout = self.readout(batch);
        match self.run(batch, &readout) {
            Ok(out) => self.postprocess(batch, out, &readout),
            Err(e) => self.fail_batch(batch, &e),
        }
    }

    /// The next batch within the step's token budget, its prefill share paced against the
    /// streams it would delay; `None` when nothing can run.
    fn schedule(&mut self) -> Option<ScheduledBatch> {
        self.propose_drafts();
        let pacer = &self.pacer;
        let elsewhere = self
            .seat
            .as_ref()
            .map(|s| s.elsewhere())
            .unwrap_or_default();
        let batch = self
            .sched
            .schedule_paced(|decodes, left| pacer.prefill_budget(decodes, left, elsewhere));
        (!batch.is_empty()).then_some(batch)
    }

    /// Gives each decoding sequence that may speculate its prompt-lookup draft: greedy (the
    /// draft is then verified against the argmax, so the output is what a plain run gives),
    /// one completion, no grammar, no logprobs; never past its length limit.
    fn propose_drafts(&mut self) {
        // A rejected draft would leave a hybrid's recurrent state past the tokens it keeps.
        if self.prompt_lookup == 0 || self.sched.has_state_slots() {
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
            let cap = match s.draft_cap {
                0 => self.prompt_lookup.min(prompt_lookup::FIRST_CAP),
                c => c,
            };
            // The pending token and the bonus token after the draft are within max_len.
            let room = s.max_len.saturating_sub(s.tokens.len() + 1);
            s.draft = prompt_lookup::draft(&s.tokens, cap.min(room));
        }
    }

    /// Whether `seq`'s request asked for prompt lookup and its rows are plain greedy.
    fn may_speculate(&self, seq: SeqId) -> bool {
        let Some((s, st)) = self.live(seq) else {
            return false;
        };
        let p = &st.params;
        p.prompt_lookup && p.n == 1 && p.prompt_logprobs.is_none() && is_plain_greedy(s, p)
    }

    /// A live sequence with its request's state.
    fn live(&self, seq: SeqId) -> Option<(&Sequence, &RequestState)> {
        let s = self.sched.get(seq)?;
        let st = self.requests.get(&s.request)?;
        Some((s, st))
    }

    /// Runs `batch` through the model (with the constrained rows' masks computed beside it)
    /// and returns its rows as `readout` asks.
    fn run(&mut self, batch: &ScheduledBatch, readout: &Readout) -> Result<StepOutput> {
        for &(src, dst) in &batch.copies {
            self.exec.copy_block(src as usize, dst as usize)?;
        }
        for &(src, dst) in &batch.state_copies {
            self.exec.copy_state(src as usize, dst as usize)?;
        }
        let meta = self.batch_meta(batch);
        let started = Instant::now();
        // The constrained sequences that sample in this step have their masks computed on
        // another thread while the forward pass runs (a mask depends only on the tokens so far).
        let mut mask_jobs: Vec<(SeqId, Constraint)> = batch
            .spans
            .iter()
            .filter(|sp| sp.logits != Logits::None)
            .filter_map(|sp| {
                let s = self.sched.get_mut(sp.seq)?;
                let samples = sp.start + sp.len == s.tokens.len();
                let c = s.constraint.take_if(|_| samples)?;
                Some((sp.seq, c))
            })
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
                // A step of layer-pass slices alone reads no rows out.
                _ if batch.spans.is_empty() => Ok(StepOutput::Tokens(Vec::new())),
                Readout::DeviceSampled(rows) => self
                    .exec
                    .forward_sample(&meta, rows)
                    .map(StepOutput::Tokens),
                Readout::Greedy => self.exec.forward_greedy(&meta).map(StepOutput::Tokens),
                Readout::Logits => self.exec.forward(&meta).map(StepOutput::Logits),
            };
            let masks = masking.map(|h| h.join().expect("the mask thread does not panic"));
            (result, masks)
        });
        let result = result.and_then(|out| self.run_layer_passes(batch).map(|()| out));
        for (id, c) in mask_jobs {
            self.sched.get_mut(id).expect("live").constraint = Some(c);
        }
        if let Some((masks, secs)) = masks {
            self.local.grammar_mask_seconds += secs;
            for (id, mask) in masks {
                self.sched.get_mut(id).expect("live").mask = Some(mask);
            }
        }
        let decodes = batch.spans.iter().filter(|s| s.is_decode());
        let (decode_spans, decode_tokens) = decodes.fold((0, 0), |(n, t), s| (n + 1, t + s.len));
        self.pacer.observe(
            decode_spans,
            batch.num_tokens() - decode_tokens + batch.layer_pass_work(),
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
            let first = meta.tokens.len();
            meta.push_span(&tokens, span.start, s.blocks.tables().to_vec(), span.logits);
            let rope = s.rope_positions(span.start..span.start + span.len);
            meta.set_rope_positions(first, &rope);
            meta.inputs.extend(s.row_inputs(span.start..ran, first));
            meta.set_adapter(s.adapter.clone());
            if let Some(slot) = s.state_slot {
                meta.set_state_slot(slot);
            }
            for save in batch.state_saves.iter().filter(|v| v.seq == span.seq) {
                meta.save_state_after(save.after, save.to);
            }
            meta.mark_generated_from(s.prompt_len);
            self.want_hidden(&mut meta, s, span.start, span.len);
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

    /// A step that failed (should be unreachable: everything was validated) ends the requests
    /// it carried with an error; it never takes the engine down.
    fn fail_batch(&mut self, batch: &ScheduledBatch, e: &anyhow::Error) {
        log::error!("forward pass failed: {e:#}");
        self.sched.abandon_state_saves(batch);
        let seqs =
            (batch.spans.iter().map(|s| s.seq)).chain(batch.layer_passes.iter().map(|p| p.seq));
        let reqs: Vec<RequestId> = seqs
            .filter_map(|id| self.sched.get(id).map(|s| s.request))
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
            let (s, st) = self.live(span.seq)?;
            if span.logits != Logits::Last || !is_plain(s, &st.params) {
                return None;
            }
            rows.push((s.sampler.params().clone(), s.sampler.rng_state()));
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
            let Some((s, st)) = self.live(span.seq) else {
                return false;
            };
            (span.logits == Logits::Last || span.draft > 0) && is_plain_greedy(s, &st.params)
        })
    }

    fn finish_seq(&mut self, seq: SeqId, reason: FinishReason) {
        let Some(s) = self.sched.remove(seq) else {
            return;
        };
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
        (self.local.state_slots_used, self.local.state_slots_total) = self.sched.state_slot_usage();
        (
            self.local.state_snapshots_kept,
            self.local.state_snapshots_total,
        ) = self.sched.snapshot_usage();
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

/// Blocks of the CPU pool `config` asks for, or why the configuration cannot run the model.
fn cpu_pool_blocks(cfg: &ModelConfig, geom: &PageGeometry, config: &EngineConfig) -> Result<usize> {
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
    Ok(blocks)
}

/// What the KV pool came to (the CUDA pool sizes itself from the device's free memory).
fn log_pool(
    exec: &Executor,
    geom: &PageGeometry,
    plan: &KvPlan,
    config: &EngineConfig,
    context: usize,
) {
    log::info!(
        "KV pool{}: {} blocks of {} tokens, {} bytes per block ({} KiB per token... {} B/token), {} MiB in all, {}",
        if exec.is_cuda() { " (device memory)" } else { "" },
        exec.blocks(),
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
    if exec.state_slots() > 0 {
        let running = running_state_slots(config, exec.state_slots());
        log::info!(
            "recurrent state: {} slots of {} bytes (one per running sequence) and {} prefix-cache \
             snapshots (one every {} tokens of a cached prompt), {} KiB in all",
            running,
            plan.state_bytes_per_sequence,
            exec.state_slots() - running,
            crate::kv::SNAPSHOT_STRIDE_TOKENS,
            (exec.state_slots() * plan.state_bytes_per_sequence) >> 10
        );
    }
}

/// Of the executor's `all` state slots, those for running sequences (one each); the rest hold
/// the prefix cache's snapshots.
fn running_state_slots(config: &EngineConfig, all: usize) -> usize {
    config.max_seqs.max(1).min(all)
}
