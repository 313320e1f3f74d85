//! NVRTC compilation of one kernel file for one GPU architecture, to PTX.
//!
//! The target is the virtual architecture `compute_XY` of the device's compute capability X.Y:
//! NVRTC emits PTX for exactly that architecture, the driver turns it into machine code for the
//! device when the module loads, and `ptxas -arch=sm_XY` can check the same PTX ahead of time
//! (registers, spills) on a machine without a GPU.

use super::kernels::KernelFile;
use super::no_panic;
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::fmt;

/// A compute capability, e.g. 8.7 (Jetson Orin) or 9.0 (H100).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Arch {
    pub major: u32,
    pub minor: u32,
}

impl Arch {
    pub const fn new(major: u32, minor: u32) -> Arch {
        Arch { major, minor }
    }

    /// Parses `sm_87`, `compute_87`, `87` or `8.7`.
    pub fn parse(s: &str) -> Option<Arch> {
        let s = s.trim();
        let digits = s
            .strip_prefix("sm_")
            .or_else(|| s.strip_prefix("compute_"))
            .unwrap_or(s);
        if let Some((a, b)) = digits.split_once('.') {
            return Some(Arch::new(a.parse().ok()?, b.parse().ok()?));
        }
        if digits.len() < 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let (a, b) = digits.split_at(digits.len() - 1);
        Some(Arch::new(a.parse().ok()?, b.parse().ok()?))
    }

    /// `sm_87`: the real architecture (what ptxas and the driver produce code for).
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }

    /// `compute_87`: the virtual architecture NVRTC targets.
    pub fn compute(&self) -> String {
        format!("compute_{}{}", self.major, self.minor)
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sm())
    }
}

/// The options every kernel is compiled with (part of the cache key through [`options_for`]).
pub(crate) fn options_for(arch: Arch) -> Vec<String> {
    vec![
        format!("--gpu-architecture={}", arch.compute()),
        "--std=c++17".into(),
        // The kernels round where the CPU rounds (explicit __fmul_rn etc. where it matters);
        // elsewhere a*b+c may fuse.
        "--fmad=true".into(),
    ]
}

/// Compiles one kernel file to PTX text for `arch`. Errors carry NVRTC's log.
pub fn compile_ptx(file: &KernelFile, arch: Arch) -> Result<String, String> {
    nvrtc_version()?;
    let src = file.source();
    no_panic("libnvrtc could not be loaded", || {
        let opts = CompileOptions {
            options: options_for(arch),
            name: Some(format!("{}.cu", file.name)),
            ..Default::default()
        };
        compile_ptx_with_opts(&src, opts)
            .map(|ptx| ptx.to_src())
            .map_err(|e| describe(file, arch, e))
    })
}

fn describe(file: &KernelFile, arch: Arch, e: cudarc::nvrtc::CompileError) -> String {
    match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => format!(
            "NVRTC could not compile kernels/{}.cu for {arch}:\n{}",
            file.name,
            log.to_string_lossy()
        ),
        other => format!(
            "NVRTC failed on kernels/{}.cu for {arch}: {other:?}",
            file.name
        ),
    }
}

/// NVRTC's version, e.g. "12.6" (part of the PTX cache key: another compiler, other PTX).
/// Fails when libnvrtc cannot be found.
pub fn nvrtc_version() -> Result<String, String> {
    use cudarc::nvrtc::sys;
    no_panic("libnvrtc could not be loaded", || {
        // SAFETY: only tries to open the library.
        if !unsafe { sys::is_culib_present() } {
            return Err(
                "libnvrtc.so not found (install the CUDA toolkit's NVRTC, or point \
                        LD_LIBRARY_PATH at it)"
                    .into(),
            );
        }
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        let r = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
        if r != sys::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcVersion failed: {r:?}"));
        }
        Ok(format!("{major}.{minor}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arch_spellings() {
        for s in ["sm_87", "compute_87", "87", "8.7"] {
            assert_eq!(Arch::parse(s), Some(Arch::new(8, 7)), "{s}");
        }
        assert_eq!(Arch::parse("sm_100"), Some(Arch::new(10, 0)));
        assert_eq!(Arch::parse("sm_x"), None);
        assert_eq!(Arch::new(9, 0).sm(), "sm_90");
        assert_eq!(Arch::new(9, 0).compute(), "compute_90");
    }
}
