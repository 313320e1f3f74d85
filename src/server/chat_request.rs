//! A chat request's prompt and output rules: messages (with tool calls and tool results)
//! rendered through the model's template with the request's tools, the constraint that
//! applies (a response format, or the grammar of a required call), and how the answer is
//! split (reasoning, content, calls).

use super::api::{ChatRequest, Message};
use super::chat_output::ChatOutput;
use super::error::ApiError;
use super::harmony;
use super::harmony_grammar::{self, Markers};
use super::tools::{self, Choice, Syntax, Tool};
use crate::grammar::ConstraintSpec;
use crate::tokenizer::{ChatMessage, ChatTemplate, TemplateInputs, Tokenizer};
use serde_json::{json, Value};

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

pub fn prepare(
    tmpl: &ChatTemplate,
    tokenizer: &Tokenizer,
    req: &ChatRequest,
    response_format: Option<ConstraintSpec>,
) -> Result<ChatSetup, ApiError> {
    let source = tmpl.source();
    if req.tools.as_ref().is_some_and(Vec::is_empty) {
        return Err(ApiError::bad_request("tools must not be empty (leave it out)").param("tools"));
    }
    let tools = req.tools.clone().unwrap_or_default();
    tools::check_tools(&tools)?;
    let choice = tools::parse_choice(req.tool_choice.as_ref(), &tools)?;
    let parallel = req.parallel_tool_calls.unwrap_or(true);
    let syntax = Syntax::of_template(source);
    let calling = choice != Choice::None;
    let offered = if calling { tools.as_slice() } else { &[] };
    let effort = req.reasoning_effort.as_ref();
    let prompt = render_prompt(tmpl, &req.messages, offered, parallel, effort, true)?;
    let harmony = syntax == Syntax::Harmony;
    let markers = match syntax {
        Syntax::Harmony => Markers::of(tokenizer),
        Syntax::Mistral => Markers::of_list(tokenizer, &tools::MISTRAL_MARKERS),
        _ => Markers::default(),
    };
    let forced = tools::forcing_grammar(syntax, &tools, &choice, parallel, &markers);
    let forced_call = forced.is_some();
    // A JSON response format shapes the answer's text, and a forced call's answer has none:
    // the call wins, as on OpenAI's API (clients such as instructor send both). A grammar or a
    // regex shapes the whole output, so it and a forced call contradict each other.
    let response_format = match response_format {
        Some(ConstraintSpec::JsonObject | ConstraintSpec::JsonSchema(_)) if forced_call => None,
        Some(spec) if forced_call => {
            return Err(ApiError::bad_request(format!(
                "a required tool call cannot be combined with a {}",
                spec.kind()
            ))
            .param("tool_choice"))
        }
        other => other,
    };
    let response_format = response_format.map(|spec| {
        if harmony {
            harmony_grammar::final_message(spec, &markers)
        } else {
            spec
        }
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
        vec![harmony::RETURN.to_string(), harmony::CALL.to_string()]
    } else {
        Vec::new()
    };
    Ok(ChatSetup {
        prompt,
        constraint,
        rules: OutputRules {
            forced: forced_call,
            tools: calling.then(|| (syntax, tools::allowed(&tools, &choice))),
            reasoning,
            opened,
            harmony,
            shown: markers.ids(),
        },
        stop: ends,
        stop_tokens: markers.stop_tokens(),
    })
}

/// The prompt of a chat: its messages through the template with the `tools` it may call
/// (shown by the template, or taught in the system message where the template shows none)
/// and its reasoning effort. `/tokenize` counts the same prompt.
pub fn render_prompt(
    tmpl: &ChatTemplate,
    messages: &[Message],
    tools: &[Tool],
    parallel: bool,
    effort: Option<&Value>,
    add_generation_prompt: bool,
) -> Result<String, ApiError> {
    let source = tmpl.source();
    let mut msgs = chat_messages(messages, Syntax::of_template(source))?;
    if !tools.is_empty() && !Syntax::template_shows_tools(source) {
        add_generic_instructions(&mut msgs, tools, parallel);
    }
    let tools_json = (!tools.is_empty()).then(|| tools::template_tools(tools));
    let inputs = TemplateInputs {
        tools: tools_json.as_ref(),
        reasoning_effort: reasoning_effort(effort)?,
    };
    tmpl.render_with(&msgs, &inputs, add_generation_prompt)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("messages"))
}

/// Teaches a model whose template shows no tools the generic call syntax, in the system
/// message (one is added when the conversation has none).
fn add_generic_instructions(msgs: &mut Vec<ChatMessage>, tools: &[Tool], parallel: bool) {
    let text = tools::generic_instructions(tools, parallel);
    match msgs.first_mut() {
        Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
        _ => msgs.insert(
            0,
            ChatMessage {
                role: "system".into(),
                content: text,
                ..Default::default()
            },
        ),
    }
}

