//! The prefix cache kept on disk: a server stopped cleanly and started again answers a long
//! cached prompt from the restored blocks (printing the time to first token cold, warm in the
//! same process, and after the restart), with the same text; a cache file for another model
//! file or KV format, or a corrupted one, is never used.

mod common;

use common::*;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

/// A prompt of about 2,000 tokens, as a long system prompt would be.
fn long_prompt() -> String {
    (0..170)
        .map(|i| format!("Rule {i}: answer briefly, politely and in plain words."))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `serve` of `model` keeping its prefix cache in `dir`, with `flags`, its log in `log`.
fn serve(model: &Path, dir: &Path, flags: &[&str], log: &Path) -> Server {
    let mut all = vec!["--prefix-cache-dir", dir.to_str().unwrap()];
    all.extend_from_slice(flags);
    Server::start_logging(model, &all, Some(log))
}

/// (seconds to the first streamed token, the whole text, prompt tokens served from the cache)
/// of a greedy completion of `prompt`.
fn ask(server: &Server, prompt: &str) -> (f64, String, u64) {
    let body = serde_json::json!({
        "prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string();
    let mut c = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    let t0 = Instant::now();
    write!(
        c,
        "POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let (mut seen, mut first, mut buf) = (Vec::new(), None, [0u8; 4096]);
    loop {
        let n = c.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
        if first.is_none() && String::from_utf8_lossy(&seen).contains("\"text\"") {
            first = Some(t0.elapsed().as_secs_f64());
        }
    }
    let text = String::from_utf8(seen).unwrap();
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let said: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    let usage = events
        .iter()
        .find(|e| e["usage"].is_object())
        .expect("usage");
    let cached = usage["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(usage["usage"]["prompt_tokens"].as_u64().unwrap() >= 2000);
    (first.expect("a token"), said, cached)
}

/// Stops the server as systemd does (SIGTERM, a clean drain), which saves the cache.
fn stop(mut server: Server) {
    server.signal(libc::SIGTERM);
    let status = server
        .exit_within(Duration::from_secs(30))
        .expect("stopped");
    assert!(status.success());
}

#[test]
fn a_restart_restores_the_prefix_cache_and_only_for_its_model_and_format() {
    let dir = scratch_dir("prefix-cache-disk");
    let (cache, log) = (dir.join("cache"), dir.join("serve.log"));
    let model = dir.join("served.gguf");
    std::fs::copy(model_path(), &model).unwrap();
    let prompt = long_prompt();

    let server = serve(&model, &cache, &[], &log);
    let (cold, text, cached) = ask(&server, &prompt);
    assert_eq!(cached, 0);
    let (warm, again, warm_cached) = ask(&server, &prompt);
    assert_eq!(again, text);
    assert!(warm_cached >= 2000, "{warm_cached}");
    stop(server);

    // kv-plan tells what a start would restore; the start restores that.
    let out = run_ok(
        edgelm()
            .args(["kv-plan", "--json", "--prefix-cache-dir"])
            .arg(&cache)
            .arg("-m")
            .arg(&model),
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["prefix_cache"]["state"], "restorable", "{plan}");
    let server = serve(&model, &cache, &[], &log);
    let restored_blocks = server.metric("edgelm_prefix_cache_restored_blocks");
    assert!(restored_blocks > 0.0);
    assert_eq!(
        plan["prefix_cache"]["blocks"].as_f64(),
        Some(restored_blocks)
    );
    let (restored, after, restored_cached) = ask(&server, &prompt);
    println!(
        "time to first token with a {}-token cached prompt: cold {:.3} s, warm {:.3} s, \
         after a restart {:.3} s ({:.2}x warm, {:.0}% of cold)",
        warm_cached,
        cold,
        warm,
        restored,
        restored / warm,
        100.0 * restored / cold
    );
    // The restart's first request reuses what the warm one did, and says the same.
    assert_eq!(restored_cached, warm_cached);
    assert_eq!(after, text);
    stop(server);

    // Another KV format: the file is not for it.
    let server = serve(&model, &cache, &["--kv-type", "q8_0"], &log);
    assert_eq!(server.metric("edgelm_prefix_cache_restored_blocks"), 0.0);
    assert_eq!(ask(&server, &prompt).2, 0);
    stop(server);

    // A corrupted file: discarded with one line, and the answer is a cold server's.
    let server = serve(&model, &cache, &[], &log);
    ask(&server, &prompt);
    stop(server);
    let file = cache.join("served.gguf.kvcache");
    let mut bytes = std::fs::read(&file).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&file, &bytes).unwrap();
    let server = serve(&model, &cache, &[], &log);
    assert_eq!(server.metric("edgelm_prefix_cache_restored_blocks"), 0.0);
    let (_, cold_again, cached) = ask(&server, &prompt);
    assert_eq!((cold_again.as_str(), cached), (text.as_str(), 0));
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("checksum fails; discarded"), "{logged}");
    stop(server);

    // The model file replaced by another: nothing restored, the file deleted.
    let server = serve(&model, &cache, &[], &log);
    ask(&server, &prompt);
    stop(server);
    std::fs::copy(gemma3_path(), dir.join("new.gguf")).unwrap();
    std::fs::rename(dir.join("new.gguf"), &model).unwrap();
    let server = serve(&model, &cache, &[], &log);
    assert_eq!(server.metric("edgelm_prefix_cache_restored_blocks"), 0.0);
    assert_eq!(ask(&server, &prompt).2, 0);
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("deleted, not used"), "{logged}");
}
