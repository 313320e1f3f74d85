//! Reading tool calls while they are generated: a JSON lexer that says how far a value's text
//! goes (complete, a prefix still open, or broken), and, for each call syntax, how far its
//! calls go (name, arguments, end). `call_stream` turns these readings into deltas; the text
//! is read again from the region's start on each token (calls are short, and a rescan cannot
//! drift from the text the way incremental state can).

use super::markers::{
    HERMES_CLOSE, HERMES_OPEN, MISTRAL_ARGS, MISTRAL_CALLS, MISTRAL_CALL_ID, PYTHON_TAG,
};
use super::types::Syntax;

/// How far a JSON value's text goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Lexed {
    /// The value is complete after this many bytes.
    Done(usize),
    /// All the text is the start of a value; `heal` is text that would complete it.
    Open { heal: String },
    /// The text stops being JSON after this many bytes (all before is a valid start).
    Broken(usize),
}

/// Where the lexer is in a value.
#[derive(Clone, Copy, Debug, PartialEq)]
enum St {
    /// A value is due (after `:`, `,` in an array, or at the start).
    Value,
    /// Just after `[`: a value or `]`.
    FirstValue,
    /// After `,` in an object: a key is due.
    Key,
    /// Just after `{`: a key or `}`.
    FirstKey,
    Colon,
    /// After a value: `,` or the container's end.
    After,
    Str {
        key: bool,
    },
    Esc {
        key: bool,
    },
    Hex {
        key: bool,
        left: u8,
    },
    Num(Num),
    Lit(&'static str, usize),
}

/// Where the lexer is in a number (JSON's grammar, one state per position).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

impl Num {
    fn next(self, c: char) -> Option<Num> {
        let digit = c.is_ascii_digit();
        Some(match (self, c) {
            (Num::Minus, '0') => Num::Zero,
            (Num::Minus, _) if digit => Num::Int,
            (Num::Int, _) if digit => Num::Int,
            (Num::Zero | Num::Int, '.') => Num::Dot,
            (Num::Dot | Num::Frac, _) if digit => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, 'e' | 'E') => Num::E,
            (Num::E, '+' | '-') => Num::ESign,
            (Num::E | Num::ESign | Num::Exp, _) if digit => Num::Exp,
            _ => return None,
        })
    }

    /// Can the number end here?
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::Exp)
    }
}

/// How far the JSON value at the start of `s` goes.
pub fn lex_value(s: &str) -> Lexed {
    let mut st = St::Value;
    let mut stack: Vec<char> = Vec::new();
    for (i, c) in s.char_indices() {
        if let St::Num(n) = st {
            if n.next(c).is_none() && n.complete() && stack.is_empty() {
                return Lexed::Done(i);
            }
        }
        match step(st, c, &mut stack) {
            Some(next) => st = next,
            None => return Lexed::Broken(i),
        }
        if st == St::After && stack.is_empty() {
            return Lexed::Done(i + c.len_utf8());
        }
    }
    Lexed::Open {
        heal: heal(st, &stack),
    }
}