/// The request's `reasoning_effort`: one of OpenAI's three levels. Every template receives it;
/// only those that set a reasoning budget (gpt-oss) read it.
pub fn reasoning_effort(v: Option<&Value>) -> Result<Option<&str>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if matches!(s.as_str(), "low" | "medium" | "high") => Ok(Some(s)),
        Some(other) => Err(ApiError::bad_request(format!(
            "reasoning_effort must be 'low', 'medium' or 'high', got {other}"
        ))
        .param("reasoning_effort")),
    }
}

/// The request's messages as the template reads them. Assistant calls carry their arguments
/// as objects; a template with no tool syntax sees them as the generic JSON text instead.
pub fn chat_messages(messages: &[Message], syntax: Syntax) -> Result<Vec<ChatMessage>, ApiError> {
    messages
        .iter()
        .map(|m| {
            // The legacy `function` role is a tool result, named by its function.
            let role = if m.role == "function" { "tool" } else { m.role.as_str() };
            if !matches!(role, "system" | "user" | "assistant" | "tool" | "developer") {
                return Err(
                    ApiError::bad_request(format!("unknown message role '{}'", m.role))
                        .param("messages"),
                );
            }
            let mut content = m.text()?;
            let calls = assistant_calls(m)?;
            // gpt-oss's template refuses a call turn with both content and reasoning (it shows
            // the content as the reasoning then), so the reasoning is left out there.
            let thinking = m
                .reasoning_content
                .clone()
                .filter(|r| m.role == "assistant" && !r.is_empty())
                .filter(|_| calls.is_none() || content.is_empty());
            let tool_calls = match calls {
                Some(calls) => {
                    let calls: Vec<Value> = calls.iter().map(template_call).collect::<Result<_, _>>()?;
                    if syntax == Syntax::Generic && content.is_empty() {
                        let generic: Vec<Value> = calls
                            .iter()
                            .map(|c| json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]}))
                            .collect();
                        content = json!({"tool_calls": generic}).to_string();
                    }
                    Some(Value::Array(calls))
                }
                None => None,
            };
            let legacy_result = (m.role == "function").then(|| legacy_call_id(m.name.as_deref()));
            Ok(ChatMessage {
                role: role.to_string(),
                content,
                tool_calls,
                tool_call_id: m.tool_call_id.clone().or(legacy_result),
                thinking,
                name: m.name.clone(),
            })
        })
        .collect()
}

/// An assistant message's calls in OpenAI's shape: its `tool_calls`, or its legacy
/// `function_call` as one call. Other roles carry none.
fn assistant_calls(m: &Message) -> Result<Option<Vec<Value>>, ApiError> {
    let only_assistants = || {
        ApiError::bad_request("only assistant messages carry tool_calls or function_call")
            .param("messages")
    };
    match (&m.tool_calls, &m.function_call) {
        (None, None) => Ok(None),
        _ if m.role != "assistant" => Err(only_assistants()),
        (Some(calls), _) => Ok(Some(calls.clone())),
        (None, Some(f)) => {
            let id = legacy_call_id(f.get("name").and_then(Value::as_str));
            Ok(Some(vec![
                json!({"id": id, "type": "function", "function": f}),
            ]))
        }
    }
}

/// The id a legacy call and its `function` result share: they are matched by name.
fn legacy_call_id(name: Option<&str>) -> String {
    format!("call_{}", name.unwrap_or("function"))
}

/// One OpenAI call (`arguments` a JSON string) as templates read it (`arguments` an object).
fn template_call(c: &Value) -> Result<Value, ApiError> {
    let bad = || {
        ApiError::bad_request("a tool call needs function.name and function.arguments")
            .param("messages")
    };
    let f = c.get("function").ok_or_else(bad)?;
    let name = f.get("name").and_then(Value::as_str).ok_or_else(bad)?;
    let args = match f.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(v) => v.clone(),
        None => json!({}),
    };
    Ok(json!({
        "id": c.get("id").cloned().unwrap_or(Value::Null),
        "type": "function",
        "function": {"name": name, "arguments": args},
        "name": name,
        "arguments": args,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn request(extra: Value) -> ChatRequest {
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
            assert_eq!(e.status, 400);
            assert_eq!(e.param.as_deref(), Some("reasoning_effort"));
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
        assert_eq!((e.status, e.param.as_deref()), (400, Some("tool_choice")));
    }

    #[test]
    fn a_vocabulary_with_the_markers_shows_them_and_stops_on_the_end_tokens() {
        let (tmpl, _) = gpt_oss();
        let tok = super::super::harmony_grammar::tests::gpt_oss_like();
        let id = |m: &str| tok.encode(m, false).unwrap()[0];
        let setup = prepare(
            &tmpl,
            &tok,
            &request(json!({"tool_choice": "required"})),
            None,
        )
        .unwrap();
        assert!(setup.rules.shows(id(harmony::CHANNEL)));
        assert!(setup.rules.shows(id(harmony::MESSAGE)));
        assert!(!setup.rules.shows(id("Hello")));
        assert_eq!(setup.stop_tokens, [id(harmony::RETURN), id(harmony::CALL)]);
        let Some(ConstraintSpec::Lark(g)) = &setup.constraint else {
            panic!("{:?}", setup.constraint)
        };
        assert!(g.contains(" <|message|> "), "markers named as tokens: {g}");
    }
}
