//! Chat templates: the GGUF's own Jinja template (`tokenizer.chat_template`) rendered with
//! minijinja, with the Python-style string methods Hugging Face templates rely on.

use anyhow::{anyhow, Result};
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
    /// An assistant turn's calls, as templates read them: `[{"id", "type", "function":
    /// {"name", "arguments": {...}}}]` (arguments as an object, not OpenAI's string).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    /// A tool result's call id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// An assistant turn's reasoning sent back by the client, under the name gpt-oss's
    /// template reads (it keeps the reasoning that led to a call for the call's result).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// What a request gives a template besides its messages. A field left `None` is not defined
/// for the template at all, so that its own default applies (`{% if x is not defined %}`).
#[derive(Clone, Copy, Debug, Default)]
pub struct TemplateInputs<'a> {
    /// The request's tools, in OpenAI's shape, for templates that show them.
    pub tools: Option<&'a serde_json::Value>,
    /// `low`, `medium` or `high`, read by templates that set a reasoning budget (gpt-oss).
    pub reasoning_effort: Option<&'a str>,
}

/// A compiled chat template. Rendering is pure: same messages, same prompt.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

const TEMPLATE_NAME: &str = "chat";

/// Instructions one render may execute. Real chat templates spend tens per message, so
/// this admits prompts of hundreds of thousands of messages, yet a template that loops
/// without end (`range` nested in `range`) fails with an error instead of hanging the
/// request thread.
pub const TEMPLATE_FUEL: u64 = 20_000_000;
/// Nesting depth of macros, includes and recursive loops (minijinja's own default is 500).
pub const TEMPLATE_RECURSION_LIMIT: usize = 100;

impl ChatTemplate {
    pub fn new(source: &str, bos_token: String, eos_token: String) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        // HF templates call str.strip(), .startswith(), dict.items() and friends.
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| -> String {
            // No clock formatting dependency: templates use this for a date banner only.
            let _ = fmt;
            String::new()
        });
        env.add_filter("tojson", tojson);
        // Jinja2 as HF configures it: trim_blocks and lstrip_blocks are on.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_recursion_limit(TEMPLATE_RECURSION_LIMIT);
        env.add_template_owned(TEMPLATE_NAME.to_string(), source.to_string())
            .map_err(|e| anyhow!("chat template does not compile: {e}"))?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            bos_token,
            eos_token,
        })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt for `messages`, with the assistant turn opened when `add_generation_prompt`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, &TemplateInputs::default(), add_generation_prompt)
    }

    /// [`Self::render`] with the request's tools and options for templates that read them.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        inputs: &TemplateInputs,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("added in new()");
        let effort = match inputs.reasoning_effort {
            Some(e) => minijinja::context! { reasoning_effort => e },
            None => minijinja::context! {},
        };
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => inputs.tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
            ..effort
        })
        .map_err(|e| anyhow!("chat template failed: {e}"))
    }
}

/// `tojson` as Hugging Face defines it for chat templates (Python's `json.dumps`): `", "` and
/// `": "` between items, non-ASCII text as is, no HTML escaping; `indent` pretty-prints. The
/// prompt a model was trained on has tool schemas and arguments in exactly this form.
fn tojson(value: &Value, indent: Option<usize>, kwargs: Kwargs) -> Result<String, Error> {
    let indent = match indent {
        Some(n) => Some(n),
        None => kwargs.get::<Option<usize>>("indent")?,
    };
    let mut out = Vec::new();
    let done = match indent {
        Some(n) => {
            let pad = " ".repeat(n);
            let f = serde_json::ser::PrettyFormatter::with_indent(pad.as_bytes());
            value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, f))
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            PythonFormatter,
        )),
    };
    done.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    String::from_utf8(out).map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))
}

/// Python's default JSON separators on one line.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_chatml_with_methods() {
        let src = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
        let t = ChatTemplate::new(src, String::new(), String::new()).unwrap();
        let msgs = vec![ChatMessage {
            role: "user".into(),
            content: "  hi ".into(),
            ..Default::default()
        }];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tojson_writes_what_python_json_dumps_writes() {
        let src = "{{ m | tojson }}|{{ m | tojson(indent=2) }}|{{ '<a> é' | tojson }}";
        let t = ChatTemplate::new(src, String::new(), String::new()).unwrap();
        let out = t
            .env
            .get_template(TEMPLATE_NAME)
            .unwrap()
            .render(minijinja::context! { m => serde_json::json!({"a": [1, "x"], "b": {}}) })
            .unwrap();
        assert_eq!(
            out,
            "{\"a\": [1, \"x\"], \"b\": {}}|{\n  \"a\": [\n    1,\n    \"x\"\n  ],\n  \"b\": {}\n}|\"<a> é\""
        );
    }

    #[test]
    fn endless_template_runs_out_of_fuel() {
        let src =
            "{% for a in range(100000) %}{% for b in range(100000) %}x{% endfor %}{% endfor %}";
        let t = ChatTemplate::new(src, String::new(), String::new()).unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("fuel"), "{err}");
    }

    #[test]
    fn deep_recursion_is_an_error() {
        let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
        let t = ChatTemplate::new(src, String::new(), String::new()).unwrap();
        assert!(t.render(&[], false).is_err());
    }

    #[test]
    fn raise_exception_is_an_error() {
        let t = ChatTemplate::new(
            "{{ raise_exception('no system role') }}",
            "".into(),
            "".into(),
        )
        .unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");
    }
}
