//! Where a connection's requests stand, as the gate, the service and the answers report it:
//! the heads and bodies being read, the answers being written, the idle spells. The
//! connection's watchdog (`conn`) reads its deadlines from here.

use super::config::FrontConfig;
use super::head::Facts;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::Instant;
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
    pub(super) changed: Notify,
    /// Heads the gate has passed (a stand-in for a refused one included).
    pub(super) heads: Cell<usize>,
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
    pub(super) fn deadline(&self, c: &FrontConfig) -> Option<(Instant, Phase)> {
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
