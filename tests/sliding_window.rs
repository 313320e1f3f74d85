//! Gemma 3's sliding windows in the paged pool, end to end with the real model and binary: its
//! local layers hold only their window, so `kv-plan` counts a long sequence at a fraction of
//! full attention, a 4,000-token prompt runs in a 40 MiB pool that full attention would
//! overflow, and the prefix cache still serves a shared prompt to every layer.

mod common;

use common::*;
use edgelm::tokenizer::Tokenizer;

fn kv_plan(model: &std::path::Path, ctx: usize) -> serde_json::Value {
    let out = run_ok(
        edgelm()
            .args(["kv-plan", "--json", "--ctx", &ctx.to_string(), "-m"])
            .arg(model),
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn kv_plan_counts_windows_per_sequence() {
    let plan = kv_plan(&gemma3_path(), 32768);
    let windowed = plan["kv_bytes_per_sequence"].as_u64().unwrap();
    let full = plan["full_attention_bytes_per_sequence"].as_u64().unwrap();
    eprintln!(
        "Gemma 3 at 32768 tokens: {windowed} bytes per sequence, {full} with full attention ({:.3}x)",
        windowed as f64 / full as f64
    );
    assert!(windowed * 5 <= full, "{windowed} > 0.2 x {full}");
    // Full attention is every layer's K and V for every token.
    assert_eq!(full, 32768 * plan["kv_bytes_per_token"].as_u64().unwrap());
    // A model without windows holds every token in every layer.
    let plan = kv_plan(&model_path(), 4096);
    assert_eq!(
        plan["kv_bytes_per_sequence"],
        plan["full_attention_bytes_per_sequence"]
    );
}

/// The first `n` tokens' worth of the GPL (at least `n` tokens for Gemma's tokenizer).
fn long_text(tok: &Tokenizer, n: usize) -> String {
    let gpl = std::fs::read_to_string(repo_root().join("tests/data/gpl-3.txt")).unwrap();
    let mut text = String::new();
    for line in gpl.lines().cycle() {
        text.push_str(line);
        text.push('\n');
        if text.len() > 4 * n && tok.encode(&text, false).unwrap().len() >= n {
            return text;
        }
    }
    unreachable!()
}

#[test]
fn a_4000_token_prompt_runs_in_40_mib() {
    let gguf = edgelm::gguf::GgufFile::open(gemma3_path()).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let prompt = long_text(&tok, 4000);
    let tokens = tok.encode(&prompt, true).unwrap().len();
    // Full attention would need more than the pool: the windows are what make it fit.
    let per_token = kv_plan(&gemma3_path(), 4096)["kv_bytes_per_token"]
        .as_u64()
        .unwrap();
    assert!(tokens as u64 * per_token > 40 << 20);
    let out = run_ok(
        edgelm()
            .args([
                "run",
                "--kv-memory-mib",
                "40",
                "-n",
                "8",
                "--temp",
                "0",
                "-t",
                "2",
            ])
            .args(["-p", &prompt, "-m"])
            .arg(gemma3_path()),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    eprintln!("{tokens}-token prompt in 40 MiB: {text:?}");
    assert!(!text.trim().is_empty(), "no text generated");
}

#[test]
fn a_shared_prompt_is_served_from_the_prefix_cache() {
    let out = run_ok(
        edgelm()
            .args(["bench", "-p", "16", "-n", "4", "--concurrency", "1"])
            .args([
                "--shared-prefix",
                "1000",
                "-r",
                "1",
                "--json",
                "-t",
                "2",
                "-m",
            ])
            .arg(gemma3_path()),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = &r["shared_prefix"];
    eprintln!("Gemma 3, 1,000 shared tokens: {s}");
    // Every layer (windowed ones included) takes the shared blocks from the cache, so the
    // second request computes only its own tokens. The bar: its TTFT is at most a quarter of
    // the cold request's (measured about 4%).
    let ratio = s["ratio"].as_f64().unwrap();
    assert!(ratio <= 0.25, "cached TTFT {ratio:.2} of the cold one");
}
