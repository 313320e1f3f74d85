//! The harmony format of OpenAI's gpt-oss models: an answer is a run of messages, each a header
//! (channel, recipient) and a body, e.g.
//! `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…<|return|>`.
//! This file splits such an answer as it streams in: the `analysis` channel is reasoning, a
//! message addressed `to=functions.NAME` is a call of NAME (its body the arguments), anything
//! else is content. The markers never reach the client; text that may still be the start of a
//! marker is held back until it is known.
//!
//! In a gpt-oss vocabulary the markers are special tokens, but the parser reads text only (the
//! chat output renders them), so a vocabulary that spells them out works the same.

use super::call_scan::{lex_value, Lexed};
use super::markers::{
    partial_suffix, HARMONY_CHANNEL as CHANNEL, HARMONY_CONSTRAIN as CONSTRAIN, HARMONY_END as END,
    HARMONY_MARKERS as MARKERS, HARMONY_MESSAGE as MESSAGE, HARMONY_START as START,
};
use super::types::{Call, Delta, Tool};

/// A header longer than this is not one: a model that writes `<|channel|>` and then runs on
/// without `<|message|>` has its text shown as content instead of held back to the end.
const MAX_HEADER: usize = 256;

/// Where a message's body goes.
#[derive(Clone, Debug, PartialEq)]
enum Kind {
    Reasoning,
    Content,
    /// A call of the named function: the body is its arguments, held until the message ends.
    Call(String),
}

#[derive(Clone, Debug, PartialEq)]
enum State {
    /// Reading a header up to `<|message|>`. The answer starts here: the generation prompt
    /// ends with `<|start|>assistant`, so the first header is what follows the role.
    Header,
    Body(Kind),
    /// `<|return|>` or `<|call|>` ended the answer; nothing after it is read.
    Done,
}

pub struct HarmonyOutput {
    /// The tools the request offered: a call of any other stays content.
    tools: Vec<Tool>,
    state: State,
    /// Text not yet classified.
    buf: String,
    /// The arguments of the call message being read.
    args: String,
    /// How much of `args` went out (from its first `{`); `None` until the call starts.
    sent: Option<usize>,
    calls: usize,
    /// The answer ended inside a call.
    pub cut: bool,
}

impl HarmonyOutput {
    pub fn new(tools: Vec<Tool>) -> HarmonyOutput {
        HarmonyOutput {
            tools,
            state: State::Header,
            buf: String::new(),
            args: String::new(),
            sent: None,
            calls: 0,
            cut: false,
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        self.advance(false, &mut out);
        out
    }

    /// The answer is complete: the open message ends with it, and an unfinished header (only
    /// markers and names) is dropped.
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        self.advance(true, &mut out);
        out
    }

    fn advance(&mut self, end: bool, out: &mut Vec<Delta>) {
        loop {
            match self.state.clone() {
                State::Done => {
                    self.buf.clear();
                    return;
                }
                State::Header => {
                    if let Some(i) = self.buf.find(MESSAGE) {
                        self.state = State::Body(self.kind_of(&self.buf[..i]));
                        self.buf.drain(..i + MESSAGE.len());
                    } else if !could_be_header(&self.buf) {
                        // Not harmony: text outside any header is content.
                        self.state = State::Body(Kind::Content);
                    } else if self.buf.len() > MAX_HEADER {
                        let keep = if end { 0 } else { partial_marker(&self.buf) };
                        let text: String = self.buf.drain(..self.buf.len() - keep).collect();
                        self.emit(&Kind::Content, &strip_markers(&text), out);
                        self.state = State::Body(Kind::Content);
                    } else {
                        if end {
                            self.buf.clear();
                        }
                        return;
                    }
                }
                State::Body(kind) => {
                    if !self.body(kind, end, out) {
                        return;
                    }
                }
            }
        }
    }

    /// Reads a body up to its next marker; `false` when it needs more text (or the answer
    /// ended, closing the message).
    fn body(&mut self, kind: Kind, end: bool, out: &mut Vec<Delta>) -> bool {
        let next = MARKERS
            .iter()
            .filter_map(|m| self.buf.find(m).map(|i| (i, *m)))
            .min();
        let Some((i, marker)) = next else {
            let keep = if end { 0 } else { partial_marker(&self.buf) };
            let text: String = self.buf.drain(..self.buf.len() - keep).collect();
            self.emit(&kind, &text, out);
            if end {
                self.close(&kind, true, out);
            }
            return false;
        };
        let text: String = self.buf.drain(..i).collect();
        self.emit(&kind, &text, out);
        match marker {
            // Stray header markers inside a body carry nothing a client needs.
            MESSAGE | CONSTRAIN => {
                self.buf.drain(..marker.len());
            }
            // A new header without `<|end|>`: the body ends here; the header keeps its marker.
            START | CHANNEL => {
                self.close(&kind, false, out);
                self.state = State::Header;
            }
            END => {
                self.buf.drain(..marker.len());
                self.close(&kind, false, out);
                self.state = State::Header;
            }
            _ => {
                self.close(&kind, false, out);
                self.state = State::Done;
            }
        }
        true
    }

