//! The server's life: binds the socket, loads the model in the background (503 meanwhile),
//! starts the front, and on a stop drains in-flight requests (bounded) before it returns.

use super::fd_limit;
use super::front;
use super::server::{ServeConfig, Server};
use crate::systemd;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

/// After the drain time, how long the answers cut short may take to end (their handlers look
/// every 100 ms).
const CUT_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The listening socket. SO_REUSEADDR: a restart right after a crash binds despite
/// connections in TIME_WAIT. No SO_REUSEPORT: any socket already on the port, another
/// edgelm's included, makes the bind fail, where a second edgelm started by mistake would
/// otherwise silently take a share of the first one's connections. The backlog is the most
/// the kernel allows (it caps it at net.core.somaxconn): a connect storm waits there for the
/// front rather than being refused by the kernel.
fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(libc::c_int::MAX)?;
    Ok(socket.into())
}

/// Binds, loads the model in the background (503 meanwhile), serves until `stop` is set
/// (reloading whenever `reload` is), then drains in-flight requests (bounded by
/// `drain_timeout`).
pub fn serve(
    mut config: ServeConfig,
    stop: Arc<AtomicBool>,
    reload: Arc<AtomicBool>,
    drain_timeout: std::time::Duration,
) -> anyhow::Result<()> {
    let listener = listener(config.addr)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", config.addr))?;
    config.front.max_connections = fd_limit::raise_for(config.front.max_connections);
    log::info!(
        "listening on http://{0}; status page http://{0}/, metrics http://{0}/metrics",
        config.addr
    );
    let server = Server::new(config);
    systemd::notify(&["STATUS=loading the model"]);
    let loader = start_loading(&server);
    let accepting = Arc::new(AtomicBool::new(true));
    let front = front::Front::start(
        listener,
        server.clone(),
        server.config.front.clone(),
        accepting.clone(),
    )
    .map_err(|e| anyhow::anyhow!("cannot start serving: {e}"))?;
    while !stop.load(Ordering::Relaxed) && server.load_error.get().is_none() {
        if reload.swap(false, Ordering::Relaxed) {
            // On a thread of its own: loading a model takes seconds, and a stop must not wait.
            let server = server.clone();
            std::thread::spawn(move || server.reload("SIGHUP"));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let cut_short = drain(&server, stop.load(Ordering::Relaxed), drain_timeout);
    accepting.store(false, Ordering::Relaxed);
    front.join();
    // A stop that came while the model was loading waits for the load to end (it cannot be
    // interrupted), then stops the engine it started: only after the join is that certain.
    let engine_threads = loader.join().unwrap_or_default();
    if let Some(err) = server.load_error.get() {
        anyhow::bail!("cannot load the model: {err}");
    }
    stop_engines(&server, engine_threads, cut_short, drain_timeout);
    Ok(())
}

/// Loads the models on a thread of their own; once their engines run, systemd hears that the
/// service is up. The thread returns the engines' threads (none if the load failed).
fn start_loading(server: &Arc<Server>) -> JoinHandle<Vec<JoinHandle<()>>> {
    let server = server.clone();
    std::thread::spawn(move || match server.load() {
        Ok(engine_threads) => {
            log::info!("model loaded; ready");
            // Listening since before the load, engines running, /health answers 200 now:
            // only at this point is the service up for systemd (Type=notify).
            if server.is_ready() {
                server.notify_serving();
            }
            engine_threads
        }
        Err(e) => {
            log::error!("cannot load the model: {e:#}");
            server.set_load_error(format!("{e:#}"));
            systemd::notify(&[&format!("STATUS=cannot load the model: {e:#}")]);
            Vec::new()
        }
    })
}

/// Drains: /health says 503 and new work is refused while in-flight requests finish, for at
/// most `drain_timeout`; then what is still under way is cut short. Returns how many were.
fn drain(server: &Server, stopping: bool, drain_timeout: std::time::Duration) -> usize {
    server.drain();
    if stopping {
        log::info!(
            "stopping: draining {} in-flight requests (at most {} s)",
            server.in_flight(),
            drain_timeout.as_secs()
        );
        systemd::notify(&[
            "STOPPING=1",
            &format!("STATUS=draining {} in-flight requests", server.in_flight()),
        ]);
    }
    let t0 = Instant::now();
    while server.in_flight() > 0 && t0.elapsed() < drain_timeout {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let cut_short = server.in_flight();
    if cut_short > 0 {
        // The drain time is over: every answer still under way ends now with an error its
        // client can parse (a stream's error event and [DONE], or an error response), and the
        // front writes those before it stops.
        server.cut_short();
        let t1 = Instant::now();
        while server.in_flight() > 0 && t1.elapsed() < CUT_LIMIT {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    cut_short
}

/// Stops every model's engine; waits for them unless answers were cut short.
fn stop_engines(
    server: &Server,
    threads: Vec<std::thread::JoinHandle<()>>,
    cut_short: usize,
    drain_timeout: std::time::Duration,
) {
    for ready in server.ready().iter().flat_map(|m| &m.list) {
        ready.engine.shutdown();
    }
    let reloaded = std::mem::take(
        &mut *server
            .reloaded_threads
            .lock()
            .unwrap_or_else(|e| e.into_inner()),
    );
    if cut_short > 0 {
        // The engines would finish every running request before they stop, however long they
        // are: their answers have ended, so returning ends the process now.
        log::warn!(
            "drain time ({} s) over: {cut_short} in-flight requests cut short",
            drain_timeout.as_secs()
        );
    } else {
        // Engines a reload replaced stopped when their last request ended.
        for thread in threads.into_iter().chain(reloaded) {
            let _ = thread.join();
        }
    }
}
