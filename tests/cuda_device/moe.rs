//! The expert kernels against the CPU on random data, then the mixture-of-experts test models
//! through the real binary on the device: `run`,
//! `perplexity` (against the CPU's on the same text), `bench` and `serve` (one completion over
//! HTTP), each saying it ran its forward passes on the device. The architecture test
//! (`architectures.rs`) checks their logits; this checks that every command reaches the expert
//! kernels through the engine, as a user would run them.

use super::device_test_model;
use super::gemm::case;
use super::{open, Xs};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use edgelm::backend::cpu::moe::route;
use edgelm::backend::cuda::launch::{moe_gemv_config, moe_gemv_kernel, MATMUL_TYPES};
use edgelm::backend::ops::{Gating, Routing};
use edgelm::quant::GgmlType;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const MOE_ARCHS: [&str; 2] = ["qwen3moe", "gpt-oss"];

fn edgelm() -> Command {
    let mut c = Command::new(
        std::env::var_os("EDGELM_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_edgelm").into()),
    );
    c.env("RUST_LOG", "info");
    c
}

/// Runs `edgelm ARGS -m MODEL --backend BACKEND`, which must succeed; on the device it must
/// say so.
fn run(args: &[&str], model: &Path, backend: &str) -> Output {
    let out = edgelm()
        .args(args)
        .arg("-m")
        .arg(model)
        .args(["--backend", backend])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "edgelm {args:?} failed: {stderr}");
    if backend == "cuda" {
        assert!(
            stderr.contains("CUDA: forward pass on"),
            "edgelm {args:?} did not run on the device: {stderr}"
        );
    }
    out
}

/// The value after `label` on the line of `edgelm perplexity --kl-divergence`'s report that
/// starts with it.
fn stat(out: &Output, label: &str) -> f64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in {stdout}"))
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_mixtures_of_experts_run_perplexity_and_bench() {
    MOE_ARCHS.into_iter().for_each(run_perplexity_and_bench);
}

