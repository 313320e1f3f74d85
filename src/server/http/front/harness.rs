//! The front on an in-memory connection, with no model loaded: raw bytes in, the answers out.
//! For the `http_front` fuzz target and the front's unit tests; everything but the socket is
//! the server's own (gate, hyper, service, handler pools), and generation is refused from the
//! head (503: the model is still loading) as it is while a real server loads.

use super::super::pool::handler_pools;
use super::super::server::{ServeConfig, Server};
use super::config::FrontConfig;
use super::conn;
use super::service::Front;
use crate::engine::EngineConfig;
use std::rc::Rc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What one connection gave back.
pub struct Exchanged {
    pub output: Vec<u8>,
    /// Request heads the gate passed.
    pub heads: usize,
}

/// Longest an exchange may take: the bytes are all sent at once, then the client's end closes,
/// so anything longer is a hang.
const LIMIT: Duration = Duration::from_secs(10);

struct Harness {
    runtime: tokio::runtime::Runtime,
    front: Rc<Front>,
}

impl Harness {
    fn new() -> Harness {
        let config = ServeConfig {
            models: vec![crate::config::ModelSection {
                path: "not-loaded.gguf".into(),
                ..Default::default()
            }],
            addr: ([127, 0, 0, 1], 0).into(),
            engine: EngineConfig::default(),
            api_key: None,
            max_queue: 4,
            max_queue_wait: Duration::ZERO,
            body_limit: 64 * 1024,
            profile: "harness".into(),
            front: FrontConfig {
                header_timeout: Duration::from_secs(5),
                body_timeout: Duration::from_secs(5),
                idle_timeout: Duration::from_secs(5),
                max_connections: 16,
                client_rate_per_s: 0.0,
                client_burst: 1.0,
                // Unpaced: an exchange must not wait for its refusals' turn.
                max_rejections_per_s: 0.0,
            },
            response_store: (16, 1 << 20),
            images: Default::default(),
            reread: None,
            prefix_cache: Default::default(),
        };
        let server = Server::new(config);
        let (generate, other) = handler_pools(&server).expect("handler threads");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a runtime");
        let front_config = server.config.front.clone();
        Harness {
            runtime,
            front: Rc::new(Front::new(server, front_config, generate, other)),
        }
    }

    fn exchange(&self, input: &[u8], quiet: Option<Duration>) -> Result<Exchanged, String> {
        let local = tokio::task::LocalSet::new();
        let (mut client, end) = tokio::io::duplex(64 * 1024);
        let front = self.front.clone();
        let run = local.run_until(async move {
            let served = tokio::task::spawn_local(conn::serve(end, [127, 0, 0, 1].into(), front));
            let mut output = Vec::new();
            let (mut rx, mut tx) = tokio::io::split(&mut client);
            let send = async {
                let _ = tx.write_all(input).await;
                if quiet.is_none() {
                    let _ = tx.shutdown().await;
                }
            };
            let read = async {
                let Some(quiet) = quiet else {
                    return rx.read_to_end(&mut output).await.map(|_| ());
                };
                let mut chunk = [0u8; 4096];
                while let Ok(n) = tokio::time::timeout(quiet, rx.read(&mut chunk)).await {
                    match n? {
                        0 => break,
                        n => output.extend_from_slice(&chunk[..n]),
                    }
                }
                Ok(())
            };
            let (_, read) = tokio::join!(send, read);
            read.map_err(|e| format!("reading the answers: {e}"))?;
            drop(client);
            let heads = served
                .await
                .map_err(|e| format!("the connection task: {e}"))?;
            Ok(Exchanged { output, heads })
        });
        self.runtime
            .block_on(async { tokio::time::timeout(LIMIT, run).await })
            .map_err(|_| format!("no end after {LIMIT:?}: a hang"))?
    }
}

thread_local! {
    static HARNESS: Harness = Harness::new();
}

/// Sends `input` on one connection and returns what came back: until the server closes, or,
/// with `quiet`, until it has said nothing for that long (the client's end stays open, so
/// that hyper does not take an end of input for a client gone and drop pipelined requests).
pub fn exchange(input: &[u8], quiet: Option<Duration>) -> Result<Exchanged, String> {
    HARNESS.with(|h| h.exchange(input, quiet))
}

