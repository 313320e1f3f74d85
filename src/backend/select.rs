//! Which backend runs the model: the profile's `engine.backend` ("cpu", "cuda" or "auto")
//! resolved against this build and this machine, with one log line whenever the answer is not
//! what was asked for.

/// The backend that will run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
}

/// Resolves `requested` for a command that is `doing` something ("serving", "running",
/// "benchmarking"). Today every answer is the CPU: without the `cuda` feature there is no GPU
/// code, and with it the forward pass does not run on the GPU yet; a `cuda` build still probes
/// the device (and compiles and loads every kernel when there is one) so that the log says what
/// this machine has.
pub fn resolve(requested: &str, doing: &str) -> Backend {
    if requested == "cpu" {
        return Backend::Cpu;
    }
    resolve_gpu(requested, doing)
}

#[cfg(not(feature = "cuda"))]
fn resolve_gpu(requested: &str, doing: &str) -> Backend {
    if requested == "cuda" {
        log::warn!("this build has no CUDA backend; {doing} on the CPU");
    }
    Backend::Cpu
}

#[cfg(feature = "cuda")]
fn resolve_gpu(_requested: &str, doing: &str) -> Backend {
    use super::cuda::{probe, CudaDevice};
    match probe(0) {
        Err(reason) => log::warn!("no CUDA device ({reason}): {doing} on the CPU"),
        Ok(info) => match CudaDevice::open(info.ordinal) {
            Err(reason) => log::warn!(
                "CUDA device {} unusable ({reason}): {doing} on the CPU",
                info.summary()
            ),
            Ok(dev) => log::warn!(
                "CUDA device {} ready, but the CUDA forward pass is not implemented yet: {doing} \
                 on the CPU",
                dev.info.summary()
            ),
        },
    }
    Backend::Cpu
}
