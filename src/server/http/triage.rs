//! What can be decided from a request head alone, before its body is read: the route, the
//! method, the API key, the declared size, and whether admission would refuse a generation
//! request right now. The front answers all of these itself, cheaply, without a thread.

use super::refusals::RefusalRate;
use super::server::Server;
use crate::server::openai::{ApiError, RESPONSES_PREFIX};
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The endpoints and the method each takes (HEAD is accepted wherever GET is).
const ROUTES: &[(&str, &str)] = &[
    ("/", "GET"),
    ("/health", "GET"),
    ("/metrics", "GET"),
    ("/api/status", "GET"),
    ("/v1/models", "GET"),
    ("/v1/completions", "POST"),
    ("/v1/chat/completions", "POST"),
    ("/v1/responses", "POST"),
    ("/v1/embeddings", "POST"),
    ("/tokenize", "POST"),
    ("/detokenize", "POST"),
    (ADMIN_LOAD_ADAPTER, "POST"),
    (ADMIN_UNLOAD_ADAPTER, "POST"),
    (ADMIN_RELOAD, "POST"),
];

/// Administration (adapters at vLLM's paths): open only where an API key is set, and only
/// with it.
pub const ADMIN_LOAD_ADAPTER: &str = "/v1/load_lora_adapter";
pub const ADMIN_UNLOAD_ADAPTER: &str = "/v1/unload_lora_adapter";
pub const ADMIN_RELOAD: &str = "/admin/reload";
const ADMIN: &[&str] = &[ADMIN_LOAD_ADAPTER, ADMIN_UNLOAD_ADAPTER, ADMIN_RELOAD];

/// What triage needs of a request head.
#[derive(Debug, PartialEq)]
pub struct Head {
    pub method: String,
    /// Without the query string.
    pub path: String,
    pub authorization: Option<String>,
    /// Declared body length (0 when absent or chunked).
    pub content_length: u64,
}

/// One model by id: `/v1/models/{id}`.
pub const MODEL_PREFIX: &str = "/v1/models/";

/// The methods `path` takes, if it is an endpoint.
fn methods(path: &str) -> Option<&'static [&'static str]> {
    if let Some((_, m)) = ROUTES.iter().find(|(p, _)| *p == path) {
        return Some(std::slice::from_ref(m));
    }
    if path.starts_with(MODEL_PREFIX) {
        Some(&["GET"])
    } else if path.starts_with(RESPONSES_PREFIX) {
        Some(&["GET", "DELETE"])
    } else {
        None
    }
}

/// Which handler pool a request goes to once its body is in.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Lane {
    /// Completions: their pool is sized to what admission lets in.
    Generate,
    /// Everything else: a few threads, so a flood of cheap-looking requests (tokenize,
    /// metrics) cannot take more than those threads' CPU.
    Other,
}

/// What the front does with a head.
pub enum Route {
    Dispatch(Lane),
    /// /health: answered by the front itself (status, JSON body), never paced, so that health
    /// checks see the truth quickly even during a flood.
    Health(u16, String),
}

/// A queued request without a first token after this long is shed (429) under a flood.
pub const SHED_AFTER: Duration = Duration::from_secs(1);

impl Server {
    /// Whether the request carries the API key (any request does when none is set).
    fn authorized(&self, auth: Option<&str>) -> bool {
        match &self.config.api_key {
            None => true,
            // The scheme is case-insensitive (RFC 9110 §11.1); the key is not.
            Some(key) => auth
                .and_then(|a| a.split_once(' '))
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .is_some_and(|(_, k)| constant_time_eq(k.trim().as_bytes(), key.as_bytes())),
        }
    }

