//! kernels/gemm.cu on a GPU: random quantized weights (every scale field set to a sane value,
//! the quants random) times q8_1 activations quantized by the CPU, for odd row counts, a K
//! stage left partly empty and token counts from 1 to past two token tiles. Checked against
//! the CPU's dequantized weights times the dequantized activations (the exact value of what the
//! integer dot products compute), and, where the GEMV applies, against gemv.cu on the same
//! data (the prefill and decode paths must agree to f32 rounding). Run twice: with the PTX the
//! runtime builds for the device (int8 mma.sync on sm_80+), and with the file compiled for
//! compute_75, which takes the dp4a fallback and which the driver JIT-compiles for any newer
//! GPU.

use super::{open, Xs};
use cudarc::driver::{CudaFunction, CudaStream, PushKernelArg};
use cudarc::nvrtc::Ptx;
use edgelm::backend::cuda::kernels::file_of;
use edgelm::backend::cuda::launch::{gemm_config, gemv_config, GEMV_MAX_TOK};
use edgelm::backend::cuda::{compile_ptx, Arch};
use edgelm::quant::{dequantize_row, quantize_row, GgmlType};
use std::sync::Arc;

const TYPES: [(GgmlType, &str); 6] = [
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q6_K, "q6_k"),
];

/// Random weight rows of `ty` whose scale fields are small positive values (f16 ones, or
/// MXFP4's E8M0 exponent).
fn weights(rng: &mut Xs, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let row_bytes = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut w: Vec<u8> = (0..rows * row_bytes).map(|_| rng.next() as u8).collect();
    if ty == GgmlType::MXFP4 {
        // 2^(e - 127): about 1/256 to 1/2.
        for b in w.chunks_exact_mut(ty.block_bytes()) {
            b[0] = 119 + (rng.next() % 8) as u8;
        }
        return w;
    }
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q4_K => &[0, 2],
        _ => &[208],
    };
    for b in w.chunks_exact_mut(ty.block_bytes()) {
        for &off in fields {
            let v = 0.01 + (rng.next() % 100) as f32 * 1e-4;
            b[off..off + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    w
}

/// Random weights and q8_1 activations, with both dequantized.
pub(super) struct Case {
    pub rows: usize,
    pub cols: usize,
    pub n_tok: usize,
    pub w: Vec<u8>,
    pub act: Vec<u8>,
    /// Dequantized weights and activations, row-major.
    pub wf: Vec<f32>,
    pub af: Vec<f32>,
}

pub(super) fn case(rng: &mut Xs, ty: GgmlType, rows: usize, cols: usize, n_tok: usize) -> Case {
    let w = weights(rng, ty, rows, cols);
    let row_bytes = w.len() / rows;
    let mut wf = vec![0f32; rows * cols];
    for (src, dst) in w.chunks_exact(row_bytes).zip(wf.chunks_exact_mut(cols)) {
        dequantize_row(ty, src, dst).unwrap();
    }
    let x: Vec<f32> = (0..n_tok * cols).map(|_| rng.sym() * 2.0).collect();
    let act_row = GgmlType::Q8_1.row_bytes(cols as u64).unwrap() as usize;
    let mut act = vec![0u8; n_tok * act_row];
    let mut af = vec![0f32; n_tok * cols];
    for t in 0..n_tok {
        let q = &mut act[t * act_row..(t + 1) * act_row];
        quantize_row(GgmlType::Q8_1, &x[t * cols..(t + 1) * cols], q);
        dequantize_row(GgmlType::Q8_1, q, &mut af[t * cols..(t + 1) * cols]).unwrap();
    }
    Case {
        rows,
        cols,
        n_tok,
        w,
        act,
        wf,
        af,
    }
}

/// Launches `f` (a gemm or gemv kernel: same arguments) and returns y, n_tok x rows. The output
/// starts as NaN with a guard after it, so a missed or stray write shows.
fn run(
    stream: &Arc<CudaStream>,
    f: &CudaFunction,
    c: &Case,
    cfg: cudarc::driver::LaunchConfig,
) -> Vec<f32> {
    const GUARD: usize = 256;
    let w_d = stream.clone_htod(&c.w).unwrap();
    let a_d = stream.clone_htod(&c.act).unwrap();
    let mut y_d = stream
        .clone_htod(&vec![f32::NAN; c.n_tok * c.rows + GUARD])
        .unwrap();
    unsafe {
        stream
            .launch_builder(f)
            .arg(&w_d)
            .arg(&a_d)
            .arg(&mut y_d)
            .arg(&(c.rows as i32))
            .arg(&(c.cols as i32))
            .arg(&(c.n_tok as i32))
            .launch(cfg)
    }
    .unwrap();
    let mut y = stream.clone_dtoh(&y_d).unwrap();
    assert!(
        y[c.n_tok * c.rows..].iter().all(|v| v.is_nan()),
        "a write past the output"
    );
    y.truncate(c.n_tok * c.rows);
    y
}

/// (exact value, sum of |products|) of row r against token t.
fn reference(c: &Case, r: usize, t: usize) -> (f64, f64) {
    let w = &c.wf[r * c.cols..(r + 1) * c.cols];
    let a = &c.af[t * c.cols..(t + 1) * c.cols];
    w.iter().zip(a).fold((0.0, 0.0), |(s, m), (&x, &y)| {
        let p = x as f64 * y as f64;
        (s + p, m + p.abs())
    })
}

fn check_all_types(
    stream: &Arc<CudaStream>,
    gemm: impl Fn(&str) -> CudaFunction,
    gemv: impl Fn(&str) -> CudaFunction,
    what: &str,
) {
    let mut rng = Xs(0x2545_f491_4f6c_dd1d);
    for (ty, suffix) in TYPES {
        // 17 blocks of 32 leave the last K stage (8 blocks) nearly empty; K-quants need whole
        // super-blocks of 256.
        let cols = if ty.block_elems() == 256 { 768 } else { 544 };
        for n_tok in [1, 5, 8, 9, 64, 65, 130] {
            let c = case(&mut rng, ty, 100, cols, n_tok);
            let y = run(
                stream,
                &gemm(&format!("gemm_{suffix}")),
                &c,
                gemm_config(c.rows, n_tok),
            );
            let mut worst = 0f64;
            for t in 0..n_tok {
                for r in 0..c.rows {
                    let (exact, scale) = reference(&c, r, t);
                    let got = y[t * c.rows + r] as f64;
                    // Q4_1's minimum meets the q8_1 block's f16-rounded sum (as on the CPU):
                    // up to 2^-11 of the scale; the rest is f32 rounding.
                    let err = (got - exact).abs() / (scale + 1e-9);
                    worst = worst.max(err);
                    assert!(
                        got.is_finite() && err <= 2e-3,
                        "{what} gemm_{suffix} {n_tok} tokens, row {r} token {t}: {got} vs {exact} \
                         (scale {scale})"
                    );
                }
            }
            if n_tok <= GEMV_MAX_TOK {
                let v = run(
                    stream,
                    &gemv(&format!("gemv_{suffix}")),
                    &c,
                    gemv_config(c.rows),
                );
                for (i, (a, b)) in y.iter().zip(&v).enumerate() {
                    let (_, scale) = reference(&c, i % c.rows, i / c.rows);
                    assert!(
                        ((a - b).abs() as f64) <= 1e-5 * scale + 1e-6,
                        "{what} gemm_{suffix} vs gemv_{suffix}, {n_tok} tokens, output {i}: {a} vs {b}"
                    );
                }
            }
            eprintln!("{what} gemm_{suffix}: {n_tok} tokens ok (worst error {worst:.2e} of scale)");
        }
    }
}

#[test]
#[ignore = "needs a CUDA device: packaging/gpu-check.sh runs it"]
fn device_gemm_matches_the_cpu() {
    let dev = open();
    let stream = dev.ctx.default_stream();
    let loaded = |name: &str| dev.function(name).unwrap().clone();
    check_all_types(&stream, loaded, loaded, &format!("{}", dev.info.arch));

    // The pre-sm_80 path: PTX for compute_75, JIT-compiled by the driver for this device.
    let ptx = compile_ptx(file_of("gemm_q4_0").unwrap(), Arch::new(7, 5)).unwrap();
    let module = dev.ctx.load_module(Ptx::from_src(ptx)).unwrap();
    check_all_types(
        &stream,
        |name| module.load_function(name).unwrap(),
        loaded,
        "sm_75 PTX (dp4a)",
    );
}
