//! One connection: hyper serves its requests through the gate, and a watchdog closes it when a
//! head, a body or an idle spell outlasts its timeout, or when the client stops reading its
//! answer. A connection that ends cleanly is closed without a reset (`linger`).

use super::gate::Gate;
use super::head::{Facts, HEAD_LIMIT, MAX_HEADERS};
use super::service::Front;
use super::stats::bump;
use super::FrontConfig;
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;

/// Which timeout closed a connection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Phase {
    Header,
    Body,
    /// Kept alive with no new request, or an answer the client does not read.
    Idle,
}

/// Where a connection's requests stand, as the gate, the service and the answers report it;
/// the watchdog reads its deadline from here.
pub struct Watch {
    /// The gate's facts of each head hyper has been given and not yet handed to the service.
    facts: RefCell<VecDeque<Facts>>,
    /// A head is being read (since accept, for the first).
    head_since: Cell<Option<Instant>>,
    /// A body is being read.
    body_since: Cell<Option<Instant>>,
    /// Every answer written, no new head begun.
    idle_since: Cell<Option<Instant>>,
    /// A write that the client has not made room for.
    stalled_since: Cell<Option<Instant>>,
    /// Requests whose head is in and whose answer is not fully handed to hyper yet.
    open_requests: Cell<usize>,
    /// A refusal waiting for the pacer: no timeout runs meanwhile.
    deferred: Cell<bool>,
    changed: Notify,
    /// Heads the gate has passed (a stand-in for a refused one included).
    heads: Cell<usize>,
    /// The front's count of open requests on all its connections.
    front_open: Rc<Cell<usize>>,
}

impl Watch {
    pub fn new(accepted: Instant, front_open: Rc<Cell<usize>>) -> Watch {
        Watch {
            facts: RefCell::new(VecDeque::new()),
            head_since: Cell::new(Some(accepted)),
            body_since: Cell::new(None),
            idle_since: Cell::new(None),
            stalled_since: Cell::new(None),
            open_requests: Cell::new(0),
            deferred: Cell::new(false),
            changed: Notify::new(),
            heads: Cell::new(0),
            front_open,
        }
    }

    /// The first byte of a head (the header timeout runs from here, or from the accept).
    pub fn head_begun(&self) {
        if self.head_since.get().is_none() {
            self.head_since.set(Some(Instant::now()));
            self.idle_since.set(None);
            self.changed.notify_one();
        }
    }

    pub fn head_complete(&self, facts: Facts) {
        self.facts.borrow_mut().push_back(facts);
        self.heads.set(self.heads.get() + 1);
        self.head_since.set(None);
        self.idle_since.set(None);
        self.open_requests.set(self.open_requests.get() + 1);
        self.front_open.set(self.front_open.get() + 1);
        self.changed.notify_one();
    }

    /// The facts of the head hyper is handing to the service now (heads come in order).
    pub fn next_facts(&self) -> Option<Facts> {
        self.facts.borrow_mut().pop_front()
    }

    pub fn reading_body(&self, reading: bool) {
        self.body_since.set(reading.then(Instant::now));
        self.changed.notify_one();
    }

    pub fn deferred(&self, deferred: bool) {
        self.deferred.set(deferred);
        self.changed.notify_one();
    }

    /// A write went through, or had to wait for the client.
    pub fn writing(&self, blocked: bool) {
        match (blocked, self.stalled_since.get()) {
            (true, None) => {
                self.stalled_since.set(Some(Instant::now()));
                self.changed.notify_one();
            }
            (false, Some(_)) => self.stalled_since.set(None),
            _ => {}
        }
    }

    /// An answer has been handed to hyper in full.
    pub fn answer_done(&self) {
        let open = self.open_requests.get().saturating_sub(1);
        self.open_requests.set(open);
        self.front_open.set(self.front_open.get().saturating_sub(1));
        if open == 0 && self.head_since.get().is_none() {
            self.idle_since.set(Some(Instant::now()));
        }
        self.changed.notify_one();
    }

