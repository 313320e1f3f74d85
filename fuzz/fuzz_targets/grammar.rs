//! Arbitrary constraints through the grammar compiler and a few mask steps, on the reference
//! model's vocabulary: the first byte picks the kind (JSON schema, Lark grammar, regex), the
//! rest is its text. Every input compiles or is refused with a message; the masks of what
//! compiles are computed and followed for a few tokens; no panic, no hang (the grammar limits
//! bound the work).

#![no_main]

#[path = "common.rs"]
mod common;

use edgelm::grammar::ConstraintSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(body) else {
        return;
    };
    let spec = match first % 3 {
        0 => match serde_json::from_str(text) {
            Ok(schema) => ConstraintSpec::JsonSchema(schema),
            Err(_) => return,
        },
        1 => ConstraintSpec::Lark(text.to_string()),
        _ => ConstraintSpec::Regex(text.to_string()),
    };
    let r = common::reference();
    let Ok(mut c) = r.grammars.compile(&spec) else {
        return;
    };
    let eog = c.eog().to_vec();
    for _ in 0..4 {
        let Ok(mask) = c.mask() else { return };
        // Follow the lowest allowed token, as a greedy sampler on flat logits would.
        let Some(t) = (0..r.tokenizer.vocab_size() as u32).find(|&t| mask.allows(t, &eog)) else {
            return;
        };
        if eog.contains(&t) || c.accept(t).is_err() {
            return;
        }
    }
});
