//! Fixed pools of handler threads. The front hands each complete request (head parsed, body
//! read) to one of them; a pool never grows, so threads stay bounded whatever the clients do,
//! and a full pool is answered 503 by the front instead of queueing without bound.

use super::server::{Request, Server};
use std::io;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};

/// Threads of the pool for everything but generation (metrics, tokenize, models, status).
const OTHER_THREADS: usize = 4;

pub struct Pool<J: Send + 'static> {
    tx: SyncSender<J>,
}

impl<J: Send + 'static> Pool<J> {
    /// `threads` threads named `name` run `work` on each job; at most `queue` jobs wait.
    /// `on_start` runs once on each thread first (its priority).
    pub fn new(
        name: &str,
        threads: usize,
        queue: usize,
        on_start: fn(),
        work: impl Fn(J) + Send + Sync + 'static,
    ) -> std::io::Result<Pool<J>> {
        let (tx, rx) = sync_channel::<J>(queue);
        let rx = Arc::new(Mutex::new(rx));
        let work = Arc::new(work);
        for i in 0..threads.max(1) {
            let (rx, work) = (rx.clone(), work.clone());
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    on_start();
                    while let Some(job) = next(&rx) {
                        // A handler that panics must not take the thread with it: the pool
                        // would shrink by one for every such request.
                        let _ =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(job)));
                    }
                })?;
        }
        Ok(Pool { tx })
    }

    /// Queues a job, or gives it back when the queue is full.
    pub fn try_submit(&self, job: J) -> Result<(), J> {
        self.tx.try_send(job).map_err(|e| match e {
            TrySendError::Full(j) | TrySendError::Disconnected(j) => j,
        })
    }
}

/// The next job; None once the pool is gone.
fn next<J>(rx: &Mutex<Receiver<J>>) -> Option<J> {
    rx.lock().unwrap_or_else(|e| e.into_inner()).recv().ok()
}

/// The handler pools: generation, and everything else.
pub fn handler_pools(server: &Arc<Server>) -> io::Result<(Pool<Request>, Pool<Request>)> {
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
        handle(server),
    )?;
    let other = Pool::new(
        "edgelm-http-other",
        OTHER_THREADS,
        64,
        super::priority::http_thread,
        handle(server),
    )?;
    Ok((generate, other))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn runs_jobs_on_a_fixed_number_of_threads_and_refuses_past_its_queue() {
        let done = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Mutex::new(()));
        let held = gate.lock().unwrap();
        let (d, g) = (done.clone(), gate.clone());
        let pool = Pool::new(
            "test",
            2,
            3,
            || {},
            move |panic: bool| {
                let _g = g.lock().unwrap_or_else(|e| e.into_inner());
                assert!(!panic, "a handler that panics");
                d.fetch_add(1, Ordering::SeqCst);
            },
        )
        .unwrap();
        // Two jobs taken by the two threads (blocked on the gate), three queued, then full.
        let mut accepted = 0;
        for _ in 0..10 {
            if pool.try_submit(false).is_ok() {
                accepted += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert_eq!(accepted, 5);
        drop(held);
        while done.load(Ordering::SeqCst) < 5 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // A panicking job leaves the pool whole.
        for _ in 0..2 {
            while pool.try_submit(true).is_err() {}
        }
        for _ in 0..2 {
            while pool.try_submit(false).is_err() {}
        }
        while done.load(Ordering::SeqCst) < 7 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
