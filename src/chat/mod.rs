//! Chat: a conversation made into a prompt through the model's chat template, and the answer
//! split back into reasoning, content and tool calls. It needs only the tokenizer (templates,
//! vocabularies) and the grammar compiler's constraint specs, so it sits below the server,
//! which turns HTTP bodies into its inputs and its outputs into OpenAI's shapes.
//!
//! Function calling speaks five syntaxes, chosen from the template (`Syntax::ALL`):
//! - Hermes/Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one block per call;
//! - Llama 3.x: a bare `{"name": ..., "parameters": {...}}` object;
//! - harmony (gpt-oss): a message `<|channel|>commentary to=functions.NAME <|constrain|>json
//!   <|message|>{...}<|call|>`, split with the rest of the answer by `harmony`;
//! - Mistral: `[TOOL_CALLS]` and a JSON list of `{"name": ..., "arguments": {...}}` (Nemo,
//!   Magistral), or `[TOOL_CALLS]NAME[ARGS]{...}` per call (newer templates);
//! - generic, for templates with no syntax of their own: `{"tool_calls": [{"name": ...,
//!   "arguments": {...}}]}`, taught to the model by a system message edgelm adds.
//!
//! Read in this order (each file uses only those above it): `types` and `markers` (the words:
//! tools, messages, syntaxes, calls, deltas, marker strings), `error`; `tools` (a request's
//! tools and choice), `prompt` (rendering); `call_scan`, `harmony`, `calls`, `call_stream`,
//! `output` (an answer split as it streams); `harmony_grammar`, `forcing` (grammars that force
//! a call); `setup` (all of it for one request).

mod call_scan;
mod call_stream;
mod calls;
mod error;
mod forcing;
mod harmony;
mod harmony_grammar;
mod markers;
mod output;
mod prompt;
mod setup;
mod tools;
mod types;

pub use error::Error;
pub use output::ChatOutput;
pub use prompt::{render_prompt, Conversation, Offer};
pub use setup::{prepare, ChatSetup, OutputRules};
pub use types::{
    Call, ContentPart, Delta, Function, ImagePart, ImageUrl, Message, MessageContent, Syntax, Tool,
    IMAGE_MARKER,
};
