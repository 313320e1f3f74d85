//! Seeded, reproducible workloads: when each request arrives and what it asks for.
//!
//! Everything is derived from the seed and the request's index, so the same flags give the same
//! requests against any server, and a request's prompt text is only built when it is sent.

use edgelm::engine::Rng;

/// Word list for synthetic prompts: common English words, each one token (with its leading
/// space) in the usual Llama-family BPE vocabularies, so a prompt of N words is close to N
/// tokens on any of them. The server's `usage.prompt_tokens` gives the exact figure.
const WORDS: &[&str] = &[
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "was",
    "with",
    "be",
    "by",
    "on",
    "not",
    "he",
    "this",
    "are",
    "or",
    "his",
    "from",
    "at",
    "which",
    "but",
    "have",
    "an",
    "had",
    "they",
    "you",
    "were",
    "their",
    "one",
    "all",
    "we",
    "can",
    "her",
    "has",
    "there",
    "been",
    "if",
    "more",
    "when",
    "will",
    "would",
    "who",
    "so",
    "no",
    "time",
    "people",
    "year",
    "way",
    "day",
    "man",
    "thing",
    "woman",
    "life",
    "child",
    "world",
    "school",
    "state",
    "family",
    "student",
    "group",
    "country",
    "problem",
    "hand",
    "part",
    "place",
    "case",
    "week",
    "company",
    "system",
    "program",
    "question",
    "work",
    "government",
    "number",
    "night",
    "point",
    "home",
    "water",
    "room",
    "mother",
    "area",
    "money",
    "story",
    "fact",
    "month",
    "lot",
    "right",
    "study",
    "book",
    "eye",
    "job",
    "word",
    "business",
    "issue",
    "side",
    "kind",
    "head",
    "house",
    "service",
    "friend",
    "father",
    "power",
    "hour",
    "game",
    "line",
    "end",
    "member",
    "law",
    "car",
    "city",
    "name",
    "team",
    "minute",
    "idea",
    "body",
    "information",
    "back",
    "parent",
    "face",
    "level",
    "office",
    "door",
    "health",
    "person",
    "art",
    "war",
    "history",
    "party",
    "result",
    "change",
    "morning",
    "reason",
    "research",
    "girl",
    "guy",
    "moment",
    "air",
    "teacher",
    "force",
    "education",
    "good",
    "new",
    "first",
    "last",
    "long",
    "great",
    "little",
    "own",
    "other",
    "old",
    "big",
    "high",
    "different",
    "small",
    "large",
    "next",
    "early",
    "young",
    "important",
    "few",
    "public",
    "bad",
    "same",
    "able",
    "make",
    "know",
    "take",
    "see",
    "come",
    "think",
    "look",
    "want",
    "give",
    "use",
    "find",
    "tell",
    "ask",
    "seem",
    "feel",
    "try",
    "leave",
    "call",
    "keep",
    "let",
    "begin",
    "show",
    "hear",
    "play",
    "run",
    "move",
    "like",
    "live",
    "believe",
    "hold",
    "bring",
    "happen",
    "write",
    "provide",
    "sit",
    "stand",
    "lose",
    "pay",
    "meet",
    "include",
    "continue",
    "set",
    "learn",
    "lead",
    "understand",
    "watch",
    "follow",
    "stop",
    "create",
    "speak",
    "read",
    "spend",
    "grow",
    "open",
    "walk",
    "win",
    "offer",
    "remember",
    "love",
    "consider",
    "appear",
    "buy",
    "wait",
    "serve",
    "die",
    "send",
    "expect",
    "build",
    "stay",
    "fall",
    "cut",
    "reach",
    "kill",
    "remain",
    "river",
    "mountain",
    "engine",
    "window",
    "garden",
    "signal",
    "battery",
    "sensor",
    "camera",
    "road",
    "field",
    "winter",
    "summer",
    "light",
    "stone",
    "paper",
    "music",
    "picture",
    "market",
    "energy",
    "machine",
];

