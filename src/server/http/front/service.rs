//! One request, from the head hyper parsed to the answer hyper writes. What the head alone
//! decides is answered here without reading the body (the gate's refusals, 404, 405, 401, 413,
//! /health, and the 429s of the per-client buckets and of admission, paced); everything else
//! has its body read (within the body timeout and the size limit) and goes to a handler pool,
//! whose answer comes back over a channel.

use super::super::pool::Pool;
use super::super::server::{Pending, Request, Server};
use super::super::triage::{Head, Lane, Route};
use super::body::Body;
use super::bucket::{ClientBuckets, Pacer};
use super::config::FrontConfig;
use super::head::{Facts, Framing};
use super::stats::{bump, FrontStats};
use super::watch::Watch;
use crate::server::generate::{HandedBody, RawResponse};
use crate::server::openai::ApiError;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use std::cell::{Cell, RefCell};
use std::convert::Infallible;
use std::net::IpAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

/// The front's state, on its one thread.
pub struct Front {
    pub server: Arc<Server>,
    pub config: FrontConfig,
    clients: RefCell<ClientBuckets>,
    pacer: Option<RefCell<Pacer>>,
    generate: Pool<Request>,
    other: Pool<Request>,
    /// Requests on every connection whose answer is not handed to hyper in full yet.
    pub open_requests: Rc<Cell<usize>>,
}

type Answer = Result<Response<Body>, Infallible>;

impl Front {
    pub fn new(
        server: Arc<Server>,
        config: FrontConfig,
        generate: Pool<Request>,
        other: Pool<Request>,
    ) -> Front {
        let now = Instant::now();
        Front {
            clients: RefCell::new(ClientBuckets::new(
                config.client_rate_per_s,
                config.client_burst,
                now,
            )),
            pacer: (config.max_rejections_per_s > 0.0)
                .then(|| RefCell::new(Pacer::new(config.max_rejections_per_s, now))),
            server,
            config,
            generate,
            other,
            open_requests: Rc::new(Cell::new(0)),
        }
    }

    pub fn stats(&self) -> &FrontStats {
        &self.server.front_stats
    }

