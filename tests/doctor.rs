//! `edgelm doctor` on the real binary and model: every check reported with a valid status,
//! failures that must fail (broken profile, wrong SHA-256), and a support bundle that carries
//! the expected files and never the API key.

mod common;

use common::*;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Output;

const CHECKS: [&str; 10] = [
    "cpu",
    "memory",
    "disk",
    "gpu",
    "jetson",
    "model",
    "profile",
    "kv_plan",
    "port",
    "self_test",
];

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("edgelm-doctor-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn profile() -> PathBuf {
    repo_root().join("firmware-configs/x86-cpu.toml")
}

fn doctor_json(args: &[&std::ffi::OsStr]) -> (Output, serde_json::Value) {
    let out = edgelm()
        .args(["doctor", "--json"])
        .args(args)
        .output()
        .expect("edgelm runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is one JSON object ({e}):\n{}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, v)
}

fn check<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no check {name} in {report}"))
}

#[test]
fn json_report_has_every_check_and_a_working_self_test() {
    let model = model_path();
    let (out, report) = doctor_json(&[
        "--model".as_ref(),
        model.as_os_str(),
        "--config".as_ref(),
        profile().as_os_str(),
    ]);
    let checks = report["checks"].as_array().unwrap();
    assert_eq!(checks.len(), CHECKS.len(), "{report}");
    for name in CHECKS {
        let c = check(&report, name);
        let status = c["status"].as_str().unwrap();
        assert!(
            ["pass", "warn", "fail"].contains(&status),
            "{name}: {status}"
        );
        assert!(
            !c["reason"].as_str().unwrap().is_empty(),
            "{name} has a reason"
        );
        assert!(c["details"].is_object(), "{name} has details");
        if status != "pass" {
            assert!(!c["hint"].as_str().unwrap().is_empty(), "{name} has a hint");
        }
    }
    let any_fail = checks.iter().any(|c| c["status"] == "fail");
    assert_eq!(report["ok"], !any_fail);
    assert_eq!(out.status.success(), !any_fail, "exit code follows ok");
    let st = check(&report, "self_test");
    assert_eq!(st["status"], "pass", "{st}");
    assert!(
        st["details"]["tokens_per_s"].as_f64().unwrap() > 0.0,
        "{st}"
    );
    assert!(
        st["details"]["generated_tokens"].as_u64().unwrap() > 0,
        "{st}"
    );
    assert_eq!(check(&report, "profile")["status"], "pass");
    let m = check(&report, "model");
    assert_eq!(m["details"]["architecture"], "llama", "{m}");
    let kv = check(&report, "kv_plan");
    // SmolLM2-135M in f16: 2 x 30 layers x 3 KV heads x 64 dims x 2 bytes.
    assert_eq!(kv["details"]["kv_bytes_per_token"], 23040, "{kv}");
    assert!(kv["details"]["tokens_fit"].as_u64().unwrap() > 0);
}

#[test]
fn text_report_lines() {
    let out = edgelm()
        .args(["doctor", "--model"])
        .arg(model_path())
        .arg("--config")
        .arg(profile())
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    for name in CHECKS {
        assert!(
            text.lines().any(|l| ["pass", "warn", "fail"]
                .iter()
                .any(|s| l.starts_with(&format!("{s}  {name}: ")))),
            "no line for {name}:\n{text}"
        );
    }
}

