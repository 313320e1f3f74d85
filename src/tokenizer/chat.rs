//! Chat templates: the GGUF's own Jinja template (`tokenizer.chat_template`) rendered with
//! minijinja, with the Python-style string methods Hugging Face templates rely on.

use anyhow::{anyhow, Result};
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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// [`Self::render`] with the request's tools (OpenAI's shape) for templates that show them.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .expect("added in new()");
        tmpl.render(minijinja::context! {
            messages => messages,
            tools => tools,
            add_generation_prompt => add_generation_prompt,
            bos_token => &self.bos_token,
            eos_token => &self.eos_token,
        })
        .map_err(|e| anyhow!("chat template failed: {e}"))
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
