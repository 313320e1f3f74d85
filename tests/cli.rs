//! The real binary on the real model: every subcommand, and clear one-line errors.

mod common;

use common::*;

#[test]
fn tokenize_prints_reference_ids_as_json() {
    let reference = reference();
    for case in reference["tokenize"].as_array().unwrap().iter().take(5) {
        let out = run_ok(
            edgelm()
                .arg("tokenize")
                .arg("-m")
                .arg(model_path())
                .arg(case["text"].as_str().unwrap()),
        );
        let got: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(got, case["ids"]);
    }
}

#[test]
fn run_greedy_prints_only_the_peer_text_on_stdout() {
    let case = &confident_case();
    let out = run_ok(
        edgelm()
            .args(["run", "--temp", "0", "-n", "48", "-t", "2", "-p"])
            .arg(case["prompt"].as_str().unwrap())
            .arg("-m")
            .arg(model_path()),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout.trim_end_matches('\n'),
        case["text"].as_str().unwrap()
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("tok/s"),
        "tokens/s reported on stderr: {stderr}"
    );
}

#[test]
fn run_chat_stops_at_end_of_turn() {
    let out = run_ok(
        edgelm()
            .args([
                "run",
                "--chat",
                "--temp",
                "0",
                "-n",
                "64",
                "-p",
                "What is 2+2?",
                "-m",
            ])
            .arg(model_path()),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(!stdout.trim().is_empty());
    assert!(
        !stdout.contains("<|im_end|>"),
        "control tokens are not printed: {stdout:?}"
    );
}

#[test]
fn seeded_sampling_is_reproducible() {
    let gen = |seed: &str| {
        let out = run_ok(
            edgelm()
                .args([
                    "run",
                    "--temp",
                    "1.0",
                    "-n",
                    "24",
                    "--seed",
                    seed,
                    "-p",
                    "Once upon a time",
                    "-m",
                ])
                .arg(model_path()),
        );
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(gen("42"), gen("42"));
}

#[test]
fn inspect_summarises_the_model() {
    let out = run_ok(edgelm().arg("inspect").arg(model_path()));
    let s = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "llama",
        "30",
        "576",
        "1536",
        "49152",
        "Q4_1",
        "Q8_0",
        "98,362,432",
    ] {
        assert!(s.contains(needle), "inspect output lacks {needle}:\n{s}");
    }
    assert!(s.lines().any(|l| l.starts_with("supported:    yes")), "{s}");
}

#[test]
fn inspect_says_whether_a_model_runs_and_why_not() {
    let out = run_ok(edgelm().arg("inspect").arg(gemma3_path()));
    let s = String::from_utf8(out.stdout).unwrap();
    let line = s.lines().find(|l| l.starts_with("supported:")).unwrap();
    assert!(
        line.contains("yes") && line.contains("15 of 18 layers with a sliding window"),
        "{line}"
    );
    // A tensor no part of the architecture reads: inspect still describes the file, and says
    // why edgelm will not run it.
    let extra = edited_model("inspect-extra-tensor.gguf", |_, tensors| {
        let norm = tensors
            .iter()
            .find(|t| t.0 == "output_norm.weight")
            .unwrap()
            .clone();
        tensors.push(("blk.0.unused_norm.weight".into(), norm.1, norm.2, norm.3));
    });
    let out = run_ok(edgelm().arg("inspect").arg(&extra));
    let s = String::from_utf8(out.stdout).unwrap();
    let line = s.lines().find(|l| l.starts_with("supported:")).unwrap();
    assert!(
        line.starts_with("supported:    no:") && line.contains("blk.0.unused_norm.weight"),
        "{line}"
    );
}

#[test]
fn errors_are_one_line_and_nonzero() {
    let cases: Vec<Vec<String>> = vec![
        vec![
            "run".into(),
            "-m".into(),
            "/nonexistent.gguf".into(),
            "-p".into(),
            "hi".into(),
        ],
        vec!["inspect".into(), "/etc/hostname".into()],
        vec![
            "tokenize".into(),
            "-m".into(),
            "Cargo.toml".into(),
            "x".into(),
        ],
        vec![
            "run".into(),
            "-m".into(),
            model_path().display().to_string(),
            "-p".into(),
            "".into(),
        ],
        vec![
            "perplexity".into(),
            "-m".into(),
            model_path().display().to_string(),
            "-f".into(),
            "/nonexistent.txt".into(),
        ],
    ];
    for args in cases {
        let out = edgelm()
            .args(&args)
            .current_dir(repo_root())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

/// Chunks of 512 tokens scored (of gpl-3.txt's 15), by us and the peer alike: enough for the
/// 1% / 2% / 7% bounds below, and half the suite time of the whole text.
const PPL_CHUNKS: &str = "8";

fn perplexity(kv_type: &str) -> f64 {
    let out = run_ok(
        edgelm()
            .args([
                "perplexity",
                "-c",
                "512",
                "--chunks",
                PPL_CHUNKS,
                "--kv-type",
                kv_type,
            ])
            .arg("-f")
            .arg(reference_dir().join("gpl-3.txt"))
            .arg("-m")
            .arg(model_path()),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    last.strip_prefix("PPL = ")
        .expect("last line is PPL = x")
        .parse()
        .unwrap()
}

/// The peer's perplexity on the same model, text and context (llama-perplexity's final
/// estimate; its KV cache is f16, as ours is in the comparison). Kept in target/kld beside the
/// KL-divergence base files, and measured again when the model is newer than the figure.
fn peer_perplexity() -> f64 {
    let model = model_path();
    let figure = repo_root().join("target/kld").join(format!(
        "{}.gpl-3.c512.x{PPL_CHUNKS}.ppl",
        model.file_stem().unwrap().to_string_lossy()
    ));
    let figure = kept(&figure, &[&model], || {
        measure_peer_perplexity(&model).to_string().into_bytes()
    });
    std::fs::read_to_string(figure)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn measure_peer_perplexity(model: &std::path::Path) -> f64 {
    peer_final_perplexity(
        std::process::Command::new(peer_tool("llama-perplexity"))
            .args(["-c", "512", "--chunks", PPL_CHUNKS, "-t", "2", "-f"])
            .arg(reference_dir().join("gpl-3.txt"))
            .arg("-m")
            .arg(model),
    )
}

/// f16 pages within 1% of the peer's perplexity; quantized pages within 2% (q8_0) and 7%
/// (q4_0) of our f16 figure.
#[test]
fn perplexity_matches_the_peer_and_quantized_pages_stay_close() {
    let peer = peer_perplexity();
    let f16 = perplexity("f16");
    eprintln!(
        "PPL f16 {f16} vs peer {peer} ({:+.2}%)",
        (f16 / peer - 1.0) * 100.0
    );
    assert!(
        (f16 / peer - 1.0).abs() < 0.01,
        "PPL {f16} not within 1% of {peer}"
    );
    let q8 = perplexity("q8_0");
    let q4 = perplexity("q4_0");
    eprintln!(
        "PPL q8_0 {q8} ({:+.2}%), q4_0 {q4} ({:+.2}%)",
        (q8 / f16 - 1.0) * 100.0,
        (q4 / f16 - 1.0) * 100.0
    );
    assert!((q8 / f16 - 1.0).abs() < 0.02, "q8_0 PPL {q8} vs f16 {f16}");
    assert!((q4 / f16 - 1.0).abs() < 0.07, "q4_0 PPL {q4} vs f16 {f16}");
}

#[test]
fn kv_plan_for_the_reference_model() {
    let out = run_ok(
        edgelm()
            .args([
                "kv-plan",
                "--ctx",
                "8192",
                "--avg-tokens",
                "512",
                "--json",
                "-m",
            ])
            .arg(model_path()),
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["kv_bytes_per_token"], 23_040);
    assert_eq!(plan["block_size"], 16);
    assert_eq!(plan["block_bytes"], 23_040 * 16);
    for key in ["pool_blocks", "max_seqs_paged", "max_seqs_contiguous"] {
        assert!(plan[key].is_u64(), "{key} missing");
    }
    let (paged, contiguous) = (
        plan["max_seqs_paged"].as_u64().unwrap(),
        plan["max_seqs_contiguous"].as_u64().unwrap(),
    );
    assert!(
        paged >= 4 * contiguous && contiguous > 0,
        "paged {paged} vs contiguous {contiguous}"
    );
    for (kv, bytes) in [("q8_0", 12_240), ("q4_0", 6_480)] {
        let out = run_ok(
            edgelm()
                .args(["kv-plan", "--json", "--kv-type", kv, "-m"])
                .arg(model_path()),
        );
        let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(plan["kv_bytes_per_token"], bytes, "{kv}");
    }
}

/// Models served together: the plan per model over its share of the pool, as `serve` divides
/// it (an embedding model's default share, the rest to the chat model).
#[test]
fn kv_plan_divides_the_pool_among_several_models() {
    let pooled = edited_model("cli-kv-plan-pooled", |kvs, _| {
        kvs.push(("llama.pooling_type".into(), edgelm::gguf::Value::U32(1)));
    });
    let out = run_ok(
        edgelm()
            .args(["kv-plan", "--json", "--memory-mib", "256", "-m"])
            .arg(format!("chat={}", model_path().display()))
            .arg("-m")
            .arg(format!("embed={}", pooled.display())),
    );
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let models = all["models"].as_array().unwrap();
    let field = |i: usize, k: &str| models[i][k].clone();
    assert_eq!(
        (field(0, "id"), field(0, "kind")),
        ("chat".into(), "generate".into())
    );
    assert_eq!(
        (field(1, "id"), field(1, "kind")),
        ("embed".into(), "embed".into())
    );
    let bytes = |i: usize| field(i, "memory_bytes").as_u64().unwrap();
    // 2048 tokens of 23,040 bytes for the embedding model; the chat model has the rest.
    assert_eq!(bytes(1), 2048 * 23_040);
    assert_eq!(bytes(0), (256 << 20) - bytes(1));
    assert!(
        models[0]["plan"]["pool_blocks"].as_u64().unwrap()
            > models[1]["plan"]["pool_blocks"].as_u64().unwrap()
    );
    let text = run_ok(
        edgelm()
            .args(["kv-plan", "--memory-mib", "256", "-m"])
            .arg(format!("chat={}", model_path().display()))
            .arg("-m")
            .arg(format!("embed={}", pooled.display())),
    );
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("== embed (embeddings, 45 MiB of the pool)"),
        "{text}"
    );
}

#[test]
fn bench_reports_json_figures() {
    let out = run_ok(
        edgelm()
            .args([
                "bench",
                "-p",
                "32",
                "-n",
                "8",
                "--concurrency",
                "1,4",
                "--concurrency-prompt",
                "16",
                "--shared-prefix",
                "64",
                "-r",
                "1",
                "--json",
                "-m",
            ])
            .arg(model_path()),
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["prefill_tok_s"].as_f64().unwrap() > 0.0);
    assert!(r["decode_tok_s"].as_f64().unwrap() > 0.0);
    let conc = r["concurrency"].as_array().unwrap();
    assert_eq!(conc.len(), 2);
    assert_eq!(conc[1]["sequences"], 4);
    assert!(conc[1]["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(
        r["shared_prefix"]["ratio"].as_f64().unwrap() < 1.0,
        "the cached prefix is faster"
    );
}

#[test]
fn shipped_profiles_pass_and_broken_ones_name_the_key() {
    let profiles: Vec<_> = std::fs::read_dir(repo_root().join("firmware-configs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    assert!(!profiles.is_empty());
    for p in &profiles {
        run_ok(edgelm().args(["config", "check"]).arg(p));
    }
    let dir = std::env::temp_dir().join(format!("edgelm-profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let broken = [
        ("[engine]\nmax_seqs = 0\n", "engine.max_seqs"),
        ("[engine]\nkv_type = \"q3_k\"\n", "q3_k"),
        ("[engine]\nthreadz = 2\n", "threadz"),
        ("[server]\nport = 0\n", "server.port"),
        ("[server]\nport = 99999\n", "port"),
        ("[log]\nlevel = \"loud\"\n", "log.level"),
        ("[engine]\nblock_size = \"16\"\n", "block_size"),
        ("[nonsense]\nx = 1\n", "nonsense"),
    ];
    for (i, (text, key)) in broken.iter().enumerate() {
        let f = dir.join(format!("broken-{i}.toml"));
        std::fs::write(&f, text).unwrap();
        let out = edgelm().arg("config-check").arg(&f).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "{text}: {err}");
    }
}
