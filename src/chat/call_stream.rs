//! A chat answer's content as it streams in, where tools may be called: calls go out as they
//! grow (a call's start once its name is fixed, then fragments of its arguments), the rest as
//! content. Text that may still turn out to be a call is held back until it is known.
//!
//! When the request forces a call (`tool_choice` `required` or named) the grammar makes the
//! whole answer a call, so nothing of it is ever content: a name is fixed as soon as one
//! offered tool begins with what was written of it, and an answer cut short still ends its
//! call (partial arguments, `cut`). Otherwise a call is known once a complete name of an
//! offered tool is read where the syntax puts it.
//!
//! Each call's arguments go out as the model writes them, so a call's `arguments` are exactly
//! the text of its fragments (compact JSON under a grammar; whatever spacing the model chose
//! otherwise).

use super::call_scan::{lex_value, Lexed, Partial, Region};
use super::calls::parse_calls;
use super::markers::{partial_suffix, HERMES_OPEN, MISTRAL_CALLS};
use super::types::{whole_call, Call, Delta, Syntax, Tool};

/// What went out of one call of the current region.
struct Sent {
    name: String,
    args: String,
    done: bool,
}

pub struct CallStream {
    syntax: Syntax,
    /// The tools a call may name (only the named one when the choice names one).
    tools: Vec<Tool>,
    forced: bool,
    /// Text from where a call may begin, not yet classified.
    held: String,
    /// The calls of the region `held` begins with, as far as they went out.
    sent: Vec<Sent>,
    /// Calls completed in earlier regions.
    base: usize,
    /// JSON syntaxes, whose region is the whole answer: it is settled (all of it was read as
    /// calls, or none of it is), and whatever follows is content.
    settled: bool,
    /// The answer ended inside a call.
    pub cut: bool,
}

impl CallStream {
    pub fn new(syntax: Syntax, tools: Vec<Tool>, forced: bool) -> CallStream {
        CallStream {
            syntax,
            tools,
            forced,
            held: String::new(),
            sent: Vec::new(),
            base: 0,
            settled: false,
            cut: false,
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        self.held.push_str(text);
        let mut out = Vec::new();
        self.start_the_only_call(&mut out);
        self.advance(false, &mut out);
        out
    }

    /// The answer is complete: an open call ends as far as it went (cut), and text held back
    /// is parsed whole (a forced call's unfinished syntax is dropped).
    pub fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        self.advance(true, &mut out);
        let held = std::mem::take(&mut self.held);
        if !self.sent.is_empty() {
            // Calls still in their region: the answer ended before the syntax did.
            self.cut = true;
            self.end_open_calls(None, &mut out);
        } else if !self.forced {
            let (text, calls) = parse_calls(self.syntax, &held, &self.tools);
            self.content(text, &mut out);
            for c in calls {
                out.extend(whole_call(self.base, c));
                self.base += 1;
            }
        }
        out
    }

    /// A forced call of the one tool it may call: its name is fixed before any of it is
    /// written.
    fn start_the_only_call(&mut self, out: &mut Vec<Delta>) {
        if self.forced && self.tools.len() == 1 && self.base == 0 && self.sent.is_empty() {
            self.start(self.tools[0].function.name.clone(), out);
        }
    }

    fn advance(&mut self, end: bool, out: &mut Vec<Delta>) {
        loop {
            if self.settled {
                let rest = std::mem::take(&mut self.held);
                self.content(rest, out);
                return;
            }
            if let Some(marker) = self.marker() {
                // Text before the region's marker cannot be a call.
                let start = self.held.find(marker).unwrap_or(if end {
                    self.held.len()
                } else {
                    self.held.len() - partial_suffix(&self.held, marker)
                });
                // Whitespace between calls (and after the last) is the syntax's, not content.
                let spacing = self.base > 0 && self.held[..start].trim().is_empty();
                if spacing && start == self.held.len() && !end {
                    return;
                }
                let free: String = self.held.drain(..start).collect();
                if !spacing {
                    self.content(free, out);
                }
                if self.held.is_empty() {
                    return;
                }
            }
            let region = Region::of(self.syntax, &self.held);
            let unknown = self.stream(&region, out);
            match (region.end, unknown.or(region.broken)) {
                (_, Some(at)) => self.broken(at, out),
                (Some(end), None) => self.region_ends(end, out),
                (None, None) => return,
            }
        }
    }

