//! The way into the engine thread from any other: submit (validated here, before the request
//! reaches the engine), cancel, shut down, read the published stats. Only plain data crosses:
//! a request in, its events out on a channel of its own.

use super::metrics::{EngineStats, SharedStats};
use super::request::{Event, GenParams, PromptImage, Request, RequestId};
use crate::kv::plan::KvPlan;
use anyhow::{bail, Result};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;

/// What the engine thread receives.
pub(super) enum Command {
    Submit(Box<Request>, Sender<Event>),
    Cancel(RequestId),
    Shutdown,
}

/// Limits every request is checked against before it reaches the engine thread.
#[derive(Clone, Debug)]
pub struct EngineLimits {
    pub context: usize,
    pub capacity_tokens: usize,
    pub vocab_size: usize,
    pub max_n: usize,
    /// The width of the model's embeddings, where it pools them (`{arch}.pooling_type` mean,
    /// cls or last); `None` for a model that serves no embeddings.
    pub embedding_width: Option<usize>,
    /// Why this engine generates no text (an encoder, which only embeds); `None` where it
    /// does.
    pub generation_refused: Option<&'static str>,
    /// Why this engine runs no LoRA adapter (its backend does not apply them); `None` where
    /// it does.
    pub adapters_refused: Option<&'static str>,
    /// The most prompt tokens one step computes: a bidirectional image, computed in one
    /// step, may not be longer.
    pub step_tokens: usize,
    /// The width of the rows a prompt may give in place of embeddings (the model's).
    pub input_width: usize,
}

/// The cloneable way in: submit, cancel, read stats.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    stats: SharedStats,
    next_id: Arc<AtomicU64>,
    pub limits: EngineLimits,
    pub plan: KvPlan,
}

impl EngineHandle {
    pub(super) fn new(
        tx: Sender<Command>,
        stats: SharedStats,
        limits: EngineLimits,
        plan: KvPlan,
    ) -> EngineHandle {
        EngineHandle {
            tx,
            stats,
            next_id: Arc::new(AtomicU64::new(1)),
            limits,
            plan,
        }
    }