    pub async fn request(
        self: Rc<Self>,
        req: hyper::Request<Incoming>,
        facts: Option<Facts>,
        watch: Rc<Watch>,
        peer: IpAddr,
    ) -> Answer {
        let facts = facts.unwrap_or_else(|| Facts {
            len: 0,
            framing: Framing::Length(0),
            refusal: Some(ApiError::bad_head(400, "malformed request head")),
        });
        if let Some(e) = facts.refusal {
            self.server.count_front_error(&e);
            return Ok(error(&e, watch, true));
        }
        // After a chunked body the gate cannot find the next head: the connection ends here.
        let last = facts.framing == Framing::Chunked;
        let head = head_of(&req, &facts);
        let lane = match self.server.route_check(&head) {
            Ok(Route::Health(status, body)) => {
                return Ok(answer(status, json_type(), Bytes::from(body), watch, last))
            }
            Ok(Route::Dispatch(lane)) => lane,
            Err(e) => {
                self.pace(&watch).await;
                return Ok(self.refusal(&e, watch, last));
            }
        };
        if lane == Lane::Generate {
            if let Err(r) = self.triage_generation(peer, &watch, last).await {
                return Ok(r);
            }
        }
        // Counted as in flight from here until admission has decided, so that a slot that
        // frees lets one request through, not every one that arrives meanwhile.
        let pending = (lane == Lane::Generate).then(|| Pending::new(&self.server));
        let body = match self.read_body(req, &watch).await {
            Ok(b) => b,
            Err(e) => {
                self.server.count_front_error(&e);
                return Ok(error(&e, watch, true));
            }
        };
        let (response, handed) = RawResponse::new();
        let request = Request {
            method: head.method,
            path: head.path,
            body: body.to_vec(),
            response,
            pending,
        };
        let pool = match lane {
            Lane::Generate => &self.generate,
            Lane::Other => &self.other,
        };
        if pool.try_submit(request).is_err() {
            bump(&self.stats().rejected_busy);
            let e = ApiError::unavailable("every request handler is busy; retry shortly");
            self.server.count_front_error(&e);
            return Ok(error(&e, watch, true));
        }
        let Ok(h) = handed.await else {
            let e = ApiError::internal("the request's handler failed");
            return Ok(error(&e, watch, true));
        };
        let status = StatusCode::from_u16(h.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = match h.body {
            HandedBody::Whole(b) => Body::whole(b, watch),
            HandedBody::Stream(rx) => Body::stream(rx, watch),
        };
        let mut r = Response::new(body);
        *r.status_mut() = status;
        for (k, v) in h.headers {
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k), HeaderValue::try_from(v)) {
                r.headers_mut().append(k, v);
            }
        }
        Ok(close_if(r, last))
    }

    /// The per-client bucket and admission, from the head: Err is the refusal to send.
    async fn triage_generation(
        &self,
        peer: IpAddr,
        watch: &Rc<Watch>,
        last: bool,
    ) -> Result<(), Response<Body>> {
        let now = Instant::now();
        let took = self.clients.borrow_mut().take(peer, now);
        if let Err(retry) = took {
            bump(&self.stats().rejected_client_rate);
            self.pace(watch).await;
            return Err(self.refusal(&ApiError::client_rate(retry), watch.clone(), last));
        }
        let Err(mut e) = self.server.admission_check(now) else {
            return Ok(());
        };
        // A refusal that had to wait for its turn asks admission again: a slot may have freed
        // meanwhile, and the request goes on after all.
        if self.pace(watch).await {
            match self.server.admission_check(Instant::now()) {
                Ok(()) => return Ok(()),
                Err(again) => e = again,
            }
        }
        Err(self.refusal(&e, watch.clone(), last))
    }

    /// Waits for a refusal's turn (refusals go out in arrival order at the pacer's rate);
    /// whether it had to wait.
    async fn pace(&self, watch: &Watch) -> bool {
        let now = Instant::now();
        let turn = self
            .pacer
            .as_ref()
            .map_or(now, |p| p.borrow_mut().turn(now));
        if turn <= now {
            return false;
        }
        bump(&self.stats().deferred);
        watch.deferred(true);
        tokio::time::sleep_until(turn.into()).await;
        watch.deferred(false);
        true
    }

    /// A refusal from the head, counted.
    fn refusal(&self, e: &ApiError, watch: Rc<Watch>, last: bool) -> Response<Body> {
        if e.status == 429 && e.code != Some("client_rate_limited") {
            bump(&self.stats().rejected_overloaded);
        }
        self.server.count_front_error(e);
        error(e, watch, last)
    }

    /// The whole body, within the size limit (the body timeout is the watchdog's).
    async fn read_body(
        &self,
        req: hyper::Request<Incoming>,
        watch: &Watch,
    ) -> Result<Bytes, ApiError> {
        let limit = self.server.config.body_limit;
        watch.reading_body(true);
        let body = Limited::new(req.into_body(), limit).collect().await;
        watch.reading_body(false);
        match body {
            Ok(b) => Ok(b.to_bytes()),
            Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                Err(ApiError::too_large(limit))
            }
            Err(e) => Err(ApiError::bad_head(
                400,
                &format!("malformed request body: {e}"),
            )),
        }
    }
}

fn head_of(req: &hyper::Request<Incoming>, facts: &Facts) -> Head {
    Head {
        method: req.method().as_str().to_string(),
        path: req.uri().path().to_string(),
        authorization: req
            .headers()
            .get(AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_string()),
        content_length: match facts.framing {
            Framing::Length(n) => n,
            Framing::Chunked => 0,
        },
    }
}

fn json_type() -> HeaderValue {
    HeaderValue::from_static("application/json")
}

fn answer(
    status: u16,
    content_type: HeaderValue,
    body: Bytes,
    watch: Rc<Watch>,
    close: bool,
) -> Response<Body> {
    let mut r = Response::new(Body::whole(body, watch));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(CONTENT_TYPE, content_type);
    close_if(r, close)
}

/// An OpenAI-style error. After a malformed or oversized request, or one whose body was not
/// wanted, the rest of the connection cannot be trusted to be a request: it closes.
fn error(e: &ApiError, watch: Rc<Watch>, close: bool) -> Response<Body> {
    let close = close || matches!(e.status, 400 | 413 | 414 | 431 | 501);
    let mut r = answer(e.status, json_type(), Bytes::from(e.body()), watch, close);
    if let Some(s) = e.retry_after {
        r.headers_mut().insert("retry-after", HeaderValue::from(s));
    }
    r
}

fn close_if(mut r: Response<Body>, close: bool) -> Response<Body> {
    if close {
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}
