//! Admission: who may come in. A request is refused (429 with Retry-After) when the requests
//! in flight fill the running batch plus the queue, or when a backlog stands between it and
//! its first token that would make it wait longer than `max_wait` before its prompt starts.
//!
//! The expected wait is the number of admitted requests that have not had a first token yet
//! times the recent *start service time*: for each request that got its first token, the
//! shorter of its own time to first token and the time since the previous first token (the
//! classic departure-based service time of a queue: when a backlog exists, first tokens come
//! one service time apart; when none does, a request's own TTFT is its service). This counts
//! what really stands between a new request and its first token — requests still queued *or*
//! still prefilling inside the running batch — at the rate the engine gets through them now,
//! whatever mix of prompt lengths and decodes it carries. So an overloaded box holds only a
//! few seconds of unstarted work, which is what lets it recover within seconds once the load
//! stops. Two things keep a box that is merely busy from refusing anyone:
//! - Long prompts (over `long_prompt` tokens) do not count: the scheduler serves them in a
//!   lane of their own beside the others (`engine::scheduler::Lanes`), so nobody waits
//!   for them. A burst of 4,000-token prompts does not shut out short requests.
//! - The backlog must be standing, not a momentary burst: the oldest unstarted request must
//!   already have waited the bound itself (CoDel's rule: act on a delay that persists, not on
//!   a queue that is long for a moment). A handful of requests arriving together at a lightly
//!   loaded box are queued, not refused.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Start service times older than this stop counting.
const WINDOW: Duration = Duration::from_secs(60);
/// The service time is averaged over this many recent first tokens at most, so that it
/// follows a change of load within seconds.
const SAMPLES: usize = 16;
/// Fewer samples than this: no estimate yet (only the count bound applies).
const MIN_SAMPLES: usize = 3;

pub struct Admission {
    /// Requests in flight at most (running batch plus queue).
    max_in_flight: usize,
    /// Zero: no bound on the expected wait.
    max_wait: Duration,
    /// Prompts over this many tokens do not count towards the backlog.
    long_prompt: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_ticket: u64,
    /// Admitted requests without a first token yet, not counting long prompts: ticket number
    /// (in arrival order) → arrival.
    unstarted: BTreeMap<u64, Instant>,
    last_first_token: Option<Instant>,
    /// (when, start service time in seconds), newest last.
    samples: VecDeque<(Instant, f64)>,
}

/// Why a request was refused, and when to come back.
#[derive(Debug, PartialEq)]
pub struct Refused {
    pub retry_after_s: u64,
    pub queue_full: bool,
}

/// An admitted request. `first_token` when its first token comes; dropping it (answered,
/// failed or abandoned) lets the admission forget it.
pub struct Ticket<'a> {
    admission: &'a Admission,
    number: u64,
    arrived: Instant,
    started: bool,
}

impl Admission {
    pub fn new(
        running_slots: usize,
        max_queue: usize,
        max_wait: Duration,
        long_prompt: usize,
    ) -> Admission {
        Admission {
            max_in_flight: running_slots + max_queue,
            max_wait,
            long_prompt,
            state: Mutex::new(State::default()),
        }
    }

