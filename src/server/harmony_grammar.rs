//! Constraints on harmony answers (gpt-oss): a required call is forced through the call
//! message's own syntax, and a response format applies to the `final` message. The markers are
//! special tokens in a gpt-oss vocabulary and text in any other, and a grammar must name them
//! the way the vocabulary holds them, so each grammar is built for one vocabulary's [`Markers`].

use super::harmony::{CALL, CHANNEL, CONSTRAIN, END, MARKERS, MESSAGE, RETURN, START};
use super::tools::Tool;
use crate::grammar::{json_object_schema, schema_as_generated, ConstraintSpec};
use crate::tokenizer::Tokenizer;

/// How one vocabulary holds the harmony markers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Markers {
    /// The markers that are one control token, with its id.
    special: Vec<(&'static str, u32)>,
    /// Of those, the ones that end generation (the engine allows them exactly where a grammar
    /// may end, so a grammar must not name them).
    eog: Vec<&'static str>,
}

impl Markers {
    pub fn of(tok: &Tokenizer) -> Markers {
        Markers::of_list(tok, &MARKERS)
    }

    /// How the vocabulary holds `markers` (another format's, e.g. Mistral's `[TOOL_CALLS]`).
    pub fn of_list(tok: &Tokenizer, markers: &[&'static str]) -> Markers {
        let mut m = Markers::default();
        for &marker in markers {
            let Ok(ids) = tok.encode(marker, false) else {
                continue;
            };
            if let [id] = ids[..] {
                if tok.is_control(id) {
                    m.special.push((marker, id));
                    if tok.is_eog(id) {
                        m.eog.push(marker);
                    }
                }
            }
        }
        m
    }

    /// The tokens that end a harmony answer (`<|return|>`, `<|call|>`) where the vocabulary has
    /// them: the engine stops on them. Spelled out as text, stop strings catch them instead.
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.special
            .iter()
            .filter(|(m, _)| *m == RETURN || *m == CALL)
            .map(|&(_, id)| id)
            .collect()
    }

    /// The markers' token ids (none where they are text).
    pub fn ids(&self) -> Vec<u32> {
        self.special.iter().map(|&(_, id)| id).collect()
    }

    fn is_special(&self, marker: &str) -> bool {
        self.special.iter().any(|(m, _)| *m == marker)
    }

    /// `marker` as a Lark item: a special token (by name where Lark can spell it, `<|…|>`,
    /// else by id), or its text.
    pub(super) fn lit(&self, marker: &str) -> String {
        match self.special.iter().find(|(m, _)| *m == marker) {
            Some(_) if marker.starts_with("<|") => marker.to_string(),
            Some((_, id)) => format!("<[{id}]>"),
            None => format!("\"{marker}\""),
        }
    }
}

