//! Turning logits into the next token: penalties, temperature, top-k, top-p, min-p, seeded.

mod rng;

pub use crate::backend::sampling::SamplingParams;
pub use rng::Rng;
use std::collections::HashMap;

pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// Scratch (id, logit) candidates, reused between tokens.
    cand: Vec<(u32, f32)>,
}

/// A copy draws what this sampler would draw next; its scratch is its own, empty.
impl Clone for Sampler {
    fn clone(&self) -> Sampler {
        Sampler {
            params: self.params.clone(),
            rng: self.rng.clone(),
            cand: Vec::new(),
        }
    }
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = params.seed.map(Rng::new).unwrap_or_else(Rng::from_entropy);
        Sampler {
            params,
            rng,
            cand: Vec::new(),
        }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Where this sampler's generator stands (see `Rng::state`), for a device sampler that takes
    /// the draw this sampler would take next.
    pub fn rng_state(&self) -> u64 {
        self.rng.state()
    }

    /// Records that a token was drawn elsewhere (on the device) from `rng_state`: the generator
    /// moves on as if `sample` had drawn it (greedy rows draw nothing).
    pub fn skip_draw(&mut self) {
        if self.params.temperature > 0.0 {
            self.rng.next_u64();
        }
    }

    /// Picks the next token. `history` is the tokens generated so far (penalties look at it).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let p = &self.params;
        let penalize =
            p.repetition_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0;
        if !penalize && p.logit_bias.is_empty() && p.temperature <= 0.0 {
            return argmax(logits);
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        for &(t, b) in &p.logit_bias {
            if let Some(c) = self.cand.get_mut(t as usize) {
                c.1 = if b <= -100.0 {
                    f32::NEG_INFINITY
                } else {
                    c.1 + b
                };
            }
        }
        if penalize {
            penalize_repeats(&mut self.cand, history, p);
        }
        if p.temperature <= 0.0 {
            return self
                .cand
                .iter()
                .fold((0u32, f32::NEG_INFINITY), |best, &c| {
                    if c.1 > best.1 {
                        c
                    } else {
                        best
                    }
                })
                .0;
        }
        // top-k first: it bounds the work of everything after it.
        let k = if p.top_k == 0 {
            self.cand.len()
        } else {
            p.top_k.min(self.cand.len())
        };
        if k < self.cand.len() {
            self.cand.select_nth_unstable_by(k - 1, by_logit);
            self.cand.truncate(k);
            self.cand.sort_unstable_by(by_logit);
        }
        let softmax = Softmax::new(&self.cand, p.temperature);
        let keep = keep_nucleus(&mut self.cand, &softmax, p.min_p, p.top_p);
        let mass: f32 = self.cand[..keep]
            .iter()
            .map(|c| softmax.weight(c.1) / softmax.sum)
            .sum();
        let mut r = self.rng.next_f32() * mass;
        for c in &self.cand[..keep] {
            let x = softmax.weight(c.1) / softmax.sum;
            if r < x {
                return c.0;
            }
            r -= x;
        }
        self.cand[keep - 1].0
    }
}

