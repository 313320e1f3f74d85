//! The ids edgelm gives what it answers, in OpenAI's forms: unique per process (a counter),
//! and for kept responses also per boot (a tag), so that an id from before a restart names
//! nothing.

/// A `/v1/completions` answer's id.
pub fn completion(n: u64) -> String {
    format!("cmpl-{n}")
}

/// A `/v1/chat/completions` answer's id.
pub fn chat_completion(n: u64) -> String {
    format!("chatcmpl-{n}")
}

/// A Responses answer's id; `boot` tells this run of the server from earlier ones.
pub fn response(boot: &str, n: u64) -> String {
    format!("resp_{boot}{n:06}")
}

/// A call's id: unique per answer, choice and call.
pub fn call(answer: &str, choice: usize, call: usize) -> String {
    format!("call_{answer}_{choice}_{call}")
}