    fn emit(&mut self, kind: &Kind, text: &str, out: &mut Vec<Delta>) {
        if text.is_empty() {
            return;
        }
        match kind {
            Kind::Reasoning => out.push(Delta::Reasoning(text.to_string())),
            Kind::Content => out.push(Delta::Content(text.to_string())),
            Kind::Call(name) => {
                self.args.push_str(text);
                self.stream_call(name, out);
            }
        }
    }

    /// A call message's body as it grows: the call starts with its arguments' `{` (a body
    /// that is not an object is content), then its arguments go out as they are written.
    fn stream_call(&mut self, name: &str, out: &mut Vec<Delta>) {
        let body = self.args.trim_start();
        let sent = match self.sent {
            Some(n) => n,
            None if body.starts_with('{') => {
                out.push(Delta::CallStart(self.calls, name.to_string()));
                0
            }
            None => return,
        };
        let upto = match lex_value(body) {
            Lexed::Done(n) | Lexed::Broken(n) => n,
            Lexed::Open { .. } => body.len(),
        };
        if upto > sent {
            out.push(Delta::CallArgs(self.calls, body[sent..upto].to_string()));
        }
        self.sent = Some(upto.max(sent));
    }

    /// A message ends (`cut`: with the answer): a call ends with the arguments that went out
    /// — completed to valid JSON where the message closed early, as far as they went where
    /// the answer was cut — and a body that never started a call is content.
    fn close(&mut self, kind: &Kind, cut: bool, out: &mut Vec<Delta>) {
        let Kind::Call(name) = kind else { return };
        let args = std::mem::take(&mut self.args);
        let Some(sent) = self.sent.take() else {
            self.emit(&Kind::Content, &args, out);
            return;
        };
        let body = args.trim_start();
        // Cut inside arguments that were still valid: they stay as far as they went.
        let cut = cut && !matches!(lex_value(body), Lexed::Broken(_));
        let mut arguments = body[..sent].to_string();
        match lex_value(&arguments) {
            Lexed::Open { .. } if cut => self.cut = true,
            Lexed::Open { heal } => {
                out.push(Delta::CallArgs(self.calls, heal.clone()));
                arguments.push_str(&heal);
            }
            Lexed::Done(_) | Lexed::Broken(_) => {}
        }
        let call = Call {
            name: name.clone(),
            arguments,
        };
        out.push(Delta::Call(self.calls, call));
        self.calls += 1;
    }

    /// Where a message with `header` goes: a call of an offered function, reasoning on the
    /// `analysis` channel, else content (`final`, a `commentary` preamble, a channel this
    /// parser does not know: text addressed to the user is better shown than lost).
    fn kind_of(&self, header: &str) -> Kind {
        let (channel, recipient) = parse_header(header);
        if let Some(name) = recipient
            .as_deref()
            .and_then(|r| r.strip_prefix("functions."))
        {
            if self.tools.iter().any(|t| t.function.name == name) {
                return Kind::Call(name.to_string());
            }
        }
        match channel.as_deref() {
            Some("analysis") => Kind::Reasoning,
            _ => Kind::Content,
        }
    }
}

/// The channel (the word after `<|channel|>`) and the recipient (`to=…`) of a header.
fn parse_header(header: &str) -> (Option<String>, Option<String>) {
    let channel = header.find(CHANNEL).and_then(|i| {
        let rest = &header[i + CHANNEL.len()..];
        let word: String = rest
            .trim_start()
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect();
        (!word.is_empty()).then_some(word)
    });
    let spaced = MARKERS
        .iter()
        .fold(header.to_string(), |h, m| h.replace(m, " "));
    let recipient = spaced
        .split_whitespace()
        .find_map(|w| w.strip_prefix("to="))
        .filter(|r| !r.is_empty())
        .map(str::to_string);
    (channel, recipient)
}

/// Can `text`, all of a header read so far, still become one? Headers begin with a marker or
/// (right after the generation prompt's role) with the recipient.
fn could_be_header(text: &str) -> bool {
    let t = text.trim_start();
    [START, CHANNEL, MESSAGE, CONSTRAIN, "to="]
        .iter()
        .any(|p| t.starts_with(p) || p.starts_with(t))
}

/// The length of the longest end of `s` that begins some marker.
fn partial_marker(s: &str) -> usize {
    MARKERS
        .iter()
        .map(|m| partial_suffix(s, m))
        .max()
        .unwrap_or(0)
}

