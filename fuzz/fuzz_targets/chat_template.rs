//! Chat rendering: arbitrary message lists through the reference model's template (must
//! succeed for the roles the server accepts), and arbitrary template sources through the
//! renderer (compile or render errors are fine; panics and hangs are not — the renderer
//! sets minijinja fuel and a recursion limit).

#![no_main]

#[path = "common.rs"]
mod common;

use arbitrary::Arbitrary;
use edgelm::tokenizer::{ChatMessage, ChatTemplate};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Role {
    System,
    User,
    Assistant,
    Tool,
    Developer,
    Other(String),
}

#[derive(Arbitrary, Debug)]
struct Msg {
    role: Role,
    content: String,
}

#[derive(Arbitrary, Debug)]
enum Input {
    Reference {
        messages: Vec<Msg>,
        add_generation_prompt: bool,
    },
    Source {
        source: String,
        bos: String,
        eos: String,
        messages: Vec<Msg>,
        add_generation_prompt: bool,
    },
}

fn messages(msgs: Vec<Msg>) -> (Vec<ChatMessage>, bool) {
    let mut known_roles = true;
    let out = msgs
        .into_iter()
        .map(|m| {
            let role = match m.role {
                Role::System => "system".to_string(),
                Role::User => "user".into(),
                Role::Assistant => "assistant".into(),
                Role::Tool => "tool".into(),
                Role::Developer => "developer".into(),
                Role::Other(s) => {
                    known_roles = false;
                    s
                }
            };
            ChatMessage {
                role,
                content: m.content,
                ..Default::default()
            }
        })
        .collect();
    (out, known_roles)
}

fuzz_target!(|input: Input| match input {
    Input::Reference {
        messages: msgs,
        add_generation_prompt,
    } => {
        let (msgs, known_roles) = messages(msgs);
        let r = common::reference()
            .chat
            .render(&msgs, add_generation_prompt);
        if known_roles {
            let text = r.expect("the reference template renders any server-accepted roles");
            for m in &msgs {
                assert!(text.contains(m.content.trim()));
            }
        }
    }
    Input::Source {
        source,
        bos,
        eos,
        messages: msgs,
        add_generation_prompt,
    } => {
        let (msgs, _) = messages(msgs);
        if let Ok(t) = ChatTemplate::new(&source, bos, eos) {
            let _ = t.render(&msgs, add_generation_prompt);
        }
    }
});
