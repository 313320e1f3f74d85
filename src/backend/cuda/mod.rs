//! The CUDA backend's foundation (feature `cuda`): device probe, kernel sources, NVRTC
//! compilation with an on-disk PTX cache, module loading, and the launch shapes of the matmul
//! and sampling kernels.
//!
//! cudarc loads `libcuda` and `libnvrtc` at run time (`dynamic-loading`), so a `cuda` build needs
//! no CUDA toolkit to build and starts on a machine without a GPU; [`probe`] then says why there
//! is no device and the caller serves on the CPU. The model's forward pass does not run on the
//! GPU yet: [`CudaDevice::open`] compiles and loads every kernel, which is what a GPU machine can
//! check today (`packaging/gpu-check.sh`).

mod cache;
mod device;
pub mod kernels;
pub mod launch;
mod nvrtc;
mod probe;

pub use cache::{cache_dir, cache_key};
pub use device::CudaDevice;
pub use kernels::{KernelFile, FILES};
pub use nvrtc::{compile_ptx, nvrtc_version, Arch};
pub use probe::{probe, DeviceInfo};

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
