//! One sequence's grammar state: the mask for its next token, and the tokens it accepted.

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;
use std::sync::Arc;

/// The tokens a sequence may take next.
#[derive(Clone)]
pub struct Mask {
    allowed: SimpleVob,
    /// The grammar may end here (its end-of-generation tokens are allowed).
    may_end: bool,
}

impl Mask {
    /// Sets every disallowed logit to -inf. Rows longer than the vocabulary the grammar
    /// knows (padding) are disallowed too.
    pub fn apply(&self, logits: &mut [f32], eog: &[u32]) {
        // Word by word: most words of a JSON mask are all-allowed or all-disallowed.
        let words = self.allowed.as_slice();
        let known = self.allowed.len().min(logits.len());
        for (w, chunk) in logits[..known].chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (b, l) in chunk.iter_mut().enumerate() {
                if bits >> b & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        logits[known..].fill(f32::NEG_INFINITY);
        if !self.may_end {
            for &t in eog {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// The one token the grammar allows, when it allows exactly one (and may not end).
    pub fn forced(&self) -> Option<u32> {
        if self.may_end || self.allowed.num_set() != 1 {
            return None;
        }
        let mut only = None;
        self.allowed.iter_set_entries(|i| only = Some(i as u32));
        only
    }

    pub fn allows(&self, token: u32, eog: &[u32]) -> bool {
        if eog.contains(&token) {
            self.may_end
        } else {
            (token as usize) < self.allowed.len() && self.allowed.is_allowed(token)
        }
    }
}

/// A compiled constraint following one sequence. Cloning gives an independent copy at the
/// same point (the n > 1 completions fork from the prompt's).
pub struct Constraint {
    matcher: Matcher,
    eog: Arc<Vec<u32>>,
}

impl Clone for Constraint {
    fn clone(&self) -> Self {
        Constraint {
            matcher: self.matcher.deep_clone(),
            eog: self.eog.clone(),
        }
    }
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

impl Constraint {
    pub(super) fn new(matcher: Matcher, eog: Arc<Vec<u32>>) -> Constraint {
        Constraint { matcher, eog }
    }

    /// The end-of-generation tokens, which the grammar treats as its end.
    pub fn eog(&self) -> &[u32] {
        &self.eog
    }

    /// The next token's mask. Fails when the grammar exceeds its per-step limits.
    pub fn mask(&mut self) -> Result<Mask, String> {
        if self.matcher.is_stopped() {
            // Complete, with nothing more allowed: only the end.
            return Ok(Mask {
                allowed: SimpleVob::new(),
                may_end: true,
            });
        }
        let allowed = self.matcher.compute_mask().map_err(|e| e.to_string())?;
        let may_end = self.matcher.is_accepting().map_err(|e| e.to_string())?;
        Ok(Mask { allowed, may_end })
    }

    /// Follows a sampled token (an end-of-generation token ends the grammar).
    pub fn accept(&mut self, token: u32) -> Result<(), String> {
        if self.eog.contains(&token) {
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| e.to_string())
    }

    /// Nothing may follow: the output is complete.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_keeps_exactly_the_allowed_tokens_and_the_end_when_it_may_end() {
        let mut allowed = SimpleVob::alloc(70);
        for t in [0u32, 31, 32, 64] {
            allowed.allow_token(t);
        }
        let eog = [5u32];
        for may_end in [false, true] {
            let mask = Mask {
                allowed: allowed.clone(),
                may_end,
            };
            let mut logits = vec![1.0f32; 80]; // longer than the grammar's vocabulary
            logits[5] = 2.0;
            mask.apply(&mut logits, &eog);
            let kept: Vec<usize> = (0..80).filter(|&i| logits[i].is_finite()).collect();
            assert_eq!(kept, vec![0, 31, 32, 64], "may_end {may_end}");
            assert_eq!(mask.allows(5, &eog), may_end);
            assert_eq!(mask.forced(), None);
        }
        let mut one = SimpleVob::alloc(70);
        one.allow_token(42);
        let mask = Mask {
            allowed: one,
            may_end: false,
        };
        assert_eq!(mask.forced(), Some(42));
    }
}