/// What to generate. Arrivals are Poisson at `rate` per second (open loop) unless the runner
/// uses a fixed number of closed-loop clients instead.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub seed: u64,
    pub rate: f64,
    /// Share of requests with a very long prompt (`long_tokens` words).
    pub long_share: f64,
    pub long_tokens: usize,
    /// Other prompts are log-uniform in words between these bounds.
    pub min_prompt_words: usize,
    pub max_prompt_words: usize,
    /// Share of requests that start with one of `system_prompts` shared prefixes.
    pub shared_share: f64,
    pub system_prompts: usize,
    pub system_words: usize,
    pub stream_share: f64,
    pub chat_share: f64,
    /// Share of streaming requests whose client hangs up part-way.
    pub disconnect_share: f64,
    pub min_max_tokens: usize,
    pub max_max_tokens: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Completions,
    Chat,
}

/// One request of the workload, without its text (see [`Workload::prompt`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    pub index: usize,
    /// Seconds from the start of the run (open loop).
    pub at_s: f64,
    pub endpoint: Endpoint,
    pub stream: bool,
    pub system: Option<usize>,
    pub words: usize,
    pub long: bool,
    pub max_tokens: usize,
    /// Hang up after this many content chunks.
    pub disconnect_after: Option<usize>,
}

pub struct Workload {
    pub config: WorkloadConfig,
    systems: Vec<String>,
}

