//! Step turns: how the engines of several models in one process share the CPU. Each model
//! has its own engine thread, scheduler and pool, but one compute pool runs every forward
//! pass, and two steps at once would each get half of it (or run inline, single-threaded).
//! So steps take turns, first come first served: a model whose step is waiting runs next,
//! however busy the other is. Each engine also publishes how many of its sequences decode
//! and how long its decode-only steps take, so that another engine's prefill is paced
//! against those streams exactly as its own prefill would be (`PrefillPacer`): a long prompt
//! or a batch of embeddings for one model never stalls another model's streams for longer
//! than the pacing allows.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// The turns of every engine in a process (one per model).
#[derive(Debug, Default)]
pub struct StepTurns {
    state: Mutex<TurnState>,
    turn_over: Condvar,
}

#[derive(Debug, Default)]
struct TurnState {
    /// The next ticket to hand out and the ticket whose step may run (a ticket lock: steps
    /// run in the order they asked).
    next_ticket: u64,
    serving: u64,
    /// Per seat: its decoding sequences and its decode-only step time in seconds.
    seats: Vec<(usize, Option<f64>)>,
}

/// One engine's place among the turns.
#[derive(Debug)]
pub struct TurnSeat {
    turns: Arc<StepTurns>,
    index: usize,
}

/// Streams other engines decode, and how long their decode-only steps take (the slowest).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DecodingElsewhere {
    pub sequences: usize,
    pub step_s: Option<f64>,
}

impl StepTurns {
    /// A seat for one more engine.
    pub fn seat(self: &Arc<Self>) -> TurnSeat {
        let mut st = self.lock();
        st.seats.push((0, None));
        TurnSeat {
            turns: self.clone(),
            index: st.seats.len() - 1,
        }
    }

    fn lock(&self) -> MutexGuard<'_, TurnState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl TurnSeat {
    /// Waits for this engine's turn; the step runs while the guard lives.
    pub fn take(&self) -> Turn {
        let mut st = self.turns.lock();
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        while st.serving != ticket {
            st = self
                .turns
                .turn_over
                .wait(st)
                .unwrap_or_else(|e| e.into_inner());
        }
        Turn(self.turns.clone())
    }

    /// Publishes this engine's decoding sequences and its decode-only step time.
    pub fn publish(&self, decoding: usize, step_s: Option<f64>) {
        self.turns.lock().seats[self.index] = (decoding, step_s);
    }

    /// What the other engines decode.
    pub fn elsewhere(&self) -> DecodingElsewhere {
        let st = self.turns.lock();
        let others = st
            .seats
            .iter()
            .enumerate()
            .filter(|&(i, &(n, _))| i != self.index && n > 0);
        let mut e = DecodingElsewhere::default();
        for (_, &(n, step)) in others {
            e.sequences += n;
            e.step_s = match (e.step_s, step) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            };
        }
        e
    }
}

/// The longest slice of paced work while no stream decodes: long enough to cost nothing in
/// turn changes, short enough that a request arriving meanwhile starts soon.
const IDLE_SLICE_S: f64 = 0.1;

impl TurnSeat {
    /// One slice of work beside the engines' steps (an image's encoder): waits for a turn,
    /// then runs `piece` (false once no work remains) while the slice lasts: at most
    /// `slowdown - 1` times the slowest decode-only step of the engines' streams, as their
    /// prefill is paced ([`super::pacer::PrefillPacer`]), and at least one piece. Returns
    /// whether work remains.
    pub fn run_slice(&self, slowdown: f64, piece: &mut dyn FnMut() -> bool) -> bool {
        let _turn = self.take();
        let streams = self.elsewhere();
        let budget_s = match (streams.sequences, streams.step_s) {
            (0, _) | (_, None) => IDLE_SLICE_S,
            (_, Some(step)) if slowdown > 1.0 => (slowdown - 1.0) * step,
            (_, Some(_)) => IDLE_SLICE_S,
        };
        let start = std::time::Instant::now();
        loop {
            if !piece() {
                return false;
            }
            if start.elapsed().as_secs_f64() >= budget_s {
                return true;
            }
        }
    }
}

/// A step's turn: the next one starts when it is dropped.
pub struct Turn(Arc<StepTurns>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.lock().serving += 1;
        self.0.turn_over.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn steps_never_overlap_and_alternate_between_waiting_engines() {
        let turns = Arc::new(StepTurns::default());
        let running = Arc::new(AtomicUsize::new(0));
        let order = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..2)
            .map(|who| {
                let seat = turns.seat();
                let (running, order) = (running.clone(), order.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let _turn = seat.take();
                        assert_eq!(running.fetch_add(1, Ordering::SeqCst), 0, "overlap");
                        order.lock().unwrap().push(who);
                        std::thread::sleep(std::time::Duration::from_micros(200));
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 100);
        // A busy engine cannot take two turns in a row while the other waits: runs of one
        // engine only happen when the other was not asking (at the start or the end).
        let runs: Vec<usize> = order.chunk_by(|a, b| a == b).map(|r| r.len()).collect();
        let middle = &runs[1..runs.len().saturating_sub(1).max(1)];
        assert!(middle.iter().all(|&n| n <= 2), "{order:?}");
    }

    #[test]
    fn a_slice_runs_as_long_as_the_streams_allow_and_at_least_one_piece() {
        let turns = Arc::new(StepTurns::default());
        let (engine, encoder) = (turns.seat(), turns.seat());
        let run = |budget_pieces: &mut usize| {
            let mut n = 0;
            let more = encoder.run_slice(2.0, &mut || {
                n += 1;
                std::thread::sleep(std::time::Duration::from_millis(2));
                n < *budget_pieces
            });
            (n, more)
        };
        // Nothing decodes: the idle slice (100 ms) outlasts 5 pieces of 2 ms.
        assert_eq!(run(&mut 5), (5, false));
        // A stream decodes at 10 ms a step: a slice of (2 - 1) × 10 ms. Each piece sleeps at
        // least 2 ms, so the slice ends by the sixth (a loaded machine may end it sooner).
        engine.publish(1, Some(0.010));
        let (n, more) = run(&mut 1000);
        assert!(more && (1..=6).contains(&n), "{n} pieces");
        // A step far shorter than a piece: still one piece a slice, so the work progresses.
        engine.publish(1, Some(0.000_01));
        assert_eq!(run(&mut 1000), (1, true));
    }

    #[test]
    fn an_engine_sees_what_the_others_decode() {
        let turns = Arc::new(StepTurns::default());
        let (a, b, c) = (turns.seat(), turns.seat(), turns.seat());
        assert_eq!(a.elsewhere(), DecodingElsewhere::default());
        b.publish(3, Some(0.010));
        c.publish(2, Some(0.030));
        a.publish(7, Some(0.500));
        let seen = a.elsewhere();
        assert_eq!(seen.sequences, 5);
        assert_eq!(seen.step_s, Some(0.030), "the slowest other's decode step");
        // An engine with nothing decoding adds nothing, whatever it measured before.
        c.publish(0, Some(0.030));
        assert_eq!(b.elsewhere().sequences, 7);
        assert_eq!(b.elsewhere().step_s, Some(0.500));
    }
}
