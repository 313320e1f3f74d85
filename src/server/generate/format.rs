//! The shape an answer is written in: OpenAI's chat or completion objects and chunks, or the
//! Responses API's object and events (both in `openai`). `run` decides when and where to write
//! (a stream as the choices grow, a whole answer once they are done, an error in the answer's
//! own form once its head is out); a format decides what.

use super::choices::{Choices, Released};

/// Why an answer failed.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// The engine refused a prompt (it does not fit the context or the pool).
    Refused(String),
    /// The engine failed while running it.
    Engine(String),
    /// The server's drain time is over.
    Shutdown,
    /// Shed before its first token: a flood of requests wants the slot it waits for (429).
    Shed,
}

pub trait Format {
    /// Server-sent events as the choices grow; otherwise one JSON object at the end.
    fn streams(&self) -> bool;

    /// What to send for what one event released: a stream's events (each framed, `data:`
    /// lines and the blank line); nothing for a whole answer, which may still take note.
    fn released(&mut self, choices: &Choices, released: &Released) -> Vec<String>;

    /// Every choice is done: a stream's closing events.
    fn stream_end(&mut self, choices: &Choices) -> Vec<String>;

    /// Every choice is done: the whole answer's JSON.
    fn whole(&mut self, choices: &Choices) -> String;

    /// The answer fails after its head went out: the error in the answer's own form (a
    /// stream's error events, or a whole answer's error object).
    fn failed(&mut self, choices: &Choices, failure: &Failure) -> Vec<String>;
}
