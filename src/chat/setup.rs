//! A chat request made ready to run: its prompt (`prompt`), the constraint that applies (a
//! response format, or the grammar of a required call), the stop markers its format adds, and
//! how the answer is split (reasoning, content, calls).

use super::error::Error;
use super::forcing::forcing_grammar;
use super::harmony_grammar;
use super::markers::{MarkerTokens, HARMONY_CALL, HARMONY_RETURN, MISTRAL_MARKERS};
use super::output::ChatOutput;
use super::prompt::{render_prompt, Conversation, Offer};
use super::tools::{allowed, Choice};
use super::types::{Syntax, Tool};
use crate::grammar::ConstraintSpec;
use crate::tokenizer::{ChatTemplate, Tokenizer};

/// How each choice's text is split into reasoning, content and calls.
#[derive(Clone)]
pub struct OutputRules {
    /// The syntax and the tools a call may name, when calls are possible.
    tools: Option<(Syntax, Vec<Tool>)>,
    /// The request forces a call (`tool_choice` `required` or named).
    forced: bool,
    reasoning: bool,
    opened: bool,
    /// A harmony answer (gpt-oss), split by its own parser.
    harmony: bool,
    /// Control tokens the parser reads as text (harmony's and Mistral's markers where they
    /// are tokens).
    shown: Vec<u32>,
}

impl OutputRules {
    pub fn output(&self) -> ChatOutput {
        if self.harmony {
            let tools = self.tools.as_ref().map(|(_, t)| t.clone());
            return ChatOutput::harmony(tools.unwrap_or_default());
        }
        ChatOutput::with_calls(self.tools.clone(), self.forced, self.reasoning, self.opened)
    }

    /// Is control token `id` part of the answer's text (otherwise it decodes to nothing)?
    pub fn shows(&self, id: u32) -> bool {
        self.shown.contains(&id)
    }

    /// The request forces a call: its answer has no content.
    pub fn forced(&self) -> bool {
        self.forced
    }
}

pub struct ChatSetup {
    pub prompt: String,
    pub constraint: Option<ConstraintSpec>,
    pub rules: OutputRules,
    /// Stop strings and tokens the format adds to the request's own (harmony's end markers).
    pub stop: Vec<String>,
    pub stop_tokens: Vec<u32>,
}

/// The prompt, constraint, stops and output rules of `conversation` on this template and
/// vocabulary; `response_format` is the request's own constraint, if any.
pub fn prepare(
    tmpl: &ChatTemplate,
    tokenizer: &Tokenizer,
    conversation: &Conversation,
    response_format: Option<ConstraintSpec>,
) -> Result<ChatSetup, Error> {
    let source = tmpl.source();
    if conversation.tools.as_ref().is_some_and(Vec::is_empty) {
        return Err(Error::new(
            "tools",
            "tools must not be empty (leave it out)",
        ));
    }
    let offer = Offer::of(conversation)?;
    let (tools, choice, parallel) = (&offer.tools, &offer.choice, offer.parallel);
    let syntax = Syntax::of_template(source);
    let calling = *choice != Choice::None;
    let prompt = render_prompt(tmpl, conversation, &offer, true)?;
    let harmony = syntax == Syntax::Harmony;
    let markers = match syntax {
        Syntax::Harmony => MarkerTokens::of(tokenizer),
        Syntax::Mistral => MarkerTokens::of_list(tokenizer, &MISTRAL_MARKERS),
        _ => MarkerTokens::default(),
    };
    let forced = forcing_grammar(syntax, tools, choice, parallel, &markers);
    let forced_call = forced.is_some();
    let response_format =
        beside_a_forced_call(response_format, forced_call)?.map(|spec| match harmony {
            true => harmony_grammar::final_message(spec, &markers),
            false => spec,
        });
    let reasoning = source.contains("<think>");
    let opened = prompt.trim_end().ends_with("<think>");
    let constraint = forced.or(response_format).map(|spec| {
        if reasoning {
            spec.after_reasoning(opened)
        } else {
            spec
        }
    });
    let ends = if harmony {
        vec![HARMONY_RETURN.to_string(), HARMONY_CALL.to_string()]
    } else {
        Vec::new()
    };
    Ok(ChatSetup {
        prompt,
        constraint,
        rules: OutputRules {
            forced: forced_call,
            tools: calling.then(|| (syntax, allowed(tools, choice))),
            reasoning,
            opened,
            harmony,
            shown: markers.ids(),
        },
        stop: ends,
        stop_tokens: markers.stop_tokens(),
    })
}

/// The request's own constraint where a call may also be forced. A JSON response format
/// shapes the answer's text, and a forced call's answer has none: the call wins, as on
/// OpenAI's API (clients such as instructor send both). A grammar or a regex shapes the whole
/// output, so it and a forced call contradict each other.
fn beside_a_forced_call(
    response_format: Option<ConstraintSpec>,
    forced_call: bool,
) -> Result<Option<ConstraintSpec>, Error> {
    match response_format {
        Some(ConstraintSpec::JsonObject | ConstraintSpec::JsonSchema(_)) if forced_call => Ok(None),
        Some(spec) if forced_call => Err(Error::new(
            "tool_choice",
            format!(
                "a required tool call cannot be combined with a {}",
                spec.kind()
            ),
        )),
        other => Ok(other),
    }
}

#[cfg(test)]
mod tests {
    use super::super::markers::{HARMONY_CHANNEL, HARMONY_MESSAGE};
    use super::*;
    use serde_json::{json, Value};

