//! Routing: a complete request, on a handler thread, to the end of its response. The status
//! page, metrics, models, tokenize and kept responses answer here; generation and embeddings
//! requests go to `handlers`.

use super::reload::Outcome;
use super::server::{Pending, Request, Server};
use super::status;
use super::triage::{self, ADMIN_LOAD_ADAPTER, ADMIN_RELOAD, ADMIN_UNLOAD_ADAPTER, MODEL_PREFIX};
use crate::engine::metrics::EngineStats;
use crate::server::generate::{Models, RawResponse};
use crate::server::openai::{self, ApiError, RESPONSES_PREFIX};
use serde_json::{json, Value};
use std::sync::Arc;

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
        pending: Option<Pending>,
    ) -> Result<(), (ApiError, RawResponse)> {
        if path == "/" {
            let page = include_str!("status.html").as_bytes();
            let _ = resp.send(200, "text/html; charset=utf-8", &[], page);
            return Ok(());
        }
        let Some(models) = self.ready() else {
            return Err((ApiError::unavailable("the model is still loading"), resp));
        };
        let models = &*models;
        if path == "/metrics" {
            let text = self.metrics_text(models);
            let _ = resp.send(200, "text/plain; version=0.0.4", &[], text.as_bytes());
            return Ok(());
        }
        match path {
            "/v1/completions" | "/v1/chat/completions" | "/v1/responses" => {
                return self.generate(models, path, body, resp, pending)
            }
            "/v1/embeddings" => return self.embeddings(models, body, resp, pending),
            _ => {}
        }
        match self.answer(models, method, path, body) {
            Ok(v) => {
                let _ = resp.send(200, "application/json", &[], v.to_string().as_bytes());
                Ok(())
            }
            Err(e) => Err((e, resp)),
        }
    }

    /// The JSON answer of a request that runs nothing on the engines.
    fn answer(
        &self,
        models: &Models,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Value, ApiError> {
        match path {
            "/api/status" => Ok(status::status_json(self, models)),
            "/v1/models" => Ok(openai::list_models(models)),
            p if p.starts_with(MODEL_PREFIX) => {
                openai::one_model(models, &percent_decoded(&p[MODEL_PREFIX.len()..]))
            }
            "/tokenize" => openai::tokenize(models, body),
            ADMIN_LOAD_ADAPTER => openai::load_adapter(models, body),
            ADMIN_UNLOAD_ADAPTER => openai::unload_adapter(models, body),
            ADMIN_RELOAD => match self.reload("POST /admin/reload") {
                Ok(Outcome::Unchanged) => Ok(json!({ "status": "unchanged" })),
                Ok(Outcome::Reloaded(ids)) => Ok(json!({ "status": "reloaded", "models": ids })),
                Err(e) => Err(ApiError::reload_failed(&e)),
            },
            "/detokenize" => openai::detokenize(models, body),
            p if p.starts_with(RESPONSES_PREFIX) => {
                self.kept_response(method, &percent_decoded(&p[RESPONSES_PREFIX.len()..]))
            }
            _ => Err(ApiError::not_found(path)),
        }
    }

    /// Prometheus text: every model's engine, the request errors, the front's counters.
    fn metrics_text(&self, models: &Models) -> String {
        let errors = self.errors.lock().map(|e| e.clone()).unwrap_or_default();
        let stats: Vec<(&str, EngineStats)> = models
            .list
            .iter()
            .map(|m| {
                let adapters = m.adapters.all();
                let stats = EngineStats {
                    adapters: adapters.len(),
                    adapter_bytes: adapters.iter().map(|a| a.bytes()).sum(),
                    ..m.engine.stats()
                };
                (m.model_name.as_str(), stats)
            })
            .collect();
        let mut text =
            openai::render_metrics(&stats, &errors, self.started.elapsed().as_secs_f64());
        self.front_stats.render(&mut text);
        self.reloads().render(&mut text);
        text
    }

    /// `GET` (the response), `GET …/input_items` (its conversation's items) or `DELETE` of a
    /// kept response.
    fn kept_response(&self, method: &str, rest: &str) -> Result<Value, ApiError> {
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
        let data: Vec<Value> = kept.input.into_iter().rev().collect();
        Ok(json!({
            "object": "list", "data": data, "has_more": false,
            "first_id": data.first().and_then(|i| i.get("id")).cloned(),
            "last_id": data.last().and_then(|i| i.get("id")).cloned(),
        }))
    }
}

/// A path segment with its `%XX` escapes decoded (a model id with spaces or `/` in it arrives
/// escaped); an invalid escape is kept as written.
fn percent_decoded(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
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
