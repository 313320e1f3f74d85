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

/// Model paths and the test models of every architecture.
mod common;
/// The GEMM, sampler, forward-pass and architecture device tests.
mod cuda_device;

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
                            failures
                                .push(format!("{arch}: no entry {f} in kernels/{}.cu", file.name));
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
    eprintln!(
        "{kernels} kernel compilations for {} architectures",
        ARCHES.len()
    );
}

/// The code for GPUs older than the kernels' targets compiles too: sm_61 (Pascal, the oldest
/// the probe accepts: dp4a) and sm_75 (Turing), where gemm.cu emulates the int8 MMA with dp4a.
/// Not checked by ptxas: no such device is a target, so their register use is not tuned.
#[test]
fn every_kernel_compiles_for_pre_ampere_gpus() {
    nvrtc_version().unwrap_or_else(|e| {
        panic!("this test needs libnvrtc (scripts/check-kernels.sh provides it): {e}")
    });
    let mut failures = Vec::new();
    for arch in [Arch::new(6, 1), Arch::new(7, 5)] {
        for file in FILES {
            match compile_ptx(file, arch) {
                Err(e) => failures.push(e),
                Ok(ptx) => failures.extend(
                    file.functions
                        .iter()
                        .filter(|f| !ptx.contains(&format!(".entry {f}(")))
                        .map(|f| format!("{arch}: no entry {f} in kernels/{}.cu", file.name)),
                ),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The reference model, fetched by packaging/fetch-model.sh (`EDGELM_MODEL` overrides: the
/// test binary may run on another machine, see packaging/gpu-check.sh).
fn model() -> PathBuf {
    std::env::var_os("EDGELM_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
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
/// then the CPU generates as usual. On a GPU machine: no fallback line, and the engine says it
/// runs the forward pass on the device.
#[test]
fn cuda_build_runs_on_the_cpu_and_says_why() {
    let device = probe(0);
    let out = edgelm()
        .args([
            "run",
            "--backend",
            "cuda",
            "--temp",
            "0",
            "-n",
            "2",
            "-p",
            "Hello",
            "-m",
        ])
        .arg(model())
        .env("RUST_LOG", "info")
        .env(
            "EDGELM_CACHE_DIR",
            std::env::temp_dir().join("edgelm-test-ptx"),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "edgelm run failed: {stderr}");
    assert!(!out.stdout.is_empty(), "no text generated");
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("on the CPU"))
        .collect();
    match device {
        Err(reason) => {
            assert_eq!(lines.len(), 1, "want one fallback line, got: {stderr}");
            assert!(lines[0].contains("no CUDA device ("), "{}", lines[0]);
            assert!(lines[0].contains(&reason), "{} vs {reason}", lines[0]);
            assert!(lines[0].ends_with("running on the CPU"), "{}", lines[0]);
            eprintln!("{}", lines[0]);
        }
        Ok(_) => {
            assert!(
                lines.is_empty(),
                "fell back to the CPU on a GPU machine: {stderr}"
            );
            let on_gpu = stderr.lines().find(|l| l.contains("CUDA: forward pass on"));
            assert!(on_gpu.is_some(), "no CUDA start-up line: {stderr}");
            eprintln!("{}", on_gpu.unwrap());
        }
    }
}

/// `edgelm serve` with `engine.backend = "cuda"` says so too (without a device) and serves; on
/// a GPU machine it serves on the device.
#[test]
fn cuda_build_serves_on_the_cpu_and_says_why() {
    let mut server = Served::start("cuda", &format!("[model]\npath = {:?}\n", model()));
    let found = server.line_with(&["on the CPU", "CUDA: forward pass on"]);
    server.wait_healthy();
    let status = server.stop();
    let line = found.unwrap_or_else(|| panic!("no backend line; stderr: {:?}", server.seen));
    if probe(0).is_err() {
        assert!(line.contains("serving on the CPU"), "{line}");
        assert!(line.contains("no CUDA device ("), "{line}");
    } else {
        assert!(line.contains("CUDA: forward pass on"), "{line}");
    }
    let status = status.expect("serve did not exit within 60 s of SIGTERM");
    assert!(status.success(), "serve exited {status:?} after SIGTERM");
    eprintln!("{line}");
}

/// `edgelm serve` with `engine.backend = "cuda"`, a profile whose `[model]` section is `model`,
/// and its stderr lines as they come.
pub struct Served {
    child: std::process::Child,
    pub port: u16,
    lines: std::sync::mpsc::Receiver<String>,
    /// The lines read so far that no `line_with` matched.
    pub seen: Vec<String>,
    dir: PathBuf,
}

impl Served {
    pub fn start(name: &str, model: &str) -> Served {
        use std::io::{BufRead, BufReader};
        let dir = std::env::temp_dir().join(format!("edgelm-{name}-serve-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let profile = dir.join("serve.toml");
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let engine = "[engine]\nbackend = \"cuda\"\nkv_memory_mib = 16\n";
        let text = format!("{model}[server]\nport = {port}\n{engine}");
        std::fs::write(&profile, text).unwrap();
        let mut child = edgelm()
            .args(["serve", "--config"])
            .arg(&profile)
            .env("RUST_LOG", "info")
            .env("EDGELM_CACHE_DIR", dir.join("cache"))
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Served {
            child,
            port,
            lines,
            seen: Vec::new(),
            dir,
        }
    }

    /// The first line holding one of `any` (a cold PTX cache: NVRTC compiles every kernel
    /// first, 70 s on 2 cores).
    pub fn line_with(&mut self, any: &[&str]) -> Option<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(240);
        loop {
            match self
                .lines
                .recv_timeout(std::time::Duration::from_millis(200))
            {
                Ok(line) if any.iter().any(|a| line.contains(a)) => return Some(line),
                Ok(line) => self.seen.push(line),
                Err(_) if std::time::Instant::now() > deadline => return None,
                Err(_) => {}
            }
        }
    }

    /// One HTTP/1.0 exchange: the status and the body.
    pub fn exchange(&self, request: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(600)));
        let mut resp = String::new();
        c.write_all(request.as_bytes()).ok()?;
        c.read_to_string(&mut resp).ok()?;
        let status = resp.split_whitespace().nth(1)?.parse().ok()?;
        let body = resp
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        Some((status, body))
    }

    /// Waits (up to 120 s) for /health to answer 200; false if it never does.
    pub fn wait_healthy(&mut self) -> bool {
        let ready_by = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while std::time::Instant::now() < ready_by && self.child.try_wait().unwrap().is_none() {
            if let Some((200, _)) = self.exchange("GET /health HTTP/1.0\r\n\r\n") {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        false
    }

    /// SIGTERM, then its exit status once it has drained (None: not within 60 s).
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let exit_by = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break Some(s);
            }
            if std::time::Instant::now() > exit_by {
                self.child.kill().ok();
                self.child.wait().ok();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        std::fs::remove_dir_all(&self.dir).ok();
        while let Ok(line) = self.lines.try_recv() {
            self.seen.push(line);
        }
        status
    }
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

/// Needs a GPU: the kernels give the CPU's answers on random data. Activation quantization is
/// byte-identical to the CPU's; GEMV results agree with the dequantized weights times the
/// activations to the activation quantization's precision; RMSNorm to a few ulp; the
/// Hadamard rotation bit for bit; argmax exactly.
#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn device_kernels_match_the_cpu() {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    use edgelm::quant::{dequantize_row, quantize_row, GgmlType};
    let dev = CudaDevice::open(0).unwrap_or_else(|e| panic!("no usable CUDA device: {e}"));
    let stream = dev.ctx.default_stream();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let cfg = |grid: usize, block: usize| LaunchConfig {
        grid_dim: (grid as u32, 1, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    };

    // Activations -> q8_1, byte for byte as the CPU quantizes them.
    let (n_tok, cols) = (3usize, 512usize);
    let nb = cols / 32;
    let x: Vec<f32> = (0..n_tok * cols)
        .map(|_| ((next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0)
        .collect();
    let x_d = stream.clone_htod(&x).unwrap();
    let mut q_d = stream.alloc_zeros::<u8>(n_tok * nb * 36).unwrap();
    let f = dev.function("quantize_q8_1").unwrap();
    unsafe {
        stream
            .launch_builder(f)
            .arg(&x_d)
            .arg(&mut q_d)
            .arg(&(n_tok as i32))
            .arg(&(cols as i32))
            .launch(cfg((n_tok * nb * 32).div_ceil(256), 256))
    }
    .unwrap();
    let q = stream.clone_dtoh(&q_d).unwrap();
    let mut want = vec![0u8; n_tok * nb * 36];
    for (xr, wr) in x.chunks_exact(cols).zip(want.chunks_exact_mut(nb * 36)) {
        quantize_row(GgmlType::Q8_1, xr, wr);
    }
    assert_eq!(q, want, "q8_1 activations differ from the CPU's");

    // GEMV for every weight type against dequantized weights x f32 activations.
    let types = [
        ("gemv_q4_0", GgmlType::Q4_0),
        ("gemv_q4_1", GgmlType::Q4_1),
        ("gemv_q5_0", GgmlType::Q5_0),
        ("gemv_q8_0", GgmlType::Q8_0),
        ("gemv_q4_k", GgmlType::Q4_K),
        ("gemv_q6_k", GgmlType::Q6_K),
    ];
    for (name, ty) in types {
        let rows = 37usize;
        let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
        let mut w: Vec<u8> = (0..rows * row_bytes).map(|_| next() as u8).collect();
        // Sane scales: every f16 scale field of every block set to a small positive value.
        let small = |v: f32| half::f16::from_f32(v).to_le_bytes();
        let (block, fields): (usize, &[usize]) = match ty {
            GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => (ty.block_bytes(), &[0]),
            GgmlType::Q4_1 | GgmlType::Q4_K => (ty.block_bytes(), &[0, 2]),
            _ => (ty.block_bytes(), &[208]),
        };
        for b in w.chunks_exact_mut(block) {
            for &off in fields {
                b[off..off + 2].copy_from_slice(&small(0.01 + (next() % 100) as f32 * 1e-4));
            }
        }
        let w_d = stream.clone_htod(&w).unwrap();
        let mut y_d = stream.alloc_zeros::<f32>(n_tok * rows).unwrap();
        unsafe {
            stream
                .launch_builder(dev.function(name).unwrap())
                .arg(&w_d)
                .arg(&q_d)
                .arg(&mut y_d)
                .arg(&(rows as i32))
                .arg(&(cols as i32))
                .arg(&(n_tok as i32))
                .launch(cfg(rows.div_ceil(4), 128))
        }
        .unwrap();
        let y = stream.clone_dtoh(&y_d).unwrap();
        let mut wf = vec![0f32; cols];
        for r in 0..rows {
            dequantize_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut wf).unwrap();
            for t in 0..n_tok {
                let xr = &x[t * cols..(t + 1) * cols];
                let exact: f64 = wf.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale: f64 = wf.iter().zip(xr).map(|(&a, &b)| (a * b).abs() as f64).sum();
                let got = y[t * rows + r] as f64;
                assert!(
                    (got - exact).abs() <= 0.02 * scale + 1e-4,
                    "{name} row {r} token {t}: {got} vs {exact} (scale {scale})"
                );
            }
        }
    }

    // RMSNorm.
    let w_norm: Vec<f32> = (0..cols).map(|i| 0.5 + (i % 7) as f32 * 0.1).collect();
    let wn_d = stream.clone_htod(&w_norm).unwrap();
    let mut o_d = stream.alloc_zeros::<f32>(n_tok * cols).unwrap();
    unsafe {
        stream
            .launch_builder(dev.function("rmsnorm").unwrap())
            .arg(&x_d)
            .arg(&wn_d)
            .arg(&mut o_d)
            .arg(&(cols as i32))
            .arg(&1e-5f32)
            .launch(cfg(n_tok, 256))
    }
    .unwrap();
    let o = stream.clone_dtoh(&o_d).unwrap();
    let mut want = vec![0f32; n_tok * cols];
    edgelm::backend::cpu::ops::rmsnorm(&x, &w_norm, 1e-5, &mut want);
    for (a, b) in o.iter().zip(&want) {
        assert!(
            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
            "rmsnorm {a} vs {b}"
        );
    }

    // Hadamard rotation: bit for bit.
    let mut h_d = stream.clone_htod(&x).unwrap();
    let chunks = (x.len() / 64) as i64;
    unsafe {
        stream
            .launch_builder(dev.function("hadamard_64").unwrap())
            .arg(&mut h_d)
            .arg(&chunks)
            .launch(cfg((chunks as usize * 32).div_ceil(256), 256))
    }
    .unwrap();
    let h = stream.clone_dtoh(&h_d).unwrap();
    let mut want = x.clone();
    edgelm::backend::cpu::ops::hadamard_64(&mut want);
    assert_eq!(h, want, "hadamard_64 differs from the CPU's");

    // Argmax: first maximum of each row.
    let mut logits = x.clone();
    logits[cols + 17] = 100.0;
    logits[cols + 300] = 100.0;
    let l_d = stream.clone_htod(&logits).unwrap();
    let mut a_d = stream.alloc_zeros::<u32>(n_tok).unwrap();
    unsafe {
        stream
            .launch_builder(dev.function("argmax_rows").unwrap())
            .arg(&l_d)
            .arg(&(cols as i32))
            .arg(&mut a_d)
            .launch(cfg(n_tok, 256))
    }
    .unwrap();
    let a = stream.clone_dtoh(&a_d).unwrap();
    for (t, &got) in a.iter().enumerate() {
        let want = edgelm::engine::sampler::argmax(&logits[t * cols..(t + 1) * cols]);
        assert_eq!(got, want, "argmax row {t}");
    }
}
