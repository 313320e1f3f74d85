//! A handler's side of a response. Handlers run on their own threads; the front's runtime owns
//! the connection and writes through hyper. A handler hands over the status and headers with
//! the whole body, or with a channel that its chunks go down one by one (each sent on at once:
//! an SSE event must not wait in a buffer). A client that goes away drops the receiving end,
//! which is how a handler learns of it (so its request can be cancelled).

use bytes::Bytes;
use std::io;
use tokio::sync::{mpsc, oneshot};

/// Chunks a streamed body may have waiting for the connection before the handler blocks.
const STREAM_BUFFER: usize = 16;

/// What a handler hands the front.
pub struct Handed {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: HandedBody,
}

pub enum HandedBody {
    Whole(Bytes),
    /// Chunks; `None` is the end. A channel that closes without it was cut short, and the
    /// connection is closed without ending the body cleanly.
    Stream(mpsc::Receiver<Option<Bytes>>),
}

/// A response not yet started.
pub struct RawResponse {
    tx: oneshot::Sender<Handed>,
}

/// The front's end: the response once the handler starts it.
pub type ReplyRx = oneshot::Receiver<Handed>;

impl RawResponse {
    pub fn new() -> (RawResponse, ReplyRx) {
        let (tx, rx) = oneshot::channel();
        (RawResponse { tx }, rx)
    }

    /// The client has gone (its connection closed) before the response started.
    pub fn peer_gone(&self) -> bool {
        self.tx.is_closed()
    }

    /// A complete response with a body of known length.
    pub fn send(
        self,
        status: u16,
        content_type: &str,
        extra: &[(&str, String)],
        body: &[u8],
    ) -> io::Result<()> {
        let mut headers = vec![("Content-Type".to_string(), content_type.to_string())];
        headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
        self.tx
            .send(Handed {
                status,
                headers,
                body: HandedBody::Whole(Bytes::copy_from_slice(body)),
            })
            .map_err(|_| gone())
    }

    /// Starts a streamed response (chunked on HTTP/1.1, to the connection's end on HTTP/1.0).
    pub fn start_chunked(self, status: u16, content_type: &str) -> io::Result<ChunkedBody> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let headers = [
            ("Content-Type", content_type),
            ("Cache-Control", "no-cache"),
            ("X-Accel-Buffering", "no"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .to_vec();
        self.tx
            .send(Handed {
                status,
                headers,
                body: HandedBody::Stream(rx),
            })
            .map_err(|_| gone())?;
        Ok(ChunkedBody { tx })
    }
}

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "the client has gone")
}

pub struct ChunkedBody {
    tx: mpsc::Sender<Option<Bytes>>,
}

impl ChunkedBody {
    /// Sends a chunk on; waits while the connection is behind. An error: the client has gone
    /// (or stopped reading for longer than the idle timeout and was cut off).
    pub fn chunk(&mut self, data: &[u8]) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.tx
            .blocking_send(Some(Bytes::copy_from_slice(data)))
            .map_err(|_| gone())
    }

    /// The body is complete.
    pub fn finish(self) -> io::Result<()> {
        self.tx.blocking_send(None).map_err(|_| gone())
    }
}