#[test]
fn broken_profile_fails_and_exits_non_zero() {
    let dir = scratch("broken");
    let p = dir.join("profile.toml");
    std::fs::write(&p, "[engine]\nmax_seqs = 0\n").unwrap();
    let model = model_path();
    let (out, report) = doctor_json(&[
        "--model".as_ref(),
        model.as_os_str(),
        "--config".as_ref(),
        p.as_os_str(),
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    let c = check(&report, "profile");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["reason"].as_str().unwrap().contains("engine.max_seqs"),
        "{c}"
    );
    assert_eq!(report["ok"], false);
    assert!(!out.status.success());
    assert_eq!(out.status.code(), Some(1));
}

/// A profile serving several models: each further model has its own check, and a missing one
/// fails the report.
#[test]
fn every_model_a_profile_serves_is_checked() {
    let dir = scratch("several");
    let p = dir.join("profile.toml");
    let text = format!(
        "[model]\npath = {:?}\n\n[[models]]\npath = {:?}\nid = \"twin\"\n\n[[models]]\n\
         path = {:?}\nid = \"gone\"\n",
        model_path(),
        model_path(),
        dir.join("missing.gguf")
    );
    std::fs::write(&p, text).unwrap();
    let (out, report) = doctor_json(&["--config".as_ref(), p.as_os_str()]);
    std::fs::remove_dir_all(&dir).unwrap();
    let twin = check(&report, "model twin");
    assert_eq!(twin["details"]["architecture"], "llama", "{twin}");
    assert_ne!(twin["status"], "fail", "{twin}");
    let gone = check(&report, "model gone");
    assert_eq!(gone["status"], "fail", "{gone}");
    assert!(
        gone["reason"].as_str().unwrap().contains("missing.gguf"),
        "{gone}"
    );
    assert!(!out.status.success());
}

/// A model with a projector: the file opened beside it and a frame encoded; a projector made
/// for another text model fails, naming why.
#[test]
fn a_models_projector_is_checked_beside_it() {
    let dir = scratch("projector");
    let p = dir.join("profile.toml");
    let mmproj = test_mmproj("gemma3");
    let text = format!(
        "[model]\npath = {:?}\nmmproj = {mmproj:?}\n\n[[models]]\npath = {:?}\nid = \"other\"\n\
         mmproj = {mmproj:?}\n",
        gemma3_path(),
        model_path(),
    );
    std::fs::write(&p, text).unwrap();
    let (out, report) = doctor_json(&["--config".as_ref(), p.as_os_str()]);
    std::fs::remove_dir_all(&dir).unwrap();
    let ok = check(&report, "projector");
    assert_eq!(ok["status"], "pass", "{ok}");
    assert_eq!(ok["details"]["positions_per_image"], 64, "{ok}");
    assert!(ok["details"]["encode_ms"].as_f64().unwrap() > 0.0, "{ok}");
    let wrong = check(&report, "projector other");
    assert_eq!(wrong["status"], "fail", "{wrong}");
    assert!(
        wrong["reason"]
            .as_str()
            .unwrap()
            .contains("feeds a gemma3 text model"),
        "{wrong}"
    );
    assert!(!out.status.success());
}

fn link_model(dir: &Path) -> PathBuf {
    let m = dir.join("model.gguf");
    std::os::unix::fs::symlink(model_path(), &m).unwrap();
    m
}

#[test]
fn sha256sums_mismatch_fails_and_match_passes() {
    let dir = scratch("sha");
    let m = link_model(&dir);
    std::fs::write(
        dir.join("SHA256SUMS"),
        format!("{}  model.gguf\n", "0".repeat(64)),
    )
    .unwrap();
    let (out, report) = doctor_json(&["--model".as_ref(), m.as_os_str()]);
    let c = check(&report, "model");
    assert_eq!(c["status"], "fail", "{c}");
    assert!(
        c["reason"].as_str().unwrap().contains("does not match"),
        "{c}"
    );
    assert!(!out.status.success());

    // The right hash (computed here independently) passes.
    use sha2::{Digest, Sha256};
    let bytes = std::fs::read(model_path()).unwrap();
    let hex: String = Sha256::digest(&bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(dir.join("SHA256SUMS"), format!("{hex}  model.gguf\n")).unwrap();
    let (_, report) = doctor_json(&["--model".as_ref(), m.as_os_str()]);
    std::fs::remove_dir_all(&dir).unwrap();
    let c = check(&report, "model");
    assert_eq!(c["status"], "pass", "{c}");
    assert_eq!(c["details"]["sha256"], hex.as_str());
}

fn bundle_entries(path: &Path) -> Vec<(String, String)> {
    let gz = flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap());
    let mut ar = tar::Archive::new(gz);
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut s = String::new();
            e.read_to_string(&mut s).unwrap();
            (name, s)
        })
        .collect()
}

