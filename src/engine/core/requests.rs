//! What the engine keeps per request beside its [`Sequence`]s (where its events go, what it
//! asked for, its timing), shared by the request's sequences (a request with `n > 1` owns
//! several), and which of a sequence's rows are plain draws.

use super::super::request::{Event, GenParams, TokenLogprob};
use super::super::sequence::{SeqId, Sequence};
use std::sync::mpsc::Sender;
use std::time::Instant;

/// One request's state, shared by its sequences.
pub(super) struct RequestState {
    pub events: Sender<Event>,
    pub params: GenParams,
    /// The tokens each of its sequences may generate (`Request::budget`).
    pub budget: usize,
    pub prompt_len: usize,
    /// Its sequences, the first one then its forks.
    pub seqs: Vec<SeqId>,
    /// Those not yet finished.
    pub live: usize,
    pub arrived: Instant,
    pub first_token: Option<Instant>,
    pub last_token: Option<Instant>,
    /// The prompt's logprobs gathered so far (prompt scoring), sent once complete.
    pub prompt_logprobs: Vec<Option<TokenLogprob>>,
}

impl RequestState {
    /// A request just admitted, with its first sequence `seq`.
    pub fn new(
        events: Sender<Event>,
        params: GenParams,
        budget: usize,
        prompt_len: usize,
        seq: SeqId,
    ) -> Self {
        RequestState {
            events,
            params,
            budget,
            prompt_len,
            seqs: vec![seq],
            live: 1,
            arrived: Instant::now(),
            first_token: None,
            last_token: None,
            prompt_logprobs: Vec::new(),
        }
    }
}

/// Whether a logits row of `seq` is plain: its token is a draw from the row and nothing
/// more. No grammar masks the row, no logprobs are reported from it, no penalty reshapes it
/// (penalties read the sequence's history), no forks are still to be made from it (they
/// each draw from the row). A plain row can be reduced where it was computed (on the GPU
/// only a token id then comes back) and the output is the same.
pub(super) fn is_plain(seq: &Sequence, params: &GenParams) -> bool {
    let p = seq.sampler.params();
    seq.constraint.is_none()
        && params.logprobs.is_none()
        && seq.forks_pending == 0
        && p.repetition_penalty == 1.0
        && p.presence_penalty == 0.0
        && p.frequency_penalty == 0.0
        && p.logit_bias.is_empty()
}

/// A plain row whose draw is its argmax: such a row needs no sampler at all, and a draft
/// can be verified against it.
pub(super) fn is_plain_greedy(seq: &Sequence, params: &GenParams) -> bool {
    is_plain(seq, params) && seq.sampler.params().temperature <= 0.0
}
