//! Forcing a call: when a request requires one (`tool_choice` `required` or a named tool), a
//! grammar in the syntax the template speaks makes the whole answer a call whose arguments
//! match the tool's schema.

use super::harmony_grammar;
use super::markers::{MarkerTokens, MISTRAL_ARGS, MISTRAL_CALLS};
use super::tools::{allowed, Choice};
use super::types::{Syntax, Tool};
use crate::grammar::{schema_as_generated, ConstraintSpec};
use serde_json::{json, Value};

/// One call's JSON in `syntax` (the key its arguments go under).
fn call_schema(syntax: Syntax, t: &Tool) -> Value {
    let args_key = if syntax == Syntax::Llama3 {
        "parameters"
    } else {
        "arguments"
    };
    json!({
        "type": "object",
        "properties": {"name": {"const": t.function.name}, args_key: t.function.parameters()},
        "required": ["name", args_key],
        "additionalProperties": false,
    })
}

/// The grammar that makes the output a call (of the named tool, or of any tool), so that the
/// arguments always validate. `None` when nothing is forced. `markers`: how the vocabulary
/// holds harmony's markers (harmony only).
pub fn forcing_grammar(
    syntax: Syntax,
    tools: &[Tool],
    choice: &Choice,
    parallel: bool,
    markers: &MarkerTokens,
) -> Option<ConstraintSpec> {
    if matches!(choice, Choice::None | Choice::Auto) {
        return None;
    }
    let allowed = allowed(tools, choice);
    let allowed: Vec<&Tool> = allowed.iter().collect();
    let one = json!({"anyOf": allowed.iter().map(|t| call_schema(syntax, t)).collect::<Vec<_>>()});
    // Parallel calls only where a call may be of any tool, and at most one per tool offered:
    // a small model left an open-ended list keeps adding calls until its tokens run out.
    let most = if parallel && matches!(choice, Choice::Required) {
        allowed.len()
    } else {
        1
    };
    Some(match syntax {
        // One call per answer: `<|call|>` ends it.
        Syntax::Harmony => harmony_grammar::forced_call(&allowed, markers),
        Syntax::Hermes => {
            let rep = " (\"\\n\" call)?".repeat(most - 1);
            ConstraintSpec::Lark(format!(
                "start: call{rep}\ncall: \"<tool_call>\\n\" body \"\\n</tool_call>\"\nbody: %json {}\n",
                schema_as_generated(&one)
            ))
        }
        Syntax::Llama3 => ConstraintSpec::JsonSchema(one),
        Syntax::Mistral => mistral_grammar(&allowed, &one, most, markers),
        Syntax::Generic => {
            let calls = json!({"type": "array", "items": one, "minItems": 1, "maxItems": most});
            ConstraintSpec::JsonSchema(json!({
                "type": "object",
                "properties": {"tool_calls": calls},
                "required": ["tool_calls"],
                "additionalProperties": false,
            }))
        }
    })
}

/// Mistral's calls in either of its forms (the model takes the one its template taught it):
/// `[TOOL_CALLS]` and a JSON list, or `[TOOL_CALLS]NAME[ARGS]{...}` per call.
fn mistral_grammar(
    allowed: &[&Tool],
    one: &Value,
    most: usize,
    markers: &MarkerTokens,
) -> ConstraintSpec {
    let calls = markers.lit(MISTRAL_CALLS);
    let list = json!({"type": "array", "items": one, "minItems": 1, "maxItems": most});
    let named: Vec<String> = allowed
        .iter()
        .map(|t| {
            format!(
                "{calls} \"{}\" {} %json {}",
                t.function.name,
                markers.lit(MISTRAL_ARGS),
                schema_as_generated(&t.function.parameters())
            )
        })
        .collect();
    ConstraintSpec::Lark(format!(
        "start: list | named{}\nlist: {calls} %json {}\nnamed: {}\n",
        " named?".repeat(most - 1),
        schema_as_generated(&list),
        named.join(" | ")
    ))
}

#[cfg(test)]
mod tests {
    use super::super::calls::parse_calls;
    use super::super::markers::tests::with_markers;
    use super::super::markers::MISTRAL_MARKERS;
    use super::super::tools::tests::tools;
    use super::*;
    use crate::grammar::Grammars;
    use crate::tokenizer::Tokenizer;