#[test]
fn bundle_has_the_files_and_no_api_key() {
    let dir = scratch("bundle");
    // A profile naming the key variable, plus a key-like literal that makes it invalid (toml
    // errors quote the offending line, so the report itself must be scrubbed too).
    let good = dir.join("good.toml");
    std::fs::copy(profile(), &good).unwrap();
    let bad = dir.join("bad.toml");
    std::fs::write(
        &bad,
        std::fs::read_to_string(profile())
            .unwrap()
            .replace("[server]\n", "[server]\napi_key = \"secret-literal-123\"\n"),
    )
    .unwrap();
    for (profile, secret) in [(&good, "secret-xyz"), (&bad, "secret-literal-123")] {
        let out_path = dir.join("support.tar.gz");
        let out = edgelm()
            .env("EDGELM_API_KEY", "secret-xyz")
            .args(["doctor", "--json", "--model"])
            .arg(model_path())
            .arg("--config")
            .arg(profile)
            .arg("--bundle")
            .arg(&out_path)
            .output()
            .unwrap();
        assert!(
            out_path.exists(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains(secret), "stdout leaks {secret}");
        serde_json::from_str::<serde_json::Value>(&stdout).expect("stdout is JSON with --bundle");
        let entries = bundle_entries(&out_path);
        let names: Vec<&str> = entries.iter().map(|(n, _)| n.as_str()).collect();
        for want in [
            "doctor.txt",
            "doctor.json",
            "profile.toml",
            "service.log",
            "metrics.txt",
            "version.txt",
        ] {
            assert!(
                names.iter().any(|n| n.ends_with(&format!("/{want}"))),
                "{want} missing from {names:?}"
            );
        }
        for (name, content) in &entries {
            assert!(!content.contains("secret-xyz"), "{name} leaks the API key");
            assert!(!content.contains(secret), "{name} leaks {secret}");
            assert!(!content.is_empty(), "{name} is empty");
        }
        // The raw compressed bytes too (names, headers).
        let raw = std::fs::read(&out_path).unwrap();
        assert!(!raw.windows(secret.len()).any(|w| w == secret.as_bytes()));
        let get = |n: &str| {
            &entries
                .iter()
                .find(|(name, _)| name.ends_with(n))
                .unwrap()
                .1
        };
        let report: serde_json::Value = serde_json::from_str(get("/doctor.json")).unwrap();
        assert_eq!(report["checks"].as_array().unwrap().len(), CHECKS.len());
        assert!(get("/profile.toml").contains("api_key_env = \"EDGELM_API_KEY\""));
        assert!(get("/version.txt").starts_with("edgelm "));
        assert!(get("/doctor.txt").contains("self_test: "));
        let _ = std::fs::remove_file(&out_path);
    }
    // The invalid profile really did fail (so its error text went through the scrubber).
    let (_, report) = doctor_json(&[
        "--model".as_ref(),
        model_path().as_os_str(),
        "--config".as_ref(),
        bad.as_os_str(),
    ]);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(check(&report, "profile")["status"], "fail");
}

/// Kills the server when the test ends, pass or panic.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn running_service_answers_port_check_and_metrics_snapshot() {
    let dir = scratch("live");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = dir.join("profile.toml");
    std::fs::write(
        &p,
        std::fs::read_to_string(profile())
            .unwrap()
            .replace("port = 8080", &format!("port = {port}"))
            .replace(
                "path = \"models/SmolLM2-135M-Instruct.Q4_1.gguf\"",
                &format!("path = {:?}", model_path().display().to_string()),
            ),
    )
    .unwrap();
    let _server = Server(
        edgelm()
            .env("EDGELM_API_KEY", "live-key-777")
            .args(["serve", "-t", "1", "--config"])
            .arg(&p)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let bundle = dir.join("b.tar.gz");
    loop {
        let out = edgelm()
            .env("EDGELM_API_KEY", "live-key-777")
            .args(["doctor", "--json", "--config"])
            .arg(&p)
            .arg("--bundle")
            .arg(&bundle)
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let c = check(&report, "port");
        if c["details"]["service_state"] == "ready" {
            assert_eq!(c["status"], "pass", "{c}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never answered ready: {c}"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    let entries = bundle_entries(&bundle);
    std::fs::remove_dir_all(&dir).unwrap();
    let metrics = &entries
        .iter()
        .find(|(n, _)| n.ends_with("/metrics.txt"))
        .unwrap()
        .1;
    // Fetched with the key (the endpoint needs it), which itself never reaches the bundle.
    assert!(metrics.contains("edgelm_kv_pool_bytes"), "{metrics}");
    for (name, content) in &entries {
        assert!(!content.contains("live-key-777"), "{name} leaks the key");
    }
}
