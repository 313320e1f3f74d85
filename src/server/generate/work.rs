//! A generation request as the engine runs it: its prompts, the engine's parameters, the stop
//! strings, and how a chat answer's text is split. What its answer looks like on the wire is
//! the caller's (`Format`).

use crate::chat::OutputRules;
use crate::engine::GenParams;

pub struct Work {
    /// One or more prompts (a completion batch), each run `params.n` times.
    pub prompts: Vec<Vec<u32>>,
    /// A single prompt's images, placed at their positions (encoded when the work runs).
    pub images: Vec<PendingImage>,
    pub params: GenParams,
    pub stop: Vec<String>,
    /// How a chat answer's text is split into reasoning, content and calls; `None`: the text
    /// is the answer (completions).
    pub rules: Option<OutputRules>,
}

/// An image decoded from a request, waiting to be encoded by the model's projector: its views
/// take the prompt's positions from each of `views` (their first positions, in order).
pub struct PendingImage {
    pub views: Vec<usize>,
    pub rgb: crate::vision::Rgb,
}

impl Work {
    /// Prompt tokens of every prompt together (what admission weighs).
    pub fn prompt_tokens(&self) -> usize {
        self.prompts.iter().map(Vec::len).sum()
    }
}
