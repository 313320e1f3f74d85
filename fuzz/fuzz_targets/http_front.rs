//! Raw bytes on one connection to the HTTP front (the gate, hyper, the service and the handler
//! pools, with no model loaded: `server::fuzz_http`). Every input gets well-formed answers, at
//! most one final answer per request head the gate passed (never a second response from one
//! request's bytes), and an end within the harness's limit (a hang is a failure); no panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = edgelm::server::fuzz_http(data) {
        panic!("{why}");
    }
});
