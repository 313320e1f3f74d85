//! Which backend runs the model: the profile's `engine.backend` ("cpu", "cuda" or "auto")
//! resolved against this build and this machine, with one log line whenever the answer is not
//! what was asked for.
//!
//! Two stages, because the second needs the model: [`resolve`] (at start-up, before the model
//! loads) asks whether this build has CUDA and the machine a device; the engine then builds the
//! CUDA executor (`engine::executor`), which opens the device, checks that the model's tensor
//! types have kernels, and allocates; any failure there falls back to the CPU with one line.

/// The backend that will run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    /// A CUDA device was found; the engine will try to start on it.
    Cuda,
}

/// Resolves `requested` for a command that is `doing` something ("serving", "running",
/// "benchmarking"). Without the `cuda` feature every answer is the CPU; with it, `cuda` and
/// `auto` give [`Backend::Cuda`] when a device is present, and otherwise the CPU with one
/// warn line saying why.
pub fn resolve(requested: &str, doing: &str) -> Backend {
    if requested == "cpu" {
        return Backend::Cpu;
    }
    resolve_gpu(requested, doing, true)
}

/// [`resolve`] without the log line (for code that only needs the answer again).
pub fn resolve_quietly(requested: &str) -> Backend {
    if requested == "cpu" {
        return Backend::Cpu;
    }
    resolve_gpu(requested, "", false)
}

#[cfg(not(feature = "cuda"))]
fn resolve_gpu(requested: &str, doing: &str, say: bool) -> Backend {
    if say && requested == "cuda" {
        log::warn!("this build has no CUDA backend; {doing} on the CPU");
    }
    Backend::Cpu
}

#[cfg(feature = "cuda")]
fn resolve_gpu(_requested: &str, doing: &str, say: bool) -> Backend {
    match super::cuda::probe(0) {
        Err(reason) => {
            if say {
                log::warn!("no CUDA device ({reason}): {doing} on the CPU");
            }
            Backend::Cpu
        }
        Ok(info) => {
            if say {
                log::info!("CUDA device {}: {doing} on it", info.summary());
            }
            Backend::Cuda
        }
    }
}
