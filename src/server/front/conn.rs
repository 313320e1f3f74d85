//! One connection while the front holds it: the bytes it sent, where its request stands, the
//! answer being written, and its deadline.

use super::super::error::ApiError;
use super::super::triage::{Lane, Pending};
use super::head::Head;
use std::io::{self, Read, Write};
use std::net::{IpAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub enum State {
    /// Reading a head. `idle`: kept alive after an answer and nothing received yet (the idle
    /// timeout applies until the first byte, then the header timeout).
    Head { idle: bool },
    /// Reading the body of a request that will be handed on.
    Body {
        head: Head,
        lane: Lane,
        pending: Option<Pending>,
    },
    /// A refusal waiting for the pacer; nothing is read meanwhile.
    Deferred {
        head: Head,
        error: ApiError,
        /// An overload refusal: admission is asked again when its turn comes.
        recheck: bool,
    },
    /// Skipping the unread body of a request the front answered, so that the answer is not
    /// lost to a reset and the connection can carry the next request.
    Discard { left: usize, keep_alive: bool },
}

/// What follows once `out` is written.
pub enum After {
    Close,
    Discard { left: usize, keep_alive: bool },
}

pub struct Conn {
    pub stream: TcpStream,
    pub peer: IpAddr,
    /// Tells this connection from a later one in the same slot.
    pub serial: u64,
    pub buf: Vec<u8>,
    pub state: State,
    pub deadline: Instant,
    /// An answer of the front's being written (empty: none).
    pub out: Vec<u8>,
    pub out_pos: usize,
    pub after: After,
}

static SERIAL: AtomicU64 = AtomicU64::new(1);

/// Bytes read per readiness report at most: one busy connection does not hold up the rest
/// (epoll is level-triggered, so the remainder is reported again).
const READ_BUDGET: usize = 64 * 1024;

impl Conn {
    pub fn new(stream: TcpStream, peer: IpAddr, deadline: Instant) -> Conn {
        Conn {
            stream,
            peer,
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            buf: Vec::new(),
            state: State::Head { idle: false },
            deadline,
            out: Vec::new(),
            out_pos: 0,
            after: After::Close,
        }
    }

    pub fn is_writing(&self) -> bool {
        !self.out.is_empty()
    }

    /// How many more bytes are worth reading in this state.
    fn wanted(&self, head_limit: usize) -> usize {
        match &self.state {
            State::Head { .. } => head_limit.saturating_sub(self.buf.len()),
            State::Body { head, .. } => head.content_length.saturating_sub(self.buf.len()),
            State::Discard { left, .. } => left.saturating_add(head_limit),
            State::Deferred { .. } => 0,
        }
    }

    /// Reads what the socket has (within this state's need and the read budget). Ok(true):
    /// the peer closed its side.
    pub fn fill(&mut self, head_limit: usize) -> io::Result<bool> {
        let mut budget = READ_BUDGET;
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let want = self.wanted(head_limit).min(budget).min(chunk.len());
            if want == 0 {
                return Ok(false);
            }
            match self.stream.read(&mut chunk[..want]) {
                Ok(0) => return Ok(true),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    budget -= n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes what it can of `out`. Ok(true): all written.
    pub fn flush(&mut self) -> io::Result<bool> {
        while self.out_pos < self.out.len() {
            match self.stream.write(&self.out[self.out_pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.out.clear();
        self.out_pos = 0;
        Ok(true)
    }
}
