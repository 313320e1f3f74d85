//! The words the chat layer speaks in, shared by every file of it: the tools a request offers,
//! the messages it sends, the call syntaxes a template can teach, a call found in an answer,
//! and the pieces (`Delta`) an answer is released in. Everything else in `chat/` builds on
//! these; this file imports nothing of its siblings but their marker strings.

use super::error::Error;
use super::markers::{HARMONY_CALL, HARMONY_CHANNEL, HERMES_OPEN, MISTRAL_CALLS, PYTHON_TAG};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: String,
    pub function: Function,
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
    /// OpenAI's strict schema adherence: every call edgelm forces already follows the schema.
    #[serde(rename = "strict")]
    pub _strict: Option<bool>,
}

impl Function {
    /// The arguments' schema (an object with any fields when the tool declares none).
    pub fn parameters(&self) -> Value {
        self.parameters
            .clone()
            .unwrap_or_else(|| json!({"type": "object"}))
    }
}

/// A call found in the output.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

/// A piece of the answer, ready to send.
#[derive(Clone, Debug, PartialEq)]
pub enum Delta {
    Content(String),
    Reasoning(String),
    /// Call `index` begins: its name is fixed (a stream sends the call's id and name now).
    CallStart(usize, String),
    /// More of call `index`'s arguments, as JSON text.
    CallArgs(usize, String),
    /// Call `index` is complete; its `arguments` are the concatenation of its `CallArgs`.
    Call(usize, Call),
}

/// The deltas of a call found whole: its start, all its arguments, its end.
pub fn whole_call(index: usize, call: Call) -> [Delta; 3] {
    [
        Delta::CallStart(index, call.name.clone()),
        Delta::CallArgs(index, call.arguments.clone()),
        Delta::Call(index, call),
    ]
}

/// The call syntaxes a chat template can teach its model; `Syntax::ALL` is the one list of
/// them that `inspect`, the docs and the README are checked against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syntax {
    Hermes,
    Llama3,
    Harmony,
    Mistral,
    Generic,
}

impl Syntax {
    /// Every syntax, in the order `of_template` tries them.
    pub const ALL: [Syntax; 5] = [
        Syntax::Harmony,
        Syntax::Mistral,
        Syntax::Hermes,
        Syntax::Llama3,
        Syntax::Generic,
    ];

    /// The name users read (`edgelm inspect`, the docs).
    pub fn name(self) -> &'static str {
        match self {
            Syntax::Hermes => "hermes",
            Syntax::Llama3 => "llama3",
            Syntax::Harmony => "harmony",
            Syntax::Mistral => "mistral",
            Syntax::Generic => "generic",
        }
    }

    /// What a call looks like in this syntax.
    pub fn example(self) -> &'static str {
        match self {
            Syntax::Hermes => r#"<tool_call>{"name": ..., "arguments": {...}}</tool_call>"#,
            Syntax::Llama3 => r#"{"name": ..., "parameters": {...}}"#,
            Syntax::Harmony => "<|channel|>commentary to=functions.NAME <|message|>{...}<|call|>",
            Syntax::Mistral => r#"[TOOL_CALLS][{"name": ..., "arguments": {...}}]"#,
            Syntax::Generic => r#"{"tool_calls": [{"name": ..., "arguments": {...}}]}"#,
        }
    }

    /// The syntax a chat template teaches its model.
    pub fn of_template(source: &str) -> Syntax {
        if source.contains(HARMONY_CHANNEL) && source.contains(HARMONY_CALL) {
            Syntax::Harmony
        } else if source.contains(MISTRAL_CALLS) {
            Syntax::Mistral
        } else if source.contains(HERMES_OPEN) {
            Syntax::Hermes
        } else if source.contains(PYTHON_TAG) || source.contains("\"parameters\"") {
            Syntax::Llama3
        } else {
            Syntax::Generic
        }
    }

    /// Does the template render `tools` itself? Otherwise edgelm describes them.
    pub fn template_shows_tools(source: &str) -> bool {
        source.contains("tools")
    }
}

#[derive(Deserialize, Debug, Clone)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
    /// An `image_url` part's image.
    pub image_url: Option<ImageUrl>,
}

/// An image as OpenAI's clients send it: a `data:` URL (or a remote one, which the server may
/// refuse), and how closely to look at it (accepted; every projector has one resolution).
#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ImageUrl {
    pub url: String,
    pub detail: Option<String>,
}

