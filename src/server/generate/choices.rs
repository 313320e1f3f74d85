//! One job's choices as the engine's events arrive: each choice's text through the stop
//! strings (and, for chat, split into reasoning, content and tool calls), its tokens and
//! logprobs, its finish reason; and the request's usage. What an event released is handed
//! back for a stream to send.

use super::text::ChoiceText;
use super::work::Work;
use crate::chat::{ChatOutput, Delta, OutputRules};
use crate::engine::{Event, FinishReason, TokenLogprob};
use crate::tokenizer::Tokenizer;
use std::time::Instant;

/// How a request ended, for its log line.
pub struct Outcome {
    /// The finish reasons ("stop", "length", several joined by '+'), or what cut it short.
    pub result: String,
    /// Tokens generated for the client, all choices together.
    pub completion_tokens: usize,
    pub first_token: Option<Instant>,
}

/// What one event released for choice `ci`: its deltas, the token's logprob, and the finish
/// reason if it ended.
pub struct Released {
    pub ci: usize,
    pub deltas: Vec<Delta>,
    pub logprob: Option<TokenLogprob>,
    pub finish: Option<&'static str>,
}

#[derive(Default)]
pub struct Choice {
    pub text: ChoiceText,
    /// Chat only: the text split into reasoning, content and calls.
    pub chat: Option<ChatOutput>,
    pub tokens: Vec<u32>,
    pub logprobs: Vec<TokenLogprob>,
    pub finish: Option<&'static str>,
    pub prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
}

pub struct Usage {
    pub prompt: usize,
    pub completion: usize,
    /// Prompt tokens read from the prefix cache.
    pub cached: usize,
}

impl Usage {
    /// Prompt tokens this request wrote to the prefix cache: a prompt's full blocks of
    /// `block_size` tokens enter it, less those it read from there.
    pub fn cache_written(&self, block_size: usize) -> usize {
        let block = block_size.max(1);
        (self.prompt / block * block).saturating_sub(self.cached)
    }
}

/// Every choice of a job: `n` per prompt, prompt `pi`'s at `pi * n ..`.
pub struct Choices {
    pub list: Vec<Choice>,
    pub usage: Usage,
    n: usize,
    done: usize,
    pub first_token: Option<Instant>,
}

impl Choices {
    pub fn new(work: &Work) -> Choices {
        let n = work.params.n;
        let list = (0..work.prompts.len() * n)
            .map(|_| Choice {
                chat: work.rules.as_ref().map(OutputRules::output),
                ..Default::default()
            })
            .collect();
        Choices {
            list,
            usage: Usage {
                prompt: work.prompts.iter().map(|p| p.len() * n).sum(),
                completion: 0,
                cached: 0,
            },
            n,
            done: 0,
            first_token: None,
        }
    }

    /// Every choice has its finish reason.
    pub fn all_done(&self) -> bool {
        self.done == self.list.len()
    }

    /// Applies one event of prompt `pi`; `on_first_token` is told when the job's first token
    /// comes. An engine error comes back as `Err` with its message.
    pub fn apply(
        &mut self,
        tokenizer: &Tokenizer,
        work: &Work,
        pi: usize,
        ev: Event,
        on_first_token: &mut dyn FnMut(Instant),
    ) -> Result<Option<Released>, String> {
        let n = self.n;
        match ev {
            Event::PromptLogprobs(lp) => {
                for c in self.list[pi * n..(pi + 1) * n].iter_mut() {
                    c.prompt_logprobs = Some(lp.clone());
                }
                Ok(None)
            }
            Event::Token {
                index,
                token,
                logprob,
            } => {
                if self.first_token.is_none() {
                    let now = Instant::now();
                    self.first_token = Some(now);
                    on_first_token(now);
                }
                Ok(self.token(tokenizer, work, pi * n + index, token, logprob))
            }
            Event::Finished {
                index,
                reason,
                completion_tokens,
                cached_tokens,
                ..
            } => {
                self.usage.completion += completion_tokens;
                if index == 0 {
                    self.usage.cached += cached_tokens * n;
                }
                Ok(self.finished(work, pi * n + index, reason))
            }
            Event::Error(e) => Err(e),
            // Only an embedding request gets one, and it is no completion.
            Event::Embedding { .. } => Err("an embedding came back for a completion".into()),
        }
    }

    /// Choice `ci`'s next token: its text through the stop strings and the chat split; a
    /// stop string ends the choice.
    fn token(
        &mut self,
        tokenizer: &Tokenizer,
        work: &Work,
        ci: usize,
        token: u32,
        logprob: Option<TokenLogprob>,
    ) -> Option<Released> {
        let c = &mut self.list[ci];
        if c.finish.is_some() {
            return None;
        }
        let shown = work.rules.as_ref().is_some_and(|r| r.shows(token));
        let piece = c.text.push(tokenizer.token_bytes(token, shown), &work.stop);
        c.tokens.push(token);
        if let Some(lp) = &logprob {
            c.logprobs.push(lp.clone());
        }
        let mut deltas = c.deltas(piece);
        if c.text.stopped {
            deltas.extend(c.end());
            c.finish = Some(c.finish_reason("stop"));
            self.done += 1;
        }
        Some(Released {
            ci,
            deltas,
            logprob,
            finish: c.finish,
        })
    }

    /// The engine ended choice `ci` (its limit, or an end-of-generation token): what its
    /// text still held back is released with its finish reason.
    fn finished(&mut self, work: &Work, ci: usize, reason: FinishReason) -> Option<Released> {
        let c = &mut self.list[ci];
        if c.finish.is_some() {
            return None;
        }
        let tail = c.text.finish(&work.stop);
        let mut deltas = c.deltas(tail);
        deltas.extend(c.end());
        c.finish = Some(c.finish_reason(if reason == FinishReason::Length {
            "length"
        } else {
            "stop"
        }));
        self.done += 1;
        Some(Released {
            ci,
            deltas,
            logprob: None,
            finish: c.finish,
        })
    }

    /// How the request ended, for its log line: `result`, or (empty) the finish reasons.
    pub fn outcome(&self, result: &str) -> Outcome {
        let result = if result.is_empty() {
            let mut reasons: Vec<&str> = self
                .list
                .iter()
                .map(|c| c.finish.unwrap_or("none"))
                .collect();
            reasons.sort_unstable();
            reasons.dedup();
            reasons.join("+")
        } else {
            result.to_string()
        };
        Outcome {
            result,
            completion_tokens: self.list.iter().map(|c| c.tokens.len()).sum(),
            first_token: self.first_token,
        }
    }
}

impl Choice {
    /// Text released by the stop-string filter, as deltas (chat: split; completions: as is).
    fn deltas(&mut self, text: String) -> Vec<Delta> {
        match &mut self.chat {
            Some(out) => out.push(&text),
            None if text.is_empty() => Vec::new(),
            None => vec![Delta::Content(text)],
        }
    }

    /// The text is complete: what the chat split still held back.
    fn end(&mut self) -> Vec<Delta> {
        self.chat.as_mut().map(|o| o.finish()).unwrap_or_default()
    }

    /// "tool_calls" when the answer called tools, else `reason`; an answer that ended inside
    /// a call keeps `reason` ("length" for a token limit), as OpenAI's does.
    fn finish_reason(&self, reason: &'static str) -> &'static str {
        match &self.chat {
            Some(o) if !o.calls.is_empty() && !o.cut() => "tool_calls",
            _ => reason,
        }
    }
}
