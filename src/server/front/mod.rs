//! The HTTP front: one thread that accepts every connection and reads every request head and
//! body with epoll, so that a connection costs a descriptor, never a thread. It enforces the
//! header, body and idle timeouts and the connection cap, answers what a head alone decides
//! (404, 405, 401, 413, /health, and the 429s of admission and of the per-client token
//! buckets) without reading the body, paces its refusals, and hands each complete request to
//! a fixed pool of handler threads, whose responses stream on the connection as before.

mod bucket;
mod conn;
mod epoll;
mod head;
pub mod stats;

pub use head::Head;

use super::error::ApiError;
use super::handlers::Pool;
use super::triage::{Lane, Pending, Route};
use super::{Request, Server};
use bucket::{ClientBuckets, TokenBucket};
use conn::{After, Conn, State};
use epoll::Epoll;
use stats::bump;
use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct FrontConfig {
    /// From accept (or the first byte after a kept-alive answer) to the end of the head.
    pub header_timeout: Duration,
    /// From the end of the head to the end of the body.
    pub body_timeout: Duration,
    /// A kept-alive connection with no new request, or a response the client does not read.
    pub idle_timeout: Duration,
    /// Connections the front holds at once; a connection beyond is closed at accept.
    pub max_connections: usize,
    /// Per-client token bucket: generation requests a second per address; 0: off.
    pub client_rate_per_s: f64,
    pub client_burst: f64,
    /// Refusals the front answers a second at most (the rest wait their turn); 0: no bound.
    pub max_rejections_per_s: f64,
}

/// Largest request head (431 beyond).
const HEAD_LIMIT: usize = 16 * 1024;
/// How often deadlines are checked (timeouts are this much late at most).
const TICK: Duration = Duration::from_millis(100);
/// Connections accepted per wake at most, so that a connect storm does not stall reading.
const ACCEPT_BATCH: usize = 256;
/// Threads of the pool for everything but generation (metrics, tokenize, models, status).
const OTHER_THREADS: usize = 4;

/// Listener token in epoll; connections are `slot + 1`.
const LISTENER: u64 = 0;

pub struct Front {
    thread: std::thread::JoinHandle<()>,
}

impl Front {
    /// Starts the front thread and the handler pools on `listener`; it runs until `accepting`
    /// turns false.
    pub fn start(
        listener: TcpListener,
        server: Arc<Server>,
        config: FrontConfig,
        accepting: Arc<AtomicBool>,
    ) -> io::Result<Front> {
        listener.set_nonblocking(true)?;
        // Every request admission can let in has a thread waiting for it, plus a few for the
        // moment between a request's admission ending and its thread being free again.
        let gen_threads = server.admission.max_in_flight() + 4;
        let handle = |s: &Arc<Server>| {
            let s = s.clone();
            move |req: Request| s.handle(req)
        };
        let generate = Pool::new(
            "edgelm-http",
            gen_threads,
            gen_threads,
            super::priority::http_thread,
            handle(&server),
        )?;
        let other = Pool::new(
            "edgelm-http-other",
            OTHER_THREADS,
            64,
            super::priority::http_thread,
            handle(&server),
        )?;
        let epoll = Epoll::new()?;
        epoll.add(listener.as_raw_fd(), LISTENER, epoll::READ)?;
        let now = Instant::now();
        let body_limit = server.config.body_limit;
        let mut front = Loop {
            body_limit,
            clients: ClientBuckets::new(config.client_rate_per_s, config.client_burst, now),
            pacer: (config.max_rejections_per_s > 0.0).then(|| {
                // A tenth of a second's worth at once: refusals go out in small bursts.
                let burst = (config.max_rejections_per_s / 10.0).max(1.0);
                TokenBucket::new(config.max_rejections_per_s, burst, now)
            }),
            config,
            server,
            listener,
            epoll,
            conns: Vec::new(),
            free: Vec::new(),
            open: 0,
            deferred: VecDeque::new(),
            generate,
            other,
            reserve_fd: reserve_fd(),
            last_tick: now,
        };
        let thread = std::thread::Builder::new()
            .name("edgelm-front".into())
            // At the normal priority, unlike the handlers: its work is bounded (refusals are
            // paced, everything else is a few syscalls per request), and it answers /health,
            // which must stay prompt on a box whose cores the engine keeps busy.
            .spawn(move || front.run(&accepting))?;
        Ok(Front { thread })
    }

    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// A descriptor held in reserve: when accept fails for want of descriptors, closing it
/// frees one to accept the waiting connection and close it at once (otherwise it would sit
/// in the backlog and the listener would report it readable again and again).
fn reserve_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

struct Loop {
    config: FrontConfig,
    /// Largest body accepted (server.body_limit_kib).
    body_limit: usize,
    server: Arc<Server>,
    listener: TcpListener,
    epoll: Epoll,
    /// Slot i holds the connection with token i + 1.
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    open: usize,
    /// Slots (with their connection's serial) whose refusal waits for the pacer, oldest first.
    deferred: VecDeque<(usize, u64)>,
    clients: ClientBuckets,
    pacer: Option<TokenBucket>,
    generate: Pool<Request>,
    other: Pool<Request>,
    reserve_fd: Option<std::fs::File>,
    last_tick: Instant,
}

/// An answer the front writes itself.
struct Answer {
    status: u16,
    body: Vec<u8>,
    retry_after: Option<u64>,
    /// The connection may stay open afterwards (if the client wants it).
    reusable: bool,
    /// A HEAD request: the head only.
    head_only: bool,
}

impl Answer {
    fn error(e: &ApiError) -> Answer {
        Answer {
            status: e.status,
            body: e.body().into_bytes(),
            retry_after: e.retry_after,
            // After these the rest of the stream cannot be trusted to be a request.
            reusable: !matches!(e.status, 400 | 411 | 413 | 431),
            head_only: false,
        }
    }