    fn gpt_oss() -> (ChatTemplate, Tokenizer) {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/gpt-oss-chat-template.jinja"
        );
        let src = std::fs::read_to_string(path).unwrap();
        let tmpl = ChatTemplate::new(&src, "<|startoftext|>".into(), "<|return|>".into()).unwrap();
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        (tmpl, Tokenizer::from_gguf(&file).unwrap())
    }

    fn request(extra: Value) -> Conversation {
        let mut body = json!({
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": null, "reasoning_content": "Need the weather tool.",
                 "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "Sunny, 21 C"}
            ],
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, "required": ["city"]}}}],
        });
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn the_gpt_oss_template_renders_tools_calls_results_and_effort() {
        let (tmpl, tok) = gpt_oss();
        let setup = prepare(
            &tmpl,
            &tok,
            &request(json!({"reasoning_effort": "high"})),
            None,
        )
        .unwrap();
        let p = &setup.prompt;
        assert!(p.starts_with("<|start|>system<|message|>"), "{p}");
        assert!(p.contains("Reasoning: high\n"), "{p}");
        assert!(
            p.contains("<|start|>developer<|message|># Instructions\n\nBe brief."),
            "{p}"
        );
        assert!(p.contains("namespace functions {\n\n// Current weather\ntype get_weather = (_: {\n// City name\ncity: string,\n}) => any;"), "{p}");
        assert!(
            p.contains(
                "<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>"
            ),
            "{p}"
        );
        assert!(p.contains("<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":"), "{p}");
        assert!(p.contains("<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\"Sunny, 21 C\"<|end|>"), "{p}");
        assert!(p.ends_with("<|start|>assistant"), "{p}");
        // Left out, the template's own default applies.
        let setup = prepare(&tmpl, &tok, &request(json!({})), None).unwrap();
        assert!(setup.prompt.contains("Reasoning: medium\n"));
        // The answer's end markers stop it; calls are parsed by the harmony parser.
        assert_eq!(setup.stop, ["<|return|>", "<|call|>"]);
        let mut out = setup.rules.output();
        out.push("<|channel|>final<|message|>It is sunny.<|return|>");
        out.finish();
        assert_eq!(out.content, "It is sunny.");
    }

    #[test]
    fn reasoning_effort_is_checked() {
        let (tmpl, tok) = gpt_oss();
        for bad in [json!("extreme"), json!(3)] {
            let e = prepare(
                &tmpl,
                &tok,
                &request(json!({"reasoning_effort": bad})),
                None,
            )
            .err()
            .unwrap();
            assert_eq!(e.param, "reasoning_effort");
        }
    }

    #[test]
    fn a_required_call_on_gpt_oss_is_forced_in_the_harmony_syntax() {
        let (tmpl, tok) = gpt_oss();
        let setup = prepare(
            &tmpl,
            &tok,
            &request(json!({"tool_choice": "required"})),
            None,
        )
        .unwrap();
        let Some(ConstraintSpec::Lark(g)) = &setup.constraint else {
            panic!("{:?}", setup.constraint)
        };
        assert!(
            g.contains("\"commentary to=functions.get_weather \""),
            "{g}"
        );
        let fmt = Some(ConstraintSpec::JsonObject);
        let setup = prepare(&tmpl, &tok, &request(json!({})), fmt).unwrap();
        let Some(ConstraintSpec::Lark(g)) = &setup.constraint else {
            panic!("{:?}", setup.constraint)
        };
        assert!(g.contains("\"final\""), "{g}");
    }

    #[test]
    fn a_forced_call_sets_a_json_format_aside_and_refuses_a_regex() {
        let (tmpl, tok) = gpt_oss();
        let forced = request(json!({"tool_choice": "required"}));
        let fmt = Some(ConstraintSpec::JsonSchema(json!({"type": "object"})));
        let setup = prepare(&tmpl, &tok, &forced, fmt).unwrap();
        let Some(ConstraintSpec::Lark(g)) = &setup.constraint else {
            panic!("{:?}", setup.constraint)
        };
        assert!(
            g.contains("functions.get_weather"),
            "the call's grammar: {g}"
        );
        let regex = Some(ConstraintSpec::Regex("[0-9]+".into()));
        let e = prepare(&tmpl, &tok, &forced, regex).err().unwrap();
        assert_eq!(e.param, "tool_choice");
    }

    #[test]
    fn a_vocabulary_with_the_markers_shows_them_and_stops_on_the_end_tokens() {
        let (tmpl, _) = gpt_oss();
        let tok = super::super::markers::tests::gpt_oss_like();
        let id = |m: &str| tok.encode(m, false).unwrap()[0];
        let setup = prepare(
            &tmpl,
            &tok,
            &request(json!({"tool_choice": "required"})),
            None,
        )
        .unwrap();
        assert!(setup.rules.shows(id(HARMONY_CHANNEL)));
        assert!(setup.rules.shows(id(HARMONY_MESSAGE)));
        assert!(!setup.rules.shows(id("Hello")));
        assert_eq!(setup.stop_tokens, [id(HARMONY_RETURN), id(HARMONY_CALL)]);
        let Some(ConstraintSpec::Lark(g)) = &setup.constraint else {
            panic!("{:?}", setup.constraint)
        };
        assert!(g.contains(" <|message|> "), "markers named as tokens: {g}");
    }
}
