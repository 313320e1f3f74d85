//! Routing: a complete request, on a handler thread, to the end of its response. The status
//! page, metrics, models and tokenize answer here; a generation request is parsed (`parse`),
//! admitted (`admission`) and run (`generate`).

use super::admission::Ticket;
use super::api::{DetokenizeRequest, TokenizeRequest};
use super::error::ApiError;
use super::http::RawResponse;
use super::{api, chat_request, front, generate, metrics, responses, tools, triage};
use super::{unix_now, Kind, Models, Ready, Request, Server};
use crate::engine::metrics::EngineStats;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

impl Server {
    /// Handles one complete request to the end of its response (on a handler thread).
    pub fn handle(self: &Arc<Self>, req: Request) {
        let Request {
            method,
            path,
            body,
            response,
            pending,
        } = req;
        if let Err((e, resp)) = self.route(&method, &path, &body, response, pending) {
            self.count_error(&e);
            triage::log_refusal(&format!("{method} {path}"), &e);
            let retry = match e.retry_after {
                Some(s) => vec![("Retry-After", s.to_string())],
                None => Vec::new(),
            };
            let _ = resp.send(e.status, "application/json", &retry, e.body().as_bytes());
        }
    }

    /// The response to a request the front has already checked (route, method, key, size).
    fn route(
        self: &Arc<Self>,
        method: &str,
        path: &str,
        body: &[u8],
        resp: RawResponse,
        pending: Option<triage::Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        if path == "/" {
            let _ = resp.send(
                200,
                "text/html; charset=utf-8",
                &[],
                include_str!("status.html").as_bytes(),
            );
            return Ok(());
        }
        let Some(models) = self.ready.get() else {
            return Err((ApiError::unavailable("the model is still loading"), resp));
        };
        let pick = |task| models.select(requested_model(body).as_deref(), task);
        let result = match path {
            "/metrics" => {
                let errors = self.errors.lock().map(|e| e.clone()).unwrap_or_default();
                let stats: Vec<(&str, EngineStats)> = models
                    .list
                    .iter()
                    .map(|m| (m.model_name.as_str(), m.engine.stats()))
                    .collect();
                let mut text =
                    metrics::render(&stats, &errors, self.started.elapsed().as_secs_f64());
                self.front_stats.render(&mut text);
                let _ = resp.send(200, "text/plain; version=0.0.4", &[], text.as_bytes());
                return Ok(());
            }
            "/api/status" => Ok(self.status_json(models)),
            "/v1/models" => Ok(json!({
                "object": "list",
                "data": models.list.iter().map(model_object).collect::<Vec<_>>(),
            })),
            p if p.starts_with(super::triage::MODEL_PREFIX) => {
                let id = percent_decoded(&p[super::triage::MODEL_PREFIX.len()..]);
                match models.list.iter().find(|m| m.model_name == id) {
                    Some(m) => Ok(model_object(m)),
                    None => Err(ApiError::model_not_found(&id)),
                }
            }
            "/tokenize" => pick(None).and_then(|m| tokenize(m, body)),
            "/detokenize" => pick(None).and_then(|m| detokenize(m, body)),
            "/v1/completions" | "/v1/chat/completions" | "/v1/responses" => {
                return match pick(Some(Kind::Generate)) {
                    Ok(m) => self.generate(m, path, body, resp, pending),
                    Err(e) => Err((e, resp)),
                };
            }
            "/v1/embeddings" => {
                return match pick(Some(Kind::Embed)) {
                    Ok(m) => self.embeddings(m, body, resp, pending),
                    Err(e) => Err((e, resp)),
                };
            }
            p if p.starts_with(responses::PREFIX) => {
                self.kept_response(method, &percent_decoded(&p[responses::PREFIX.len()..]))
            }
            _ => Err(ApiError::not_found(path)),
        };
        match result {
            Ok(v) => {
                let _ = resp.send(200, "application/json", &[], v.to_string().as_bytes());
                Ok(())
            }
            Err(e) => Err((e, resp)),
        }
    }

