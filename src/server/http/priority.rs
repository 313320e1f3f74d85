//! Thread priorities while serving: the engine comes first. Its compute threads run at the
//! normal nice level (0) and the handler threads (parsing, tokenizing, relaying tokens: work
//! that grows with what clients send) at `HTTP_NICE`, so that whatever the clients send, a
//! step of the engine is not waiting for the CPU behind work done for them. The front thread
//! stays at the normal level: its work is bounded (its refusals are paced) and it answers
//! /health, which must stay prompt while the engine keeps every core busy. `EDGELM_HTTP_NICE` and `EDGELM_COMPUTE_NICE` override
//! the two levels, for measuring the choice (docs/http-front.md); they are not settings.

use std::sync::OnceLock;

const HTTP_NICE: i32 = 5;

fn env_nice(name: &str, default: i32) -> i32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|n| (-20..=19).contains(n))
        .unwrap_or(default)
}

/// The nice level of handler threads.
fn http_nice() -> i32 {
    static N: OnceLock<i32> = OnceLock::new();
    *N.get_or_init(|| env_nice("EDGELM_HTTP_NICE", HTTP_NICE))
}

/// The compute threads' nice level while serving (set before the pool starts).
pub fn compute_nice() -> i32 {
    env_nice("EDGELM_COMPUTE_NICE", 0)
}

/// Runs first on every handler thread.
pub fn http_thread() {
    crate::backend::cpu::pool::set_this_thread_nice(http_nice());
}
