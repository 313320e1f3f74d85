//! OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}` with an HTTP status.

use crate::chat;
use crate::server::generate::Failure;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for the Retry-After header (429s).
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    pub fn param(mut self, p: &str) -> ApiError {
        self.param = Some(p.to_string());
        self
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            status: 401,
            message: "missing or invalid API key (send Authorization: Bearer <key>)".into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
            retry_after: None,
        }
    }

    /// An endpoint this server keeps closed as it is configured.
    pub fn forbidden(message: &str) -> ApiError {
        ApiError {
            status: 403,
            message: message.into(),
            kind: "permission_error",
            param: None,
            code: Some("forbidden"),
            retry_after: None,
        }
    }

    pub fn not_found(path: &str) -> ApiError {
        ApiError {
            status: 404,
            message: format!("no such endpoint: {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("not_found"),
            retry_after: None,
        }
    }

    /// A model id this server does not serve (OpenAI's `model_not_found`).
    pub fn model_not_found(id: &str) -> ApiError {
        ApiError {
            status: 404,
            message: format!("The model '{id}' does not exist"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
            retry_after: None,
        }
    }

    /// A response id this server does not keep (never made, deleted, forgotten, or from
    /// before a restart).
    pub fn response_not_found(id: &str) -> ApiError {
        ApiError {
            status: 404,
            message: format!("Response with id '{id}' not found."),
            kind: "invalid_request_error",
            param: None,
            code: Some("response_not_found"),
            retry_after: None,
        }
    }

    pub fn method_not_allowed(method: &str, path: &str) -> ApiError {
        ApiError {
            status: 405,
            message: format!("method {method} is not allowed on {path}"),
            kind: "invalid_request_error",
            param: None,
            code: Some("method_not_allowed"),
            retry_after: None,
        }
    }

    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            status: 413,
            message: format!("request body exceeds {limit} bytes"),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
            retry_after: None,
        }
    }

    /// 429: the queue is full, or a new request would wait too long for its turn.
    pub fn overloaded(retry_after_s: u64, queue_full: bool) -> ApiError {
        ApiError {
            status: 429,
            message: if queue_full {
                format!("the server is at capacity (queue full); retry in {retry_after_s} s")
            } else {
                format!("the server is busy (the requests not yet started ahead of this one would make it wait too long); retry in {retry_after_s} s")
            },
            kind: "rate_limit_error",
            param: None,
            code: Some("queue_full"),
            retry_after: Some(retry_after_s),
        }
    }

    /// 429 from the per-client token bucket: this client sends faster than its share.
    pub fn client_rate(retry_after_s: u64) -> ApiError {
        ApiError {
            status: 429,
            message: format!("too many requests from this client; retry in {retry_after_s} s"),
            kind: "rate_limit_error",
            param: None,
            code: Some("client_rate_limited"),
            retry_after: Some(retry_after_s),
        }
    }

    /// A request head (or body framing) the front refuses: 400, 414 or 431 by the limit it
    /// breaks, 501 for a transfer coding it does not read.
    pub fn bad_head(status: u16, message: &str) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("bad_request_head"),
            retry_after: None,
        }
    }

    pub fn unavailable(message: &str) -> ApiError {
        ApiError {
            status: 503,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: Some("unavailable"),
            retry_after: None,
        }
    }

    /// A reload that did not happen: the models serving before it still serve.
    pub fn reload_failed(why: &str) -> ApiError {
        ApiError {
            status: 500,
            message: format!("reload failed, the running models keep serving: {why}"),
            kind: "server_error",
            param: None,
            code: Some("reload_failed"),
            retry_after: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// Short label for the errors metric.
    pub fn reason(&self) -> &'static str {
        match self.status {
            400 => "invalid_request",
            401 => "unauthorized",
            403 => "forbidden",
            404 => "not_found",
            405 => "method_not_allowed",
            414 => "target_too_long",
            413 => "too_large",
            431 => "head_too_large",
            429 if self.code == Some("client_rate_limited") => "client_rate",
            429 => "queue_full",
            503 => "unavailable",
            _ => "internal",
        }
    }

    pub fn body(&self) -> String {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}).to_string()
    }
}

/// A chat request's messages, tools or options at fault: a 400 naming the field.
impl From<chat::Error> for ApiError {
    fn from(e: chat::Error) -> ApiError {
        ApiError::bad_request(e.message).param(e.param)
    }
}

/// Why an answer failed, as its client reads it: a prompt the engine refused is the
/// request's fault (400, naming the prompt), a shed request may retry (429), a stopping
/// server is unavailable (503), and an engine failure is the server's (500).
impl From<&Failure> for ApiError {
    fn from(f: &Failure) -> ApiError {
        match f {
            Failure::Refused(why) => ApiError::bad_request(why.clone()).param("prompt"),
            Failure::Engine(why) => ApiError::internal(why.clone()),
            Failure::Shutdown => ApiError::unavailable("the server is shutting down"),
            Failure::Shed => ApiError::overloaded(1, false),
        }
    }
}