    /// Validates and queues a request; its events arrive on the returned receiver.
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        params: GenParams,
    ) -> Result<(RequestId, Receiver<Event>)> {
        self.submit_with_images(prompt, Vec::new(), params)
    }

    /// [`EngineHandle::submit`] for a prompt some of whose runs are given as rows (images).
    pub fn submit_with_images(
        &self,
        prompt: Vec<u32>,
        images: Vec<PromptImage>,
        params: GenParams,
    ) -> Result<(RequestId, Receiver<Event>)> {
        let l = &self.limits;
        check_images(&images, prompt.len(), &params, l)?;
        if prompt.is_empty() {
            bail!("the prompt is empty");
        }
        if let (false, Some(why)) = (params.embed, l.generation_refused) {
            bail!("{why}");
        }
        if let (Some(_), Some(why)) = (&params.adapter, l.adapters_refused) {
            bail!("{why}");
        }
        if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= l.vocab_size) {
            bail!(
                "token id {bad} is outside the vocabulary ({} tokens)",
                l.vocab_size
            );
        }
        if params.n == 0 || params.n > l.max_n {
            bail!("n must be between 1 and {}", l.max_n);
        }
        let budget = self.budget(prompt.len(), &params)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        let req = Request {
            id,
            prompt,
            images,
            params,
            budget,
            submitted: std::time::Instant::now(),
        };
        self.tx
            .send(Command::Submit(Box::new(req), tx))
            .map_err(|_| anyhow::anyhow!("the engine has stopped"))?;
        Ok((id, rx))
    }

    /// The tokens a request may generate: its own `max_tokens`, or where it names none what
    /// the context and the pool leave its prompt; an embedding request generates none. A
    /// prompt whose limit does not fit (or that leaves no room for one token) is refused.
    fn budget(&self, prompt: usize, params: &GenParams) -> Result<usize> {
        let l = &self.limits;
        let (asked, what) = match (params.embed, params.max_tokens) {
            (true, _) => (0, "no generated token".to_string()),
            (false, Some(m)) => (m, format!("max_tokens ({m})")),
            (false, None) => (1, "one generated token".to_string()),
        };
        let total = prompt.saturating_add(asked);
        if total > l.context {
            bail!(
                "prompt ({prompt} tokens) plus {what} exceeds the context length of {} tokens",
                l.context
            );
        }
        if total > l.capacity_tokens {
            bail!(
                "prompt plus {what} ({total} tokens) exceeds the KV pool ({} tokens)",
                l.capacity_tokens
            );
        }
        Ok(match (params.embed, params.max_tokens) {
            (false, None) => l.context.min(l.capacity_tokens) - prompt,
            _ => asked,
        })
    }

    /// Cancels a request: all its blocks are freed at the start of the next step.
    pub fn cancel(&self, id: RequestId) {
        let _ = self.tx.send(Command::Cancel(id));
    }

    /// Asks the engine to finish in-flight work and stop.
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }

    pub fn stats(&self) -> EngineStats {
        self.stats.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

/// Images lie inside the prompt, in order, apart from each other; an embedding request has
/// none (its pooling reads token rows).
fn check_images(
    images: &[PromptImage],
    prompt: usize,
    params: &GenParams,
    l: &EngineLimits,
) -> Result<()> {
    if images.is_empty() {
        return Ok(());
    }
    if params.embed {
        bail!("an embedding request takes no images");
    }
    let mut from = 0;
    for image in images {
        if image.rows.is_empty() || image.at < from || image.end() > prompt {
            bail!(
                "image rows at positions {}..{} do not fit the prompt of {prompt} tokens in order",
                image.at,
                image.end()
            );
        }
        if image.rows.width != l.input_width {
            bail!(
                "image rows are {} wide, the model's inputs {}",
                image.rows.width,
                l.input_width
            );
        }
        if image.rows.bidirectional && image.rows.len() > l.step_tokens {
            bail!(
                "an image of {} positions does not fit one step of {} tokens (max_batched_tokens)",
                image.rows.len(),
                l.step_tokens
            );
        }
        from = image.end();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvLayout, KvType, PageGeometry};
    use std::sync::Mutex;

    const LIMITS: EngineLimits = EngineLimits {
        context: 100,
        capacity_tokens: 80,
        vocab_size: 50,
        max_n: 4,
        embedding_width: None,
        generation_refused: None,
        adapters_refused: None,
        step_tokens: 64,
        input_width: 8,
    };

    /// A handle whose engine is the returned receiver.
    fn handle(limits: EngineLimits) -> (EngineHandle, Receiver<Command>) {
        let geom = PageGeometry {
            layers: 2,
            kv_heads: 1,
            head_dim: 32,
            block_size: 16,
            kv_type: KvType::F16,
        };
        let plan = KvPlan::new(&geom, &KvLayout::full(2), 1, 1 << 20, 100, 16);
        let stats: SharedStats = Arc::new(Mutex::new(EngineStats::default()));
        let (tx, rx) = mpsc::channel();
        (EngineHandle::new(tx, stats, limits, plan), rx)
    }

    fn params(max_tokens: Option<usize>) -> GenParams {
        GenParams {
            max_tokens,
            ..Default::default()
        }
    }

    fn submitted(rx: &Receiver<Command>) -> Request {
        match rx.try_recv() {
            Ok(Command::Submit(req, _)) => *req,
            _ => panic!("no request reached the engine"),
        }
    }

    #[test]
    fn a_valid_request_reaches_the_engine_with_a_fresh_id() {
        let (h, rx) = handle(LIMITS);
        let (a, _) = h.submit(vec![1, 2, 3], params(Some(10))).unwrap();
        let (b, _) = h.clone().submit(vec![4], params(Some(10))).unwrap();
        assert_ne!(a, b, "ids are unique across clones");
        let req = submitted(&rx);
        assert_eq!(
            (req.id, req.prompt, req.params.max_tokens, req.budget),
            (a, vec![1, 2, 3], Some(10), 10)
        );
        assert_eq!(submitted(&rx).id, b);
    }

    #[test]
    fn until_the_context_end_means_what_the_context_and_the_pool_leave() {
        let (h, rx) = handle(LIMITS);
        h.submit(vec![1; 30], params(None)).unwrap();
        // The pool (80 tokens) binds before the context (100).
        assert_eq!(submitted(&rx).budget, 50);
    }

    #[test]
    fn invalid_requests_never_reach_the_engine() {
        let (h, rx) = handle(LIMITS);
        let refused = |prompt: Vec<u32>, p: GenParams, why: &str| {
            let e = h.submit(prompt, p).unwrap_err().to_string();
            assert!(e.contains(why), "{e:?} should say {why:?}");
        };
        refused(vec![], params(Some(1)), "empty");
        refused(
            vec![1, 50],
            params(Some(1)),
            "token id 50 is outside the vocabulary",
        );
        refused(
            vec![1],
            GenParams {
                n: 0,
                ..params(Some(1))
            },
            "n must be between 1 and 4",
        );
        refused(
            vec![1],
            GenParams {
                n: 5,
                ..params(Some(1))
            },
            "n must be between 1 and 4",
        );
        refused(
            vec![1; 60],
            params(Some(41)),
            "exceeds the context length of 100",
        );
        refused(
            vec![1; 60],
            params(Some(21)),
            "exceeds the KV pool (80 tokens)",
        );
        refused(vec![1; 90], params(None), "exceeds the KV pool");
        assert!(rx.try_recv().is_err());
    }

    #[test]
    fn cancel_and_shutdown_are_sent_as_commands() {
        let (h, rx) = handle(LIMITS);
        h.cancel(7);
        h.shutdown();
        assert!(matches!(rx.try_recv(), Ok(Command::Cancel(7))));
        assert!(matches!(rx.try_recv(), Ok(Command::Shutdown)));
    }

    #[test]
    fn a_stopped_engine_is_an_error_not_a_panic() {
        let (h, rx) = handle(LIMITS);
        drop(rx);
        let e = h.submit(vec![1], params(Some(1))).unwrap_err().to_string();
        assert!(e.contains("stopped"), "{e}");
        h.cancel(1);
        h.shutdown();
    }
}
