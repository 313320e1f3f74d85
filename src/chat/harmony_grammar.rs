//! Constraints on harmony answers (gpt-oss): a required call is forced through the call
//! message's own syntax, and a response format applies to the `final` message. The markers are
//! special tokens in a gpt-oss vocabulary and text in any other, and a grammar must name them
//! the way the vocabulary holds them, so each grammar is built for one vocabulary's
//! [`MarkerTokens`].

use super::markers::{
    MarkerTokens, HARMONY_CALL as CALL, HARMONY_CHANNEL as CHANNEL, HARMONY_CONSTRAIN as CONSTRAIN,
    HARMONY_END as END, HARMONY_MESSAGE as MESSAGE, HARMONY_START as START,
};
use super::types::Tool;
use crate::grammar::{json_object_schema, schema_as_generated, ConstraintSpec};

/// The call of one of `allowed`: `<|channel|>commentary to=functions.NAME <|constrain|>json
/// <|message|>` and arguments that match the tool's schema, then `<|call|>` (left to the
/// engine where it ends generation). The one message gpt-oss writes for a call.
pub fn forced_call(allowed: &[&Tool], markers: &MarkerTokens) -> ConstraintSpec {
    let call_end = if markers.ends_generation(CALL) {
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
pub fn final_message(spec: ConstraintSpec, markers: &MarkerTokens) -> ConstraintSpec {
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
mod tests {
    use super::super::markers::tests::gpt_oss_like;
    use super::*;
    use crate::grammar::Grammars;
    use crate::tokenizer::Tokenizer;
    use serde_json::json;

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
            let markers = MarkerTokens::of(&tok);
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
    fn a_response_format_applies_to_the_final_message() {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let schema = ConstraintSpec::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        for tok in [Tokenizer::from_gguf(&file).unwrap(), gpt_oss_like()] {
            let spec = final_message(schema.clone(), &MarkerTokens::of(&tok));
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