/// Uniform in [0, 1) with 53 bits.
fn unit(rng: &mut Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

fn range(rng: &mut Rng, lo: usize, hi: usize) -> usize {
    lo + (rng.next_u64() % (hi.saturating_sub(lo) as u64 + 1)) as usize
}

/// Deterministic filler text of `words` words.
fn words_text(rng: &mut Rng, words: usize) -> String {
    let mut out = String::with_capacity(words * 6);
    for i in 0..words {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
    }
    out
}

impl Workload {
    pub fn new(config: WorkloadConfig) -> Workload {
        let systems = (0..config.system_prompts)
            .map(|k| {
                let mut rng = Rng::new(config.seed ^ 0x5157_0000 ^ k as u64);
                format!(
                    "You are field assistant number {k}. Background notes: {}.",
                    words_text(&mut rng, config.system_words)
                )
            })
            .collect();
        Workload { config, systems }
    }

    /// The `index`-th request; `at_s` is filled in by [`Workload::arrivals`].
    pub fn planned(&self, index: usize) -> Planned {
        let c = &self.config;
        let mut rng = Rng::new(c.seed.wrapping_mul(0x9E37_79B9).wrapping_add(index as u64));
        let long = unit(&mut rng) < c.long_share;
        let words = if long {
            c.long_tokens
        } else {
            let (lo, hi) = (
                c.min_prompt_words.max(1) as f64,
                c.max_prompt_words.max(1) as f64,
            );
            (lo * (hi / lo).max(1.0).powf(unit(&mut rng))).round() as usize
        };
        let system = (c.system_prompts > 0 && unit(&mut rng) < c.shared_share)
            .then(|| (rng.next_u64() % c.system_prompts as u64) as usize);
        let stream = unit(&mut rng) < c.stream_share;
        let endpoint = if unit(&mut rng) < c.chat_share {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        let max_tokens = range(&mut rng, c.min_max_tokens.max(1), c.max_max_tokens.max(1));
        let disconnect_after = (stream && unit(&mut rng) < c.disconnect_share)
            .then(|| range(&mut rng, 1, (max_tokens / 2).max(1)));
        Planned {
            index,
            at_s: 0.0,
            endpoint,
            stream,
            system,
            words,
            long,
            max_tokens,
            disconnect_after,
        }
    }

    /// Poisson arrivals at the configured rate within `duration_s`, at most `max_requests`.
    pub fn arrivals(&self, duration_s: f64, max_requests: Option<usize>) -> Vec<Planned> {
        let mut rng = Rng::new(self.config.seed ^ 0xA11_1FA1);
        let mut t = 0.0;
        let mut out = Vec::new();
        while max_requests.is_none_or(|m| out.len() < m) {
            t += -(1.0 - unit(&mut rng)).ln() / self.config.rate;
            if t >= duration_s {
                break;
            }
            let mut p = self.planned(out.len());
            p.at_s = t;
            out.push(p);
        }
        out
    }

    /// The request's shared system prompt, if any, and its own text.
    pub fn prompt(&self, p: &Planned) -> (Option<&str>, String) {
        let mut rng = Rng::new(self.config.seed ^ 0x7E47 ^ (p.index as u64) << 20);
        let text = format!(
            "Request {}. Summarise the following notes: {}",
            p.index,
            words_text(&mut rng, p.words)
        );
        (p.system.map(|k| self.systems[k].as_str()), text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> WorkloadConfig {
        WorkloadConfig {
            seed: 7,
            rate: 4.0,
            long_share: 0.05,
            long_tokens: 4000,
            min_prompt_words: 8,
            max_prompt_words: 1024,
            shared_share: 0.5,
            system_prompts: 4,
            system_words: 200,
            stream_share: 0.7,
            chat_share: 0.5,
            disconnect_share: 0.2,
            min_max_tokens: 16,
            max_max_tokens: 128,
        }
    }

    #[test]
    fn same_seed_same_requests_and_texts() {
        let (a, b) = (Workload::new(config()), Workload::new(config()));
        let (ra, rb) = (a.arrivals(60.0, None), b.arrivals(60.0, None));
        assert_eq!(ra, rb);
        assert_eq!(a.prompt(&ra[3]), b.prompt(&rb[3]));
        let other = Workload::new(WorkloadConfig {
            seed: 8,
            ..config()
        });
        assert_ne!(other.arrivals(60.0, None), ra);
    }

    #[test]
    fn arrivals_follow_the_rate_and_the_mix_follows_the_shares() {
        let w = Workload::new(config());
        let r = w.arrivals(2000.0, None);
        let rate = r.len() as f64 / 2000.0;
        assert!((rate - 4.0).abs() < 0.2, "rate {rate}");
        assert!(r.windows(2).all(|p| p[0].at_s < p[1].at_s));
        let share = |f: &dyn Fn(&Planned) -> bool| {
            r.iter().filter(|p| f(p)).count() as f64 / r.len() as f64
        };
        assert!((share(&|p| p.long) - 0.05).abs() < 0.015);
        assert!((share(&|p| p.stream) - 0.7).abs() < 0.03);
        assert!((share(&|p| p.system.is_some()) - 0.5).abs() < 0.03);
        assert!((share(&|p| p.disconnect_after.is_some()) - 0.14).abs() < 0.03);
        assert!(r.iter().all(|p| p.disconnect_after.is_none() || p.stream));
        assert!(r.iter().all(|p| (16..=128).contains(&p.max_tokens)));
        assert!(r.iter().all(|p| p.long || (8..=1024).contains(&p.words)));
        assert_eq!(w.arrivals(2000.0, Some(10)).len(), 10);
    }

    #[test]
    fn prompts_have_the_planned_length_and_share_system_prompts() {
        let w = Workload::new(config());
        let r = w.arrivals(100.0, None);
        let long = r.iter().find(|p| p.long).expect("some long prompt");
        let (_, text) = w.prompt(long);
        assert!(text.split(' ').count() >= 4000);
        let shared: Vec<_> = r.iter().filter(|p| p.system == Some(1)).take(2).collect();
        assert_eq!(w.prompt(shared[0]).0, w.prompt(shared[1]).0);
        assert_ne!(w.prompt(shared[0]).1, w.prompt(shared[1]).1);
    }
}
