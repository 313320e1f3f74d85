//! What the engine keeps beside the scheduler's [`Sequence`]s: a record per sequence (how its
//! next token is chosen) and a record per request (where its events go, what it asked for,
//! its timing). They are separate because a request with `n > 1` owns several sequences.

use super::super::request::{Event, GenParams, RequestId, TokenLogprob};
use super::super::sampler::Sampler;
use super::super::sequence::{SeqId, Sequence};
use crate::grammar::{Constraint, Mask};
use std::sync::mpsc::Sender;
use std::time::Instant;

/// One live sequence's state beside its `Sequence`: how its tokens are chosen and how long
/// its drafts may be. The scheduler owns its tokens, blocks and current draft (it sizes each
/// step by them); this is the rest, dropped with the sequence.
pub(super) struct SeqRecord {
    /// The request the sequence is one completion of.
    pub request: RequestId,
    pub sampler: Sampler,
    /// The grammar state of a constrained sequence (a request with a response format or
    /// tools). A step takes it out while it computes the mask beside the forward pass.
    pub constraint: Option<Constraint>,
    /// The mask computed beside this step's forward pass, for a constrained sequence that
    /// samples in it (an error: the grammar gave up).
    pub mask: Option<Result<Mask, String>>,
    /// The longest prompt-lookup draft to propose next (0: not yet speculated): it grows
    /// while drafts are accepted whole and shrinks to what was accepted when they are not,
    /// because verifying a draft token costs a share of a decode step whether or not it is
    /// kept.
    pub draft_cap: usize,
    /// An embedding sequence's hidden rows pooled so far.
    pub pooled: Option<crate::engine::pooled::Pooled>,
}

impl SeqRecord {
    pub fn new(request: RequestId, sampler: Sampler, constraint: Option<Constraint>) -> Self {
        SeqRecord {
            request,
            sampler,
            constraint,
            mask: None,
            draft_cap: 0,
            pooled: None,
        }
    }
}

/// One request's state, shared by its sequences.
pub(super) struct RequestState {
    pub events: Sender<Event>,
    pub params: GenParams,
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
    pub fn new(events: Sender<Event>, params: GenParams, prompt_len: usize, seq: SeqId) -> Self {
        RequestState {
            events,
            params,
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
pub(super) fn is_plain(rec: &SeqRecord, params: &GenParams, seq: &Sequence) -> bool {
    let p = rec.sampler.params();
    rec.constraint.is_none()
        && params.logprobs.is_none()
        && seq.forks_pending == 0
        && p.repetition_penalty == 1.0
        && p.presence_penalty == 0.0
        && p.frequency_penalty == 0.0
        && p.logit_bias.is_empty()
}

/// A plain row whose draw is its argmax: such a row needs no sampler at all, and a draft
/// can be verified against it.
pub(super) fn is_plain_greedy(rec: &SeqRecord, params: &GenParams, seq: &Sequence) -> bool {
    is_plain(rec, params, seq) && rec.sampler.params().temperature <= 0.0
}
