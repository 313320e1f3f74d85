//! Every supported architecture end to end through the real binary: `run`, `perplexity` and
//! `serve` (a completion over HTTP) on each test model (tests/common/test_models.rs), on
//! Gemma 3 270M, and on a `mistral`-labelled copy of the reference model; `bench` on the
//! mixtures of experts, and a gpt-oss call through its harmony template. Whether the numbers
//! are right is tests/kld.rs's question; this one asks that every entry point takes every
//! family.

mod common;

use common::*;
use std::path::PathBuf;
use std::time::Duration;

fn models() -> Vec<(String, PathBuf)> {
    let mut all: Vec<(String, PathBuf)> = TEST_ARCHS
        .iter()
        .map(|a| (a.to_string(), test_model(a)))
        .collect();
    all.push(("gemma3 270M".into(), gemma3_path()));
    let mistral = edited_model("mistral-labelled.gguf", |kvs, _| {
        for (key, value) in kvs.iter_mut() {
            if key == "general.architecture" {
                *value = edgelm::gguf::Value::String("mistral".into());
            } else if let Some(rest) = key.strip_prefix("llama.") {
                *key = format!("mistral.{rest}");
            }
        }
    });
    all.push(("mistral".into(), mistral));
    all
}

#[test]
fn every_architecture_runs() {
    for (name, model) in models() {
        let out = run_ok(
            edgelm()
                .args(["run", "-p", "The weather today", "-n", "6", "--temp", "0"])
                .args(["--ignore-eos", "-t", "2", "-m"])
                .arg(&model),
        );
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("{name}: {text:?}");
        assert!(!text.is_empty(), "{name}: no text");
    }
}

#[test]
fn every_architecture_computes_perplexity() {
    for (name, model) in models() {
        let out = run_ok(
            edgelm()
                .args(["perplexity", "-c", "128", "--chunks", "1", "-t", "2", "-f"])
                .arg(repo_root().join("tests/data/gpl-2.txt"))
                .arg("-m")
                .arg(&model),
        );
        let all = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        let ppl: f64 = all
            .lines()
            .find_map(|l| l.split("Final estimate: PPL = ").nth(1))
            .unwrap_or_else(|| panic!("{name}: no estimate in {all}"))
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        eprintln!("{name}: PPL {ppl}");
        assert!(ppl.is_finite() && ppl > 1.0, "{name}: PPL {ppl}");
    }
}

#[test]
fn every_architecture_serves_a_completion() {
    for (name, model) in models() {
        let server = Server::start(&model);
        let (status, body) = server.request(
            "POST",
            "/v1/completions",
            r#"{"prompt":"The weather today","max_tokens":6,"temperature":0,"ignore_eos":true}"#,
        );
        assert_eq!(status, 200, "{name}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let usage = v["usage"]["completion_tokens"].as_u64().unwrap();
        eprintln!("{name}: {}", v["choices"][0]["text"]);
        assert!(usage > 0, "{name}: {body}");
    }
}

/// gpt-oss speaks harmony: its test model carries gpt-oss's chat template, so a forced call
/// is generated in the channel syntax and comes back as `tool_calls`, and `reasoning_effort`
/// reaches the template.
#[test]
fn gpt_oss_answers_a_forced_call_through_harmony() {
    let server = Server::start(&test_model("gpt-oss"));
    let tools = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":12}},"required":["city"],"additionalProperties":false}}}]"#;
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"Weather in Paris?"}}],"tools":{tools},"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}},"reasoning_effort":"high","max_tokens":120,"temperature":0}}"#
    );
    let (status, body) = server.request("POST", "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{body}");
    let call = &choice["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{body}");
    let args: serde_json::Value = serde_json::from_str(call["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {body}"));
    assert!(args["city"].is_string(), "{body}");
    assert!(choice["message"]["content"].is_null() || choice["message"]["content"] == "");
    let (status, body) = server.request(
        "POST",
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Hi"}],"reasoning_effort":"extreme","max_tokens":4}"#,
    );
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("reasoning_effort"), "{body}");
}