    #[test]
    fn forcing_grammars_compile_and_accept_a_call_in_each_syntax() {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let g = Grammars::new(&tok).unwrap();
        let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function", "function": {"name": "lamp", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}])).unwrap();
        for (syntax, text) in [
            (
                Syntax::Hermes,
                "<tool_call>\n{\"name\": \"lamp\", \"arguments\": {\"on\": true}}\n</tool_call>",
            ),
            (
                Syntax::Llama3,
                "{\"name\": \"lamp\", \"parameters\": {\"on\": false}}",
            ),
            (
                Syntax::Generic,
                "{\"tool_calls\": [{\"name\": \"lamp\", \"arguments\": {\"on\": true}}]}",
            ),
            (
                Syntax::Harmony,
                "<|channel|>commentary to=functions.lamp <|constrain|>json<|message|>{\"on\": true}<|call|>",
            ),
            (
                Syntax::Mistral,
                "[TOOL_CALLS][{\"name\": \"lamp\", \"arguments\": {\"on\": true}}]",
            ),
            (Syntax::Mistral, "[TOOL_CALLS]lamp[ARGS]{\"on\": false}"),
        ] {
            let spec =
                forcing_grammar(syntax, &tools, &Choice::Required, true, &MarkerTokens::of(&tok))
                    .unwrap();
            let mut c = g
                .compile(&spec)
                .unwrap_or_else(|e| panic!("{syntax:?}: {e}"));
            let eog = c.eog().to_vec();
            for t in tok.encode(text, false).unwrap() {
                assert!(c.mask().unwrap().allows(t, &eog), "{syntax:?}: {text}");
                c.accept(t).unwrap();
            }
            assert!(c.mask().unwrap().allows(eog[0], &eog), "{syntax:?} may end");
            assert_eq!(parse_calls(syntax, text, &tools).1.len(), 1);
        }
    }

    #[test]
    fn mistral_markers_that_are_tokens_are_forced_as_tokens() {
        let tok = with_markers(&MISTRAL_MARKERS);
        let g = Grammars::new(&tok).unwrap();
        let markers = MarkerTokens::of_list(&tok, &MISTRAL_MARKERS);
        assert_eq!(markers.ids().len(), 3);
        let tools: Vec<Tool> = serde_json::from_value(json!([{"type": "function", "function": {"name": "lamp", "parameters": {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"]}}}])).unwrap();
        let spec =
            forcing_grammar(Syntax::Mistral, &tools, &Choice::Required, true, &markers).unwrap();
        let ids = tok
            .encode("[TOOL_CALLS]lamp[ARGS]{\"on\": true}", false)
            .unwrap();
        assert_eq!(ids[0], markers.ids()[0], "the marker is one token");
        let mut c = g.compile(&spec).unwrap();
        let eog = c.eog().to_vec();
        for t in ids {
            assert!(c.mask().unwrap().allows(t, &eog));
            c.accept(t).unwrap();
        }
        assert!(c.mask().unwrap().allows(eog[0], &eog));
    }

    #[test]
    fn a_schema_after_reasoning_allows_the_think_block() {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let tok = Tokenizer::from_gguf(&file).unwrap();
        let g = Grammars::new(&tok).unwrap();
        let spec = ConstraintSpec::JsonSchema(
            json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}),
        );
        let mut c = g.compile(&spec.after_reasoning(false)).unwrap();
        let eog = c.eog().to_vec();
        for t in tok
            .encode("<think>\nSome thoughts.\n</think>\n\n{\"a\": 1}", false)
            .unwrap()
        {
            assert!(c.mask().unwrap().allows(t, &eog));
            c.accept(t).unwrap();
        }
        assert!(c.mask().unwrap().allows(eog[0], &eog));
    }

    #[test]
    fn syntax_follows_the_template() {
        assert_eq!(Syntax::of_template("{{ '<tool_call>' }}"), Syntax::Hermes);
        assert_eq!(Syntax::of_template("<|python_tag|>"), Syntax::Llama3);
        assert_eq!(Syntax::of_template("<|im_start|>"), Syntax::Generic);
        let mistral = "{%- if message.tool_calls %}{{- '[TOOL_CALLS]' }}{%- for t in message.tool_calls %}{{- t.function.name + '[ARGS]' + t.function.arguments|tojson }}{%- endfor %}{%- endif %}";
        assert_eq!(Syntax::of_template(mistral), Syntax::Mistral);
        let gpt_oss = include_str!("../../tests/data/gpt-oss-chat-template.jinja");
        assert_eq!(Syntax::of_template(gpt_oss), Syntax::Harmony);
        assert!(forcing_grammar(
            Syntax::Generic,
            &tools(),
            &Choice::Auto,
            true,
            &MarkerTokens::default()
        )
        .is_none());
    }
}
