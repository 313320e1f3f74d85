//! A chat answer as it streams in, split three ways: reasoning (`<think>…</think>` of Qwen3
//! and the DeepSeek-R1 distills, reported as `reasoning_content`), content, and tool calls.
//! Text that may still turn out to be a call is held back until it is known. Harmony answers
//! (gpt-oss) have their own parser (`harmony`); this type keeps the totals for both.

use super::call_stream::CallStream;
use super::harmony::HarmonyOutput;
use super::markers::partial_suffix;
use super::types::{Call, Delta, Syntax, Tool};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Think {
    /// Not a reasoning model, or its reasoning is over.
    Off,
    /// At the start of a reasoning model's answer: `<think>` may come.
    MayOpen,
    Inside,
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

pub struct ChatOutput {
    /// Where calls are possible: the answer's content, split into content and calls.
    calls_in: Option<CallStream>,
    think: Think,
    /// Set for a harmony answer, which it splits instead of the rest of this type.
    harmony: Option<HarmonyOutput>,
    /// Text not yet classified.
    buf: String,
    pub content: String,
    pub reasoning: String,
    pub calls: Vec<Call>,
}

impl ChatOutput {
    /// `tools`: the syntax and the offered tools when calls are possible. `reasoning`: the
    /// model thinks first; `opened`: the prompt already opened its `<think>` block.
    pub fn new(tools: Option<(Syntax, Vec<Tool>)>, reasoning: bool, opened: bool) -> ChatOutput {
        ChatOutput::with_calls(tools, false, reasoning, opened)
    }

    /// As `new`; `forced`: the request forces a call (of one of `tools`), so the whole answer
    /// after any reasoning is a call and never content.
    pub fn with_calls(
        tools: Option<(Syntax, Vec<Tool>)>,
        forced: bool,
        reasoning: bool,
        opened: bool,
    ) -> ChatOutput {
        let think = match (reasoning, opened) {
            (false, _) => Think::Off,
            (true, true) => Think::Inside,
            (true, false) => Think::MayOpen,
        };
        ChatOutput {
            calls_in: tools.map(|(syntax, tools)| CallStream::new(syntax, tools, forced)),
            think,
            harmony: None,
            buf: String::new(),
            content: String::new(),
            reasoning: String::new(),
            calls: Vec::new(),
        }
    }

    /// A harmony answer; calls of `tools` (none: calls stay content) are found.
    pub fn harmony(tools: Vec<Tool>) -> ChatOutput {
        let mut o = ChatOutput::new(None, false, false);
        o.harmony = Some(HarmonyOutput::new(tools));
        o
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        if let Some(h) = &mut self.harmony {
            let d = h.push(text);
            self.record(&d);
            return d;
        }
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.advance(false, &mut out);
        out
    }

    /// The answer is complete: everything held back is classified and released.
    pub fn finish(&mut self) -> Vec<Delta> {
        if let Some(h) = &mut self.harmony {
            let d = h.finish();
            self.record(&d);
            return d;
        }
        let mut out = Vec::new();
        self.advance(true, &mut out);
        if let Some(c) = &mut self.calls_in {
            let d = c.finish();
            self.record(&d);
            out.extend(d);
        }
        out
    }

    /// The answer ended inside a call (a token limit, a stop string): its calls are partial.
    pub fn cut(&self) -> bool {
        match (&self.harmony, &self.calls_in) {
            (Some(h), _) => h.cut,
            (None, Some(c)) => c.cut,
            (None, None) => false,
        }
    }

    fn advance(&mut self, end: bool, out: &mut Vec<Delta>) {
        loop {
            match self.think {
                Think::MayOpen => {
                    let t = self.buf.trim_start();
                    if let Some(rest) = t.strip_prefix(OPEN) {
                        self.buf = rest.to_string();
                        self.think = Think::Inside;
                    } else if !end && OPEN.starts_with(t) {
                        return; // maybe the start of `<think>`
                    } else {
                        self.think = Think::Off;
                    }
                }
                Think::Inside => {
                    if let Some(i) = self.buf.find(CLOSE) {
                        let r = self.buf[..i].to_string();
                        self.buf = self.buf[i + CLOSE.len()..].trim_start().to_string();
                        self.emit_reasoning(r, out);
                        self.think = Think::Off;
                    } else {
                        let keep = if end {
                            0
                        } else {
                            partial_suffix(&self.buf, CLOSE)
                        };
                        let r: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.emit_reasoning(r, out);
                        return;
                    }
                }
                Think::Off => {
                    let text = std::mem::take(&mut self.buf);
                    self.content_text(text, out);
                    return;
                }
            }
        }
    }

    /// Content text: straight out without tools; with tools, split into content and calls.
    fn content_text(&mut self, text: String, out: &mut Vec<Delta>) {
        let Some(c) = &mut self.calls_in else {
            self.emit_content(text, out);
            return;
        };
        let d = c.push(&text);
        self.record(&d);
        out.extend(d);
    }

    /// Adds what another parser released to the totals.
    fn record(&mut self, deltas: &[Delta]) {
        for d in deltas {
            match d {
                Delta::Content(t) => self.content.push_str(t),
                Delta::Reasoning(t) => self.reasoning.push_str(t),
                Delta::Call(_, c) => self.calls.push(c.clone()),
                Delta::CallStart(..) | Delta::CallArgs(..) => {}
            }
        }
    }

    fn emit_content(&mut self, text: String, out: &mut Vec<Delta>) {
        if !text.is_empty() {
            self.content.push_str(&text);
            out.push(Delta::Content(text));
        }
    }

    fn emit_reasoning(&mut self, text: String, out: &mut Vec<Delta>) {
        if !text.is_empty() {
            self.reasoning.push_str(&text);
            out.push(Delta::Reasoning(text));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn all(o: &mut ChatOutput, pieces: &[&str]) -> Vec<Delta> {
        let mut d: Vec<Delta> = pieces.iter().flat_map(|p| o.push(p)).collect();
        d.extend(o.finish());
        d
    }

    #[test]
    fn reasoning_is_split_from_content_across_pieces() {
        let mut o = ChatOutput::new(None, true, false);
        all(
            &mut o,
            &["<thi", "nk>I should ", "greet.</th", "ink>\n\nHello!"],
        );
        assert_eq!(o.reasoning, "I should greet.");
        assert_eq!(o.content, "Hello!");
        let mut o = ChatOutput::new(None, true, true);
        all(&mut o, &["hmm</think>Hi"]);
        assert_eq!((o.reasoning.as_str(), o.content.as_str()), ("hmm", "Hi"));
        let mut o = ChatOutput::new(None, true, false);
        all(&mut o, &["No thinking here."]);
        assert_eq!(
            (o.reasoning.as_str(), o.content.as_str()),
            ("", "No thinking here.")
        );
    }

    #[test]
    fn calls_are_held_back_and_parsed() {
        let tools: Vec<Tool> =
            serde_json::from_value(json!([{"type": "function", "function": {"name": "f"}}]))
                .unwrap();
        let mut o = ChatOutput::new(Some((Syntax::Hermes, tools.clone())), false, false);
        let d = all(
            &mut o,
            &[
                "Sure. <tool_",
                "call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>",
            ],
        );
        assert_eq!(d[0], Delta::Content("Sure. ".into()));
        assert_eq!(d[1], Delta::CallStart(0, "f".into()));
        assert!(matches!(&d[3], Delta::Call(0, c) if c.name == "f"));
        let mut o = ChatOutput::new(Some((Syntax::Generic, tools.clone())), false, false);
        let d = all(
            &mut o,
            &[
                "{\"tool_calls\": [{\"name\": \"f\", ",
                "\"arguments\": {}}]}",
            ],
        );
        assert_eq!(d.len(), 3);
        assert_eq!(o.content, "");
        let mut o = ChatOutput::new(Some((Syntax::Generic, tools.clone())), false, false);
        let d = all(&mut o, &["Plain ", "answer."]);
        assert_eq!(d[0], Delta::Content("Plain ".into()));
        assert_eq!(o.content, "Plain answer.");
        // A forced call cut short: its name and partial arguments, no content, `cut`.
        let mut o = ChatOutput::with_calls(Some((Syntax::Generic, tools)), true, true, false);
        let d = all(
            &mut o,
            &[
                "<think>hm</think>",
                "{\"tool_calls\": [{\"name",
                "\": \"f\", \"arguments\": {\"a\": ",
            ],
        );
        assert_eq!(d[0], Delta::Reasoning("hm".into()));
        assert_eq!(d[1], Delta::CallStart(0, "f".into()));
        assert_eq!(o.content, "");
        assert_eq!(o.calls[0].arguments, "{\"a\": ");
        assert!(o.cut());
    }
}
