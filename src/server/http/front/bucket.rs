//! Token buckets, one per client address (fairness: a client sending faster than its rate
//! gets 429 with Retry-After while the others are served), and the pacer of the front's own
//! refusals (the rate at which it answers requests it turns away, so that a flood of them
//! costs a bounded amount of CPU however fast the clients resend).

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    /// Starts full. `rate` tokens a second, `burst` at most.
    pub fn new(rate: f64, burst: f64, now: Instant) -> TokenBucket {
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.at = now;
    }

    /// Takes a token, or says how long until one is there.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
        }
    }

    /// Full again: it has nothing to remember.
    fn is_full(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.tokens >= self.burst
    }
}

/// The front's refusals in arrival order, `rate` a second with bursts of a tenth of a second's
/// worth: each refusal is given its turn as it arrives (the virtual-scheduling form of a token
/// bucket), so later ones never overtake earlier ones.
pub struct Pacer {
    interval: Duration,
    /// How far ahead of the schedule a burst may run.
    tolerance: Duration,
    /// When the next refusal would be due were there no burst allowance.
    next: Instant,
}

impl Pacer {
    pub fn new(rate: f64, now: Instant) -> Pacer {
        let burst = (rate / 10.0).max(1.0);
        let interval = Duration::from_secs_f64(1.0 / rate);
        Pacer {
            interval,
            tolerance: interval.mul_f64(burst - 1.0),
            next: now,
        }
    }

    /// When a refusal arriving now may be answered (now, or its turn after the waiting ones).
    pub fn turn(&mut self, now: Instant) -> Instant {
        let due = self.next.max(now);
        self.next = due + self.interval;
        due.checked_sub(self.tolerance).map_or(now, |t| t.max(now))
    }
}

/// Buckets by client address. Only clients seen lately are kept: a bucket that has refilled
/// is the same as a new one, so it is dropped, which bounds the map by the clients active
/// within about `burst / rate` seconds.
pub struct ClientBuckets {
    rate: f64,
    burst: f64,
    buckets: HashMap<IpAddr, TokenBucket>,
    last_prune: Instant,
}

/// Past this many addresses the map is pruned at once, not only every few seconds.
const PRUNE_AT: usize = 4096;

impl ClientBuckets {
    /// `rate` 0: off (every request passes).
    pub fn new(rate: f64, burst: f64, now: Instant) -> ClientBuckets {
        ClientBuckets {
            rate,
            burst: burst.max(1.0),
            buckets: HashMap::new(),
            last_prune: now,
        }
    }

    pub fn enabled(&self) -> bool {
        self.rate > 0.0
    }

    /// One request from `ip`: Ok, or the seconds (at least 1) it should wait (Retry-After).
    pub fn take(&mut self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        if !self.enabled() {
            return Ok(());
        }
        if self.buckets.len() >= PRUNE_AT || now.duration_since(self.last_prune).as_secs() >= 5 {
            self.buckets.retain(|_, b| !b.is_full(now));
            self.last_prune = now;
        }
        let (rate, burst) = (self.rate, self.burst);
        self.buckets
            .entry(ip)
            .or_insert_with(|| TokenBucket::new(rate, burst, now))
            .take(now)
            .map_err(|wait| wait.as_secs_f64().ceil().max(1.0) as u64)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_bucket_allows_its_burst_then_its_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10.0, 3.0, t0);
        assert!((0..3).all(|_| b.take(t0).is_ok()));
        let wait = b.take(t0).unwrap_err();
        assert!(wait > 90 * MS && wait <= 100 * MS, "{wait:?}");
        assert!(b.take(t0 + 100 * MS).is_ok());
        assert!(b.take(t0 + 100 * MS).is_err());
        // It never holds more than the burst, however long it rested.
        let later = t0 + Duration::from_secs(100);
        assert!((0..3).all(|_| b.take(later).is_ok()));
        assert!(b.take(later).is_err());
    }

    #[test]
    fn the_pacer_answers_a_burst_then_one_per_interval_in_order() {
        let t0 = Instant::now();
        let mut p = Pacer::new(100.0, t0);
        // 10 at once (a tenth of a second's worth), then 10 ms apart, each after the last.
        let turns: Vec<Instant> = (0..15).map(|_| p.turn(t0)).collect();
        assert!(turns[..10].iter().all(|&t| t == t0), "{turns:?}");
        for w in turns[9..].windows(2) {
            let gap = w[1] - w[0];
            assert!(gap >= 9 * MS && gap <= 11 * MS, "{gap:?}");
        }
        // After a rest it has its burst again.
        let later = t0 + Duration::from_secs(5);
        assert!((0..10).all(|_| p.turn(later) == later));
        assert!(p.turn(later) > later);
    }

    #[test]
    fn clients_are_limited_apart_and_forgotten_when_full() {
        let t0 = Instant::now();
        let mut c = ClientBuckets::new(1.0, 2.0, t0);
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert!(c.take(a, t0).is_ok() && c.take(a, t0).is_ok());
        assert_eq!(c.take(a, t0), Err(1), "Retry-After is at least a second");
        assert!(c.take(b, t0).is_ok(), "another client has its own bucket");
        // Both buckets refill within 2 s; the next prune (5 s on) forgets them.
        assert!(c.take(b, t0 + Duration::from_secs(6)).is_ok());
        assert_eq!(c.len(), 1, "only the client seen since is kept");
        let off = &mut ClientBuckets::new(0.0, 0.0, t0);
        assert!((0..1000).all(|_| off.take(a, t0).is_ok()));
    }
}
