//! The CUDA backend without a GPU (feature `cuda`): every kernel compiles with NVRTC for the
//! Jetson Orin (sm_87) and Hopper (sm_90) through the same code path the runtime uses, and a
//! `cuda` build with no device falls back to the CPU and says so. `scripts/check-kernels.sh`
//! provides libnvrtc (PyPI wheels), runs this file, then checks the PTX with `ptxas -v`.
//!
//! The tests marked `#[ignore]` need a CUDA device; they are never counted as passes here:
//! `packaging/gpu-check.sh` runs them (`--ignored`) on a GPU machine.
#![cfg(feature = "cuda")]

use edgelm::backend::cuda::{compile_ptx, nvrtc_version, probe, Arch, CudaDevice, FILES};
use std::path::PathBuf;
use std::process::Command;

const ARCHES: [Arch; 2] = [Arch::new(8, 7), Arch::new(9, 0)];

/// With `EDGELM_PTX_OUT` set, the PTX goes to `$EDGELM_PTX_OUT/sm_XY/<file>.ptx` for ptxas.
fn ptx_out() -> Option<PathBuf> {
    std::env::var_os("EDGELM_PTX_OUT").map(PathBuf::from)
}

#[test]
fn every_kernel_compiles_for_sm87_and_sm90() {
    let version = nvrtc_version().unwrap_or_else(|e| {
        panic!("this test needs libnvrtc (scripts/check-kernels.sh provides it): {e}")
    });
    eprintln!("NVRTC {version}");
    let mut failures = Vec::new();
    let mut kernels = 0;
    for arch in ARCHES {
        for file in FILES {
            match compile_ptx(file, arch) {
                Err(e) => failures.push(e),
                Ok(ptx) => {
                    for f in file.functions {
                        if !ptx.contains(&format!(".entry {f}(")) {
                            failures.push(format!("{arch}: no entry {f} in kernels/{}.cu", file.name));
                        }
                    }
                    kernels += file.functions.len();
                    eprintln!(
                        "{arch} kernels/{}.cu: {} kernels, {} bytes of PTX",
                        file.name,
                        file.functions.len(),
                        ptx.len()
                    );
                    if let Some(dir) = ptx_out() {
                        let dir = dir.join(arch.sm());
                        std::fs::create_dir_all(&dir).unwrap();
                        std::fs::write(dir.join(format!("{}.ptx", file.name)), ptx).unwrap();
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    eprintln!("{kernels} kernel compilations for {} architectures", ARCHES.len());
}

/// The reference model, fetched by packaging/fetch-model.sh (`EDGELM_MODEL` overrides: the
/// test binary may run on another machine, see packaging/gpu-check.sh).
fn model() -> PathBuf {
    std::env::var_os("EDGELM_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    })
}

/// The `cuda` build of edgelm (`EDGELM_BIN` overrides, as for the model).
fn edgelm() -> Command {
    Command::new(
        std::env::var_os("EDGELM_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_edgelm").into()),
    )
}

/// `edgelm run --backend cuda` on a machine without a GPU: one warn line naming the reason,
/// then the CPU generates as usual. (On a GPU machine the line says the device is ready but the
/// forward pass is not on it yet; either way the CPU runs.)
#[test]
fn cuda_build_runs_on_the_cpu_and_says_why() {
    let device = probe(0);
    let out = edgelm()
        .args(["run", "--backend", "cuda", "--temp", "0", "-n", "2", "-p", "Hello", "-m"])
        .arg(model())
        .env("RUST_LOG", "warn")
        .env("EDGELM_CACHE_DIR", std::env::temp_dir().join("edgelm-test-ptx"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "edgelm run failed: {stderr}");
    assert!(!out.stdout.is_empty(), "no text generated");
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("on the CPU")).collect();
    assert_eq!(lines.len(), 1, "want one fallback line, got: {stderr}");
    match device {
        Err(reason) => {
            assert!(lines[0].contains("no CUDA device ("), "{}", lines[0]);
            assert!(lines[0].contains(&reason), "{} vs {reason}", lines[0]);
            assert!(lines[0].ends_with("running on the CPU"), "{}", lines[0]);
        }
        Ok(_) => assert!(lines[0].contains("CUDA device"), "{}", lines[0]),
    }
    eprintln!("{}", lines[0]);
}

/// `edgelm serve` with `engine.backend = "cuda"` says so too (without a device) and serves.
#[test]
fn cuda_build_serves_on_the_cpu_and_says_why() {
    use std::io::{BufRead, BufReader};
    let dir = std::env::temp_dir().join(format!("edgelm-cuda-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let profile = dir.join("cuda.toml");
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    std::fs::write(
        &profile,
        format!(
            "[model]\npath = {:?}\n[server]\nport = {port}\n[engine]\nbackend = \"cuda\"\n\
             kv_memory_mib = 16\n",
            model()
        ),
    )
    .unwrap();
    let mut child = edgelm()
        .args(["serve", "--config"])
        .arg(&profile)
        .env("RUST_LOG", "warn")
        .env("EDGELM_CACHE_DIR", dir.join("cache"))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen = Vec::new();
    let found = loop {
        match rx.recv_timeout(std::time::Duration::from_millis(200)) {
            Ok(line) if line.contains("on the CPU") => break Some(line),
            Ok(line) => seen.push(line),
            Err(_) if std::time::Instant::now() > deadline => break None,
            Err(_) => {}
        }
    };
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let line = found.unwrap_or_else(|| panic!("no fallback line; stderr: {seen:?}"));
    assert!(line.contains("serving on the CPU"), "{line}");
    if probe(0).is_err() {
        assert!(line.contains("no CUDA device ("), "{line}");
    }
    assert!(status.success(), "serve exited {status:?} after SIGTERM");
    eprintln!("{line}");
}

/// Needs a GPU: the device is found and every kernel compiles for its own architecture and
/// loads (what `serve` does at start-up on a GPU machine).
#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn device_opens_and_every_kernel_loads() {
    let dev = CudaDevice::open(0).unwrap_or_else(|e| panic!("no usable CUDA device: {e}"));
    eprintln!("{}", dev.info.summary());
    for file in FILES {
        for f in file.functions {
            assert!(dev.function(f).is_some(), "{f} not loaded");
        }
    }
}
