//! Writing responses ourselves on the raw connection: tiny_http's own chunked encoder buffers
//! 8 KiB before sending, which would hold SSE events back, and a failed write is how we learn
//! that a client went away (so its request can be cancelled).

use std::io::{self, Write};

pub struct RawResponse {
    out: Box<dyn Write + Send>,
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

impl RawResponse {
    pub fn new(out: Box<dyn Write + Send>) -> RawResponse {
        RawResponse { out }
    }

    /// A complete response with a body of known length.
    pub fn send(
        mut self,
        status: u16,
        content_type: &str,
        extra: &[(&str, String)],
        body: &[u8],
    ) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
            reason_phrase(status),
            body.len()
        );
        for (k, v) in extra {
            head += &format!("{k}: {v}\r\n");
        }
        head += "\r\n";
        self.out.write_all(head.as_bytes())?;
        self.out.write_all(body)?;
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
    out: Box<dyn Write + Send>,
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
