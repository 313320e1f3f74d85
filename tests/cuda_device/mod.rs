//! Device tests of the GEMM, the sampler, the forward pass and the image encoder (part of
//! tests/cuda_kernels.rs, so that `packaging/gpu-check.sh` carries them to a GPU machine with
//! the rest). Each needs a CUDA device and is `#[ignore]`d elsewhere.

mod architectures;
mod embeddings;
mod forward;
mod gemm;
mod hybrid;
mod moe;
mod recurrent;
mod sample;
mod vision;

use crate::common::{test_model, test_model_cut};
use edgelm::backend::cuda::CudaDevice;
use std::path::PathBuf;

fn open() -> CudaDevice {
    let dev = CudaDevice::open(0).unwrap_or_else(|e| panic!("no usable CUDA device: {e}"));
    eprintln!("{}", dev.info.summary());
    dev
}

/// The test model of `arch` the device tests run: cut to its first EDGELM_CUDA_TEST_LAYERS
/// layers where that is set (the emulator's run, scripts/check-cuda-emu.sh), whole on a GPU.
fn device_test_model(arch: &str) -> PathBuf {
    let layers = std::env::var("EDGELM_CUDA_TEST_LAYERS").ok();
    match layers.and_then(|v| v.parse().ok()) {
        Some(layers) => test_model_cut(arch, layers),
        None => test_model(arch),
    }
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// xorshift64: reproducible test data.
struct Xs(u64);

impl Xs {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-1, 1).
    fn sym(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Roughly normal (sum of four uniforms), mean 0, standard deviation about 1.15.
    fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.sym()).sum()
    }
}