    /// A 503 once the server drains: no new work is taken.
    pub(super) fn refuse_if_draining(&self) -> Result<(), ApiError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        Ok(())
    }

    /// Back-pressure for a request of `n_prompt` prompt tokens: the running batch plus a queue
    /// bounded in requests, and a backlog of unstarted requests bounded in expected wait; past
    /// that, 429. Admitted, it counts in flight until the returned guard is dropped.
    pub(super) fn admit_request(
        &self,
        n_prompt: usize,
        pending: Option<triage::Pending>,
    ) -> Result<(Ticket<'_>, InFlight<'_>), ApiError> {
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

    fn generate(
        self: &Arc<Self>,
        ready: &Ready,
        path: &str,
        body: &[u8],
        resp: RawResponse,
        pending: Option<triage::Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        let job = match self
            .refuse_if_draining()
            .and_then(|_| self.parse_job(ready, path, body))
        {
            Ok(j) => j,
            Err(e) => return Err((e, resp)),
        };
        let n_prompt: usize = job.prompts.iter().map(|p| p.len()).sum();
        let (mut ticket, _in_flight) = match self.admit_request(n_prompt, pending) {
            Ok(admitted) => admitted,
            Err(e) => return Err((e, resp)),
        };
        let started = Instant::now();
        let id = job.id.clone();
        let mut on_first_token = |at: Instant| ticket.first_token(at);
        let shed = |waited: std::time::Duration| {
            // Only while there is a queue at all (more in flight than running slots): a
            // request in a running slot is never shed, however slow its first token.
            let shed = waited >= triage::SHED_AFTER
                && self.in_flight() > self.config.running_slots()
                && self.flooded(Instant::now());
            if shed {
                front::stats::bump(&self.front_stats.shed);
            }
            shed
        };
        let out = generate::run(ready, job, resp, &mut on_first_token, &shed, &self.cut)?;
        let ttft = out
            .first_token
            .map(|t| format!("{:.3}s", t.duration_since(started).as_secs_f64()))
            .unwrap_or_else(|| "-".into());
        if out.result == generate::GONE {
            // The client left (queued, prefilling or decoding): its work was cancelled.
            self.count("cancelled");
        }
        log::info!(
            "{id}: {}, prompt_tokens={n_prompt} completion_tokens={} ttft={ttft} duration={:.3}s",
            out.result,
            out.completion_tokens,
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// `GET` (the response), `GET …/input_items` (its conversation's items) or `DELETE` of a
    /// kept response.
    fn kept_response(&self, method: &str, rest: &str) -> Result<serde_json::Value, ApiError> {
        let (id, items) = match rest.strip_suffix("/input_items") {
            Some(id) => (id, true),
            None => (rest, false),
        };
        if method == "DELETE" && !items {
            return match self.responses.delete(id) {
                true => Ok(json!({"id": id, "object": "response", "deleted": true})),
                false => Err(ApiError::response_not_found(id)),
            };
        }
        let kept = self
            .responses
            .get(id)
            .filter(|_| method != "DELETE")
            .ok_or_else(|| ApiError::response_not_found(id))?;
        if !items {
            return Ok(kept.response);
        }
        // Newest first, as OpenAI lists them.
        let data: Vec<serde_json::Value> = kept.input.into_iter().rev().collect();
        Ok(json!({
            "object": "list", "data": data, "has_more": false,
            "first_id": data.first().and_then(|i| i.get("id")).cloned(),
            "last_id": data.last().and_then(|i| i.get("id")).cloned(),
        }))
    }

    /// The status page's figures: the process's memory, the first model's engine figures at
    /// the top level (as with one model), and a line per model under `models`.
    fn status_json(&self, models: &Models) -> serde_json::Value {
        let ready = models.first();
        let s = ready.engine.stats();
        let now = unix_now();
        let hit_rate = if s.prefix_queried_tokens > 0 {
            s.prefix_hit_tokens as f64 / s.prefix_queried_tokens as f64
        } else {
            0.0
        };
        let mut errors = self.errors.lock().map(|e| e.clone()).unwrap_or_default();
        // A client that leaves before its answer is not the server's error.
        let cancelled = errors.remove("cancelled").unwrap_or(0);
        json!({
            "state": if self.is_ready() { "ready" } else { "draining" },
            "version": env!("CARGO_PKG_VERSION"),
            "backend": s.backend,
            "model": ready.model_name,
            "models": models.list.iter().map(model_status).collect::<Vec<_>>(),
            "profile": self.config.profile,
            "kv_type": self.config.engine.kv_type.name(),
            "resident_bytes": metrics::resident_bytes(),
            // The process's memory: every model's weights and pool.
            "weight_bytes": models.list.iter().map(|m| m.engine.stats().weight_bytes).sum::<usize>(),
            "kv_pool_bytes": models.list.iter().map(|m| m.engine.stats().kv_pool_bytes).sum::<usize>(),
            "errors": errors.values().sum::<u64>(),
            "errors_by_reason": errors,
            "cancelled": cancelled,
            "uptime_s": self.started.elapsed().as_secs_f64(),
            "now": now,
            "running": s.running,
            "waiting": s.waiting,
            "kv_total": s.kv_blocks_total,
            "kv_used": s.kv_blocks_used,
            "kv_cached": s.kv_blocks_cached,
            "prefix_hit_rate": hit_rate,
            "generation_tokens": s.generation_tokens,
            "constrained_requests": s.constrained_requests,
            "grammar_mask_seconds": s.grammar_mask_seconds,
            "draft_tokens": s.draft_tokens,
            "accepted_draft_tokens": s.accepted_draft_tokens,
            "tokens_per_second": s.recent_tokens.iter().map(|&(t, n)| (t, n)).collect::<Vec<_>>(),
            "ttft": s.recent_ttft,
        })
    }
}

/// One model's line on the status page.
fn model_status(m: &Ready) -> serde_json::Value {
    let s = m.engine.stats();
    json!({
        "id": m.model_name, "kind": m.kind.as_str(), "running": s.running, "waiting": s.waiting,
        "kv_pool_bytes": s.kv_pool_bytes, "kv_total": s.kv_blocks_total, "kv_used": s.kv_blocks_used,
        "weight_bytes": s.weight_bytes, "prompt_tokens": s.prompt_tokens,
        "generation_tokens": s.generation_tokens,
    })
}

/// The `model` a request body names, when it is a JSON object with a string there (anything
/// else is for the endpoint's own parser to refuse).
fn requested_model(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        #[serde(default)]
        model: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<Named>(body).ok()?.model? {
        serde_json::Value::String(s) => Some(s),
        _ => None,
    }
}

fn tokenize(ready: &Ready, body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let req: TokenizeRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let text = match (&req.prompt, &req.messages) {
        (Some(p), None) => p.clone(),
        (None, Some(msgs)) => {
            let tmpl = ready
                .chat
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("this model has no chat template"))?;
            // The tools as a chat request with the same fields would offer them.
            let tools = req.tools.clone().unwrap_or_default();
            tools::check_tools(&tools)?;
            let choice = tools::parse_choice(req.tool_choice.as_ref(), &tools)?;
            let offered = if choice == tools::Choice::None {
                &[]
            } else {
                tools.as_slice()
            };
            chat_request::render_prompt(
                tmpl,
                msgs,
                offered,
                req.parallel_tool_calls.unwrap_or(true),
                req.reasoning_effort.as_ref(),
                req.add_generation_prompt.unwrap_or(true),
            )?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of prompt or messages",
            ))
        }
    };
    let ids = ready
        .tokenizer
        .encode(&text, req.add_special_tokens.unwrap_or(true))
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    Ok(json!({"count": ids.len(), "max_model_len": ready.engine.limits.context, "tokens": ids}))
}

