//! Calls in a finished answer: each syntax's calls found in the whole text, the rest left as
//! text. A call that does not parse, or names a tool the request did not offer, stays text.
//! (`call_stream` finds calls while an answer streams; it settles held text with this.)

use super::call_scan::{Lexed, Region};
use super::harmony::HarmonyOutput;
use super::markers::MISTRAL_CALLS;
use super::types::{Call, Delta, Syntax, Tool};
use serde_json::Value;

/// Splits finished output into its text and its calls. Calls that do not parse, or name a
/// tool the request did not offer, stay text.
pub fn parse_calls(syntax: Syntax, text: &str, tools: &[Tool]) -> (String, Vec<Call>) {
    let known = |n: &str| tools.iter().any(|t| t.function.name == n);
    let call_of = |v: &Value, args_keys: &[&str]| -> Option<Call> {
        let name = v.get("name")?.as_str()?;
        let args = args_keys.iter().find_map(|k| v.get(*k))?;
        (known(name) && args.is_object()).then(|| Call {
            name: name.to_string(),
            arguments: args.to_string(),
        })
    };
    match syntax {
        Syntax::Harmony => {
            let mut h = HarmonyOutput::new(tools.to_vec());
            let mut deltas = h.push(text);
            deltas.extend(h.finish());
            let mut rest = String::new();
            let mut calls = Vec::new();
            for d in deltas {
                match d {
                    Delta::Content(t) => rest.push_str(&t),
                    Delta::Call(_, c) => calls.push(c),
                    _ => {}
                }
            }
            (rest, calls)
        }
        Syntax::Hermes => {
            let mut rest = String::new();
            let mut calls = Vec::new();
            let mut s = text;
            while let Some(open) = s.find("<tool_call>") {
                let after = &s[open + "<tool_call>".len()..];
                let Some(close) = after.find("</tool_call>") else {
                    break;
                };
                match serde_json::from_str::<Value>(after[..close].trim())
                    .ok()
                    .and_then(|v| call_of(&v, &["arguments", "parameters"]))
                {
                    Some(c) => {
                        rest.push_str(&s[..open]);
                        calls.push(c);
                    }
                    None => rest.push_str(&s[..open + "<tool_call>".len() + close + 12]),
                }
                s = &after[close + "</tool_call>".len()..];
            }
            rest.push_str(s);
            if calls.is_empty() {
                (text.to_string(), calls)
            } else {
                (rest.trim().to_string(), calls)
            }
        }
        Syntax::Mistral => parse_mistral(text, tools),
        Syntax::Llama3 | Syntax::Generic => {
            let body = text.trim().trim_start_matches("<|python_tag|>").trim();
            let Ok(v) = serde_json::from_str::<Value>(body) else {
                return (text.to_string(), Vec::new());
            };
            let calls: Option<Vec<Call>> = if let Some(list) = v.get("tool_calls") {
                list.as_array().and_then(|l| {
                    l.iter()
                        .map(|c| call_of(c, &["arguments", "parameters"]))
                        .collect()
                })
            } else {
                call_of(&v, &["parameters", "arguments"]).map(|c| vec![c])
            };
            match calls {
                Some(c) if !c.is_empty() => (String::new(), c),
                _ => (text.to_string(), Vec::new()),
            }
        }
    }
}

/// Mistral's calls: each `[TOOL_CALLS]` region whose calls are complete and name offered
/// tools; the text before the first is the rest (other regions stay text).
fn parse_mistral(text: &str, tools: &[Tool]) -> (String, Vec<Call>) {
    let known = |n: &str| tools.iter().any(|t| t.function.name == n);
    let mut rest = String::new();
    let mut calls = Vec::new();
    let mut s = text;
    while let Some(open) = s.find(MISTRAL_CALLS) {
        rest.push_str(&s[..open]);
        s = &s[open..];
        let r = Region::of(Syntax::Mistral, s);
        let found: Option<Vec<Call>> = r
            .calls
            .iter()
            .map(|p| {
                let (name, true) = p.name.clone()? else {
                    return None;
                };
                let (start, Lexed::Done(n)) = p.args.clone()? else {
                    return None;
                };
                let args = &s[start..start + n];
                let object = serde_json::from_str::<Value>(args).ok()?.is_object();
                (known(&name) && object).then(|| Call {
                    name,
                    arguments: args.to_string(),
                })
            })
            .collect();
        match (r.end, found) {
            (Some(end), Some(found)) if !found.is_empty() => {
                calls.extend(found);
                s = &s[end..];
            }
            _ => {
                rest.push_str(MISTRAL_CALLS);
                s = &s[MISTRAL_CALLS.len()..];
            }
        }
    }
    rest.push_str(s);
    if calls.is_empty() {
        (text.to_string(), calls)
    } else {
        (rest.trim().to_string(), calls)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tools::tests::tools;
    use super::*;
    use serde_json::json;

    #[test]
    fn hermes_calls_are_found_and_the_rest_is_text() {
        let out = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
        let (text, calls) = parse_calls(Syntax::Hermes, out, &tools());
        assert_eq!(text, "Let me check.");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            serde_json::from_str::<Value>(&calls[0].arguments).unwrap(),
            json!({"city": "Oslo"})
        );
    }

    #[test]
    fn unknown_tools_and_bad_json_stay_text() {
        let out = "<tool_call>{\"name\": \"launch\", \"arguments\": {}}</tool_call>";
        assert!(parse_calls(Syntax::Hermes, out, &tools()).1.is_empty());
        assert!(parse_calls(Syntax::Generic, "{\"tool_calls\": [", &tools())
            .1
            .is_empty());
        let (text, calls) = parse_calls(Syntax::Generic, "hello", &tools());
        assert_eq!((text.as_str(), calls.len()), ("hello", 0));
    }

    #[test]
    fn generic_and_llama3_forms() {
        let g = r#"{"tool_calls": [{"name": "set_lamp", "arguments": {"on": true}}, {"name": "get_weather", "arguments": {"city": "Rome"}}]}"#;
        let (_, calls) = parse_calls(Syntax::Generic, g, &tools());
        assert_eq!(calls.len(), 2);
        let l = r#"<|python_tag|>{"name": "set_lamp", "parameters": {"on": false}}"#;
        let (text, calls) = parse_calls(Syntax::Llama3, l, &tools());
        assert_eq!((text.as_str(), calls[0].name.as_str()), ("", "set_lamp"));
    }

    #[test]
    fn mistral_forms() {
        let list = r#"[TOOL_CALLS][{"name": "set_lamp", "arguments": {"on": true}, "id": "abc123def"}, {"name": "get_weather", "arguments": {"city": "Rome"}}]"#;
        let (text, calls) = parse_calls(Syntax::Mistral, list, &tools());
        assert_eq!((text.as_str(), calls.len()), ("", 2));
        assert_eq!(calls[1].arguments, r#"{"city": "Rome"}"#);
        let named = r#"Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]set_lamp[ARGS]{"on": false}"#;
        let (text, calls) = parse_calls(Syntax::Mistral, named, &tools());
        assert_eq!((text.as_str(), calls.len()), ("Checking.", 2));
        let bad = "[TOOL_CALLS]launch[ARGS]{}";
        assert_eq!(parse_calls(Syntax::Mistral, bad, &tools()).0, bad);
    }
}
