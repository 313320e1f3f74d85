//! What crosses the engine boundary: requests in, events out. Plain data only.

use super::SamplingParams;
use crate::backend::batch::RowInput;
use std::ops::Range;

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
    /// The LoRA adapter it runs with (`None`: the base model).
    pub adapter: Option<std::sync::Arc<crate::backend::adapter::Adapter>>,
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
            adapter: None,
        }
    }
}

/// Prompt positions `at..at + rows.len()` take `rows` as their input (an image's), in place
/// of their tokens' embeddings (the prompt holds placeholder tokens there).
#[derive(Clone, Debug)]
pub struct PromptImage {
    pub at: usize,
    pub rows: std::sync::Arc<crate::backend::batch::Embedded>,
}

impl PromptImage {
    pub fn end(&self) -> usize {
        self.at + self.rows.len()
    }
}

/// The image rows that positions `range` take, for a span whose first token is token `first`
/// of the batch: each attends through its image's last position where the image is
/// bidirectional (chunks never cut such an image: [`uncut_chunk`]).
pub fn row_inputs(images: &[PromptImage], range: Range<usize>, first: usize) -> Vec<RowInput> {
    let mut out = Vec::new();
    for image in images {
        let bidirectional = image.rows.bidirectional;
        for pos in image.at.max(range.start)..image.end().min(range.end) {
            out.push(RowInput {
                token: first + pos - range.start,
                rows: image.rows.clone(),
                row: pos - image.at,
                through: if bidirectional { image.end() - 1 } else { pos },
            });
        }
    }
    out
}

/// The three-part RoPE positions of positions `range` of a sequence whose prompt holds
/// `images`, where any of them takes M-RoPE positions (Qwen3-VL's, as llama.cpp's
/// `mtmd_image_tokens_get_decoder_pos`): an image's row turns by its start (less what the
/// images before it saved), its grid row and its column; the image then advances the count
/// by its grid's longer side, not its rows. Empty where no image takes them.
pub fn rope_positions(images: &[PromptImage], range: Range<usize>) -> Vec<[usize; 3]> {
    if images.iter().all(|i| i.rows.grid.is_none()) {
        return Vec::new();
    }
    range
        .map(|pos| {
            // What the images before `pos` (or holding it) save.
            let mut saved = 0;
            for image in images.iter().take_while(|i| i.at <= pos) {
                let Some((columns, lines)) = image.rows.grid else {
                    continue;
                };
                if pos < image.end() {
                    let (start, i) = (image.at - saved, pos - image.at);
                    return [start, start + i / columns, start + i % columns];
                }
                saved += image.rows.len() - columns.max(lines);
            }
            [pos - saved; 3]
        })
        .collect()
}

/// The longest chunk of at most `len` positions from `start` that does not cut an image whose
/// positions see each other: it stops before such an image, or takes all of it when it starts
/// inside one (0 when `len` cannot hold the rest of it).
pub fn uncut_chunk(images: &[PromptImage], start: usize, len: usize) -> usize {
    let end = start + len;
    for image in images.iter().filter(|i| i.rows.bidirectional) {
        if image.at < end && end < image.end() {
            return match image.at > start {
                true => image.at - start,
                false => 0,
            };
        }
    }
    len
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::batch::Embedded;
    use std::sync::Arc;

    fn image(at: usize, grid: Option<(usize, usize)>, len: usize) -> PromptImage {
        let rows = Arc::new(Embedded {
            rows: vec![0.0; len],
            width: 1,
            key: 1,
            bidirectional: false,
            grid,
        });
        PromptImage { at, rows }
    }

    #[test]
    fn mrope_images_turn_by_row_and_column_and_move_the_text_after_by_their_longer_side() {
        // Three text positions, a 3 × 2 image (6 rows), then text: it takes the image's
        // start plus 3, not 6.
        let images = [image(3, Some((3, 2)), 6)];
        let got = rope_positions(&images, 2..11);
        let want = [
            [2, 2, 2],
            [3, 3, 3],
            [3, 3, 4],
            [3, 3, 5],
            [3, 4, 3],
            [3, 4, 4],
            [3, 4, 5],
            [6, 6, 6],
            [7, 7, 7],
        ];
        assert_eq!(got, want);
        // A second image after it starts where the text has moved to.
        let two = [image(3, Some((3, 2)), 6), image(10, Some((1, 2)), 2)];
        assert_eq!(
            rope_positions(&two, 10..13),
            [[7, 7, 7], [7, 8, 7], [9, 9, 9]]
        );
        // Images without a grid: no three-part positions at all.
        assert!(rope_positions(&[image(3, None, 6)], 0..10).is_empty());
    }
}

#[derive(Clone, Debug)]
pub struct Request {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    /// Runs of the prompt given as rows (images), in order, apart from each other.
    pub images: Vec<PromptImage>,
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
