//! Prefill pacing: how many prompt tokens a step may carry while other sequences decode.
//!
//! Every decoding sequence waits for the whole step, so a step that carries a 512-token prefill
//! chunk on a small CPU stalls each stream for seconds (head-of-line blocking). The pacer
//! measures how long decode-only steps take and what one prefill token adds, and sizes the
//! prefill share so that a mixed step takes at most `slowdown` times a decode-only one. Without
//! decoders, prefill gets the whole step budget.

use super::turns::DecodingElsewhere;

/// Weight of the newest observation in the running averages.
const ALPHA: f64 = 0.2;

#[derive(Clone, Debug)]
pub struct PrefillPacer {
    /// A step carrying prefill may take this many times a decode-only step (≤ 1: no pacing).
    slowdown: f64,
    /// Prefill tokens allowed per step at least, so long prompts always progress.
    min_chunk: usize,
    decode_step_s: Option<f64>,
    prefill_token_s: Option<f64>,
}

fn ewma(avg: &mut Option<f64>, x: f64) {
    *avg = Some(match *avg {
        Some(a) => a + ALPHA * (x - a),
        None => x,
    });
}

impl PrefillPacer {
    pub fn new(slowdown: f64, min_chunk: usize) -> PrefillPacer {
        PrefillPacer {
            slowdown,
            min_chunk: min_chunk.max(1),
            decode_step_s: None,
            prefill_token_s: None,
        }
    }

    /// Prefill tokens the next step may carry when `decoding` sequences decode in it, out of
    /// `max` (what the step budget leaves after the decodes). Streams another model's engine
    /// decodes (`elsewhere`) wait for this step too: without streams of its own, the step is
    /// paced against theirs.
    pub fn prefill_budget(
        &self,
        decoding: usize,
        max: usize,
        elsewhere: DecodingElsewhere,
    ) -> usize {
        if self.slowdown <= 1.0 {
            return max;
        }
        let decode_step_s = match (decoding, elsewhere.sequences) {
            (0, 0) => return max,
            (0, _) => elsewhere.step_s,
            _ => self.decode_step_s,
        };
        let allowed = match (decode_step_s, self.prefill_token_s) {
            (Some(step), Some(tok)) if tok > 0.0 => ((self.slowdown - 1.0) * step / tok) as usize,
            // Not measured yet: the smallest chunk, until the first mixed step tells.
            _ => self.min_chunk,
        };
        allowed.max(self.min_chunk).min(max)
    }

    /// The running average of decode-only steps (what other engines pace against).
    pub fn decode_step_s(&self) -> Option<f64> {
        self.decode_step_s
    }

    /// Records a finished step: `decode` one-token spans and `prefill` prompt tokens in `secs`.
    pub fn observe(&mut self, decode: usize, prefill: usize, secs: f64) {
        if !(secs.is_finite() && secs >= 0.0) {
            return;
        }
        if prefill == 0 {
            if decode > 0 {
                ewma(&mut self.decode_step_s, secs);
            }
            return;
        }
        let decode_part = if decode > 0 {
            self.decode_step_s.unwrap_or(0.0)
        } else {
            0.0
        };
        ewma(
            &mut self.prefill_token_s,
            (secs - decode_part).max(0.0) / prefill as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: DecodingElsewhere = DecodingElsewhere {
        sequences: 0,
        step_s: None,
    };

    #[test]
    fn without_decoders_or_pacing_prefill_gets_everything() {
        let p = PrefillPacer::new(2.0, 16);
        assert_eq!(p.prefill_budget(0, 512, NONE), 512);
        let off = PrefillPacer::new(0.0, 16);
        assert_eq!(off.prefill_budget(8, 500, NONE), 500);
    }

    #[test]
    fn mixed_steps_are_sized_to_the_slowdown() {
        let mut p = PrefillPacer::new(2.0, 16);
        assert_eq!(
            p.prefill_budget(8, 504, NONE),
            16,
            "unmeasured: the smallest chunk"
        );
        for _ in 0..50 {
            p.observe(8, 0, 0.050); // decode-only steps: 50 ms
            p.observe(8, 20, 0.050 + 20.0 * 0.001); // each prefill token adds 1 ms
        }
        // (2 - 1) × 50 ms / 1 ms = 50 tokens.
        let b = p.prefill_budget(8, 504, NONE);
        assert!((48..=52).contains(&b), "{b}");
        assert_eq!(
            p.prefill_budget(8, 30, NONE),
            30,
            "never above what the step has left"
        );
        // A slower prefill (longer context) shrinks the chunk, never below the minimum.
        for _ in 0..50 {
            p.observe(8, 20, 0.050 + 20.0 * 0.010);
        }
        assert_eq!(p.prefill_budget(8, 504, NONE), 16);
    }

    #[test]
    fn prefill_only_steps_teach_the_token_cost() {
        let mut p = PrefillPacer::new(3.0, 8);
        p.observe(4, 0, 0.040);
        p.observe(0, 400, 0.800); // 2 ms per token
        assert_eq!(p.prefill_budget(4, 1000, NONE), 40);
        p.observe(0, 0, f64::NAN);
        assert_eq!(p.prefill_budget(4, 1000, NONE), 40);
    }

    #[test]
    fn another_models_streams_pace_a_step_without_streams_of_its_own() {
        let mut p = PrefillPacer::new(2.0, 4);
        p.observe(0, 400, 0.400); // 1 ms per prompt token
        let chat = DecodingElsewhere {
            sequences: 3,
            step_s: Some(0.020),
        };
        // (2 - 1) × 20 ms / 1 ms = 20 tokens while the other model's streams decode.
        assert_eq!(p.prefill_budget(0, 512, chat), 20);
        assert_eq!(p.prefill_budget(0, 512, NONE), 512);
        let unmeasured = DecodingElsewhere {
            step_s: None,
            ..chat
        };
        assert_eq!(p.prefill_budget(0, 512, unmeasured), 4);
    }
}