    fn for_method(mut self, method: &str) -> Answer {
        self.head_only = method == "HEAD";
        self
    }
}

impl Loop {
    fn run(&mut self, accepting: &AtomicBool) {
        let mut events = Vec::with_capacity(512);
        while accepting.load(Ordering::Relaxed) {
            let now = Instant::now();
            let wait = self.drain_deferred(now).unwrap_or(TICK).min(TICK);
            if let Err(e) = self.epoll.wait(&mut events, wait) {
                log::error!("epoll failed: {e}");
                std::thread::sleep(TICK);
            }
            for ev in &events {
                let (token, flags) = (ev.u64, ev.events);
                if token == LISTENER {
                    self.accept();
                } else {
                    self.on_event(token as usize - 1, flags);
                }
            }
            let now = Instant::now();
            if now.duration_since(self.last_tick) >= TICK {
                self.last_tick = now;
                self.expire(now);
            }
        }
    }

    fn stats(&self) -> &stats::FrontStats {
        &self.server.front_stats
    }

    fn accept(&mut self) {
        for _ in 0..ACCEPT_BATCH {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    bump(&self.stats().accepted);
                    if self.open >= self.config.max_connections {
                        bump(&self.stats().rejected_cap);
                        refuse_at_accept(stream);
                        continue;
                    }
                    if let Err(e) = self.add(stream, peer.ip()) {
                        log::warn!("cannot watch a connection: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    bump(&self.stats().rejected_fds);
                    // Free the reserve, take the connection off the backlog, close it.
                    self.reserve_fd = None;
                    if let Ok((s, _)) = self.listener.accept() {
                        refuse_at_accept(s);
                    }
                    self.reserve_fd = reserve_fd();
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // The peer gave up before the accept (ECONNABORTED) and the like.
                Err(_) => return,
            }
        }
    }

    fn add(&mut self, stream: TcpStream, peer: std::net::IpAddr) -> io::Result<()> {
        stream.set_nonblocking(true)?;
        // Streamed tokens are written one small chunk at a time: they must not wait for the
        // previous segment's acknowledgement.
        stream.set_nodelay(true)?;
        let slot = self.free.pop().unwrap_or_else(|| {
            self.conns.push(None);
            self.conns.len() - 1
        });
        self.epoll
            .add(stream.as_raw_fd(), slot as u64 + 1, epoll::READ)?;
        let deadline = Instant::now() + self.config.header_timeout;
        self.conns[slot] = Some(Conn::new(stream, peer, deadline));
        self.open += 1;
        self.stats().open.store(self.open as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Takes the connection out of the front (closing it, unless the caller keeps it).
    fn remove(&mut self, slot: usize) -> Option<Conn> {
        let conn = self.conns.get_mut(slot)?.take()?;
        let _ = self.epoll.delete(conn.stream.as_raw_fd());
        self.free.push(slot);
        self.open -= 1;
        self.stats().open.store(self.open as u64, Ordering::Relaxed);
        Some(conn)
    }

    fn conn(&mut self, slot: usize) -> Option<&mut Conn> {
        self.conns.get_mut(slot)?.as_mut()
    }

    fn on_event(&mut self, slot: usize, flags: u32) {
        let failed = flags & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0;
        let Some(conn) = self.conn(slot) else { return };
        if matches!(conn.state, State::Deferred { .. }) {
            // Not reading while its refusal waits; only a connection gone matters.
            if failed || flags & libc::EPOLLRDHUP as u32 != 0 {
                self.remove(slot);
            }
            return;
        }
        if !conn.out.is_empty() {
            match conn.flush() {
                Ok(true) => self.after_write(slot),
                Ok(false) => {}
                Err(_) => {
                    self.remove(slot);
                }
            }
            return;
        }
        match conn.fill(HEAD_LIMIT) {
            Ok(eof) => {
                self.progress(slot, Instant::now());
                if eof || failed {
                    // The client closed its side: nothing more will come. A request that is
                    // complete has been handed on by now; anything else is dropped.
                    if self.conn(slot).is_some_and(|c| !c.is_writing()) {
                        self.remove(slot);
                    }
                }
            }
            Err(_) => {
                self.remove(slot);
            }
        }
    }

    /// Moves a connection on with the bytes it has.
    fn progress(&mut self, slot: usize, now: Instant) {
        enum Next {
            Wait,
            Head(Head),
            Answer(Answer),
            Dispatch,
            Close,
            Again,
        }
        loop {
            let (header_timeout, idle_timeout) =
                (self.config.header_timeout, self.config.idle_timeout);
            let Some(conn) = self.conn(slot) else { return };
            let next = match &mut conn.state {
                State::Head { .. } if conn.buf.is_empty() => Next::Wait,
                State::Head { idle } => {
                    if *idle {
                        // The next request has begun: it gets the header timeout.
                        *idle = false;
                        conn.deadline = now + header_timeout;
                    }
                    match head::parse(&conn.buf) {
                        head::Parsed::Partial if conn.buf.len() >= HEAD_LIMIT => {
                            Next::Answer(Answer::error(&ApiError::bad_head(
                                431,
                                "the request head is too large",
                            )))
                        }
                        head::Parsed::Partial => Next::Wait,
                        head::Parsed::Invalid(why) => {
                            Next::Answer(Answer::error(&ApiError::bad_head(400, why)))
                        }
                        head::Parsed::Complete(h) => {
                            conn.buf.drain(..h.len);
                            Next::Head(h)
                        }
                    }
                }
                State::Body { head, .. } if conn.buf.len() >= head.content_length => Next::Dispatch,
                State::Body { .. } | State::Deferred { .. } => Next::Wait,
                State::Discard { left, keep_alive } => {
                    let n = (*left).min(conn.buf.len());
                    conn.buf.drain(..n);
                    *left -= n;
                    if *left > 0 {
                        Next::Wait
                    } else if !*keep_alive {
                        Next::Close
                    } else {
                        conn.state = State::Head { idle: true };
                        conn.deadline = now + idle_timeout;
                        // A pipelined request may already be in the buffer.
                        Next::Again
                    }
                }
            };
            match next {
                Next::Wait => return,
                Next::Again => {}
                Next::Head(h) => return self.on_head(slot, h, now),
                Next::Answer(a) => return self.answer(slot, a, false, 0, now),
                Next::Dispatch => return self.dispatch(slot),
                Next::Close => {
                    self.remove(slot);
                    return;
                }
            }
        }
    }

    fn on_head(&mut self, slot: usize, head: Head, now: Instant) {
        let lane = match self.server.route_check(&head) {
            Ok(Route::Health(status, body)) => {
                let a = Answer {
                    status,
                    body: body.into_bytes(),
                    retry_after: None,
                    reusable: true,
                    head_only: false,
                };
                let keep = head.keep_alive;
                let a = a.for_method(&head.method);
                return self.answer(slot, a, keep, head.content_length, now);
            }
            Ok(Route::Dispatch(lane)) => lane,
            Err(e) => return self.refuse(slot, head, e, false, now),
        };
        if lane == Lane::Generate {
            let peer = match self.conn(slot) {
                Some(c) => c.peer,
                None => return,
            };
            if let Err(retry) = self.clients.take(peer, now) {
                bump(&self.stats().rejected_client_rate);
                return self.refuse(slot, head, ApiError::client_rate(retry), false, now);
            }
            if let Err(e) = self.server.admission_check(now) {
                return self.refuse(slot, head, e, true, now);
            }
        }
        self.start_body(slot, head, lane, now);
    }

    /// A refusal, answered now if the pacer allows, otherwise when its turn comes (then,
    /// if `recheck`, admission is asked again: the request may go on after all).
    fn refuse(&mut self, slot: usize, head: Head, e: ApiError, recheck: bool, now: Instant) {
        let pace =
            self.deferred.is_empty() && self.pacer.as_mut().is_none_or(|p| p.take(now).is_ok());
        if pace {
            return self.refuse_now(slot, head, &e, now);
        }
        bump(&self.stats().deferred);
        let Some(conn) = self.conn(slot) else { return };
        let serial = conn.serial;
        let fd = conn.stream.as_raw_fd();
        conn.state = State::Deferred {
            head,
            error: e,
            recheck,
        };
        // Level-triggered reads would report its unread bytes on every wait: watch only
        // for the peer going away.
        let _ = self
            .epoll
            .modify(fd, slot as u64 + 1, libc::EPOLLRDHUP as u32);
        self.deferred.push_back((slot, serial));
    }

    fn refuse_now(&mut self, slot: usize, head: Head, e: &ApiError, now: Instant) {
        if e.status == 429 && e.code != Some("client_rate_limited") {
            bump(&self.stats().rejected_overloaded);
        }
        self.server.count_front_error(e);
        let keep = head.keep_alive;
        let a = Answer::error(e).for_method(&head.method);
        self.answer(slot, a, keep, head.content_length, now);
    }

    /// Answers the refusals whose turn has come; returns how long until the next may go.
    fn drain_deferred(&mut self, now: Instant) -> Option<Duration> {
        while let Some(&(slot, serial)) = self.deferred.front() {
            let live = self.conn(slot).is_some_and(|c| c.serial == serial);
            if !live {
                self.deferred.pop_front();
                continue;
            }
            if let Some(p) = self.pacer.as_mut() {
                if let Err(wait) = p.take(now) {
                    return Some(wait);
                }
            }
            self.deferred.pop_front();
            let Some(conn) = self.conn(slot) else {
                continue;
            };
            let State::Deferred {
                head,
                error,
                recheck,
            } = std::mem::replace(&mut conn.state, State::Head { idle: false })
            else {
                continue;
            };
            let fd = conn.stream.as_raw_fd();
            let _ = self.epoll.modify(fd, slot as u64 + 1, epoll::READ);
            let error = if recheck {
                match self.server.admission_check(now) {
                    Ok(()) => {
                        self.start_body(slot, head, Lane::Generate, now);
                        continue;
                    }
                    Err(e) => e,
                }
            } else {
                error
            };
            self.refuse_now(slot, head, &error, now);
        }
        None
    }

    fn start_body(&mut self, slot: usize, head: Head, lane: Lane, now: Instant) {
        let pending = (lane == Lane::Generate).then(|| Pending::new(&self.server));
        let body_timeout = self.config.body_timeout;
        let Some(conn) = self.conn(slot) else { return };
        if head.expect_continue && conn.buf.len() < head.content_length {
            // The client waits for this before it sends the body (curl does, past 1 KiB).
            let _ = (&conn.stream).write(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        conn.deadline = now + body_timeout;
        conn.state = State::Body {
            head,
            lane,
            pending,
        };
        self.progress(slot, now);
    }

    /// Hands a complete request to its handler pool; the connection leaves the front.
    fn dispatch(&mut self, slot: usize) {
        let Some(conn) = self.remove(slot) else {
            return;
        };
        let Conn {
            stream,
            mut buf,
            state,
            ..
        } = conn;
        let State::Body {
            head,
            lane,
            pending,
        } = state
        else {
            return;
        };
        buf.truncate(head.content_length);
        let prepared = stream
            .set_nonblocking(false)
            .and_then(|_| stream.set_write_timeout(Some(self.config.idle_timeout)));
        if prepared.is_err() {
            return;
        }
        let req = Request {
            method: head.method,
            path: head.path,
            auth: head.authorization,
            body: buf,
            stream,
            pending,
        };
        let pool = match lane {
            Lane::Generate => &self.generate,
            Lane::Other => &self.other,
        };
        if let Err(req) = pool.try_submit(req) {
            bump(&self.stats().rejected_busy);
            let e = ApiError::unavailable("every request handler is busy; retry shortly");
            self.server.count_front_error(&e);
            let a = Answer::error(&e);
            // Best effort on a socket that has just been read from: a short response fits
            // its send buffer; the connection closes either way.
            let _ = req.stream.set_nonblocking(true);
            let bytes =
                super::http::response_bytes(a.status, "application/json", &[], &a.body, false);
            let _ = (&req.stream).write(&bytes);
        }
    }

    /// Writes an answer of the front's own; afterwards the connection skips the unread body
    /// (`body_len` less what already came) and, if `keep_alive`, waits for the next request.
    fn answer(&mut self, slot: usize, a: Answer, keep_alive: bool, body_len: usize, now: Instant) {
        let (idle, body_limit) = (self.config.idle_timeout, self.body_limit);
        let Some(conn) = self.conn(slot) else { return };
        let keep = keep_alive && a.reusable && body_len <= body_limit;
        let retry: Vec<(&str, String)> = a
            .retry_after
            .map(|s| vec![("Retry-After", s.to_string())])
            .unwrap_or_default();
        conn.out = super::http::response_bytes(a.status, "application/json", &retry, &a.body, keep);
        if a.head_only {
            // The head says how long the body would be; the body itself is not sent, or a
            // kept-alive client would read it as the start of the next response.
            conn.out.truncate(conn.out.len() - a.body.len());
        }
        conn.out_pos = 0;
        conn.after = if body_len <= body_limit && a.reusable {
            After::Discard {
                left: body_len,
                keep_alive: keep,
            }
        } else {
            After::Close
        };
        conn.deadline = now + idle;
        match conn.flush() {
            Ok(true) => self.after_write(slot),
            Ok(false) => {
                let fd = conn.stream.as_raw_fd();
                let _ = self.epoll.modify(fd, slot as u64 + 1, epoll::WRITE);
            }
            Err(_) => {
                self.remove(slot);
            }
        }
    }

    fn after_write(&mut self, slot: usize) {
        let now = Instant::now();
        let (body_timeout, idle) = (self.config.body_timeout, self.config.idle_timeout);
        let Some(conn) = self.conn(slot) else { return };
        let fd = conn.stream.as_raw_fd();
        match std::mem::replace(&mut conn.after, After::Close) {
            After::Close => {
                self.remove(slot);
                return;
            }
            After::Discard { left, keep_alive } => {
                conn.state = State::Discard { left, keep_alive };
                conn.deadline = now + if left > 0 { body_timeout } else { idle };
            }
        }
        let _ = self.epoll.modify(fd, slot as u64 + 1, epoll::READ);
        self.progress(slot, now);
    }

    /// Closes the connections past their deadline.
    fn expire(&mut self, now: Instant) {
        for slot in 0..self.conns.len() {
            let Some(conn) = self.conns[slot].as_ref() else {
                continue;
            };
            if now < conn.deadline || matches!(conn.state, State::Deferred { .. }) {
                continue;
            }
            let stats = &self.server.front_stats;
            match (&conn.state, conn.is_writing()) {
                (_, true) | (State::Head { idle: true }, _) => bump(&stats.timeout_idle),
                (State::Head { idle: false }, _) => bump(&stats.timeout_header),
                _ => bump(&stats.timeout_body),
            }
            self.remove(slot);
        }
    }
}

/// A connection over the cap: a minimal 503 if the send buffer takes it at once, then closed.
fn refuse_at_accept(stream: TcpStream) {
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n";
    let _ = stream.set_nonblocking(true);
    let _ = (&stream).write(BUSY);
}
