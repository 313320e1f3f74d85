//! Arbitrary request bodies through the /v1/completions, /v1/chat/completions and
//! /v1/responses parsing and
//! validation (`server::fuzz_parse_request`: JSON, unknown keys, sampling ranges, prompts, token
//! ids, chat messages and tools through the reference chat template, response formats and
//! grammars compiled, tokenization), with the reference
//! model's tokenizer and no engine. Every input is accepted or rejected with a 4xx; no panic.
//! The first byte picks the endpoint (a Responses body is also translated into its chat
//! request).

#![no_main]

#[path = "common.rs"]
mod common;

use edgelm::server::fuzz_parse_request;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let r = common::reference();
    let path = match first % 3 {
        0 => "/v1/completions",
        1 => "/v1/chat/completions",
        _ => "/v1/responses",
    };
    if let Err(status) = fuzz_parse_request(&r.tokenizer, Some(&r.chat), &r.grammars, path, body) {
        assert!((400..500).contains(&status), "{path}: status {status}");
    }
});
