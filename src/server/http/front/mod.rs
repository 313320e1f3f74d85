//! The HTTP front: one thread whose single-threaded runtime owns every connection, so that a
//! connection costs a descriptor and a little memory, never a thread. hyper's HTTP/1.1 server
//! does the framing (heads, bodies, keep-alive, pipelining, responses); the front keeps
//! edgelm's policies: the gate's stricter head rules (`gate`, `head`), the header, body and
//! idle timeouts and the connection cap (`conn`, here), answers from the head alone before the
//! body is read, paced, and the handler pools (`service`). docs/http-front.md says why.

mod body;
mod bucket;
pub mod config;
mod conn;
mod gate;
mod harness;
mod head;
mod service;
pub mod stats;
mod watch;

pub use config::FrontConfig;
pub use harness::fuzz_http;

use super::pool::handler_pools;
use super::server::Server;
use service::Front as State;
use stats::bump;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{TcpListener, TcpStream};

/// How often the front looks whether it should stop.
const TICK: Duration = Duration::from_millis(50);
/// After the stop, how long answers still being written may take.
const FLUSH_LIMIT: Duration = Duration::from_secs(2);

pub struct Front {
    thread: std::thread::JoinHandle<()>,
}

impl Front {
    /// Starts the front thread and the handler pools on `listener`; it runs until `accepting`
    /// turns false, then finishes writing the answers under way (briefly) and returns.
    pub fn start(
        listener: std::net::TcpListener,
        server: Arc<Server>,
        config: FrontConfig,
        accepting: Arc<AtomicBool>,
    ) -> io::Result<Front> {
        listener.set_nonblocking(true)?;
        let (generate, other) = handler_pools(&server)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()?;
        let thread = std::thread::Builder::new()
            .name("edgelm-front".into())
            // At the normal priority, unlike the handlers: its work is bounded (refusals are
            // paced, everything else is a few syscalls per request), and it answers /health,
            // which must stay prompt on a box whose cores the engine keeps busy.
            .spawn(move || {
                let local = tokio::task::LocalSet::new();
                local.block_on(&runtime, async move {
                    let listener = match TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => return log::error!("cannot serve: {e}"),
                    };
                    let state = Rc::new(State::new(server, config, generate, other));
                    run(listener, state, &accepting).await;
                });
            })?;
        Ok(Front { thread })
    }

    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// Accepts until `accepting` turns false, then waits (bounded) for the answers under way to be
/// written; returning drops every connection.
async fn run(listener: TcpListener, front: Rc<State>, accepting: &AtomicBool) {
    let mut reserve = reserve_fd();
    let mut tick = tokio::time::interval(TICK);
    while accepting.load(Ordering::Relaxed) {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => admit(stream, peer.ip(), &front),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    bump(&front.stats().rejected_fds);
                    // Free the reserve, take the connection off the backlog, close it:
                    // otherwise it would sit there and be reported again and again.
                    drop(reserve.take());
                    if let Ok((s, _)) = listener.accept().await {
                        refuse_at_accept(&s);
                    }
                    if reserve.is_none() {
                        reserve = reserve_fd();
                    }
                }
                // The peer gave up before the accept (ECONNABORTED) and the like.
                Err(_) => {}
            },
            _ = tick.tick() => {}
        }
    }
    drop(listener);
    let t0 = Instant::now();
    while front.open_requests.get() > 0 && t0.elapsed() < FLUSH_LIMIT {
        tick.tick().await;
    }
}

fn admit(stream: TcpStream, peer: std::net::IpAddr, front: &Rc<State>) {
    let stats = front.stats();
    bump(&stats.accepted);
    let open = stats.open.load(Ordering::Relaxed) as usize;
    if open >= front.config.max_connections {
        bump(&stats.rejected_cap);
        return refuse_at_accept(&stream);
    }
    // Streamed tokens are written one small chunk at a time: they must not wait for the
    // previous segment's acknowledgement.
    let _ = stream.set_nodelay(true);
    stats.open.fetch_add(1, Ordering::Relaxed);
    let front = front.clone();
    tokio::task::spawn_local(async move {
        conn::serve(stream, peer, front.clone()).await;
        front.stats().open.fetch_sub(1, Ordering::Relaxed);
    });
}

/// A descriptor held in reserve: when accept fails for want of descriptors, closing it
/// frees one to accept the waiting connection and close it at once.
fn reserve_fd() -> Option<std::fs::File> {
    std::fs::File::open("/dev/null").ok()
}

/// A connection over the cap: a minimal 503 if the send buffer takes it at once, then closed.
fn refuse_at_accept(stream: &TcpStream) {
    const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\nRetry-After: 1\r\n\r\n";
    let _ = stream.try_write(BUSY);
}