fn step(st: St, c: char, stack: &mut Vec<char>) -> Option<St> {
    let ws = matches!(c, ' ' | '\t' | '\n' | '\r');
    Some(match st {
        St::Value | St::FirstValue | St::Key | St::FirstKey | St::Colon | St::After if ws => st,
        St::FirstValue if c == ']' => close(stack),
        St::Value | St::FirstValue => open_value(c, stack)?,
        St::FirstKey if c == '}' => close(stack),
        St::Key | St::FirstKey if c == '"' => St::Str { key: true },
        St::Colon if c == ':' => St::Value,
        St::After => match (c, stack.last()) {
            (',', Some('{')) => St::Key,
            (',', Some('[')) => St::Value,
            ('}', Some('{')) | (']', Some('[')) => close(stack),
            _ => return None,
        },
        St::Str { key } => match c {
            '"' if key => St::Colon,
            '"' => St::After,
            '\\' => St::Esc { key },
            c if (c as u32) < 0x20 => return None,
            _ => st,
        },
        St::Esc { key } => match c {
            '"' | '\\' | '/' | 'b' | 'f' | 'n' | 'r' | 't' => St::Str { key },
            'u' => St::Hex { key, left: 4 },
            _ => return None,
        },
        St::Hex { key, left } if c.is_ascii_hexdigit() => match left {
            1 => St::Str { key },
            _ => St::Hex {
                key,
                left: left - 1,
            },
        },
        St::Num(n) => match n.next(c) {
            Some(next) => St::Num(next),
            // The number ended; the character belongs to what follows it.
            None if n.complete() => step(St::After, c, stack)?,
            None => return None,
        },
        St::Lit(word, at) if word[at..].starts_with(c) => match at + 1 == word.len() {
            true => St::After,
            false => St::Lit(word, at + 1),
        },
        _ => return None,
    })
}

fn open_value(c: char, stack: &mut Vec<char>) -> Option<St> {
    Some(match c {
        '{' => {
            stack.push('{');
            St::FirstKey
        }
        '[' => {
            stack.push('[');
            St::FirstValue
        }
        '"' => St::Str { key: false },
        '-' => St::Num(Num::Minus),
        '0' => St::Num(Num::Zero),
        '1'..='9' => St::Num(Num::Int),
        't' => St::Lit("true", 1),
        'f' => St::Lit("false", 1),
        'n' => St::Lit("null", 1),
        _ => return None,
    })
}

fn close(stack: &mut Vec<char>) -> St {
    stack.pop();
    St::After
}

/// Text that completes a value left in `st` with `stack` open: the shortest valid ending
/// (a key left without its value gets `null`).
fn heal(st: St, stack: &[char]) -> String {
    let key_rest = |key: bool| if key { ": null" } else { "" };
    let mut h = match st {
        St::Str { key } => format!("\"{}", key_rest(key)),
        St::Esc { key } => format!("\\\"{}", key_rest(key)),
        St::Hex { key, left } => format!("{}\"{}", "0".repeat(left as usize), key_rest(key)),
        St::Num(n) if !n.complete() => "0".into(),
        St::Lit(word, at) => word[at..].into(),
        St::Value => "null".into(),
        St::Key => "\"\": null".into(),
        St::Colon => ": null".into(),
        _ => String::new(),
    };
    h.extend(
        stack
            .iter()
            .rev()
            .map(|&c| if c == '{' { '}' } else { ']' }),
    );
    h
}

/// One call as far as the text goes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Partial {
    /// Where the call begins.
    pub at: usize,
    /// The name's text so far, and whether it is complete.
    pub name: Option<(String, bool)>,
    /// Where the arguments' text begins, and how far it goes from there.
    pub args: Option<(usize, Lexed)>,
    /// Where the call ends (it is complete).
    pub end: Option<usize>,
}

/// A syntax's calls read from the start of a region of text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub calls: Vec<Partial>,
    /// The syntax ended after this many bytes (what follows is not part of it).
    pub end: Option<usize>,
    /// The text left the syntax here.
    pub broken: Option<usize>,
}

/// Why a reading stopped before the syntax ended.
enum Stop {
    /// The text ends inside the syntax.
    More,
    Broken(usize),
}

/// The argument keys of a call object: Llama 3 writes `parameters`, the others `arguments`.
const ARGS: [&str; 2] = ["arguments", "parameters"];

