//! One connection: hyper serves its requests through the gate, and a watchdog closes it when a
//! head, a body or an idle spell outlasts its timeout, or when the client stops reading its
//! answer. A connection that ends cleanly is closed without a reset (`linger`).

use super::config::FrontConfig;
use super::gate::Gate;
use super::head::{HEAD_LIMIT, MAX_HEADERS};
use super::service::Front;
use super::stats::bump;
use super::watch::{Phase, Watch};
use hyper::server::conn::http1;
use hyper_util::rt::TokioIo;
use std::net::IpAddr;
use std::rc::Rc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

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