    /// Admits one more request of `prompt_tokens` while `in_flight` are already in, or says
    /// why not.
    pub fn admit(
        &self,
        in_flight: usize,
        prompt_tokens: usize,
        now: Instant,
    ) -> Result<Ticket<'_>, Refused> {
        let mut st = self.state();
        if let Some(r) = self.refusal(&st, in_flight, now) {
            return Err(r);
        }
        let number = st.next_ticket;
        st.next_ticket += 1;
        if prompt_tokens <= self.long_prompt {
            st.unstarted.insert(number, now);
        }
        Ok(Ticket {
            admission: self,
            number,
            arrived: now,
            started: false,
        })
    }

    /// Whether a request arriving now, with `in_flight` already in, would be refused, and
    /// why: the same rules as [`Admission::admit`] (which a refusal does not depend on the
    /// prompt for), without taking a ticket. The HTTP front asks this from the request head,
    /// so that a request admission would refuse anyway is answered before its body is read
    /// and parsed.
    pub fn would_refuse(&self, in_flight: usize, now: Instant) -> Option<Refused> {
        self.refusal(&self.state(), in_flight, now)
    }

    /// Requests in flight at most (the running batch plus the queue).
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn refusal(&self, st: &State, in_flight: usize, now: Instant) -> Option<Refused> {
        let service = st.service_time(now);
        let wait_s = service.map(|s| st.unstarted.len() as f64 * s);
        if in_flight >= self.max_in_flight {
            return Some(Refused {
                retry_after_s: wait_s.map_or(1, |w| w.ceil().clamp(1.0, 60.0) as u64),
                queue_full: true,
            });
        }
        let bound = self.max_wait.as_secs_f64();
        let standing =
            st.unstarted.values().next().is_some_and(|&oldest| {
                now.saturating_duration_since(oldest).as_secs_f64() >= bound
            });
        wait_s
            .filter(|&w| bound > 0.0 && w > bound && standing)
            .map(|w| Refused {
                // When enough of the backlog ahead will have started.
                retry_after_s: (w - bound).ceil().clamp(1.0, 60.0) as u64,
                queue_full: false,
            })
    }

    /// The state, even after a panic elsewhere poisoned the lock (it stays consistent: every
    /// update is a single step).
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    fn unstarted(&self) -> usize {
        self.state().unstarted.len()
    }
}

impl State {
    /// Mean recent start service time. Plain mean, no trimming: under a backlog first tokens
    /// come in clusters (prompts finishing in the same step) with long gaps between, and only
    /// the mean of the gaps is the rate at which requests start.
    fn service_time(&self, now: Instant) -> Option<f64> {
        let recent: Vec<f64> = self
            .samples
            .iter()
            .filter(|(t, _)| now.duration_since(*t) <= WINDOW)
            .map(|&(_, s)| s)
            .collect();
        (recent.len() >= MIN_SAMPLES).then(|| recent.iter().sum::<f64>() / recent.len() as f64)
    }
}

