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
    let reference = reference();
    let case = &reference["greedy"][0];
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

#[test]
fn perplexity_matches_the_peer_within_one_percent() {
    let out = run_ok(
        edgelm()
            .args(["perplexity", "-c", "512", "-f"])
            .arg(reference_dir().join("gpl-3.txt"))
            .arg("-m")
            .arg(model_path()),
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last = stdout.lines().last().unwrap();
    let ppl: f64 = last
        .strip_prefix("PPL = ")
        .expect("last line is PPL = x")
        .parse()
        .unwrap();
    let peer = 18.3914;
    eprintln!(
        "PPL {ppl} vs peer {peer} ({:+.2}%)",
        (ppl / peer - 1.0) * 100.0
    );
    assert!(
        (ppl / peer - 1.0).abs() < 0.01,
        "PPL {ppl} not within 1% of {peer}"
    );
}
