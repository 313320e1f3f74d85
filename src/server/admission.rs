//! Admission: who may join the queue. Past the running batch, requests wait; a request is
//! refused (429 with Retry-After) when the queue is full, or when at the rate requests have
//! been finishing lately it would wait longer than `max_wait` before it even starts. The
//! second bound is what lets an overloaded box recover within seconds once the load stops:
//! its queue never holds more than a few seconds of work, whatever its length in requests.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How far back finished requests count towards the service rate.
const WINDOW: Duration = Duration::from_secs(30);

pub struct Admission {
    running_slots: usize,
    max_queue: usize,
    /// Zero: no bound on the predicted wait.
    max_wait: Duration,
    finished: Mutex<VecDeque<Instant>>,
}

/// Why a request was refused, and when to come back.
#[derive(Debug, PartialEq)]
pub struct Refused {
    pub retry_after_s: u64,
    pub queue_full: bool,
}

impl Admission {
    pub fn new(running_slots: usize, max_queue: usize, max_wait: Duration) -> Admission {
        Admission {
            running_slots,
            max_queue,
            max_wait,
            finished: Mutex::new(VecDeque::new()),
        }
    }

    /// Whether one more request may come in while `in_flight` are already in.
    pub fn check(&self, in_flight: usize, now: Instant) -> Result<(), Refused> {
        let ahead = (in_flight + 1).saturating_sub(self.running_slots);
        let rate = self.service_rate(now);
        let wait_s = rate.map(|r| ahead as f64 / r);
        let retry_after_s = wait_s.map_or(1, |w| w.ceil().clamp(1.0, 60.0) as u64);
        if in_flight >= self.running_slots + self.max_queue {
            return Err(Refused {
                retry_after_s,
                queue_full: true,
            });
        }
        if ahead > 0 && !self.max_wait.is_zero() {
            if let Some(w) = wait_s.filter(|&w| w > self.max_wait.as_secs_f64()) {
                return Err(Refused {
                    retry_after_s: (w - self.max_wait.as_secs_f64()).ceil().clamp(1.0, 60.0) as u64,
                    queue_full: false,
                });
            }
        }
        Ok(())
    }

    /// A request left (answered, failed or abandoned): its slot is free again.
    pub fn finished(&self, now: Instant) {
        if let Ok(mut f) = self.finished.lock() {
            f.push_back(now);
            while f.front().is_some_and(|&t| now.duration_since(t) > WINDOW) {
                f.pop_front();
            }
        }
    }

    /// Requests finished per second lately; None until some have.
    fn service_rate(&self, now: Instant) -> Option<f64> {
        let f = self.finished.lock().ok()?;
        let recent: Vec<Instant> = f
            .iter()
            .copied()
            .filter(|&t| now.duration_since(t) <= WINDOW)
            .collect();
        // Too few to tell a rate from (a server that just started, or one idle for a while).
        if recent.len() < 3 {
            return None;
        }
        let span = now.duration_since(recent[0]).as_secs_f64().max(1.0);
        Some(recent.len() as f64 / span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_bound_holds_without_a_rate() {
        let a = Admission::new(2, 3, Duration::from_secs(5));
        let now = Instant::now();
        for in_flight in 0..5 {
            assert_eq!(a.check(in_flight, now), Ok(()));
        }
        let r = a.check(5, now).unwrap_err();
        assert!(r.queue_full && r.retry_after_s >= 1);
    }

    #[test]
    fn a_queue_longer_than_the_wait_bound_is_refused() {
        let a = Admission::new(2, 100, Duration::from_secs(5));
        let t0 = Instant::now();
        // One request finished every 2 s for 20 s: 0.5 per second.
        for i in 0..10 {
            a.finished(t0 + Duration::from_secs(2 * i));
        }
        let now = t0 + Duration::from_secs(20);
        assert_eq!(a.check(0, now), Ok(()), "a free slot: no wait");
        // With 2 running and 2 queued, the next waits 3 / 0.5 = 6 s > 5 s.
        assert_eq!(a.check(3, now), Ok(()), "2 ahead: 4 s");
        let r = a.check(4, now).unwrap_err();
        assert!(!r.queue_full);
        assert_eq!(r.retry_after_s, 1);
        // No bound on the wait: only the count.
        let unbounded = Admission::new(2, 100, Duration::ZERO);
        for i in 0..10 {
            unbounded.finished(t0 + Duration::from_secs(2 * i));
        }
        assert_eq!(unbounded.check(50, now), Ok(()));
    }

    #[test]
    fn old_completions_stop_counting() {
        let a = Admission::new(1, 100, Duration::from_secs(1));
        let t0 = Instant::now();
        for i in 0..5 {
            a.finished(t0 + Duration::from_millis(100 * i));
        }
        assert!(a.check(10, t0 + Duration::from_secs(1)).is_err());
        // Long after, the rate is unknown again and only the count bound applies.
        assert_eq!(a.check(10, t0 + Duration::from_secs(120)), Ok(()));
    }
}