fn strip_markers(s: &str) -> String {
    MARKERS.iter().fold(s.to_string(), |t, m| t.replace(m, ""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn tools() -> Vec<Tool> {
        serde_json::from_value(json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])).unwrap()
    }

    /// The answer split whole: (reasoning, content, calls).
    fn split(pieces: &[&str]) -> (String, String, Vec<Call>) {
        let mut h = HarmonyOutput::new(tools());
        let mut deltas: Vec<Delta> = pieces.iter().flat_map(|p| h.push(p)).collect();
        deltas.extend(h.finish());
        let (mut r, mut c, mut calls) = (String::new(), String::new(), Vec::new());
        for d in deltas {
            match d {
                Delta::Reasoning(t) => r += &t,
                Delta::Content(t) => c += &t,
                Delta::Call(i, call) => {
                    assert_eq!(i, calls.len(), "calls are numbered in order");
                    calls.push(call);
                }
                Delta::CallStart(..) | Delta::CallArgs(..) => {}
            }
        }
        (r, c, calls)
    }

    const BOTH: &str = "<|channel|>analysis<|message|>The user greets; answer briefly.<|end|><|start|>assistant<|channel|>final<|message|>Hello! How can I help?<|return|>";

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let (r, c, calls) = split(&[BOTH]);
        assert_eq!(r, "The user greets; answer briefly.");
        assert_eq!(c, "Hello! How can I help?");
        assert!(calls.is_empty());
        let (r, c, _) = split(&["<|channel|>final<|message|>Just this.<|return|>"]);
        assert_eq!((r.as_str(), c.as_str()), ("", "Just this."));
        // Ended by the stop string (the parser never sees `<|return|>`).
        let (_, c, _) = split(&["<|channel|>final<|message|>Cut here"]);
        assert_eq!(c, "Cut here");
    }

    #[test]
    fn calls_with_the_recipient_after_or_before_the_channel() {
        for out in [
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>",
            " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Paris\"}<|call|>",
            "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}",
        ] {
            let (_, c, calls) = split(&[out]);
            assert_eq!(c, "", "{out}");
            assert_eq!(calls.len(), 1, "{out}");
            assert_eq!(calls[0].name, "get_weather");
            assert_eq!(
                serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
                json!({"city": "Paris"})
            );
        }
    }

    #[test]
    fn unknown_calls_bad_arguments_and_preambles_are_content() {
        let (_, c, calls) =
            split(&["<|channel|>commentary to=functions.launch json<|message|>{\"x\":1}<|call|>"]);
        assert_eq!((c.as_str(), calls.len()), ("{\"x\":1}", 0));
        let (_, c, calls) = split(&[
            "<|channel|>commentary to=functions.get_weather json<|message|>not json<|call|>",
        ]);
        assert_eq!((c.as_str(), calls.len()), ("not json", 0));
        let (_, c, calls) = split(&["<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{}<|call|>"]);
        assert_eq!((c.as_str(), calls.len()), ("Checking the weather.", 1));
    }

    #[test]
    fn unknown_channels_and_plain_text_are_content() {
        let (r, c, _) = split(&["<|channel|>notes<|message|>Shown.<|end|>"]);
        assert_eq!((r.as_str(), c.as_str()), ("", "Shown."));
        let (_, c, _) = split(&["Hello there, no format at all."]);
        assert_eq!(c, "Hello there, no format at all.");
        // Text after the end of the answer is not read.
        let (_, c, _) = split(&["<|channel|>final<|message|>A<|return|>B"]);
        assert_eq!(c, "A");
        // A header that never ends is shown (without its markers) rather than held forever.
        let long = format!("<|channel|>{}", "x".repeat(300));
        let (_, c, _) = split(&[&long]);
        assert_eq!(c, "x".repeat(300));
        let (r, c, _) = split(&["<|channel|>analysis"]);
        assert_eq!((r.as_str(), c.as_str()), ("", ""));
    }

    /// A small deterministic generator (no dependency): chunk sizes 1 to 3 chars.
    fn chunks(text: &str, seed: u64) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut out = Vec::new();
        let mut i = 0;
        while i < chars.len() {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = 1 + (state >> 33) as usize % 3;
            out.push(chars[i..(i + n).min(chars.len())].iter().collect());
            i += n;
        }
        out
    }

    #[test]
    fn streaming_in_small_pieces_gives_the_whole_result_and_never_leaks_markers() {
        let texts = [
            BOTH,
            "<|channel|>analysis<|message|>Weather é needed<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Köln\"}<|call|>",
            "<|channel|>commentary<|message|>One moment<|end|><|start|>assistant<|channel|>final<|message|>Done <|| <| |>.<|return|>",
        ];
        for text in texts {
            let whole = split(&[text]);
            // Deltas join into these: no marker split over two pieces shows either.
            for t in [&whole.0, &whole.1] {
                assert!(MARKERS.iter().all(|m| !t.contains(m)), "{t:?} leaked");
            }
            for seed in 0..50 {
                let pieces = chunks(text, seed);
                let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
                let mut h = HarmonyOutput::new(tools());
                for p in &refs {
                    for d in h.push(p) {
                        if let Delta::Content(t) | Delta::Reasoning(t) = &d {
                            assert!(MARKERS.iter().all(|m| !t.contains(m)), "{t:?} leaked");
                        }
                    }
                }
                assert_eq!(split(&refs), whole, "seed {seed}: {refs:?}");
            }
        }
        assert_eq!(split(&[texts[2]]).1, "One momentDone <|| <| |>.");
    }
}