    /// The route of a request from its head, or the error to answer it with.
    pub(super) fn route_check(&self, head: &Head) -> Result<Route, ApiError> {
        let path = head.path.as_str();
        let Some(allowed) = methods(path) else {
            return Err(ApiError::not_found(path));
        };
        let method = head.method.as_str();
        let takes = |m: &str| allowed.contains(&m) || (m == "HEAD" && allowed.contains(&"GET"));
        if !takes(method) {
            return Err(ApiError::method_not_allowed(method, path));
        }
        // Health and the status page stay open; everything else needs the key if one is set.
        let open = matches!(path, "/health" | "/");
        if !open && !self.authorized(head.authorization.as_deref()) {
            return Err(ApiError::unauthorized());
        }
        if ADMIN.contains(&path) && self.config.api_key.is_none() {
            return Err(ApiError::forbidden(
                "administration endpoints are closed: serve with an API key (--api-key) to \
                 open them to its holders",
            ));
        }
        // A declared length over the limit is refused now; a chunked body is limited as it
        // is read.
        if head.content_length > self.config.body_limit as u64 {
            return Err(ApiError::too_large(self.config.body_limit));
        }
        Ok(match path {
            "/health" => {
                let (status, state) = self.health();
                let mut body = json!({ "status": state });
                // Whether the last reload failed (why is behind the key, in /api/status).
                if self.reloads().last_error.is_some() {
                    body["last_reload"] = json!("failed");
                }
                Route::Health(status, body.to_string())
            }
            // Embeddings run through the engine as prompts do, and are admitted as they are.
            "/v1/completions" | "/v1/chat/completions" | "/v1/responses" | "/v1/embeddings" => {
                Route::Dispatch(Lane::Generate)
            }
            _ => Route::Dispatch(Lane::Other),
        })
    }

    /// Whether a generation request arriving now may go on to have its body read and parsed.
    /// Admission's own rules, peeked with the requests already handed to handlers but not yet
    /// through admission counted as in flight; and one rule of the front's: under a flood
    /// (see [`Server::flooded`]) clients resend as soon as they are refused, so there is
    /// always one ready to take a running slot the moment it frees. A queue then only adds
    /// latency (its requests wait for slots that retrying clients would fill anyway), so a
    /// request only goes on when a running slot is free.
    pub(super) fn admission_check(&self, now: Instant) -> Result<(), ApiError> {
        if self.draining.load(Ordering::Relaxed) {
            return Err(ApiError::unavailable("the server is shutting down"));
        }
        if self.ready().is_none() {
            return Err(ApiError::unavailable("the model is still loading"));
        }
        let in_flight = self.in_flight() + self.pending.load(Ordering::SeqCst);
        let refused = match self.admission.would_refuse(in_flight, now) {
            Some(r) => Some(ApiError::overloaded(r.retry_after_s, r.queue_full)),
            None if in_flight >= self.config.running_slots() && self.flooded(now) => {
                Some(ApiError::overloaded(1, false))
            }
            None => None,
        };
        match refused {
            Some(e) => {
                let tenth = self.tenth(now);
                self.refusals().note(tenth);
                Err(e)
            }
            None => Ok(()),
        }
    }

    fn tenth(&self, now: Instant) -> u64 {
        (now.saturating_duration_since(self.started).as_millis() / 100) as u64
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, RefusalRate> {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A flood: more overload refusals in the last second than twice the requests admission
    /// lets in at once. Clients that wait as Retry-After says come back at most once a
    /// second each, so only clients resending at once (or more of them than the box holds
    /// twice over) refuse that fast; a burst that overflows the queue once does not. The
    /// front answers refusals at `max_rejections_per_s` at most (a client resending at once
    /// sends no faster than it is answered), so the bound is at most a quarter of that.
    pub(super) fn flooded(&self, now: Instant) -> bool {
        let tenth = self.tenth(now);
        let mut bound = 2 * self.admission.max_in_flight() as u64;
        let paced = self.config.front.max_rejections_per_s;
        if paced > 0.0 {
            bound = bound.min((paced / 4.0) as u64);
        }
        self.refusals().last_second(tenth) > bound
    }

    /// /health's status and state.
    pub(super) fn health(&self) -> (u16, &'static str) {
        if self.is_ready() {
            (200, "ready")
        } else if self.draining.load(Ordering::Relaxed) {
            (503, "draining")
        } else if self.load_error.get().is_some() {
            (503, "failed")
        } else {
            (503, "loading")
        }
    }

    /// Counts an error the front answered, as the handlers count theirs, and logs it.
    pub(super) fn count_front_error(&self, e: &ApiError) {
        self.count_error(e);
        log_refusal("refused at the front", e);
    }
}

/// One line per refused request, without its body or key. Overload refusals (429, 503) come
/// in floods and have their own metrics, so they are logged at debug only.
pub fn log_refusal(what: &str, e: &ApiError) {
    let level = if matches!(e.status, 429 | 503) {
        log::Level::Debug
    } else {
        log::Level::Info
    };
    log::log!(level, "{what}: {} {}", e.status, e.message);
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