/// `edgelm run`, `perplexity` (against the CPU's, within twice the CPU q8_0 pages' distance)
/// and `bench` with `arch`'s test model on the device.
pub(super) fn run_perplexity_and_bench(arch: &str) {
    let text = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/gpl-2.txt");
    {
        let model = device_test_model(arch);
        let out = run(
            &["run", "--temp", "0", "-n", "2", "-p", "The license says"],
            &model,
            "cuda",
        );
        assert!(!out.stdout.is_empty(), "{arch}: no text generated");

        // One 64-token chunk: the CPU's f16-page log-probabilities as the base, then the
        // device's distance from them against the CPU's own q8_0 pages', with the bar of the
        // other device tests (docs/cuda.md): within twice the yardstick. On the emulator the
        // device has stayed under the yardstick itself.
        let base =
            std::env::temp_dir().join(format!("edgelm-moe-{arch}-{}.kld", std::process::id()));
        let base_s = base.to_str().unwrap();
        let c = ["-c", "64", "--chunks", "1", "--kl-divergence-base", base_s];
        run(
            &[&["perplexity", "-f", text][..], &c].concat(),
            &model,
            "cpu",
        );
        let kld = |kv: &str, backend: &str| {
            let args = [&["perplexity", "--kl-divergence", "--kv-type", kv][..], &c].concat();
            let out = run(&args, &model, backend);
            (stat(&out, "Mean    KLD:"), stat(&out, "Same top p:"))
        };
        let (device, yardstick) = (kld("f16", "cuda"), kld("q8_0", "cpu"));
        std::fs::remove_file(&base).ok();
        eprintln!(
            "{arch}: against the CPU's f16 pages, the device's mean KLD {:.6} (same top {:.2}%), \
             the CPU's q8_0 pages' {:.6} ({:.2}%)",
            device.0, device.1, yardstick.0, yardstick.1
        );
        assert!(
            device.0 <= 2.0 * yardstick.0,
            "{arch}: the device's mean KLD {} exceeds twice the CPU q8_0 pages' {}",
            device.0,
            yardstick.0
        );

        let out = run(
            &[
                "bench",
                "-p",
                "8",
                "-n",
                "2",
                "--concurrency",
                "1",
                "--concurrency-prompt",
                "4",
                "--shared-prefix",
                "0",
                "-r",
                "1",
                "--json",
            ],
            &model,
            "cuda",
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for key in ["prefill_tok_s", "decode_tok_s"] {
            let v = report[key].as_f64().unwrap_or(0.0);
            assert!(v > 0.0, "{arch}: bench {key} = {v}: {report}");
        }
    }
}

/// POSTs `body` to `path` on 127.0.0.1:`port` (HTTP/1.0: the reply ends at close).
fn post(port: u16, path: &str, body: &str) -> Option<String> {
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(300))).ok()?;
    write!(
        c,
        "POST {path} HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut resp = String::new();
    c.read_to_string(&mut resp).ok()?;
    Some(resp)
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn cuda_mixtures_of_experts_serve_a_completion() {
    MOE_ARCHS.into_iter().for_each(serve_a_completion);
}

/// `edgelm serve` with `arch`'s test model on the device: one completion over HTTP.
pub(super) fn serve_a_completion(arch: &str) {
    {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        // The backend is a profile setting for `serve`.
        let profile = std::env::temp_dir().join(format!(
            "edgelm-cuda-moe-{arch}-{}.toml",
            std::process::id()
        ));
        std::fs::write(
            &profile,
            format!(
                "[model]\npath = {:?}\n[server]\nport = {port}\n[engine]\nbackend = \"cuda\"\n\
                 kv_memory_mib = 16\n",
                device_test_model(arch)
            ),
        )
        .unwrap();
        let mut child = edgelm()
            .args(["serve", "--config"])
            .arg(&profile)
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let log = std::thread::spawn(move || stderr.lines().map_while(Result::ok).collect());
        // A completion rather than a chat: a chat template's preamble is a long prompt for the
        // emulator (seconds per token of prefill with experts).
        let body = r#"{"model": "m", "prompt": "Hi!", "max_tokens": 4, "temperature": 0}"#;
        // 503 until the engine is ready (NVRTC may compile every kernel first).
        let deadline = Instant::now() + Duration::from_secs(240);
        let reply = loop {
            match post(port, "/v1/completions", body) {
                Some(r)
                    if r.starts_with("HTTP/1.") && r.split_whitespace().nth(1) != Some("503") =>
                {
                    break Some(r)
                }
                _ if Instant::now() > deadline || child.try_wait().unwrap().is_some() => {
                    break None
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = child.wait().unwrap();
        std::fs::remove_file(&profile).ok();
        let log: Vec<String> = log.join().unwrap();
        let reply = reply.unwrap_or_else(|| panic!("{arch}: no reply; log: {log:?}"));
        assert!(
            log.iter().any(|l| l.contains("CUDA: forward pass on")),
            "{arch}: not served on the device: {log:?}"
        );
        assert_eq!(
            reply.split_whitespace().nth(1),
            Some("200"),
            "{arch}: {reply}"
        );
        let json = &reply[reply.find("\r\n\r\n").unwrap() + 4..];
        let v: serde_json::Value = serde_json::from_str(json).unwrap();
        assert_eq!(v["object"], "text_completion", "{arch}: {v}");
        assert!(
            v["usage"]["completion_tokens"].as_u64().unwrap() >= 1,
            "{arch}: {v}"
        );
        assert!(
            status.success(),
            "{arch}: serve exited {status:?} after SIGTERM"
        );
        eprintln!("{arch}: served on the device: {}", v["choices"][0]["text"]);
    }
}

/// gemv.cu's `moe_gemv_*` on random experts of every type against the CPU's dequantized
/// products, each pair reading its own expert (as picked) and its token's activations; and
/// moe.cu's `moe_route` against the CPU's routing for both gatings.
#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn device_expert_kernels_match_the_cpu() {
    let dev = open();
    let s = dev.ctx.default_stream();
    let mut rng = Xs(0x9e37_79b9_7f4a_7c15);
    let (experts, rows, cols, n_tok, used) = (3usize, 37usize, 512usize, 3usize, 2usize);
    // Token t's picks; the down matrices read pair rows (act_div 1) in the kernel, the same
    // code path with another divisor, so gate/up's act_div = used is what is checked here.
    let ids: Vec<i32> = vec![2, 0, 1, 2, 0, 1];
    for ty in MATMUL_TYPES.into_iter().chain([GgmlType::MXFP4]) {
        // Every expert's rows stacked, as in a GGUF's 3-D expert tensor.
        let c = case(&mut rng, ty, experts * rows, cols, n_tok);
        let (w, wf, act, af) = (&c.w, &c.wf, &c.act, &c.af);
        let expert_bytes = w.len() / experts;
        let pairs = n_tok * used;
        let (w_d, ids_d, a_d) = (
            s.clone_htod(w).unwrap(),
            s.clone_htod(&ids).unwrap(),
            s.clone_htod(act).unwrap(),
        );
        let mut y_d = s.clone_htod(&vec![f32::NAN; pairs * rows]).unwrap();
        let name = moe_gemv_kernel(ty).unwrap();
        unsafe {
            s.launch_builder(dev.function(name).unwrap())
                .arg(&w_d)
                .arg(&(expert_bytes as i64))
                .arg(&ids_d)
                .arg(&a_d)
                .arg(&(used as i32))
                .arg(&mut y_d)
                .arg(&(rows as i32))
                .arg(&(cols as i32))
                .launch(moe_gemv_config(rows, pairs))
        }
        .unwrap();
        let y = s.clone_dtoh(&y_d).unwrap();
        for p in 0..pairs {
            let (e, t) = (ids[p] as usize, p / used);
            for r in 0..rows {
                let wr = &wf[(e * rows + r) * cols..(e * rows + r + 1) * cols];
                let a = &af[t * cols..(t + 1) * cols];
                let (exact, scale) = wr.iter().zip(a).fold((0f64, 0f64), |(s, m), (&u, &v)| {
                    let q = u as f64 * v as f64;
                    (s + q, m + q.abs())
                });
                let got = y[p * rows + r] as f64;
                assert!(
                    got.is_finite() && (got - exact).abs() <= 2e-3 * scale + 1e-9,
                    "{name} pair {p} (expert {e}, token {t}) row {r}: {got} vs {exact}"
                );
            }
        }
        eprintln!("{name}: {pairs} pairs of {rows} rows match the CPU");
    }

    let (n_expert, k, n) = (8usize, 3usize, 5usize);
    let logits: Vec<f32> = (0..n * n_expert).map(|_| rng.sym() * 4.0).collect();
    for (gating, normalize, scale) in [
        (Gating::SoftmaxThenTopK, true, 1.0),
        (Gating::SoftmaxThenTopK, false, 2.5),
        (Gating::TopKThenSoftmax, false, 1.0),
    ] {
        let routing = Routing {
            used: k,
            gating,
            normalize,
            scale,
        };
        let l_d = s.clone_htod(&logits).unwrap();
        let mut ids_d = s.clone_htod(&vec![-1i32; n * k]).unwrap();
        let mut wts_d = s.clone_htod(&vec![f32::NAN; n * k]).unwrap();
        let gating_id = (gating == Gating::TopKThenSoftmax) as i32;
        unsafe {
            s.launch_builder(dev.function("moe_route").unwrap())
                .arg(&l_d)
                .arg(&(n_expert as i32))
                .arg(&(k as i32))
                .arg(&gating_id)
                .arg(&(normalize as i32))
                .arg(&scale)
                .arg(&mut ids_d)
                .arg(&mut wts_d)
                .arg(&(n as i32))
                .launch(LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (64, 1, 1),
                    shared_mem_bytes: 0,
                })
        }
        .unwrap();
        let (got_ids, got_wts) = (s.clone_dtoh(&ids_d).unwrap(), s.clone_dtoh(&wts_d).unwrap());
        let mut picks = Vec::new();
        for t in 0..n {
            route(
                &logits[t * n_expert..(t + 1) * n_expert],
                routing,
                &mut picks,
            );
            for (j, &(e, w)) in picks.iter().enumerate() {
                let i = t * k + j;
                assert_eq!(got_ids[i] as usize, e, "{routing:?} token {t} pick {j}");
                assert!(
                    (got_wts[i] - w).abs() <= 1e-5 * w.abs().max(1e-3),
                    "{routing:?} token {t} pick {j}: weight {} vs {w}",
                    got_wts[i]
                );
            }
        }
    }
    eprintln!("moe_route: {n} tokens' picks and weights match the CPU for both gatings");
}
