//! A generation request, parsed and validated once: what the engine runs (`Work`) and how its
//! answer is shaped (which endpoint's objects, the id, streaming, logprobs, echo). Handlers
//! pass this one value from parsing to the answer's last byte.

use super::responses::ResponseMeta;
use crate::server::generate::{Ready, Work};

pub enum Flavor {
    Completion {
        /// Each prompt's text, for `echo` (empty without it).
        echo: Vec<String>,
    },
    /// A chat answer.
    Chat,
    /// A chat answer written as a Responses object (or its events).
    Response(Box<ResponseMeta>),
}

pub struct Job {
    pub id: String,
    /// Seconds since the epoch.
    pub created: u64,
    pub work: Work,
    pub stream: bool,
    /// A stream ends with a usage chunk.
    pub include_usage: bool,
    /// Top-N alternatives per generated token (Some(0): only the token's own logprob).
    pub logprobs: Option<usize>,
    pub flavor: Flavor,
    /// A chat request in the legacy `functions` form: its call comes back as
    /// `message.function_call` with `finish_reason: "function_call"`.
    pub legacy_functions: bool,
}

impl Job {
    /// The name its answer carries as `model`: the adapter's it runs with, else the model's.
    pub fn model_name<'a>(&'a self, ready: &'a Ready) -> &'a str {
        match &self.work.params.adapter {
            Some(a) => &a.name,
            None => &ready.model_name,
        }
    }

    /// The request forces a call: its answer has no content.
    pub fn forces_a_call(&self) -> bool {
        self.work.rules.as_ref().is_some_and(|r| r.forced())
    }

    /// A chat-shaped answer (chat completions or Responses).
    pub fn is_chat(&self) -> bool {
        !matches!(self.flavor, Flavor::Completion { .. })
    }
}