/// Where an image stands in a rendered prompt: llama.cpp's media marker, which its server
/// writes in a message's text for each image part too.
pub const IMAGE_MARKER: &str = "<__media__>";

/// An image of a conversation, and the content part it came in (for errors that name it).
#[derive(Debug, Clone, PartialEq)]
pub struct ImagePart {
    pub url: ImageUrl,
    /// `messages[i].content[j]`.
    pub param: String,
}

/// One message of a conversation, as OpenAI's clients send it.
#[derive(Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: String,
    pub content: Option<MessageContent>,
    pub name: Option<String>,
    /// An assistant turn's calls, as OpenAI sends them back.
    pub tool_calls: Option<Vec<Value>>,
    /// A tool result's call.
    pub tool_call_id: Option<String>,
    /// The legacy form of an assistant's one call (`{"name", "arguments"}`), answered by a
    /// `role: function` message with the same `name`.
    pub function_call: Option<Value>,
    /// Sent back by some clients with an assistant turn; not part of the prompt.
    #[serde(rename = "refusal")]
    pub _refusal: Option<Value>,
    /// Clients may send the reasoning back: templates see it as `thinking` (gpt-oss keeps the
    /// reasoning behind a call), others drop it.
    pub reasoning_content: Option<String>,
}

impl Message {
    /// A message of `role` with plain text (as the Responses API's items become messages).
    pub fn text_of(role: &str, text: impl Into<String>) -> Message {
        Message {
            role: role.to_string(),
            content: Some(MessageContent::Text(text.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
            function_call: None,
            _refusal: None,
            reasoning_content: None,
        }
    }

    /// Its image parts, in order; `index` is the message's place in the conversation.
    pub fn images(&self, index: usize) -> Vec<ImagePart> {
        let Some(MessageContent::Parts(parts)) = &self.content else {
            return Vec::new();
        };
        parts
            .iter()
            .enumerate()
            .filter_map(|(j, p)| {
                p.image_url.clone().map(|url| ImagePart {
                    url,
                    param: format!("messages[{index}].content[{j}]"),
                })
            })
            .collect()
    }

    /// The message's text: its string, or its parts joined, each image part as
    /// [`IMAGE_MARKER`] (as llama.cpp's server writes it).
    pub fn text(&self) -> Result<String, Error> {
        match &self.content {
            None => Ok(String::new()),
            Some(MessageContent::Text(t)) => Ok(t.clone()),
            Some(MessageContent::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    match (p.kind.as_str(), &p.text, &p.image_url) {
                        ("text", _, None) => s += p.text.as_deref().unwrap_or(""),
                        ("image_url", None, Some(_)) => s += IMAGE_MARKER,
                        (kind, ..) => {
                            return Err(Error::new(
                                "messages",
                                format!(
                                    "content part type '{kind}' is not supported (text and \
                                     image_url, each with its own field)"
                                ),
                            ))
                        }
                    }
                }
                Ok(s)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The docs name every syntax `Syntax::ALL` holds, by the name `inspect` prints: the
    /// structured-output guide lists each one, and the README's module map names them all.
    #[test]
    fn every_syntax_is_named_in_the_docs() {
        let root = env!("CARGO_MANIFEST_DIR");
        let guide = std::fs::read_to_string(format!("{root}/docs/structured-output.md")).unwrap();
        let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
        let listed = readme
            .lines()
            .find(|l| l.starts_with("| `src/chat/` |"))
            .expect("the README's module map has a row for src/chat/");
        for syntax in Syntax::ALL {
            let name = syntax.name();
            assert!(
                guide.contains(&format!("- **`{name}`**")),
                "docs/structured-output.md does not list `{name}`"
            );
            assert!(
                listed.contains(name),
                "README.md's src/chat/ row does not name {name}"
            );
        }
    }

    #[test]
    fn each_syntax_is_found_in_a_template_that_speaks_it() {
        for syntax in Syntax::ALL {
            let template = match syntax {
                Syntax::Harmony => "<|channel|> <|call|>".to_string(),
                Syntax::Llama3 => "<|python_tag|>".to_string(),
                Syntax::Generic => "{{ messages }}".to_string(),
                other => other.example().to_string(),
            };
            assert_eq!(Syntax::of_template(&template), syntax, "{template}");
        }
    }
}
