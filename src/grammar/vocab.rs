//! The model's vocabulary as llguidance sees it, and the compiler of request constraints.

use super::{Constraint, ConstraintSpec};
use crate::tokenizer::Tokenizer;
use llguidance::api::ParserLimits;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// Per-step work a grammar may cost before it is refused (llguidance's limits, tightened
/// where its defaults let one request hold the engine for long). Compile-time limits stop a
/// hostile schema while the request is parsed; step limits make a runaway mask fail that one
/// sequence instead of stalling the batch.
fn limits() -> ParserLimits {
    ParserLimits {
        max_items_in_row: 2_000,
        initial_lexer_fuel: 1_000_000,
        step_lexer_fuel: 200_000,
        step_max_items: 50_000,
        max_lexer_states: 100_000,
        max_grammar_size: 200_000,
        ..ParserLimits::default()
    }
}

/// Compiles constraints against one model's vocabulary. Built once per model: the token trie
/// over every vocabulary entry's bytes, with control tokens marked special (a grammar can
/// name them, `<|im_end|>` style, but never produces them as text).
pub struct Grammars {
    factory: ParserFactory,
    /// Tokens that end generation: allowed exactly when the grammar may end.
    eog: Vec<u32>,
}

impl Grammars {
    pub fn new(tokenizer: &Tokenizer) -> anyhow::Result<Grammars> {
        let vocab = tokenizer.vocab_size();
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                let bytes = tokenizer.token_bytes(id, true);
                if tokenizer.is_control(id) || bytes.is_empty() {
                    // TokTrie's convention for special tokens: a 0xff byte, then the name.
                    let name = if bytes.is_empty() {
                        format!("<[{id}]>").into_bytes()
                    } else {
                        bytes.to_vec()
                    };
                    [vec![TokTrie::SPECIAL_TOKEN_MARKER], name].concat()
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let eog = tokenizer.eog_tokens().to_vec();
        let eos = tokenizer.eos.or(eog.first().copied()).unwrap_or(0);
        let mut info = TokRxInfo::new(vocab as u32, eos);
        info.tok_bos = tokenizer.bos;
        info.tok_end_of_turn = eog.iter().copied().find(|&t| t != eos);
        let trie = TokTrie::from(&info, &words);
        // Greedy re-tokenization over the trie: llguidance uses it only to force tokens, and
        // edgelm forces one token at a time (where the mask leaves a single choice).
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        // No token-trie slices: llguidance's JSON-string slices speed up masks inside long
        // strings but cost 11 MiB on a 49K vocabulary (more on Gemma's 262K), against this
        // appliance's memory budget; measured without them, constrained decode stays within
        // a few percent of free decode (`edgelm bench --json-schema`).
        let mut factory = ParserFactory::new(&env, Default::default(), &[])?;
        factory.quiet();
        *factory.limits_mut() = limits();
        Ok(Grammars { factory, eog })
    }

    /// A matcher for `spec` at the start of the output, with its first mask computed: a
    /// grammar that does not compile, or that exceeds a limit on its first step, fails here
    /// (the caller answers 400) rather than in the engine.
    pub fn compile(&self, spec: &ConstraintSpec) -> Result<Constraint, String> {
        let parser = self
            .factory
            .create_parser(spec.grammar())
            .map_err(|e| format!("invalid {}: {e}", spec.kind()))?;
        let mut matcher = Matcher::new(Ok(parser));
        matcher
            .compute_mask()
            .map_err(|e| format!("{} exceeds the grammar limits: {e}", spec.kind()))?;
        Ok(Constraint::new(matcher, Arc::new(self.eog.clone())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> (Tokenizer, Grammars) {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let g = Grammars::new(&tok).unwrap();
        (tok, g)
    }

    /// Walks `text`'s tokens through the constraint, checking each is allowed.
    fn follows(c: &mut Constraint, tok: &Tokenizer, text: &str) -> bool {
        for t in tok.encode(text, false).unwrap() {
            if !c.mask().unwrap().allows(t, c.eog().to_vec().as_slice()) {
                return false;
            }
            c.accept(t).unwrap();
        }
        true
    }

    #[test]
    fn a_schema_allows_valid_json_and_then_only_the_end() {
        let (tok, g) = reference();
        let schema = serde_json::json!({"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": false});
        let mut c = g
            .compile(&ConstraintSpec::JsonSchema(schema.clone()))
            .unwrap();
        assert!(follows(&mut c, &tok, r#"{"on": true}"#));
        let m = c.mask().unwrap();
        let eog = c.eog().to_vec();
        assert!(
            m.allows(eog[0], &eog),
            "the end is allowed once the object is complete"
        );
        let mut c = g.compile(&ConstraintSpec::JsonSchema(schema)).unwrap();
        assert!(!follows(&mut c, &tok, r#"{"off": 1}"#));
    }

    #[test]
    fn numbers_end_within_the_digits_llama_cpp_allows() {
        let (tok, g) = reference();
        let schema = serde_json::json!({"type": "array", "items": {"type": "number"}});
        let ok = |text: &str| {
            let mut c = g
                .compile(&ConstraintSpec::JsonSchema(schema.clone()))
                .unwrap();
            follows(&mut c, &tok, text)
        };
        for good in [
            "[-12.5]",
            "[0, 3.1415926535]",
            "[9007199254740991]",
            "[1.5000000000]",
        ] {
            assert!(ok(good), "{good}");
        }
        assert!(!ok("[3.14159265358]"), "an 11th fraction digit");
        assert!(
            !ok("[1.50000000000]"),
            "an 11th fraction digit, even a zero"
        );
        assert!(!ok("[90071992547409920]"), "beyond 2^53 - 1");
        let integers = serde_json::json!({"type": "object", "properties": {"n": {"type": ["integer", "null"], "minimum": 5}}});
        let mut c = g.compile(&ConstraintSpec::JsonSchema(integers)).unwrap();
        assert!(!follows(&mut c, &tok, r#"{"n": 12345678901234567"#));
    }

    #[test]
    fn a_json_object_bounds_its_numbers_as_a_schema_does() {
        let (tok, g) = reference();
        let ok = |text: &str| {
            let mut c = g.compile(&ConstraintSpec::JsonObject).unwrap();
            follows(&mut c, &tok, text)
        };
        assert!(ok(r#"{"a": [1, -2.5, {"b": null}], "c": "x", "d": true}"#));
        assert!(ok(r#"{"n": 9007199254740991}"#));
        assert!(!ok(r#"{"n": 90071992547409920}"#), "beyond 2^53 - 1");
        assert!(!ok(r#"{"a": [{"n": 3.14159265358}]}"#), "nested, 11 digits");
        assert!(!ok("[1]"), "an object only");
        let after = ConstraintSpec::JsonObject.after_reasoning(true);
        let mut c = g.compile(&after).unwrap();
        assert!(!follows(
            &mut c,
            &tok,
            &format!("hm</think>{{\"n\": {}", "1".repeat(60))
        ));
    }

    #[test]
    fn lark_regex_and_forced_tokens() {
        let (tok, g) = reference();
        let mut c = g
            .compile(&ConstraintSpec::Lark(r#"start: "yes" | "no""#.into()))
            .unwrap();
        assert!(follows(&mut c, &tok, "no"));
        let mut c = g
            .compile(&ConstraintSpec::Regex("[A-Z]{2}-[0-9]{4}".into()))
            .unwrap();
        assert!(!follows(&mut c, &tok, "ab-1234"));
        // A grammar with one continuation forces it.
        let mut c = g
            .compile(&ConstraintSpec::Lark(r#"start: "<tool_call>""#.into()))
            .unwrap();
        assert!(c.mask().unwrap().forced().is_some());
    }

    #[test]
    fn bad_grammars_are_refused_with_the_reason() {
        let (_, g) = reference();
        for spec in [
            ConstraintSpec::Lark("start: undefined_rule".into()),
            ConstraintSpec::Regex("(unclosed".into()),
            ConstraintSpec::JsonSchema(serde_json::json!({"type": "nonsense"})),
        ] {
            let e = g.compile(&spec).unwrap_err();
            assert!(e.starts_with("invalid"), "{e}");
        }
    }
}