impl Region {
    /// Reads `s` as `syntax`'s calls. Hermes and Mistral regions begin with their marker
    /// (one `<tool_call>` block; one `[TOOL_CALLS]` list or call); the JSON syntaxes' region
    /// is the whole answer. Harmony has its own parser.
    pub fn of(syntax: Syntax, s: &str) -> Region {
        let mut r = Region::default();
        let read = match syntax {
            Syntax::Generic => generic(s, &mut r),
            Syntax::Llama3 => llama3(s, &mut r),
            Syntax::Hermes => hermes(s, &mut r),
            Syntax::Mistral => mistral(s, &mut r),
            Syntax::Harmony => Err(Stop::Broken(0)),
        };
        match read {
            Ok(end) => r.end = Some(end),
            Err(Stop::Broken(at)) => r.broken = Some(at),
            Err(Stop::More) => {}
        }
        r
    }
}

fn skip_ws(s: &str, i: usize) -> usize {
    i + s[i..].len() - s[i..].trim_start().len()
}

/// `lit` after optional whitespace.
fn literal(s: &str, i: usize, lit: &str) -> Result<usize, Stop> {
    let i = skip_ws(s, i);
    let rest = &s[i..];
    if rest.starts_with(lit) {
        Ok(i + lit.len())
    } else if lit.starts_with(rest) {
        Err(Stop::More)
    } else {
        Err(Stop::Broken(i))
    }
}

/// A complete JSON string after optional whitespace: its value and where it ends.
fn string(s: &str, i: usize) -> Result<(String, usize), Stop> {
    let i = skip_ws(s, i);
    match s[i..].chars().next() {
        None => return Err(Stop::More),
        Some('"') => {}
        Some(_) => return Err(Stop::Broken(i)),
    }
    match lex_value(&s[i..]) {
        Lexed::Done(n) => serde_json::from_str(&s[i..i + n])
            .map(|v| (v, i + n))
            .map_err(|_| Stop::Broken(i)),
        Lexed::Open { .. } => Err(Stop::More),
        Lexed::Broken(n) => Err(Stop::Broken(i + n)),
    }
}

/// `{"name": ..., "arguments": {...}}` (keys in any order; others skipped), read into a new
/// call of `r`.
fn call_object(s: &str, i: usize, r: &mut Region) -> Result<usize, Stop> {
    let at = skip_ws(s, i);
    let mut i = literal(s, at, "{")?;
    r.calls.push(Partial {
        at,
        ..Default::default()
    });
    let k = r.calls.len() - 1;
    if let Ok(end) = literal(s, i, "}") {
        r.calls[k].end = Some(end);
        return Ok(end);
    }
    loop {
        let (key, after) = string(s, i)?;
        i = skip_ws(s, literal(s, after, ":")?);
        if i == s.len() {
            return Err(Stop::More);
        }
        let lexed = lex_value(&s[i..]);
        if key == "name" {
            if !s[i..].starts_with('"') {
                return Err(Stop::Broken(i));
            }
            r.calls[k].name = Some(match &lexed {
                Lexed::Done(_) => (string(s, i)?.0, true),
                _ => (s[i + 1..].to_string(), false),
            });
        } else if ARGS.contains(&key.as_str()) {
            if !s[i..].starts_with('{') {
                return Err(Stop::Broken(i));
            }
            r.calls[k].args = Some((i, lexed.clone()));
        }
        i = match lexed {
            Lexed::Done(n) => i + n,
            Lexed::Open { .. } => return Err(Stop::More),
            Lexed::Broken(n) => return Err(Stop::Broken(i + n)),
        };
        i = skip_ws(s, i);
        match s[i..].chars().next() {
            None => return Err(Stop::More),
            Some(',') => i += 1,
            Some('}') => {
                r.calls[k].end = Some(i + 1);
                return Ok(i + 1);
            }
            Some(_) => return Err(Stop::Broken(i)),
        }
    }
}

/// Call objects in a JSON list, `[` already read: `call, call]`.
fn call_list(s: &str, mut i: usize, r: &mut Region) -> Result<usize, Stop> {
    loop {
        i = skip_ws(s, call_object(s, i, r)?);
        match s[i..].chars().next() {
            None => return Err(Stop::More),
            Some(',') => i += 1,
            Some(']') => return Ok(i + 1),
            Some(_) => return Err(Stop::Broken(i)),
        }
    }
}