/// The call of one of `allowed`: `<|channel|>commentary to=functions.NAME <|constrain|>json
/// <|message|>` and arguments that match the tool's schema, then `<|call|>` (left to the
/// engine where it ends generation). The one message gpt-oss writes for a call.
pub fn forced_call(allowed: &[&Tool], markers: &Markers) -> ConstraintSpec {
    let call_end = if markers.eog.contains(&CALL) {
        String::new()
    } else {
        markers.lit(CALL)
    };
    let mut g = format!(
        "start: {}\n",
        (0..allowed.len())
            .map(|i| format!("call{i}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    for (i, t) in allowed.iter().enumerate() {
        g += &format!(
            "call{i}: {} \"commentary to=functions.{} \" {} \"json\" {} args{i} {call_end}\nargs{i}: %json {}\n",
            markers.lit(CHANNEL),
            t.function.name,
            markers.lit(CONSTRAIN),
            markers.lit(MESSAGE),
            schema_as_generated(&t.function.parameters()),
        );
    }
    ConstraintSpec::Lark(g)
}

/// `spec` on the answer's `final` message, after an optional `analysis` message (free text up
/// to its `<|end|>`): gpt-oss may reason first, and only what the client reads is held to the
/// format. A Lark grammar keeps its own start rule, so it is left as given.
pub fn final_message(spec: ConstraintSpec, markers: &Markers) -> ConstraintSpec {
    let body = match &spec {
        ConstraintSpec::JsonObject => format!("%json {}", json_object_schema()),
        ConstraintSpec::JsonSchema(s) => format!("%json {}", schema_as_generated(s)),
        ConstraintSpec::Regex(r) => format!("/{}/", r.replace('/', "\\/")),
        ConstraintSpec::Lark(_) => return spec,
    };
    // The analysis text runs to the first `<|end|>`. As text the end is inside the lexeme (the
    // lexer takes the longest match, so its regex admits no other end, as for `</think>`); as
    // a special token it is no text at all and ends any lexeme.
    let (analysis, end) = if markers.is_special(END) {
        ("/(?s:.*)/".to_string(), markers.lit(END))
    } else {
        (
            "/(?s:.*)<\\|end\\|>/ & ~/(?s:.*<\\|end\\|>.+)/".to_string(),
            String::new(),
        )
    };
    ConstraintSpec::Lark(format!(
        "start: analysis? {ch} \"final\" {msg} body\nanalysis: {ch} \"analysis\" {msg} ANALYSIS {end} {start} \"assistant\"\nANALYSIS: {analysis}\nbody: {body}\n",
        ch = markers.lit(CHANNEL),
        msg = markers.lit(MESSAGE),
        start = markers.lit(START),
    ))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::grammar::Grammars;
    use crate::tokenizer::VocabSpec;
    use serde_json::json;

    /// GGUF's token type of control tokens.
    const CONTROL: i32 = 3;

    fn reference_spec() -> VocabSpec {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        VocabSpec::from_gguf(&file).unwrap()
    }

    /// The reference vocabulary with the harmony markers added as control tokens, as gpt-oss
    /// has them (`<|return|>` its end of generation, `<|call|>` not).
    pub(in crate::server) fn gpt_oss_like() -> Tokenizer {
        with_markers(&MARKERS)
    }

    /// The reference vocabulary with `markers` added as control tokens (and `<|return|>` its
    /// end of generation where it is one of them).
    pub(in crate::server) fn with_markers(markers: &[&str]) -> Tokenizer {
        let mut spec = reference_spec();
        for m in markers {
            spec.tokens.push(m.to_string());
            spec.token_types.push(CONTROL);
            spec.scores.push(0.0);
        }
        if let Some(end) = spec.tokens.iter().position(|t| t == RETURN) {
            spec.eos = Some(end as u32);
        }
        Tokenizer::from_spec(&spec).unwrap()
    }

    fn tools() -> Vec<Tool> {
        serde_json::from_value(json!([
            {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "set_lamp", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}
        ]))
        .unwrap()
    }

    /// Does the constraint take `text` token by token, and may it end there?
    fn takes(tok: &Tokenizer, spec: &ConstraintSpec, text: &str) -> (bool, bool) {
        let g = Grammars::new(tok).unwrap();
        let mut c = g.compile(spec).unwrap_or_else(|e| panic!("{e}\n{spec:?}"));
        let eog = c.eog().to_vec();
        for t in tok.encode(text, false).unwrap() {
            if !c.mask().unwrap().allows(t, &eog) {
                return (false, false);
            }
            c.accept(t).unwrap();
        }
        let may_end = c.is_finished() || c.mask().unwrap().allows(eog[0], &eog);
        (true, may_end)
    }

    const CALL_TEXT: &str = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";

    #[test]
    fn a_forced_call_takes_the_call_message_and_nothing_else() {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let text_vocab = Tokenizer::from_gguf(&file).unwrap();
        let t = tools();
        for tok in [text_vocab, gpt_oss_like()] {
            let markers = Markers::of(&tok);
            let spec = forced_call(&t.iter().collect::<Vec<_>>(), &markers);
            assert_eq!(takes(&tok, &spec, CALL_TEXT), (true, true), "{markers:?}");
            let lamp = CALL_TEXT
                .replace("get_weather", "set_lamp")
                .replace("{\"city\": \"Paris\"}", "{\"on\": true}");
            assert_eq!(takes(&tok, &spec, &lamp), (true, true));
            assert!(!takes(&tok, &spec, "The weather in Paris is sunny.").0);
            // Arguments off the tool's schema, and a tool not allowed, are refused.
            assert!(!takes(&tok, &spec, &CALL_TEXT.replace("\"city\"", "\"town\"")).0);
            let only = forced_call(&[&t[1]], &markers);
            assert!(!takes(&tok, &only, CALL_TEXT).0);
        }
    }

    #[test]
    fn markers_follow_the_vocabulary() {
        let tok = gpt_oss_like();
        let m = Markers::of(&tok);
        assert_eq!(m.special.len(), 7);
        assert_eq!(m.eog, vec![RETURN, CALL]);
        assert_eq!(m.stop_tokens().len(), 2);
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let m = Markers::of(&Tokenizer::from_gguf(&file).unwrap());
        assert_eq!(m, Markers::default());
        assert!(m.stop_tokens().is_empty());
    }

    #[test]
    fn a_response_format_applies_to_the_final_message() {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let schema = ConstraintSpec::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        for tok in [Tokenizer::from_gguf(&file).unwrap(), gpt_oss_like()] {
            let spec = final_message(schema.clone(), &Markers::of(&tok));
            let direct = "<|channel|>final<|message|>{\"a\": 1}";
            assert_eq!(takes(&tok, &spec, direct), (true, true));
            let reasoned = "<|channel|>analysis<|message|>Need an object with a.<|end|><|start|>assistant<|channel|>final<|message|>{\"a\": 2}";
            assert_eq!(takes(&tok, &spec, reasoned), (true, true));
            assert!(!takes(&tok, &spec, "<|channel|>final<|message|>{\"b\": 1}").0);
            assert!(!takes(&tok, &spec, "{\"a\": 1}").0);
            // Unfinished JSON may not end.
            assert_eq!(
                takes(&tok, &spec, "<|channel|>final<|message|>{\"a\""),
                (true, false)
            );
        }
    }
}
