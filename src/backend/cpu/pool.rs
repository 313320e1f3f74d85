//! The compute thread pool: persistent workers that spin briefly between operations and park
//! when idle, so a forward pass costs no syscalls per matmul (a 30-layer decode step runs some
//! 300 parallel operations in a few milliseconds; futex wake-ups per operation, as a general
//! work-stealing pool does, would cost a third of that).
//!
//! The calling thread works too: a pool of `n` threads has `n - 1` workers. Tasks are claimed
//! dynamically from one counter, so a slow core never holds the others back. Calls from
//! several threads at once are safe: whoever finds the pool busy runs its tasks inline.

use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking. Long enough to bridge the gaps between the
/// operations of one forward pass (microseconds) and between engine steps under load; short
/// enough that an idle server sleeps.
const SPIN: Duration = Duration::from_micros(500);

type Job<'a> = &'a (dyn Fn(usize) + Sync);

struct Shared {
    /// The job generation, its task count and the next task index to claim, in one word
    /// (see [`pack`]) so that one compare-and-swap validates all three.
    claim: AtomicU64,
    /// Address of the current job's `Job` reference (valid while the generation's tasks run).
    job: AtomicPtr<()>,
    completed: AtomicUsize,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
    /// The first panic of the current job's tasks, re-raised on the caller once every task
    /// has finished (a worker never dies, and no task outlives the job it borrows from).
    panic: Mutex<Option<Box<dyn Any + Send>>>,
    park: Mutex<()>,
    wake: Condvar,
}

pub struct Pool {
    shared: Arc<Shared>,
    threads: usize,
    /// Held by the one caller whose job is running.
    submit: Mutex<()>,
}

static GLOBAL: OnceLock<Pool> = OnceLock::new();

/// Sizes the process-wide pool (the first call wins; later calls report what it is).
/// `on_start` runs on every worker thread as it starts.
pub fn init(threads: usize, on_start: fn()) -> usize {
    GLOBAL
        .get_or_init(|| Pool::new(threads.max(1), on_start))
        .threads
}

fn global() -> &'static Pool {
    GLOBAL.get_or_init(|| {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        Pool::new(n, || {})
    })
}

/// The nice level compute threads take (`set_compute_nice`); 0, the default, leaves them at
/// the normal level. `edgelm serve` keeps 0 and runs its HTTP threads at a lower priority
/// instead (src/server/priority.rs): the engine's step must keep its CPU under any load, and a
/// flood of requests to refuse must not take it.
static COMPUTE_NICE: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Sets the nice level compute threads take when they start (call before the pool starts).
pub fn set_compute_nice(nice: i32) {
    COMPUTE_NICE.store(nice, Relaxed);
}

/// Runs first on every compute thread (and the engine's): takes the configured nice level.
pub fn lower_thread_priority() {
    let nice = COMPUTE_NICE.load(Relaxed);
    if nice != 0 {
        set_this_thread_nice(nice);
    }
}

/// Sets the calling thread's nice level (Linux's nice values are per thread).
pub fn set_this_thread_nice(nice: i32) {
    #[cfg(target_os = "linux")]
    // SAFETY: setpriority with PRIO_PROCESS and who = 0 only changes the calling thread's nice
    // value; it touches no memory of ours.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = nice;
}

/// Threads the process-wide pool runs on (the caller included).
pub fn threads() -> usize {
    global().threads
}

/// Runs `f(0..n_tasks)` on the process-wide pool and returns when all have finished.
pub fn parallel_for(n_tasks: usize, f: impl Fn(usize) + Sync) {
    global().run(n_tasks, &f);
}

impl Pool {
    pub fn new(threads: usize, on_start: fn()) -> Pool {
        let shared = Arc::new(Shared {
            claim: AtomicU64::new(0),
            job: AtomicPtr::new(std::ptr::null_mut()),
            completed: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panic: Mutex::new(None),
            park: Mutex::new(()),
            wake: Condvar::new(),
        });
        for i in 1..threads {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(format!("edgelm-compute-{i}"))
                .spawn(move || {
                    on_start();
                    worker(&s)
                })
                .expect("cannot start a compute thread");
        }
        Pool {
            shared,
            threads,
            submit: Mutex::new(()),
        }
    }

