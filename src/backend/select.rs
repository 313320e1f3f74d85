//! Which backend runs the model: the one asked for ([`Requested`]: `--backend` or the profile's
//! `engine.backend`, "cpu", "cuda" or "auto") resolved against this build and this machine,
//! with one log line whenever the answer is not what was asked for.
//!
//! Two stages, because the second needs the model: [`Requested::resolve`] (at start-up,
//! before the model loads) asks whether this build has CUDA and the machine a device; the
//! engine then builds the CUDA executor (`engine::executor`), which opens the device, checks
//! that the model's tensor types have kernels, and allocates; any failure there falls back to
//! the CPU with one line.

/// The backend that will run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Cpu,
    /// A CUDA device was found; the engine will try to start on it.
    Cuda,
}

/// The backend asked for, by a flag or a profile's `engine.backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requested {
    Cpu,
    /// CUDA, falling back to the CPU (with a warning) when there is no device.
    Cuda,
    /// CUDA when there is a device, else the CPU.
    Auto,
}

impl Requested {
    /// The spellings flags and profiles accept, in [`Requested`]'s order.
    pub const NAMES: [&'static str; 3] = ["cpu", "cuda", "auto"];

    /// The name a flag or profile spells this with.
    pub fn name(self) -> &'static str {
        match self {
            Requested::Cpu => "cpu",
            Requested::Cuda => "cuda",
            Requested::Auto => "auto",
        }
    }

    /// Resolves this request for a command that is `doing` something ("serving", "running",
    /// "benchmarking"). Without the `cuda` feature every answer is the CPU; with it, `cuda`
    /// and `auto` give [`Backend::Cuda`] when a device is present, and otherwise the CPU with
    /// one warn line saying why.
    pub fn resolve(self, doing: &str) -> Backend {
        match self {
            Requested::Cpu => Backend::Cpu,
            _ => resolve_gpu(self.name(), doing, true),
        }
    }

    /// [`Requested::resolve`] without the log line (for code that only needs the answer again).
    pub fn resolve_quietly(self) -> Backend {
        match self {
            Requested::Cpu => Backend::Cpu,
            _ => resolve_gpu(self.name(), "", false),
        }
    }
}

impl std::str::FromStr for Requested {
    type Err = String;

    fn from_str(s: &str) -> Result<Requested, String> {
        match s {
            "cpu" => Ok(Requested::Cpu),
            "cuda" => Ok(Requested::Cuda),
            "auto" => Ok(Requested::Auto),
            _ => Err(format!("backend {s:?} is not one of cpu, cuda, auto")),
        }
    }
}

/// [`Requested::resolve`] for a backend still spelled as a profile's string; anything but
/// "cpu" asks for CUDA (the profile loader has already rejected other spellings).
pub fn resolve(requested: &str, doing: &str) -> Backend {
    if requested == "cpu" {
        return Backend::Cpu;
    }
    resolve_gpu(requested, doing, true)
}

#[cfg(not(feature = "cuda"))]
fn resolve_gpu(requested: &str, doing: &str, say: bool) -> Backend {
    if say && requested == "cuda" {
        log::warn!("this build has no CUDA backend; {doing} on the CPU");
    }
    Backend::Cpu
}

/// Device 0, probed once per process: every resolution (a command's, then the engine
/// configuration's) sees the same answer, and the driver is opened only once to find it.
#[cfg(feature = "cuda")]
fn probed_device() -> &'static Result<super::cuda::DeviceInfo, String> {
    static PROBED: std::sync::OnceLock<Result<super::cuda::DeviceInfo, String>> =
        std::sync::OnceLock::new();
    PROBED.get_or_init(|| super::cuda::probe(0))
}

#[cfg(feature = "cuda")]
fn resolve_gpu(_requested: &str, doing: &str, say: bool) -> Backend {
    match probed_device() {
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
