//! Model updates without downtime: a new file renamed over the served one and a reload
//! (`POST /admin/reload`, `SIGHUP`) switch the server to it while clients stream, losing no
//! request; a corrupt file leaves the old model serving with the failure in `/metrics` and
//! `/health`; a file truncated in place ends the process with one line naming it (for systemd
//! to restart it), never a silent SIGBUS.

mod common;

use common::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const KEY: &str = "sesame";

/// `src` put at `dst` as an update does it: a copy beside it, renamed over it.
fn replace(dst: &Path, src: &Path) {
    let new = dst.with_extension("new");
    std::fs::copy(src, &new).unwrap();
    std::fs::rename(&new, dst).unwrap();
}

/// The token ids the served model gives a fixed text: which vocabulary serves.
fn token_ids(server: &Server) -> String {
    let (status, body) = server.request("POST", "/tokenize", r#"{"prompt": "Reloading"}"#);
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["tokens"].to_string()
}

/// One streamed completion; whether it came back whole (200 and `data: [DONE]`).
fn stream_whole(server: &Server, k: usize) -> bool {
    let body = serde_json::json!({
        "prompt": format!("Story number {k}: once upon a time"), "max_tokens": 24,
        "stream": true, "temperature": 0,
    });
    let (status, text) = server.request_raw("POST", "/v1/completions", &body.to_string());
    status == 200 && text.trim_end().ends_with("data: [DONE]")
}

/// Reloads through the endpoint: its status and answer.
fn reload(server: &Server) -> (u16, serde_json::Value) {
    let (status, body) = server.request("POST", "/admin/reload", "");
    (status, serde_json::from_str(&body).unwrap_or_default())
}

#[test]
fn a_reload_under_load_switches_models_and_loses_no_request() {
    let dir = scratch_dir("reload-under-load");
    let served = dir.join("served.gguf");
    std::fs::copy(model_path(), &served).unwrap();
    let server = Server::start_with(&served, &["--api-key", KEY, "--max-seqs", "8"]);
    let smollm = token_ids(&server);
    assert_eq!(reload(&server).1["status"], "unchanged");
    let (status, _) = server.request_keyed("POST", "/admin/reload", "", None);
    assert_eq!(status, 401);

    // Four clients stream completions one after another the whole time (polite load).
    let stop = AtomicBool::new(false);
    let (whole, broken) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let switched_in = std::thread::scope(|s| {
        for c in 0..4 {
            let (stop, whole, broken, server) = (&stop, &whole, &broken, &server);
            s.spawn(move || {
                let mut k = c;
                while !stop.load(Ordering::Relaxed) {
                    let counter = if stream_whole(server, k) {
                        whole
                    } else {
                        broken
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    k += 4;
                }
            });
        }
        std::thread::sleep(Duration::from_secs(2));
        let t0 = Instant::now();
        replace(&served, &gemma3_path());
        let reloading = s.spawn(|| (reload(&server), Instant::now()));
        // The front answers health checks while the new model loads: at once, not when the
        // reload ends (a front that waited would answer just before the reload does).
        std::thread::sleep(Duration::from_millis(200));
        let asked = Instant::now();
        let (status, _) = server.request("GET", "/health", "");
        let answered = Instant::now();
        assert_eq!(status, 200);
        let ((status, answer), reloaded) = reloading.join().unwrap();
        let (health, rest) = (answered - asked, reloaded.saturating_duration_since(asked));
        assert!(
            health * 4 < rest,
            "/health took {health:?} of the reload's {rest:?}"
        );
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["status"], "reloaded", "{answer}");
        let switched_in = t0.elapsed();
        let before = whole.load(Ordering::Relaxed);
        while whole.load(Ordering::Relaxed) < before + 8 {
            std::thread::sleep(Duration::from_millis(50));
        }
        stop.store(true, Ordering::Relaxed);
        switched_in
    });
    let gemma = token_ids(&server);
    println!(
        "reload to another model: answered by it {:.1} s after the rename; {} streams whole, \
         {} broken",
        switched_in.as_secs_f64(),
        whole.load(Ordering::Relaxed),
        broken.load(Ordering::Relaxed)
    );
    assert_ne!(gemma, smollm, "the new model's vocabulary does not serve");
    assert!(switched_in < Duration::from_secs(30));
    assert_eq!(broken.load(Ordering::Relaxed), 0);
    assert_eq!(
        server.metric(r#"edgelm_reloads_total{result="reloaded"}"#),
        1.0
    );

    // A corrupt file renamed over it: the reload fails, the model before it serves on.
    let garbage = dir.join("garbage.gguf");
    std::fs::write(&garbage, b"GGUF not really a model").unwrap();
    replace(&served, &garbage);
    let (status, answer) = reload(&server);
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["error"]["code"], "reload_failed", "{answer}");
    assert_eq!(server.metric("edgelm_reload_failed"), 1.0);
    let (_, health) = server.request("GET", "/health", "");
    assert!(health.contains(r#""last_reload":"failed""#), "{health}");
    assert!(stream_whole(&server, 0));
    assert_eq!(token_ids(&server), gemma);

    // The first model back, by SIGHUP this time.
    replace(&served, &model_path());
    server.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(60);
    while server.metric(r#"edgelm_reloads_total{result="reloaded"}"#) < 2.0 {
        assert!(Instant::now() < deadline, "SIGHUP did not reload");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(server.metric("edgelm_reload_failed"), 0.0);
    assert_eq!(token_ids(&server), smollm);
}

#[test]
fn a_model_truncated_in_place_ends_the_server_with_one_line() {
    let dir = scratch_dir("reload-truncated");
    let served = dir.join("served.gguf");
    std::fs::copy(model_path(), &served).unwrap();
    let log = dir.join("stderr.log");
    let mut server = Server::start_logging(&served, &[], Some(&log));
    // Cut short where it lies, as `cp new.gguf served.gguf` would begin to do.
    let len = std::fs::metadata(&served).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&served)
        .unwrap();
    file.set_len(len / 3).unwrap();
    // Whether a read faults first or the reload finds the change, the server ends the same way.
    let _ = server.request(
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 4}"#,
    );
    server.signal(libc::SIGHUP);
    let status = server.exit_within(Duration::from_secs(30));
    let status = status.expect("still running on a truncated model");
    let err = std::fs::read_to_string(&log).unwrap();
    let last = err.lines().last().unwrap_or("");
    // Exit status 1 (systemd's Restart=on-failure starts it again), not a signal's death.
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(last.contains("served.gguf"), "{last}");
    assert!(last.contains("in place"), "{last}");
}