/// Repetition (llama.cpp / CTRL style), frequency and presence penalties on the logits of the
/// tokens in `history`.
fn penalize_repeats(cand: &mut [(u32, f32)], history: &[u32], p: &SamplingParams) {
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in history {
        *counts.entry(t).or_default() += 1;
    }
    for (&t, &c) in &counts {
        if let Some(entry) = cand.get_mut(t as usize) {
            let l = &mut entry.1;
            // llama.cpp / CTRL style: shrink positive logits, grow negative ones.
            if *l > 0.0 {
                *l /= p.repetition_penalty;
            } else {
                *l *= p.repetition_penalty;
            }
            *l -= c as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }
}

/// Softmax weights relative to the best candidate (whose weight is 1), normalised over the
/// candidates in a fixed order (rank order after top-k, else token order), so the draw does not
/// depend on how the selection in [`keep_nucleus`] permutes them.
struct Softmax {
    max: f32,
    inv_t: f32,
    /// The weights' sum.
    sum: f32,
}

impl Softmax {
    fn new(cand: &[(u32, f32)], temperature: f32) -> Softmax {
        let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        let inv_t = 1.0 / temperature;
        let sum: f32 = cand.iter().map(|c| ((c.1 - max) * inv_t).exp()).sum();
        Softmax { max, inv_t, sum }
    }

    fn weight(&self, l: f32) -> f32 {
        ((l - self.max) * self.inv_t).exp()
    }
}

/// Sorts the candidates, best first, only as far as min-p and top-p can reach (with no top-k a
/// 262K vocabulary is never sorted whole, only a growing prefix); how many of them are kept.
fn keep_nucleus(cand: &mut [(u32, f32)], softmax: &Softmax, min_p: f32, top_p: f32) -> usize {
    let mut sorted = cand.len().min(SORTED_FIRST);
    loop {
        if sorted < cand.len() {
            cand.select_nth_unstable_by(sorted - 1, by_logit);
        }
        cand[..sorted].sort_unstable_by(by_logit);
        // min-p: tokens far less likely than the best one are dropped.
        let mut keep = sorted;
        if min_p > 0.0 {
            keep = cand[..sorted]
                .iter()
                .take_while(|c| softmax.weight(c.1) >= min_p)
                .count()
                .max(1);
        }
        // top-p: the smallest prefix whose mass reaches top_p.
        let mut acc = 0.0;
        let mut reached = false;
        if top_p < 1.0 {
            for (i, c) in cand[..keep].iter().enumerate() {
                acc += softmax.weight(c.1) / softmax.sum;
                if acc >= top_p {
                    keep = i + 1;
                    reached = true;
                    break;
                }
            }
        }
        let cut = reached || keep < sorted;
        if cut || sorted == cand.len() {
            return keep;
        }
        sorted = (sorted * 8).min(cand.len());
    }
}

/// How many candidates are sorted before min-p or top-p is checked (then 8× as many).
const SORTED_FIRST: usize = 256;

/// Higher logit first; ties by the lower token id (a total order, so partial selection and a
/// full sort agree).
fn by_logit(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The log-probability of `token` and the `n` most likely tokens with theirs, best first,
/// without a vocabulary-sized allocation (one pass for the normaliser, one bounded selection).
pub fn logprobs_of(logits: &[f32], token: u32, n: usize) -> (f32, Vec<(u32, f32)>) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - lse) as f32;
    // The n best so far, kept sorted (n is at most 20). Masked-out entries (-inf, a
    // constrained row) are never alternatives.
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if l == f32::NEG_INFINITY {
                continue;
            }
            if top.len() == n && by_logit(&(i as u32, l), &top[n - 1]).is_ge() {
                continue;
            }
            let at = top.partition_point(|t| by_logit(t, &(i as u32, l)).is_lt());
            top.insert(at, (i as u32, l));
            top.truncate(n);
        }
    }
    let chosen = logits
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    (chosen, top.into_iter().map(|(t, l)| (t, lp(l))).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// log-softmax of one logit row, computed in f64 for stable scoring.
    fn log_softmax(logits: &[f32]) -> Vec<f32> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
        let lse = max as f64 + sum.ln();
        logits.iter().map(|&l| (l as f64 - lse) as f32).collect()
    }

    /// The `n` most likely tokens with their log-probabilities, best first, from log-probabilities
    /// already computed (`log_softmax`).
    fn top_logprobs(lp: &[f32], n: usize) -> Vec<(u32, f32)> {
        let mut idx: Vec<(u32, f32)> = lp.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        let n = n.min(idx.len());
        if n == 0 {
            return Vec::new();
        }
        idx.select_nth_unstable_by(n - 1, by_logit);
        idx.truncate(n);
        idx.sort_by(by_logit);
        idx
    }

    #[test]
    fn greedy_takes_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 2.0], &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(7),
            ..Default::default()
        };
        let run = || {
            let mut s = Sampler::new(params.clone());
            (0..20).map(|_| s.sample(&logits, &[])).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        let mut k1 = Sampler::new(SamplingParams {
            top_k: 1,
            ..params.clone()
        });
        assert_eq!(k1.sample(&logits, &[]), argmax(&logits));
    }

    #[test]
    fn repetition_penalty_changes_choice() {
        let params = SamplingParams {
            temperature: 0.0,
            repetition_penalty: 2.0,
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        assert_eq!(s.sample(&[1.0, 1.5], &[1]), 0);
    }

    /// A logit bias moves the greedy choice; -100 bans a token even when sampling.
    #[test]
    fn logit_bias_shifts_and_bans() {
        let greedy = |bias: Vec<(u32, f32)>| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 0.0,
                logit_bias: bias,
                ..Default::default()
            });
            s.sample(&[1.0, 1.5, 0.5], &[])
        };
        assert_eq!(greedy(vec![]), 1);
        assert_eq!(greedy(vec![(2, 2.0)]), 2);
        assert_eq!(greedy(vec![(1, -100.0)]), 0);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: Some(7),
            logit_bias: vec![(1, -100.0)],
            ..Default::default()
        });
        for _ in 0..200 {
            assert_ne!(s.sample(&[1.0, 9.0, 0.5], &[]), 1);
        }
    }

    #[test]
    fn without_top_k_a_large_vocabulary_samples_the_same_as_a_full_sort() {
        // 300K candidates, top-k off: the growing sorted prefix must give what sorting all
        // would (a reference implementation of the same rules).
        let logits: Vec<f32> = (0..300_000u32)
            .map(|i| ((i.wrapping_mul(2_654_435_761) >> 7) % 1000) as f32 * 0.01)
            .collect();
        for (top_p, min_p) in [(0.95, 0.0), (1.0, 0.05), (0.5, 0.0), (1.0, 0.0)] {
            let params = SamplingParams {
                temperature: 0.7,
                top_k: 0,
                top_p,
                min_p,
                seed: Some(3),
                ..Default::default()
            };
            let mut s = Sampler::new(params.clone());
            let mut rng = Rng::new(3);
            for _ in 0..5 {
                let got = s.sample(&logits, &[]);
                let want = reference_draw(&logits, &params, &mut rng);
                assert_eq!(got, want, "top_p {top_p} min_p {min_p}");
            }
        }
    }

    /// The sampling rules with a full sort.
    fn reference_draw(logits: &[f32], p: &SamplingParams, rng: &mut Rng) -> u32 {
        let mut cand: Vec<(u32, f32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        cand.sort_by(by_logit);
        let max = cand[0].1;
        let inv_t = 1.0 / p.temperature;
        let w: Vec<f32> = cand.iter().map(|c| ((c.1 - max) * inv_t).exp()).collect();
        // Normalised in token order, as the sampler does without top-k.
        let sum: f32 = logits.iter().map(|&l| ((l - max) * inv_t).exp()).sum();
        let mut keep = cand.len();
        if p.min_p > 0.0 {
            keep = w.iter().take_while(|&&x| x >= p.min_p).count().max(1);
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &x) in w.iter().enumerate().take(keep) {
                acc += x / sum;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
        }
        let mass: f32 = w[..keep].iter().map(|x| x / sum).sum();
        let mut r = rng.next_f32() * mass;
        for i in 0..keep {
            if r < w[i] / sum {
                return cand[i].0;
            }
            r -= w[i] / sum;
        }
        cand[keep - 1].0
    }

    #[test]
    fn logprobs_of_matches_log_softmax() {
        let logits: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919) % 101) as f32 * 0.05)
            .collect();
        let lp = log_softmax(&logits);
        let (chosen, top) = logprobs_of(&logits, 17, 5);
        assert!((chosen - lp[17]).abs() < 1e-6);
        assert_eq!(top, top_logprobs(&lp, 5));
    }

    #[test]
    fn logprobs_are_normalised() {
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        let total: f32 = lp.iter().map(|l| l.exp()).sum();
        assert!((total - 1.0).abs() < 1e-5);
        assert_eq!(
            top_logprobs(&log_softmax(&[1.0, 3.0, 2.0]), 2)
                .iter()
                .map(|x| x.0)
                .collect::<Vec<_>>(),
            vec![1, 2]
        );
    }
}