impl Ticket<'_> {
    /// The request's first token came at `now`.
    pub fn first_token(&mut self, now: Instant) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let mut st = self.admission.state();
        st.unstarted.remove(&self.number);
        let own = now.saturating_duration_since(self.arrived);
        let since_previous = st
            .last_first_token
            .map_or(own, |t| now.saturating_duration_since(t));
        st.last_first_token = Some(now);
        st.samples
            .push_back((now, own.min(since_previous).as_secs_f64()));
        while st.samples.len() > SAMPLES {
            st.samples.pop_front();
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if !self.started {
            self.admission.state().unstarted.remove(&self.number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const LONG: usize = 2048;

    fn admission(slots: usize, queue: usize, wait_s: u64) -> Admission {
        Admission::new(slots, queue, Duration::from_secs(wait_s), LONG)
    }

    #[test]
    fn the_count_bound_holds_without_an_estimate() {
        let a = admission(2, 3, 5);
        let now = Instant::now();
        let tickets: Vec<_> = (0..5).map(|i| a.admit(i, 100, now).unwrap()).collect();
        let r = a.admit(5, 100, now).err().unwrap();
        assert!(r.queue_full && r.retry_after_s >= 1);
        assert_eq!(a.unstarted(), 5);
        drop(tickets);
        assert_eq!(a.unstarted(), 0, "abandoned tickets are forgotten");
    }

    /// Ten requests arrive at `t0` and the first four start 2 s apart.
    fn backlog(a: &Admission, t0: Instant) -> Vec<Ticket<'_>> {
        let mut tickets: Vec<_> = (0..10).map(|i| a.admit(i, 100, t0).unwrap()).collect();
        for (i, t) in tickets.iter_mut().take(4).enumerate() {
            t.first_token(t0 + 2 * S * (i as u32 + 1));
        }
        tickets
    }

    #[test]
    fn a_standing_backlog_longer_than_the_bound_is_refused() {
        let a = admission(16, 100, 5);
        let t0 = Instant::now();
        let mut first = backlog(&a, t0);
        let now = t0 + 8 * S;
        // 6 unstarted at 2 s each: 12 s > 5 s, and the oldest has waited 8 s.
        let r = a.admit(10, 100, now).err().unwrap();
        assert!(!r.queue_full);
        assert_eq!(r.retry_after_s, 7);
        // Once all but two have started, 2 × 2 s = 4 s: admitted.
        for (i, t) in first.iter_mut().skip(4).take(4).enumerate() {
            t.first_token(now + 2 * S * (i as u32 + 1));
        }
        assert!(a.admit(10, 100, now + 16 * S).is_ok());
        // No bound on the wait: only the count.
        let unbounded = admission(16, 100, 0);
        let _held = backlog(&unbounded, t0);
        assert!(unbounded.admit(10, 100, now).is_ok());
    }

    #[test]
    fn long_prompts_do_not_count_towards_the_backlog() {
        let a = admission(16, 100, 5);
        let t0 = Instant::now();
        let _first = backlog(&a, t0);
        let now = t0 + 8 * S;
        assert!(a.admit(10, 100, now).is_err());
        // The same backlog of 4,000-token prompts: the scheduler serves others beside them.
        let b = admission(16, 100, 5);
        let mut long: Vec<_> = (0..10).map(|i| b.admit(i, 4000, t0).unwrap()).collect();
        for (i, t) in long.iter_mut().take(4).enumerate() {
            t.first_token(t0 + 2 * S * (i as u32 + 1));
        }
        assert_eq!(b.unstarted(), 0);
        assert!(b.admit(10, 100, now).is_ok());
    }

    #[test]
    fn a_momentary_burst_at_light_load_is_queued_not_refused() {
        let a = admission(16, 100, 5);
        let t0 = Instant::now();
        // Requests a few seconds apart, each starting 0.3 s after it came: no backlog.
        for i in 0..10u32 {
            let at = t0 + 3 * S * i;
            let mut t = a.admit(0, 100, at).unwrap();
            t.first_token(at + Duration::from_millis(300));
        }
        let now = t0 + 31 * S;
        // 20 arrive together: the last expects 19 × 0.3 s = 5.7 s, over the bound, but nobody
        // has waited yet: all are admitted.
        let held: Vec<_> = (0..20).map(|i| a.admit(i, 100, now)).collect();
        assert!(held.iter().all(Result::is_ok));
        // Two seconds on, none started: not yet standing. Six seconds on, it is, and the next
        // is refused.
        assert!(a.admit(20, 100, now + 2 * S).is_ok());
        assert!(a.admit(21, 100, now + 6 * S).is_err());
    }

    #[test]
    fn the_peek_agrees_with_admit_and_takes_no_ticket() {
        let a = admission(16, 100, 5);
        let t0 = Instant::now();
        let _first = backlog(&a, t0);
        let held = a.unstarted();
        for (in_flight, at) in [(10, t0 + 8 * S), (10, t0 + S), (116, t0 + S), (0, t0)] {
            let peek = a.would_refuse(in_flight, at);
            assert_eq!(a.unstarted(), held, "a peek takes no ticket");
            assert_eq!(peek, a.admit(in_flight, 100, at).err(), "at {in_flight}");
        }
    }

    #[test]
    fn old_service_times_stop_counting() {
        let a = admission(1, 100, 1);
        let t0 = Instant::now();
        for i in 0..5u32 {
            let mut t = a.admit(0, 100, t0).unwrap();
            t.first_token(t0 + 10 * S * (i + 1));
        }
        // One unstarted for a second at 10 s each: over the 1 s bound.
        let _queued = a.admit(0, 100, t0 + 51 * S).unwrap();
        assert!(a.admit(1, 100, t0 + 52 * S).is_err());
        // Long after, there is no estimate and only the count bound applies.
        assert!(a.admit(1, 100, t0 + 200 * S).is_ok());
    }
}