    /// The marker that opens a region, for syntaxes that mark calls in free text.
    fn marker(&self) -> Option<&'static str> {
        match self.syntax {
            Syntax::Hermes => Some(HERMES_OPEN),
            Syntax::Mistral => Some(MISTRAL_CALLS),
            _ => None,
        }
    }

    /// Sends what `region` adds to its calls; where a call names a tool not offered, the
    /// region is not a call from there.
    fn stream(&mut self, region: &Region, out: &mut Vec<Delta>) -> Option<usize> {
        for (k, p) in region.calls.iter().enumerate() {
            if k == self.sent.len() {
                match self.known_name(p) {
                    Some(name) => self.start(name, out),
                    None if matches!(p.name, Some((_, true))) => return Some(p.at),
                    None => return None,
                }
            }
            self.more_args(k, p, out);
        }
        None
    }

    /// The call's name, once it is fixed: complete and offered, or (forced) the only offered
    /// name that begins with what was written.
    fn known_name(&self, p: &Partial) -> Option<String> {
        let (name, complete) = p.name.as_ref()?;
        let names = self.tools.iter().map(|t| &t.function.name);
        let mut fits: Vec<&String> = if *complete {
            names.filter(|n| *n == name).collect()
        } else if self.forced {
            names.filter(|n| n.starts_with(name.as_str())).collect()
        } else {
            Vec::new()
        };
        fits.dedup();
        match fits[..] {
            [only] => Some(only.clone()),
            _ => None,
        }
    }

    fn start(&mut self, name: String, out: &mut Vec<Delta>) {
        out.push(Delta::CallStart(self.base + self.sent.len(), name.clone()));
        self.sent.push(Sent {
            name,
            args: String::new(),
            done: false,
        });
    }

    /// Sends call `k`'s new argument text, and its end once it is complete.
    fn more_args(&mut self, k: usize, p: &Partial, out: &mut Vec<Delta>) {
        let index = self.base + k;
        let sent = &mut self.sent[k];
        if sent.done {
            return;
        }
        if let Some((start, lexed)) = &p.args {
            let upto = match lexed {
                Lexed::Done(n) | Lexed::Broken(n) => start + n,
                Lexed::Open { .. } => self.held.len(),
            };
            let new = &self.held[start + sent.args.len()..upto];
            if !new.is_empty() {
                sent.args.push_str(new);
                out.push(Delta::CallArgs(index, new.to_string()));
            }
        }
        if p.end.is_some() {
            if p.args.is_none() {
                // A call written without arguments takes none.
                sent.args.push_str("{}");
                out.push(Delta::CallArgs(index, "{}".into()));
            }
            sent.done = true;
            let call = Call {
                name: sent.name.clone(),
                arguments: sent.args.clone(),
            };
            out.push(Delta::Call(index, call));
        }
    }

    /// Ends every call that went out and is not complete: with `heal` (text that completes
    /// its arguments' JSON) or as far as it went.
    fn end_open_calls(&mut self, heal: Option<&dyn Fn(&str) -> String>, out: &mut Vec<Delta>) {
        for (k, sent) in self.sent.iter_mut().enumerate() {
            if sent.done {
                continue;
            }
            let index = self.base + k;
            let more = match heal {
                Some(heal) => heal(&sent.args),
                None => String::new(),
            };
            if !more.is_empty() {
                sent.args.push_str(&more);
                out.push(Delta::CallArgs(index, more));
            }
            sent.done = true;
            let call = Call {
                name: sent.name.clone(),
                arguments: sent.args.clone(),
            };
            out.push(Delta::Call(index, call));
        }
    }

    /// The region is complete at `end`: its calls all went out.
    fn region_ends(&mut self, end: usize, out: &mut Vec<Delta>) {
        let region: String = self.held.drain(..end).collect();
        if self.sent.is_empty() {
            // A syntax with no call in it (an empty list) is only text.
            self.content(region, out);
        }
        self.next_region();
    }

    /// The text left the syntax at `at`. Calls that went out end there (their arguments
    /// completed to valid JSON); what follows is content. A region that had no call is all
    /// content up to there.
    fn broken(&mut self, at: usize, out: &mut Vec<Delta>) {
        let upto = match self.marker() {
            Some(m) if self.sent.is_empty() => at.max(m.len()),
            _ => at,
        };
        let text: String = self.held.drain(..upto).collect();
        if self.sent.is_empty() {
            self.content(text, out);
        } else {
            self.end_open_calls(Some(&heal_args), out);
        }
        self.next_region();
    }

    fn next_region(&mut self) {
        self.base += self.sent.len();
        self.sent.clear();
        if self.marker().is_none() {
            self.settled = true;
        }
    }

    /// Content, except where a call is forced: the grammar makes all of that answer a call,
    /// so its text is syntax (an unfinished one) and never content.
    fn content(&mut self, text: String, out: &mut Vec<Delta>) {
        if !text.is_empty() && !self.forced {
            out.push(Delta::Content(text));
        }
    }
}