    pub fn run(&self, n_tasks: usize, f: Job<'_>) {
        let guard = match self.submit.try_lock() {
            Ok(g) if n_tasks > 1 && n_tasks <= FIELD_MASK as usize && self.threads > 1 => g,
            // Busy (another caller, or a task calling back in), one task, no workers, or more
            // tasks than a claim word counts (callers size tasks far below that).
            _ => return (0..n_tasks).for_each(f),
        };
        let s = &*self.shared;
        let job_ref: Job<'_> = f;
        s.completed.store(0, Relaxed);
        // Workers read this only after claiming a task of the generation published below.
        s.job.store(&job_ref as *const Job<'_> as *mut (), Relaxed);
        let generation = generation_of(s.claim.load(Relaxed)).wrapping_add(1) & GEN_MASK;
        s.claim.store(pack(generation, n_tasks as u64, 0), SeqCst);
        if s.sleepers.load(SeqCst) > 0 {
            let _g = lock(&s.park);
            s.wake.notify_all();
        }
        let mut done = run_tasks(s, generation);
        // Wait for the tasks other threads claimed; they are short, so spin.
        while done < n_tasks {
            std::hint::spin_loop();
            done = s.completed.load(Acquire);
        }
        let panic = lock(&s.panic).take();
        drop(guard);
        if let Some(p) = panic {
            resume_unwind(p);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, SeqCst);
        let _g = lock(&s.park);
        s.wake.notify_all();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

const FIELD_BITS: u32 = 20;
const FIELD_MASK: u64 = (1 << FIELD_BITS) - 1;
const GEN_MASK: u64 = (1 << (64 - 2 * FIELD_BITS)) - 1;

/// generation (24 bits) | task count (20 bits) | next index (20 bits).
fn pack(generation: u64, n_tasks: u64, next: u64) -> u64 {
    (generation << (2 * FIELD_BITS)) | (n_tasks << FIELD_BITS) | next
}

fn generation_of(claim: u64) -> u64 {
    claim >> (2 * FIELD_BITS)
}

/// Claims and runs tasks of `generation` until none are left; returns the completed count
/// as last seen.
fn run_tasks(s: &Shared, generation: u64) -> usize {
    let mut completed = 0;
    loop {
        let cur = s.claim.load(Acquire);
        let (n_tasks, idx) = ((cur >> FIELD_BITS) & FIELD_MASK, cur & FIELD_MASK);
        if generation_of(cur) != generation || idx >= n_tasks {
            return completed;
        }
        if s.claim
            .compare_exchange_weak(cur, cur + 1, AcqRel, Relaxed)
            .is_err()
        {
            continue;
        }
        // Only now read the job: the claimed task is unfinished, so its caller is still inside
        // `run` and has not published another job; `job` is this generation's and alive.
        let job = s.job.load(Acquire);
        // SAFETY: see above; the pointer was stored from a live `Job` reference.
        let f: Job<'_> = unsafe { *(job as *const Job<'_>) };
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(idx as usize))) {
            lock(&s.panic).get_or_insert(p);
        }
        completed = s.completed.fetch_add(1, AcqRel) + 1;
    }
}

fn worker(s: &Shared) {
    let mut seen = 0u64;
    loop {
        let start = Instant::now();
        let mut spins = 0u32;
        let generation = loop {
            let g = generation_of(s.claim.load(Acquire));
            if g != seen {
                break g;
            }
            if s.shutdown.load(Relaxed) {
                return;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(256) && start.elapsed() > SPIN {
                let mut parked = lock(&s.park);
                s.sleepers.fetch_add(1, SeqCst);
                while generation_of(s.claim.load(SeqCst)) == seen && !s.shutdown.load(SeqCst) {
                    parked = s.wake.wait(parked).unwrap_or_else(|e| e.into_inner());
                }
                s.sleepers.fetch_sub(1, SeqCst);
                drop(parked);
            }
        };
        seen = generation;
        run_tasks(s, generation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        let pool = Pool::new(3, || {});
        for n in [0, 1, 2, 7, 100, 1000] {
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            pool.run(n, &|i| {
                hits[i].fetch_add(1, Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Relaxed) == 1), "n = {n}");
        }
    }

    #[test]
    fn survives_parking_and_concurrent_callers() {
        let pool = Arc::new(Pool::new(3, || {}));
        let total = Arc::new(AtomicUsize::new(0));
        let callers: Vec<_> = (0..4)
            .map(|c| {
                let (pool, total) = (pool.clone(), total.clone());
                std::thread::spawn(move || {
                    for round in 0..3000usize {
                        // Task counts change every job: a worker holding a stale view of an
                        // earlier job would index past the end of `hits`.
                        let n = 2 + (round * 7 + c) % 41;
                        let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                        pool.run(n, &|i| {
                            hits[i].fetch_add(1, Relaxed);
                        });
                        assert!(hits.iter().all(|h| h.load(Relaxed) == 1));
                        total.fetch_add(n, Relaxed);
                        if round % 1000 == 0 {
                            // Long enough for the workers to park.
                            std::thread::sleep(Duration::from_millis(2));
                        }
                    }
                })
            })
            .collect();
        let mut want = 0;
        for c in 0..4usize {
            want += (0..3000usize)
                .map(|round| 2 + (round * 7 + c) % 41)
                .sum::<usize>();
        }
        for c in callers {
            c.join().unwrap();
        }
        assert_eq!(total.load(Relaxed), want);
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_survives() {
        let pool = Pool::new(2, || {});
        for _ in 0..20 {
            let r = catch_unwind(AssertUnwindSafe(|| {
                pool.run(8, &|i| {
                    if i == 5 {
                        panic!("task 5 failed");
                    }
                })
            }));
            assert!(r.is_err());
            let hits = AtomicUsize::new(0);
            pool.run(8, &|_| {
                hits.fetch_add(1, Relaxed);
            });
            assert_eq!(hits.load(Relaxed), 8);
        }
    }

    #[test]
    fn nested_calls_run_inline() {
        let pool = Pool::new(2, || {});
        let total = AtomicUsize::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|_| {
                total.fetch_add(1, Relaxed);
            });
        });
        assert_eq!(total.load(Relaxed), 12);
    }
}