fn detokenize(ready: &Ready, body: &[u8]) -> Result<serde_json::Value, ApiError> {
    let req: DetokenizeRequest = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
    let ids = api::token_ids(&req.tokens, ready.tokenizer.vocab_size())?;
    Ok(json!({"prompt": ready.tokenizer.decode(&ids, true)}))
}

/// A served model as OpenAI describes one: `created` is the model file's modification time;
/// `kind` says which endpoints it answers (generation, or `/v1/embeddings`).
fn model_object(ready: &Ready) -> serde_json::Value {
    json!({
        "id": ready.model_name, "object": "model", "created": ready.model_created,
        "owned_by": "edgelm", "max_model_len": ready.engine.limits.context,
        "kind": ready.kind.as_str(),
    })
}

/// A path segment with its `%XX` escapes decoded (a model id with spaces or `/` in it arrives
/// escaped); an invalid escape is kept as written.
fn percent_decoded(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// Counts an admitted request in flight until dropped.
pub(super) struct InFlight<'a>(&'a Server);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod model_id_tests {
    use super::percent_decoded;

    #[test]
    fn model_ids_are_percent_decoded_and_bad_escapes_kept() {
        assert_eq!(percent_decoded("a%20b%2Fc.gguf"), "a b/c.gguf");
        assert_eq!(percent_decoded("plain.gguf"), "plain.gguf");
        assert_eq!(percent_decoded("50%"), "50%");
        assert_eq!(percent_decoded("%zz%4"), "%zz%4");
    }
}