/// Text that completes `args` (the start of a JSON object) into valid JSON.
fn heal_args(args: &str) -> String {
    if args.is_empty() {
        return "{}".into();
    }
    match lex_value(args) {
        Lexed::Open { heal } => heal,
        Lexed::Done(_) | Lexed::Broken(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn tools() -> Vec<Tool> {
        serde_json::from_value(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "get_time"}},
            {"type": "function", "function": {"name": "set_lamp"}}
        ]))
        .unwrap()
    }

    /// Every delta of `pieces` pushed one by one, then finished.
    fn run(s: &mut CallStream, pieces: &[&str]) -> Vec<Delta> {
        let mut d: Vec<Delta> = pieces.iter().flat_map(|p| s.push(p)).collect();
        d.extend(s.finish());
        d
    }

    /// Checks the contract (one start, fragments that add up, one end per call, in order)
    /// and returns (content, calls).
    fn check(deltas: &[Delta]) -> (String, Vec<Call>) {
        let mut content = String::new();
        let mut calls: Vec<Call> = Vec::new();
        let mut open: Option<(usize, String, String)> = None;
        for d in deltas {
            match d {
                Delta::Content(t) => content.push_str(t),
                Delta::CallStart(i, name) => {
                    assert!(open.is_none(), "{deltas:?}");
                    assert_eq!(*i, calls.len());
                    open = Some((*i, name.clone(), String::new()));
                }
                Delta::CallArgs(i, a) => {
                    let o = open.as_mut().expect("args after a start");
                    assert_eq!(*i, o.0);
                    o.2.push_str(a);
                }
                Delta::Call(i, c) => {
                    let (oi, name, args) = open.take().expect("an end after a start");
                    assert_eq!((*i, &name, &args), (oi, &c.name, &c.arguments));
                    calls.push(c.clone());
                }
                Delta::Reasoning(_) => panic!("no reasoning here"),
            }
        }
        assert!(open.is_none(), "every call ends: {deltas:?}");
        (content, calls)
    }

    /// Splits `text` every `n` chars.
    fn pieces(text: &str, n: usize) -> Vec<String> {
        let chars: Vec<char> = text.chars().collect();
        chars.chunks(n).map(|c| c.iter().collect()).collect()
    }

    #[test]
    fn calls_stream_as_they_grow_in_every_syntax() {
        let cases = [
            (
                Syntax::Generic,
                r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "set_lamp", "arguments": {}}]}"#,
            ),
            (
                Syntax::Hermes,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"set_lamp\", \"arguments\": {}}\n</tool_call>",
            ),
            (
                Syntax::Llama3,
                r#"<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}"#,
            ),
            (
                Syntax::Mistral,
                r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "set_lamp", "arguments": {}}]"#,
            ),
            (
                Syntax::Mistral,
                r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]set_lamp[ARGS]{}"#,
            ),
        ];
        for (syntax, text) in cases {
            for forced in [false, true] {
                for n in [1, 3, 1000] {
                    let parts = pieces(text, n);
                    let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                    let mut s = CallStream::new(syntax, tools(), forced);
                    let deltas = run(&mut s, &refs);
                    let (content, calls) = check(&deltas);
                    assert_eq!(content, "", "{syntax:?} {text}");
                    assert_eq!(calls[0].name, "get_weather");
                    assert_eq!(
                        serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
                        json!({"city": "Paris"})
                    );
                    assert!(!s.cut);
                    if n == 1 {
                        let fragments = deltas
                            .iter()
                            .filter(|d| matches!(d, Delta::CallArgs(0, _)))
                            .count();
                        assert!(fragments > 5, "{syntax:?}: streamed, not whole");
                    }
                }
            }
        }
    }

    #[test]
    fn a_forced_name_is_fixed_by_a_unique_prefix_and_an_auto_one_when_complete() {
        let mut s = CallStream::new(Syntax::Generic, tools(), true);
        let d = s.push(r#"{"tool_calls": [{"name": "get_"#);
        assert!(d.is_empty(), "get_weather or get_time: {d:?}");
        let d = s.push("w");
        assert_eq!(d, [Delta::CallStart(0, "get_weather".into())]);
        let mut s = CallStream::new(Syntax::Generic, tools(), false);
        assert!(s
            .push(r#"{"tool_calls": [{"name": "get_weather"#)
            .is_empty());
        assert_eq!(s.push("\", "), [Delta::CallStart(0, "get_weather".into())]);
        // One tool to call: known before the model writes anything.
        let one = vec![tools().remove(0)];
        let mut s = CallStream::new(Syntax::Hermes, one, true);
        assert_eq!(s.push("<tool"), [Delta::CallStart(0, "get_weather".into())]);
    }

    #[test]
    fn a_cut_forced_call_keeps_its_name_and_partial_arguments_and_no_content() {
        for (syntax, text) in [
            (
                Syntax::Generic,
                r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Pa"#,
            ),
            (
                Syntax::Hermes,
                "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa",
            ),
            (
                Syntax::Mistral,
                r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Pa"#,
            ),
        ] {
            let mut s = CallStream::new(syntax, tools(), true);
            let (content, calls) = check(&run(&mut s, &[text]));
            assert_eq!(content, "");
            assert_eq!(calls.len(), 1);
            assert_eq!(calls[0].name, "get_weather");
            assert_eq!(calls[0].arguments, r#"{"city": "Pa"#);
            assert!(s.cut, "{syntax:?}");
        }
        // Cut before a name is fixed: nothing at all.
        let mut s = CallStream::new(Syntax::Generic, tools(), true);
        assert!(run(&mut s, &[r#"{"tool_calls": [{"na"#]).is_empty());
        // Complete calls but an unclosed envelope are cut too.
        let mut s = CallStream::new(Syntax::Generic, tools(), true);
        let text = r#"{"tool_calls": [{"name": "set_lamp", "arguments": {}}"#;
        let (_, calls) = check(&run(&mut s, &[text]));
        assert_eq!((calls.len(), s.cut), (1, true));
    }

    #[test]
    fn auto_answers_that_are_not_calls_are_content() {
        for (syntax, text) in [
            (Syntax::Generic, "Plain answer."),
            (Syntax::Generic, r#"{"answer": 42}"#),
            (
                Syntax::Generic,
                r#"{"tool_calls": [{"name": "launch", "arguments": {}}]}"#,
            ),
            (Syntax::Hermes, "Use <tool_call> tags."),
            (Syntax::Llama3, "<b>bold</b>"),
            (Syntax::Mistral, "No [TOOL_CALLS] here"),
        ] {
            for n in [1, 1000] {
                let parts = pieces(text, n);
                let refs: Vec<&str> = parts.iter().map(String::as_str).collect();
                let mut s = CallStream::new(syntax, tools(), false);
                let (content, calls) = check(&run(&mut s, &refs));
                assert_eq!((content.as_str(), calls.len()), (text, 0), "{syntax:?}");
            }
        }
    }

    #[test]
    fn content_around_calls_and_broken_arguments() {
        let mut s = CallStream::new(Syntax::Hermes, tools(), false);
        let (content, calls) = check(&run(
            &mut s,
            &[
                "Let me check. <tool_ca",
                "ll>{\"name\": \"get_time\", \"arguments\": {}}</tool_call> Done.",
            ],
        ));
        assert_eq!((content.as_str(), calls.len()), ("Let me check.  Done.", 1));
        // An auto call whose arguments break off ends with valid JSON; the rest is content.
        let mut s = CallStream::new(Syntax::Generic, tools(), false);
        let text = r#"{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo" oops"#;
        let (content, calls) = check(&run(&mut s, &[text]));
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"city": "Oslo"})
        );
        assert_eq!(content, "oops");
        assert!(!s.cut);
    }
}
