//! The bytes between a connection and hyper. Each request head is held back until it is
//! complete and checked (`head::inspect`); only then does hyper read it, and the body after it
//! up to its `Content-Length`, before the next head is held in turn. So every head hyper parses
//! has passed edgelm's rules, and a head that breaks them reaches hyper as a stand-in head
//! whose request is answered with the refusal (in order, after the answers before it) and
//! closes the connection. A chunked body's end is hyper's to find: after one, the bytes go
//! straight through and the connection closes after that request's answer.
//!
//! The gate also tells the connection (`Watch`) when a head starts and ends and when writing
//! stalls, which is what its timeouts run on.

use super::head::{self, Facts, Framing, Inspected, TARGET_LIMIT};
use super::watch::Watch;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What hyper is given in place of a refused head; its request is answered with the refusal.
const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\nHost: edgelm\r\n\r\n";

/// Bytes read from the connection at a time while a head is held.
const READ_CHUNK: usize = 4096;

enum Mode {
    /// Holding bytes until they make a complete head.
    Head,
    /// Passing this many more body bytes.
    Body(u64),
    /// After a chunked body's head: everything passes.
    Through,
    /// A stand-in head was given: nothing more passes (the connection closes after its answer).
    Refused,
}

pub struct Gate<T> {
    io: T,
    /// Read from the connection, not yet given to hyper.
    held: Vec<u8>,
    /// How many of `held`'s first bytes hyper may have.
    release: usize,
    mode: Mode,
    /// `held` may hold a head not inspected yet (bytes that came after the last request's).
    recheck: bool,
    watch: Rc<Watch>,
}

impl<T> Gate<T> {
    pub fn new(io: T, watch: Rc<Watch>) -> Gate<T> {
        Gate {
            io,
            held: Vec::new(),
            release: 0,
            mode: Mode::Head,
            recheck: false,
            watch,
        }
    }

    pub fn into_inner(self) -> T {
        self.io
    }

    /// Decides what to do with the held bytes of a head; false when more are needed.
    fn check_head(&mut self) -> bool {
        match head::inspect(&self.held) {
            Inspected::Partial => false,
            Inspected::Complete(facts) => {
                self.release = facts.len;
                self.recheck = true;
                self.mode = match facts.framing {
                    Framing::Length(0) => Mode::Head,
                    Framing::Length(n) => Mode::Body(n),
                    Framing::Chunked => Mode::Through,
                };
                self.watch.head_complete(facts);
                true
            }
            Inspected::Refused(e) => {
                self.held.clear();
                self.held.extend_from_slice(STAND_IN);
                self.release = STAND_IN.len();
                self.mode = Mode::Refused;
                self.watch.head_complete(Facts {
                    len: STAND_IN.len(),
                    framing: Framing::Length(0),
                    refusal: Some(e),
                });
                true
            }
        }
    }
}

impl<T: AsyncRead + Unpin> Gate<T> {
    /// Reads from the connection straight into hyper's buffer, at most `limit` bytes.
    fn read_through(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        limit: u64,
    ) -> Poll<io::Result<usize>> {
        let room = (buf.remaining() as u64).min(limit) as usize;
        let mut sub = ReadBuf::new(buf.initialize_unfilled_to(room));
        match Pin::new(&mut self.io).poll_read(cx, &mut sub) {
            Poll::Ready(Ok(())) => {
                let n = sub.filled().len();
                buf.advance(n);
                Poll::Ready(Ok(n))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Gate<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.release > 0 {
                let n = this.release.min(buf.remaining());
                buf.put_slice(&this.held[..n]);
                this.held.drain(..n);
                this.release -= n;
                return Poll::Ready(Ok(()));
            }
            match this.mode {
                // Until the connection closes: hyper sees no end of input while it answers.
                Mode::Refused => return Poll::Pending,
                Mode::Body(0) => {
                    this.mode = Mode::Head;
                    this.recheck = true;
                }
                Mode::Body(left) if !this.held.is_empty() => {
                    let n = left.min(this.held.len() as u64);
                    this.release = n as usize;
                    this.mode = Mode::Body(left - n);
                }
                Mode::Body(left) => {
                    let n = std::task::ready!(this.read_through(cx, buf, left))?;
                    this.mode = Mode::Body(left - n as u64);
                    return Poll::Ready(Ok(()));
                }
                Mode::Through if !this.held.is_empty() => this.release = this.held.len(),
                Mode::Through => {
                    std::task::ready!(this.read_through(cx, buf, u64::MAX))?;
                    return Poll::Ready(Ok(()));
                }
                Mode::Head => {
                    if std::mem::take(&mut this.recheck) && !this.held.is_empty() {
                        // Bytes that came after the last body: the next head has begun.
                        this.watch.head_begun();
                        if this.check_head() {
                            continue;
                        }
                    }
                    // More of the head. A head completes only at a line's end, so the held
                    // bytes are parsed again only when a newline (or the limit) comes.
                    let mut chunk = [0u8; READ_CHUNK];
                    let mut rb = ReadBuf::new(&mut chunk);
                    std::task::ready!(Pin::new(&mut this.io).poll_read(cx, &mut rb))?;
                    let got = rb.filled();
                    if got.is_empty() {
                        // The client closed: hyper sees the end (and drops a partial head).
                        return Poll::Ready(Ok(()));
                    }
                    this.watch.head_begun();
                    this.held.extend_from_slice(got);
                    // Past the target's limit a line with no end is refused without its end.
                    let worth_parsing = got.contains(&b'\n') || this.held.len() > TARGET_LIMIT;
                    if worth_parsing {
                        this.check_head();
                    }
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Gate<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write(cx, data);
        this.watch.writing(r.is_pending());
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch.writing(r.is_pending());
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