/// `{"tool_calls": [call, ...]}`.
fn generic(s: &str, r: &mut Region) -> Result<usize, Stop> {
    let mut i = 0;
    for lit in ["{", "\"tool_calls\"", ":", "["] {
        i = literal(s, i, lit)?;
    }
    let i = call_list(s, i, r)?;
    literal(s, i, "}")
}

/// `<|python_tag|>`(optional) and one call object.
fn llama3(s: &str, r: &mut Region) -> Result<usize, Stop> {
    let i = match literal(s, 0, PYTHON_TAG) {
        Ok(i) => i,
        Err(Stop::More) => return Err(Stop::More),
        Err(Stop::Broken(_)) => 0,
    };
    call_object(s, i, r)
}

/// `<tool_call>` call object `</tool_call>`.
fn hermes(s: &str, r: &mut Region) -> Result<usize, Stop> {
    let i = literal(s, 0, HERMES_OPEN)?;
    let i = call_object(s, i, r)?;
    literal(s, i, HERMES_CLOSE)
}

/// `[TOOL_CALLS]` and then a JSON list of call objects (Mistral Nemo, Magistral), or one
/// call as `NAME[ARGS]{...}` (newer Mistral templates; some put `[CALL_ID]id` before
/// `[ARGS]`), where each further call has its own `[TOOL_CALLS]`.
fn mistral(s: &str, r: &mut Region) -> Result<usize, Stop> {
    let i = literal(s, 0, MISTRAL_CALLS)?;
    let i = skip_ws(s, i);
    match s[i..].chars().next() {
        None => Err(Stop::More),
        Some('[') => call_list(s, i + 1, r),
        Some(_) => mistral_named(s, i, r),
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == '-'
}

/// `NAME([CALL_ID]ID)?[ARGS]{...}` from `i`.
fn mistral_named(s: &str, i: usize, r: &mut Region) -> Result<usize, Stop> {
    let name_len = s[i..].len() - s[i..].trim_start_matches(is_name_char).len();
    let mut j = i + name_len;
    r.calls.push(Partial {
        at: i,
        name: (name_len > 0).then(|| (s[i..j].to_string(), j < s.len())),
        ..Default::default()
    });
    let k = r.calls.len() - 1;
    if name_len == 0 && j < s.len() {
        return Err(Stop::Broken(i));
    }
    match literal(s, j, MISTRAL_CALL_ID) {
        Ok(after) => {
            let id = &s[after..];
            j = after + id.len() - id.trim_start_matches(is_name_char).len();
        }
        Err(Stop::More) => return Err(Stop::More),
        Err(Stop::Broken(_)) => {}
    }
    j = literal(s, j, MISTRAL_ARGS)?;
    if j == s.len() {
        return Err(Stop::More);
    }
    if !s[j..].starts_with('{') {
        return Err(Stop::Broken(j));
    }
    let lexed = lex_value(&s[j..]);
    r.calls[k].args = Some((j, lexed.clone()));
    match lexed {
        Lexed::Done(n) => {
            r.calls[k].end = Some(j + n);
            Ok(j + n)
        }
        Lexed::Open { .. } => Err(Stop::More),
        Lexed::Broken(n) => Err(Stop::Broken(j + n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_complete_open_or_broken() {
        assert_eq!(lex_value(r#"{"a": [1, "x"]} tail"#), Lexed::Done(15));
        assert_eq!(lex_value("12 "), Lexed::Done(2));
        assert_eq!(lex_value(r#""é" "#), Lexed::Done(4));
        assert_eq!(lex_value(r#"{"a": tru}"#), Lexed::Broken(9));
        assert_eq!(lex_value(r#"{"a" 1}"#), Lexed::Broken(5));
        assert_eq!(lex_value("[1,]"), Lexed::Broken(3));
        assert_eq!(lex_value("-x"), Lexed::Broken(1));
    }

    #[test]
    fn an_open_value_heals_into_valid_json() {
        for open in [
            "{",
            r#"{"a"#,
            r#"{"a""#,
            r#"{"a": "#,
            r#"{"a": "x\"#,
            r#"{"a": "\u00"#,
            r#"{"a": -"#,
            r#"{"a": 1."#,
            r#"{"a": 1e"#,
            r#"{"a": 12"#,
            r#"{"a": [tr"#,
            r#"{"a": [1, "#,
            r#"{"a": [{"b": null}, {"#,
            r#"{"a": 1, "#,
        ] {
            let Lexed::Open { heal } = lex_value(open) else {
                panic!("{open} should be open")
            };
            let whole = format!("{open}{heal}");
            assert!(
                serde_json::from_str::<serde_json::Value>(&whole).is_ok(),
                "{whole}"
            );
        }
    }

    fn names(r: &Region) -> Vec<Option<(String, bool)>> {
        r.calls.iter().map(|c| c.name.clone()).collect()
    }

    #[test]
    fn each_syntax_reads_its_calls_as_they_grow() {
        let generic = r#"{"tool_calls": [{"name": "f", "arguments": {"a": 1}}, {"name": "ge"#;
        let r = Region::of(Syntax::Generic, generic);
        assert_eq!(
            names(&r),
            [Some(("f".into(), true)), Some(("ge".into(), false))]
        );
        let (start, lexed) = r.calls[0].args.clone().unwrap();
        assert_eq!(
            (&generic[start..start + 8], lexed),
            (r#"{"a": 1}"#, Lexed::Done(8))
        );
        assert!(r.calls[0].end.is_some() && r.calls[1].end.is_none());
        assert_eq!((r.end, r.broken), (None, None));

        let hermes =
            "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": \"x\"}}\n</tool_call> after";
        let r = Region::of(Syntax::Hermes, hermes);
        assert_eq!(&hermes[r.end.unwrap()..], " after");

        let llama = r#"<|python_tag|>{"name": "f", "parameters": {"a": [1, 2"#;
        let r = Region::of(Syntax::Llama3, llama);
        let (start, lexed) = r.calls[0].args.clone().unwrap();
        assert!(matches!(lexed, Lexed::Open { .. }));
        assert_eq!(&llama[start..], r#"{"a": [1, 2"#);

        for mistral in [
            r#"[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abc123def"}]"#,
            r#"[TOOL_CALLS]f[ARGS]{"a": 1}"#,
            r#"[TOOL_CALLS]f[CALL_ID]abc123def[ARGS]{"a": 1}"#,
        ] {
            let r = Region::of(Syntax::Mistral, mistral);
            assert_eq!(names(&r), [Some(("f".into(), true))], "{mistral}");
            assert_eq!(r.end, Some(mistral.len()), "{mistral}");
        }
        let r = Region::of(Syntax::Mistral, "[TOOL_CALLS]get_we");
        assert_eq!(names(&r), [Some(("get_we".into(), false))]);
    }

    #[test]
    fn text_that_leaves_the_syntax_is_broken_where_it_leaves() {
        assert_eq!(Region::of(Syntax::Generic, "Sure").broken, Some(0));
        assert_eq!(
            Region::of(Syntax::Generic, r#"{"answer": 1}"#).broken,
            Some(1)
        );
        assert_eq!(Region::of(Syntax::Generic, r#"{"tool_"#).broken, None);
        let r = Region::of(
            Syntax::Hermes,
            r#"<tool_call>{"name": "f", "arguments": 3}"#,
        );
        assert_eq!(r.broken, Some(38));
        assert_eq!(Region::of(Syntax::Llama3, "<|py").broken, None);
        assert_eq!(Region::of(Syntax::Llama3, "<b>").broken, Some(0));
    }
}
