//! The CUDA backend (feature `cuda`): device probe, kernel sources, NVRTC compilation with an
//! on-disk PTX cache, module loading, the launch shapes of the kernels, the op set on the device
//! (`step::CudaStep`), and [`CudaExecutor`], which runs a model's one forward pass
//! (`backend::ops::Network`) over the device's weights, KV pool, workspace and decode graphs;
//! beside it, [`EncoderOps`], the ops a vision encoder runs on the device.
//!
//! cudarc loads `libcuda` and `libnvrtc` at run time (`dynamic-loading`), so a `cuda` build needs
//! no CUDA toolkit to build and starts on a machine without a GPU; [`probe`] then says why there
//! is no device and the caller serves on the CPU. None of this has run on a GPU yet:
//! `packaging/gpu-check.sh` carries the device tests to one.

mod cache;
mod device;
mod encoder_ops;
mod executor;
mod graphs;
pub mod kernels;
mod kv_pool;
pub mod launch;
mod mem;
mod nvrtc;
mod ops;
mod probe;
mod step;
mod weights;
mod workspace;

pub use cache::{cache_dir, cache_key};
pub use device::CudaDevice;
pub use encoder_ops::{DeviceIndex, DeviceMatrix, DeviceRows, EncoderOps, Rows, VIT_MAX_HEAD_DIM};
pub use executor::{CudaExecutor, ExecutorConfig, Want};
pub use kernels::{KernelFile, FILES};
pub use kv_pool::{blocks_for, KvBudget};
pub use nvrtc::{compile_ptx, nvrtc_version, Arch};
pub use probe::{probe, DeviceInfo};
pub use weights::{check_supported, HEAD_DIMS};

/// Runs `f`, turning a panic into an error: with dynamic loading, cudarc panics when a library
/// or one of its symbols is missing, and a missing GPU must never take the process down.
pub(crate) fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("panic");
            Err(format!("{what}: {msg}"))
        }
    }
}