/// A mixture of experts reads only the experts its tokens pick: `bench` measures the weight
/// bytes the matmuls read per decoded token, which must be within 10% of the active matrices'
/// bytes (router and the picked experts), well under the bytes of every expert.
#[test]
fn mixtures_of_experts_read_only_their_active_experts() {
    for arch in ["qwen3moe", "gpt-oss"] {
        let out = run_ok(
            edgelm()
                .args(["bench", "-t", "2", "-p", "16", "-n", "16", "-r", "1"])
                .args(["--concurrency", "1", "--shared-prefix", "0", "--json", "-m"])
                .arg(test_model(arch)),
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let measured = v["decode_weight_bytes_measured"].as_f64().unwrap();
        let active = v["decode_weight_bytes_active"].as_f64().unwrap();
        let all = v["weight_bytes_all"].as_f64().unwrap();
        eprintln!("{arch}: {measured} bytes read per token, {active} active, {all} in all");
        assert!(
            (measured / active - 1.0).abs() < 0.1,
            "{arch}: {measured} vs {active}"
        );
        assert!(active < 0.8 * all, "{arch}: {active} of {all} active");
    }
}

/// A hybrid keeps each running sequence's recurrent state in a slot of its own: with more
/// requests than slots (2) and prompts prefilled in several chunks (16 tokens a step), every
/// greedy answer is the one the prompt gets alone; an n = 2 request's fork (its state copied
/// at the fork) gives it too; and every slot and block is back once the load is done. (No
/// prefix-cache snapshots here, so that every prompt runs its chunks.)
#[test]
fn a_hybrid_keeps_each_sequences_state_apart() {
    for arch in ["lfm2", "qwen35"] {
        eprintln!("{arch}:");
        keeps_each_sequences_state_apart(arch);
    }
}

fn keeps_each_sequences_state_apart(arch: &str) {
    let server = hybrid_server(
        arch,
        "max_seqs = 2\nmax_batched_tokens = 16\nstate_snapshot_mib = 0",
    );
    let prompts: Vec<String> = (0..5)
        .map(|i| {
            format!(
                "Story {i}: once upon a time, in a village by the sea, there lived a fisherman \
                 whose {} boat",
                ["red", "old", "small", "fast", "blue"][i]
            )
        })
        .collect();
    let ask = |p: &str, n: usize| -> Vec<String> {
        let body = serde_json::json!({"prompt": p, "max_tokens": 8, "temperature": 0,
                                      "ignore_eos": true, "n": n});
        let (status, body) = server.request("POST", "/v1/completions", &body.to_string());
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let texts: Vec<String> = v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(texts.len(), n, "{body}");
        texts
    };
    let alone: Vec<String> = prompts.iter().map(|p| ask(p, 1).remove(0)).collect();
    let together: Vec<String> = std::thread::scope(|scope| {
        let asks: Vec<_> = prompts
            .iter()
            .map(|p| scope.spawn(|| ask(p, 1).remove(0)))
            .collect();
        asks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        eprintln!("prompt {i}: {a:?}");
        assert_eq!(a, t, "prompt {i}: alone {a:?}, with others {t:?}");
    }
    for (i, text) in ask(&prompts[1], 2).iter().enumerate() {
        assert_eq!(text, &alone[1], "fork {i}");
    }
    assert_eq!(server.metric("edgelm_state_slots"), 2.0);
    // A finished sequence's slot and blocks go back just after its answer is sent.
    assert_eq!(server.settled_metric("edgelm_state_slots_used"), 0.0);
    assert_eq!(server.settled_metric("edgelm_kv_blocks_used"), 0.0);
}

/// A server on `arch`'s test model with these `[engine]` profile lines (the step's token
/// budget is a profile setting for `serve`).
fn hybrid_server(arch: &str, engine: &str) -> Server {
    // Tests run in threads of one process: each profile gets a name of its own.
    static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile =
        std::env::temp_dir().join(format!("edgelm-hybrid-{}-{n}.toml", std::process::id()));
    std::fs::write(&profile, format!("[engine]\n{engine}\n")).unwrap();
    let server = Server::start_with(test_model(arch), &["--config", profile.to_str().unwrap()]);
    std::fs::remove_file(&profile).ok();
    server
}

/// A hybrid's prefix cache: a prompt that shares a long start with an earlier one resumes
/// after the last state snapshot within the shared part (snapshots are written inside prompt
/// chunks of any length: 100 tokens a step here), the whole prompt again resumes at its last
/// full block, and every greedy answer (its log-probabilities too) is the one a server
/// without snapshots computes from scratch. The snapshots show in /metrics, and every slot
/// and block comes back.
#[test]
fn a_hybrid_resumes_a_cached_prompt_from_a_state_snapshot() {
    for arch in ["lfm2", "qwen35"] {
        eprintln!("{arch}:");
        resumes_a_cached_prompt_from_a_state_snapshot(arch);
    }
}

fn resumes_a_cached_prompt_from_a_state_snapshot(arch: &str) {
    let text = std::fs::read_to_string(repo_root().join("tests/data/gpl-2.txt")).unwrap();
    let shared: String = text.chars().skip(2000).take(3500).collect();
    let prompts = [
        format!("{shared}\n\nIn short, the licence says that"),
        format!("{shared}\n\nThe first condition is"),
        format!("{shared}\n\nIn short, the licence says that"),
    ];
    // (text and its tokens' log-probabilities, prompt tokens, cached tokens) per prompt, one
    // after another. The log-probabilities tell a state restored exactly from one that is
    // only close (the test model's few convolution layers rarely change a greedy token).
    let answers = |snapshot_mib: usize| -> Vec<(String, u64, u64)> {
        let server = hybrid_server(
            arch,
            &format!("max_batched_tokens = 100\nstate_snapshot_mib = {snapshot_mib}"),
        );
        let out = prompts
            .iter()
            .map(|p| {
                let body = serde_json::json!({"prompt": p, "max_tokens": 12, "logprobs": 1,
                                              "temperature": 0, "ignore_eos": true});
                let (status, body) = server.request("POST", "/v1/completions", &body.to_string());
                assert_eq!(status, 200, "{body}");
                let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                let (choice, usage) = (&v["choices"][0], &v["usage"]);
                let logprobs = &choice["logprobs"]["token_logprobs"];
                (
                    format!("{} {logprobs}", choice["text"]),
                    usage["prompt_tokens"].as_u64().unwrap(),
                    usage["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap(),
                )
            })
            .collect();
        let kept = server.metric("edgelm_state_snapshots_kept");
        assert_eq!(kept > 0.0, snapshot_mib > 0, "{kept} snapshots kept");
        assert_eq!(server.settled_metric("edgelm_state_slots_used"), 0.0);
        assert_eq!(server.settled_metric("edgelm_kv_blocks_used"), 0.0);
        out
    };
    let warm = answers(16);
    let cold = answers(0);
    let (stride, block) = (edgelm::kv::SNAPSHOT_STRIDE_TOKENS as u64, 16);
    for (i, (w, c)) in warm.iter().zip(&cold).enumerate() {
        eprintln!("prompt {i}: {w:?}");
        assert_eq!(w.0, c.0, "prompt {i}: with snapshots {w:?}, without {c:?}");
        assert_eq!(c.2, 0, "prompt {i}: nothing cached without snapshots");
    }
    assert_eq!(warm[0].2, 0);
    // The second prompt leaves the first in its last few tokens: it resumes at the stride
    // point before that.
    let (prompt, cached) = (warm[1].1, warm[1].2);
    assert!(
        cached > 0 && prompt - cached <= stride + block,
        "{cached} of {prompt} cached"
    );
    assert_eq!(warm[2].2, (warm[2].1 - 1) / block * block);
}

/// The physics of a hybrid's pool: 16 sequences at once hold the state memory `kv-plan`
/// predicts (a slot each, and the snapshots' budget), more requests than slots queue and all
/// finish, and every slot and block is back once the load is done.
#[test]
fn sixteen_hybrid_sequences_hold_the_state_memory_kv_plan_predicts() {
    for arch in ["lfm2", "qwen35"] {
        let plan = run_ok(
            edgelm()
                .args(["kv-plan", "--json", "--state-snapshot-mib", "8", "-m"])
                .arg(test_model(arch)),
        );
        let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
        let per_seq = plan["state_bytes_per_sequence"].as_f64().unwrap();
        let snapshots = plan["state_snapshot_bytes"].as_f64().unwrap();
        assert!(per_seq > 0.0 && snapshots > 0.0, "{arch}: {plan}");

        let server = hybrid_server(arch, "max_seqs = 16\nstate_snapshot_mib = 8");
        let busiest = std::sync::atomic::AtomicU64::new(0);
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            scope.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let used = server.metric("edgelm_state_slots_used") as u64;
                    busiest.fetch_max(used, std::sync::atomic::Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            let asks: Vec<_> = (0..20)
                .map(|i| {
                    let server = &server;
                    scope.spawn(move || {
                        let body = serde_json::json!({
                            "prompt": format!("Request {i}: the fisherman counted {i} boats and"),
                            "max_tokens": 24, "ignore_eos": true});
                        server.request("POST", "/v1/completions", &body.to_string())
                    })
                })
                .collect();
            for (i, h) in asks.into_iter().enumerate() {
                let (status, body) = h.join().unwrap();
                assert_eq!(status, 200, "{arch} request {i}: {body}");
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let busiest = busiest.into_inner();
        let pool = server.metric("edgelm_state_pool_bytes");
        eprintln!("{arch}: {pool} state bytes, at most {busiest} of 16 slots held at once");
        assert_eq!(
            pool,
            16.0 * per_seq + snapshots,
            "{arch}: kv-plan's prediction"
        );
        assert!(busiest <= 16, "{arch}: {busiest} slots held");
        assert_eq!(server.metric("edgelm_state_slots"), 16.0);
        assert_eq!(server.settled_metric("edgelm_state_slots_used"), 0.0);
        assert_eq!(server.settled_metric("edgelm_kv_blocks_used"), 0.0);
    }
}

/// `bench` on each hybrid, its shared-prefix part included: the second request, which shares
/// 1,000 prompt tokens with the first, takes all but the last stretch of them from the cache
/// (a state snapshot every 64 tokens). The TTFT ratio it prints is the acceptance figure
/// (docs/performance.md); a benchmark's timings are not asserted here.
#[test]
fn hybrids_bench_with_their_prefix_cache() {
    for arch in ["lfm2", "qwen35"] {
        let out = run_ok(
            edgelm()
                .args([
                    "bench", "-t", "2", "-p", "32", "-n", "8", "-r", "1", "--json",
                ])
                .args(["--concurrency", "1,4", "--shared-prefix", "1000", "-m"])
                .arg(test_model(arch)),
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let s = &v["shared_prefix"];
        eprintln!("{arch}: decode {} tok/s; {s}", v["decode_tok_s"]);
        assert!(v["decode_tok_s"].as_f64().unwrap() > 0.0, "{arch}: {v}");
        let cached = s["second_cached_tokens"].as_u64().unwrap();
        let stride = edgelm::kv::SNAPSHOT_STRIDE_TOKENS as u64;
        assert!(
            cached >= 1000 - stride - 16,
            "{arch}: {cached} tokens cached"
        );
    }
}
