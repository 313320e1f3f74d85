//! What crosses the engine boundary: requests in, events out. Plain data only.

use super::SamplingParams;

pub type RequestId = u64;

#[derive(Clone, Debug)]
pub struct GenParams {
    /// The most tokens to generate; `None`: until the model stops or the sequence fills the
    /// context (or all the KV pool holds). The engine applies no default of its own: a
    /// request's caller decides (the server in `openai::sampling::Endpoint`).
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// Completions to generate from the one prompt (they share its KV blocks).
    pub n: usize,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Extra token ids that end generation.
    pub stop_tokens: Vec<u32>,
    /// Top-N log-probabilities to report with each generated token (0: only the token's own).
    pub logprobs: Option<usize>,
    /// Report the prompt tokens' log-probabilities (scoring); disables prefix-cache reuse for
    /// this request, since every prompt position needs its logits.
    pub prompt_logprobs: Option<usize>,
    /// What the output must match (a compiled grammar at its start), or free text.
    pub constraint: Option<crate::grammar::Constraint>,
    /// Speculate with prompt-lookup drafts where the engine allows it
    /// (`EngineConfig::prompt_lookup`): greedy output is unchanged, only faster.
    pub prompt_lookup: bool,
    /// An embedding request: the prompt is prefilled only (no token is generated, no KV is
    /// held after it) and its hidden states are pooled as the model says into one
    /// [`Event::Embedding`].
    pub embed: bool,
}

impl Default for GenParams {
    fn default() -> Self {
        GenParams {
            max_tokens: None,
            sampling: SamplingParams::default(),
            n: 1,
            ignore_eos: false,
            stop_tokens: Vec::new(),
            logprobs: None,
            prompt_logprobs: None,
            constraint: None,
            prompt_lookup: false,
            embed: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Request {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    pub params: GenParams,
    /// The tokens it may generate: its `max_tokens`, or what the context and the pool leave
    /// its prompt (`EngineHandle::submit` works it out once).
    pub budget: usize,
    /// When the client submitted it (the engine takes it in only between steps).
    pub submitted: std::time::Instant,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation or stop token.
    Stop,
    /// `max_tokens` or the context length reached.
    Length,
    /// Cancelled by the client (or a stop string found by the caller).
    Cancelled,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Log-probability information for one position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The most likely alternatives, best first.
    pub top: Vec<(u32, f32)>,
}

#[derive(Clone, Debug)]
pub enum Event {
    /// Log-probabilities of the prompt tokens (position 0 has none), sent once before any
    /// generated token when `prompt_logprobs` was asked for.
    PromptLogprobs(Vec<Option<TokenLogprob>>),
    /// A generated token for completion `index` (0..n).
    Token {
        index: usize,
        token: u32,
        logprob: Option<TokenLogprob>,
    },
    /// Completion `index` ended. `cached_tokens`: prompt tokens served from the prefix cache.
    Finished {
        index: usize,
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    /// An embedding request's pooled, L2-normalised vector (nothing more follows).
    Embedding {
        vector: Vec<f32>,
        prompt_tokens: usize,
    },
    /// The request failed as a whole (nothing more follows).
    Error(String),
}