    /// When the connection is closed unless something happens first, and for which timeout.
    fn deadline(&self, c: &FrontConfig) -> Option<(Instant, Phase)> {
        if let Some(t) = self.stalled_since.get() {
            return Some((t + c.idle_timeout, Phase::Idle));
        }
        if self.deferred.get() {
            return None;
        }
        if let Some(t) = self.body_since.get() {
            return Some((t + c.body_timeout, Phase::Body));
        }
        if self.open_requests.get() > 0 {
            // Its answer is being made; a client that stops reading it shows as a stall.
            return None;
        }
        if let Some(t) = self.head_since.get() {
            return Some((t + c.header_timeout, Phase::Header));
        }
        self.idle_since
            .get()
            .map(|t| (t + c.idle_timeout, Phase::Idle))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let open = self.open_requests.get();
        self.front_open
            .set(self.front_open.get().saturating_sub(open));
    }
}

/// Returns when a timeout has run out, with its phase.
async fn watchdog(watch: &Watch, config: &FrontConfig) -> Phase {
    loop {
        let changed = watch.changed.notified();
        match watch.deadline(config) {
            Some((at, phase)) if Instant::now() >= at => return phase,
            Some((at, _)) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(at.into()) => {}
                    _ = changed => {}
                }
            }
            None => changed.await,
        }
    }
}

/// hyper's HTTP/1 server as the front uses it: a read end of input means the client has gone
/// (its request is cancelled); header names in their usual case (some clients and tests
/// match `Retry-After` byte for byte); the gate's limits as a second line.
fn http1() -> http1::Builder {
    let mut b = http1::Builder::new();
    b.half_close(false)
        .keep_alive(true)
        .title_case_headers(true)
        .max_headers(MAX_HEADERS)
        .max_buf_size(4 * HEAD_LIMIT)
        .header_read_timeout(None::<Duration>);
    b
}

/// Serves one accepted connection to its end; returns how many request heads it had.
pub async fn serve<T>(stream: T, peer: IpAddr, front: Rc<Front>) -> usize
where
    T: AsyncRead + AsyncWrite + Unpin + 'static,
{
    let watch = Rc::new(Watch::new(Instant::now(), front.open_requests.clone()));
    let service = {
        let (front, watch) = (front.clone(), watch.clone());
        hyper::service::service_fn(move |req| {
            // hyper hands heads over in the order the gate checked them.
            let facts = watch.next_facts();
            front.clone().request(req, facts, watch.clone(), peer)
        })
    };
    let gate = Gate::new(stream, watch.clone());
    let conn = http1()
        .serve_connection(TokioIo::new(gate), service)
        .without_shutdown();
    tokio::select! {
        done = conn => {
            if let Ok(parts) = done {
                linger(parts.io.into_inner().into_inner()).await;
            }
        }
        phase = watchdog(&watch, &front.config) => {
            let s = front.stats();
            bump(match phase {
                Phase::Header => &s.timeout_header,
                Phase::Body => &s.timeout_body,
                Phase::Idle => &s.timeout_idle,
            });
        }
    }
    watch.heads.get()
}

/// Closes a connection whose answers are complete without resetting it: says so (FIN), then
/// reads and drops whatever the client still sends until it closes too. Closing with unread
/// bytes (the rest of a refused body, a request pipelined after a `Connection: close`) would
/// send a reset, which can destroy the end of an answer the client has not read yet. Bounded:
/// a client that neither sends nor closes is let go after a moment.
async fn linger<T: AsyncRead + AsyncWrite + Unpin>(mut stream: T) {
    const LINGER: Duration = Duration::from_millis(200);
    const MOST: usize = 1 << 20;
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut scratch = [0u8; 4096];
    let mut dropped = 0;
    let _ = tokio::time::timeout(LINGER, async {
        while dropped < MOST {
            match stream.read(&mut scratch).await {
                Ok(n) if n > 0 => dropped += n,
                _ => return,
            }
        }
    })
    .await;
}