/// For the fuzz target: any bytes on a connection get well-formed answers, at most one final
/// answer per request head (never a second response from one request's bytes), and an end.
pub fn fuzz_http(input: &[u8]) -> Result<(), String> {
    let x = exchange(input, None)?;
    let answers = status_lines(&x.output)?;
    let finals = answers.iter().filter(|&&s| s != 100).count();
    if finals > x.heads {
        return Err(format!(
            "{finals} answers to {} heads: {answers:?}",
            x.heads
        ));
    }
    Ok(())
}

/// The status of every response in `output`, read by the framing each declares; an answer that
/// does not parse, or a body cut short, is an error. A response with a length followed by
/// another response's head, or by nothing, answered a `HEAD` (no body of the front's starts
/// with a head; the output alone cannot tell a `HEAD` answer from a body not begun).
pub fn status_lines(output: &[u8]) -> Result<Vec<u16>, String> {
    let mut statuses = Vec::new();
    let mut at = 0;
    while at < output.len() {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut r = httparse::Response::new(&mut headers);
        let len = match r.parse(&output[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            other => return Err(format!("a malformed answer ({other:?}) at byte {at}")),
        };
        let status = r.code.unwrap_or(0);
        statuses.push(status);
        let field = |name: &str| {
            r.headers
                .iter()
                .find(|h| h.name.eq_ignore_ascii_case(name))
                .map(|h| String::from_utf8_lossy(h.value).to_ascii_lowercase())
        };
        let body = &output[at + len..];
        at += len;
        if status == 100 || body.is_empty() || body.starts_with(b"HTTP/1.") {
            continue;
        }
        if let Some(n) = field("content-length") {
            let n: usize = n.parse().map_err(|_| format!("Content-Length {n}"))?;
            if body.len() < n {
                return Err(format!("a body cut short at byte {at}"));
            }
            at += n;
        } else if field("transfer-encoding").as_deref() == Some("chunked") {
            at += chunked_len(body).ok_or(format!("a chunked body cut short at byte {at}"))?;
        } else {
            at = output.len();
        }
    }
    Ok(statuses)
}

/// The length of a chunked body, its last chunk included.
fn chunked_len(body: &[u8]) -> Option<usize> {
    let mut at = 0;
    loop {
        let line = body[at..].windows(2).position(|w| w == b"\r\n")?;
        let size =
            usize::from_str_radix(std::str::from_utf8(&body[at..at + line]).ok()?, 16).ok()?;
        at += line + 2 + size + 2;
        if at > body.len() {
            return None;
        }
        if size == 0 {
            return Some(at);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET: Option<Duration> = Some(Duration::from_millis(300));

    fn statuses(input: &[u8]) -> (Vec<u16>, usize) {
        let x = exchange(input, QUIET).unwrap();
        (status_lines(&x.output).unwrap(), x.heads)
    }

    #[test]
    fn pipelined_heads_are_answered_in_order_each_once() {
        let two =
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /nothing HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(statuses(two), (vec![503, 404], 2));
        // A body that holds a request is skipped by its length, never read as a head.
        let body = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        let mut raw = format!(
            "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        raw.extend_from_slice(body);
        raw.extend_from_slice(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n");
        assert_eq!(statuses(&raw), (vec![503, 404], 2));
    }

    #[test]
    fn a_refused_head_is_answered_after_the_ones_before_it_and_ends_the_connection() {
        let raw = b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n\
            POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n\
            GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        assert_eq!(statuses(raw), (vec![404, 400], 2));
    }

    #[test]
    fn a_chunked_body_is_read_and_the_connection_ends_after_its_answer() {
        let raw = b"POST /detokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n\
            3\r\n{\"t\r\n0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n";
        let x = exchange(raw, QUIET).unwrap();
        let text = String::from_utf8_lossy(&x.output);
        assert_eq!(status_lines(&x.output).unwrap(), vec![503], "{text}");
        assert!(text.contains("Connection: close"), "{text}");
    }

    #[test]
    fn heads_cut_off_or_over_the_limits_get_one_answer_or_none() {
        assert_eq!(statuses(b"GET /health HTTP/1.1\r\nHo"), (vec![], 0));
        let long = format!("GET /{} HTTP/1.1\r\nHost: x\r\n\r\n", "a".repeat(40_000));
        assert_eq!(statuses(long.as_bytes()), (vec![414], 1));
        assert_eq!(
            statuses(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),
            (vec![400], 1)
        );
    }

    #[test]
    fn the_fuzz_checks_hold_on_the_corpus_seeds() {
        for raw in [
            &b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"[..],
            b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.0\r\n\r\n",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n{}",
        ] {
            fuzz_http(raw).unwrap();
        }
    }
}
