//! The requests that run on an engine: a generation request (completions, chat, Responses)
//! or an embeddings request is parsed and checked (`openai`), admitted (`admission`), run
//! (`generate`) and logged; every one counts in flight until its answer is written.

use super::server::{Pending, Server};
use super::triage;
use crate::server::generate::{self, Failure, Kind, Models, RawResponse, Ready, Watchers, GONE};
use crate::server::openai::{self, ApiError, Body, EmbeddingsBody, Job, Parsing, Served};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The log target of the one line each request ends with: a name of its own, so that a
/// filter (`RUST_LOG=edgelm::server::requests=info`) or a journal search finds every request
/// wherever the code that writes the line lives.
const REQUEST_LOG: &str = "edgelm::server::requests";

impl Server {
    /// A 503 once the server drains: no new work is taken.
    fn refuse_if_draining(&self) -> Result<(), ApiError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        Ok(())
    }

    /// Back-pressure for a request of `n_prompt` prompt tokens: the running batch plus a queue
    /// bounded in requests, and a backlog of unstarted requests bounded in expected wait; past
    /// that, 429. Admitted, it counts in flight until the returned guard is dropped.
    fn admit_request(
        &self,
        n_prompt: usize,
        pending: Option<Pending>,
    ) -> Result<(super::admission::Ticket<'_>, InFlight<'_>), ApiError> {
        let before = self.in_flight.fetch_add(1, Ordering::SeqCst);
        let in_flight = InFlight(self);
        let admitted = self.admission.admit(before, n_prompt, Instant::now());
        // Admission has decided (and `in_flight` counts it if admitted): no longer pending.
        drop(pending);
        match admitted {
            Ok(ticket) => Ok((ticket, in_flight)),
            Err(r) => Err(ApiError::overloaded(r.retry_after_s, r.queue_full)),
        }
    }

    /// The job a generation body asks for, and the model that runs it.
    fn generation_job<'m>(
        &self,
        models: &'m Models,
        path: &str,
        body: &[u8],
    ) -> Result<(&'m Ready, Job), ApiError> {
        self.refuse_if_draining()?;
        let body = Body::parse(path, body)?;
        let (ready, adapter) = openai::select_adapted(models, body.model(), Some(Kind::Generate))?;
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut job = Parsing::new(models, ready, &self.responses, &self.boot_tag).job(body, n)?;
        job.work.params.adapter = adapter;
        Ok((ready, job))
    }

    /// `POST /v1/completions`, `/v1/chat/completions` or `/v1/responses`.
    pub(super) fn generate(
        self: &Arc<Self>,
        models: &Models,
        path: &str,
        body: &[u8],
        resp: RawResponse,
        pending: Option<Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        let (ready, job) = match self.generation_job(models, path, body) {
            Ok(x) => x,
            Err(e) => return Err((e, resp)),
        };
        let n_prompt = job.work.prompt_tokens();
        let (mut ticket, _in_flight) = match self.admit_request(n_prompt, pending) {
            Ok(admitted) => admitted,
            Err(e) => return Err((e, resp)),
        };
        let started = Instant::now();
        let watch = Watchers {
            on_first_token: &mut |at: Instant| ticket.first_token(at),
            shed: &|waited: Duration| self.shed(waited),
            cut: &self.cut,
        };
        let mut format = openai::format_for(ready, &job);
        let out = generate::run(ready, &job.work, format.as_mut(), resp, watch)
            .map_err(|(failure, resp)| (ApiError::from(&failure), resp))?;
        if out.result == GONE {
            // The client left (queued, prefilling or decoding): its work was cancelled.
            self.count("cancelled");
        }
        let ttft = out
            .first_token
            .map(|t| format!("{:.3}s", t.duration_since(started).as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        log::info!(
            target: REQUEST_LOG,
            "{}: {}, prompt_tokens={n_prompt} completion_tokens={} ttft={ttft} duration={:.3}s",
            job.id,
            out.result,
            out.completion_tokens,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Whether a queued request that has waited this long without a first token is shed: only
    /// while there is a queue at all (more in flight than running slots), since a request in a
    /// running slot is never shed, however slow its first token, and only under a flood.
    fn shed(&self, waited: Duration) -> bool {
        let shed = waited >= triage::SHED_AFTER
            && self.in_flight() > self.config.running_slots()
            && self.flooded(Instant::now());
        if shed {
            super::front::stats::bump(&self.front_stats.shed);
        }
        shed
    }

    /// `POST /v1/embeddings`: parsed, admitted as a generation request is (its prompt tokens
    /// count), run, answered.
    pub(super) fn embeddings(
        self: &Arc<Self>,
        models: &Models,
        body: &[u8],
        resp: RawResponse,
        pending: Option<Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        let checked = self.refuse_if_draining().and_then(|_| {
            let body = EmbeddingsBody::parse(body)?;
            let (ready, adapter) =
                openai::select_adapted(models, body.model()?, Some(Kind::Embed))?;
            let job = openai::check_embeddings(&Served::of(ready), &body)?;
            Ok((ready, adapter, job))
        });
        let (ready, adapter, job) = match checked {
            Ok(x) => x,
            Err(e) => return Err((e, resp)),
        };
        let n_prompt: usize = job.inputs.iter().map(Vec::len).sum();
        let (mut ticket, _in_flight) = match self.admit_request(n_prompt, pending) {
            Ok(admitted) => admitted,
            Err(e) => return Err((e, resp)),
        };
        let started = Instant::now();
        let vectors = match generate::embed(&ready.engine, &job.inputs, adapter) {
            Ok(v) => v,
            // A refused input is named as the embeddings request names it.
            Err(Failure::Refused(why)) => {
                return Err((ApiError::bad_request(why).param("input"), resp))
            }
            Err(f) => return Err((ApiError::from(&f), resp)),
        };
        ticket.first_token(Instant::now());
        let body = openai::embeddings_answer(&job, vectors).to_string();
        let _ = resp.send(200, "application/json", &[], body.as_bytes());
        log::info!(
            target: REQUEST_LOG,
            "embeddings: {} inputs, prompt_tokens={n_prompt} duration={:.3}s",
            job.inputs.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// Counts an admitted request in flight until dropped.
struct InFlight<'a>(&'a Server);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}
