//! The overload refusals of the last second, counted in tenths: a flood of requests shows as
//! a high rate, and a queued request may then be shed (`triage::SHED_AFTER`).

/// Overload refusals counted over the last second, in tenths.
#[derive(Default)]
pub struct RefusalRate {
    tenths: [u64; 10],
    /// The tenth of a second (since the server started) the newest slot is.
    last: u64,
}

impl RefusalRate {
    fn advance(&mut self, tenth: u64) {
        let from = self.last.max(tenth.saturating_sub(10));
        for t in from + 1..=tenth {
            self.tenths[(t % 10) as usize] = 0;
        }
        self.last = self.last.max(tenth);
    }

    pub fn note(&mut self, tenth: u64) {
        self.advance(tenth);
        self.tenths[(tenth % 10) as usize] += 1;
    }

    pub fn last_second(&mut self, tenth: u64) -> u64 {
        self.advance(tenth);
        self.tenths.iter().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::RefusalRate;

    #[test]
    fn the_refusal_rate_counts_the_last_second_only() {
        let mut r = RefusalRate::default();
        for _ in 0..5 {
            r.note(3);
        }
        r.note(9);
        assert_eq!(r.last_second(9), 6);
        assert_eq!(r.last_second(12), 6, "tenths 3..12 are the last second");
        assert_eq!(r.last_second(13), 1, "tenth 3 has gone");
        assert_eq!(r.last_second(500), 0);
        r.note(500);
        assert_eq!(r.last_second(500), 1);
    }
}
