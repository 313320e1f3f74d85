//! Writing responses ourselves on the raw connection: every chunk is flushed at once (an SSE
//! event must not wait in a buffer), and a failed write is how we learn that a client went
//! away (so its request can be cancelled). The front writes its own short answers whole with
//! `response_bytes`.

use std::io::{self, Write};

pub struct RawResponse {
    out: Box<dyn Sink>,
}

/// Where a response goes: the connection (buffered: one write per flush).
pub trait Sink: Write + Send {
    /// Whether the client has closed or reset the connection, seen without writing to it
    /// (before a response starts there is nothing to write).
    fn peer_gone(&self) -> bool;
}

impl Sink for io::BufWriter<std::net::TcpStream> {
    fn peer_gone(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut p = libc::pollfd {
            fd: self.get_ref().as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call; timeout 0 never blocks.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) != 0
    }
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        411 => "Length Required",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

/// A complete response with a body of known length, as bytes. `keep_alive`: the connection
/// stays open for the next request (only the front's own answers, which it writes whole
/// without a thread, do that; every handler's response ends its connection).
pub fn response_bytes(
    status: u16,
    content_type: &str,
    extra: &[(&str, String)],
    body: &[u8],
    keep_alive: bool,
) -> Vec<u8> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {}\r\n",
        reason_phrase(status),
        body.len(),
        if keep_alive { "keep-alive" } else { "close" }
    );
    for (k, v) in extra {
        head += &format!("{k}: {v}\r\n");
    }
    head += "\r\n";
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

impl RawResponse {
    pub fn new(out: Box<dyn Sink>) -> RawResponse {
        RawResponse { out }
    }

    /// See [`Sink::peer_gone`].
    pub fn peer_gone(&self) -> bool {
        self.out.peer_gone()
    }

    /// A complete response with a body of known length.
    pub fn send(
        mut self,
        status: u16,
        content_type: &str,
        extra: &[(&str, String)],
        body: &[u8],
    ) -> io::Result<()> {
        self.out
            .write_all(&response_bytes(status, content_type, extra, body, false))?;
        self.out.flush()
    }

    /// Starts a chunked response; every `chunk` is sent and flushed at once.
    pub fn start_chunked(mut self, status: u16, content_type: &str) -> io::Result<ChunkedBody> {
        let head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nTransfer-Encoding: chunked\r\nCache-Control: no-cache\r\nConnection: close\r\nX-Accel-Buffering: no\r\n\r\n",
            reason_phrase(status)
        );
        self.out.write_all(head.as_bytes())?;
        self.out.flush()?;
        Ok(ChunkedBody { out: self.out })
    }
}

pub struct ChunkedBody {
    out: Box<dyn Sink>,
}

impl ChunkedBody {
    pub fn chunk(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        write!(self.out, "{:x}\r\n", data.len())?;
        self.out.write_all(data)?;
        self.out.write_all(b"\r\n")?;
        self.out.flush()
    }

    /// One server-sent event carrying `payload`.
    pub fn sse(&mut self, payload: &str) -> io::Result<()> {
        self.chunk(format!("data: {payload}\n\n").as_bytes())
    }

    pub fn finish(mut self) -> io::Result<()> {
        self.out.write_all(b"0\r\n\r\n")?;
        self.out.flush()
    }
}
