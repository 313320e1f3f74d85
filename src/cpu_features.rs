//! What this CPU can run, detected once, and the `EDGELM_SIMD` override, parsed once.
//!
//! Every kernel choice (the quantized dot tables, the GEMM panels, the AVX2 builds of
//! `fma_dispatch!` functions, the CPU backend's hand-written loops) asks [`enabled`], so one
//! environment variable switches them all together and an unsafe `target_feature` call is
//! only ever made after the features it was compiled for were seen here.
//!
//! A leaf: anything may use it, it uses nothing of the crate.

use std::sync::OnceLock;

/// What `EDGELM_SIMD` asks for: the fastest variant (unset), or a slower one for comparison
/// or for diagnosing a suspected SIMD bug in the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdOverride {
    /// Unset (or unrecognised): the fastest this CPU has.
    Auto,
    /// `scalar`: the portable reference code everywhere.
    Scalar,
    /// `avx2`: AVX2 even where AVX-512 VNNI or AVX-VNNI is present (packed weights, `vpdpbusd`
    /// emulated).
    Avx2,
    /// `avx2-unpacked`: AVX2 on the file's row-major weights (its per-pair dots and panels),
    /// for comparison with the packed AVX2 kernels.
    Avx2Unpacked,
    /// `avx2-vnni`: the packed kernels in 256-bit registers (AVX2 with AVX-VNNI's `vpdpbusd`)
    /// even where AVX-512 VNNI is present; there, without AVX-VNNI, its 256-bit EVEX form.
    Avx2Vnni,
    /// `avx512-256`: the AVX-512 VNNI panels in 256-bit registers only.
    Avx512In256,
    /// `neon`: baseline NEON even where `sdot` (dotprod) is present.
    Neon,
}

impl SimdOverride {
    fn parse(value: &str) -> Option<SimdOverride> {
        Some(match value {
            "" => SimdOverride::Auto,
            "scalar" => SimdOverride::Scalar,
            "avx2" => SimdOverride::Avx2,
            "avx2-unpacked" => SimdOverride::Avx2Unpacked,
            "avx2-vnni" => SimdOverride::Avx2Vnni,
            "avx512-256" => SimdOverride::Avx512In256,
            "neon" => SimdOverride::Neon,
            _ => return None,
        })
    }
}

/// The instruction-set extensions the kernels are written for. Each flag is true only when
/// every feature its kernels' `target_feature` lists was detected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Features {
    /// x86-64 AVX2 + FMA + F16C.
    pub avx2: bool,
    /// x86-64 AVX-512 F, VL, BW and VNNI (on top of `avx2`).
    pub avx512_vnni: bool,
    /// x86-64 AVX-VNNI, the VEX-encoded 256-bit `vpdpbusd` (on top of `avx2`).
    pub avx_vnni: bool,
    /// AArch64 Advanced SIMD.
    pub neon: bool,
    /// AArch64 `sdot` (dotprod, on top of `neon`).
    pub neon_dotprod: bool,
    /// AArch64 `smmla` (i8mm, on top of `neon_dotprod`).
    pub neon_i8mm: bool,
}

/// `EDGELM_SIMD`, read and parsed on the first call. An unrecognised value is logged once
/// and treated as unset, so a typo cannot silently select a slow path.
pub fn simd_override() -> SimdOverride {
    static OVERRIDE: OnceLock<SimdOverride> = OnceLock::new();
    *OVERRIDE.get_or_init(|| {
        let raw = std::env::var("EDGELM_SIMD").unwrap_or_default();
        SimdOverride::parse(&raw).unwrap_or_else(|| {
            log::warn!("EDGELM_SIMD={raw:?} is not one of scalar, avx2, avx2-unpacked, avx2-vnni, avx512-256, neon; ignored");
            SimdOverride::Auto
        })
    })
}

/// What the hardware has, whatever `EDGELM_SIMD` says (tests use it to exercise every
/// kernel the machine can run).
pub fn hardware() -> Features {
    static HARDWARE: OnceLock<Features> = OnceLock::new();
    *HARDWARE.get_or_init(detect_hardware)
}

/// What the kernels may use: [`hardware`] less what `EDGELM_SIMD` turns off.
#[inline]
pub fn enabled() -> Features {
    static ENABLED: OnceLock<Features> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let hw = hardware();
        match simd_override() {
            SimdOverride::Scalar => Features::default(),
            SimdOverride::Avx2 | SimdOverride::Avx2Unpacked => Features {
                avx512_vnni: false,
                avx_vnni: false,
                ..hw
            },
            SimdOverride::Avx2Vnni => Features {
                avx512_vnni: false,
                ..hw
            },
            SimdOverride::Neon => Features {
                neon_dotprod: false,
                neon_i8mm: false,
                ..hw
            },
            SimdOverride::Auto | SimdOverride::Avx512In256 => hw,
        }
    })
}

/// True when the AVX2 + FMA + F16C kernels may run (the check behind `fma_dispatch!`).
#[inline]
pub fn avx2() -> bool {
    enabled().avx2
}

/// True when 512-bit vectors may be used (AVX-512 detected, not turned off or held to 256-bit
/// registers by `EDGELM_SIMD`): the third build of `fma_dispatch!`.
#[inline]
pub fn avx512() -> bool {
    enabled().avx512_vnni && simd_override() != SimdOverride::Avx512In256
}

#[cfg(target_arch = "x86_64")]
fn detect_hardware() -> Features {
    use std::arch::is_x86_feature_detected as has;
    let avx2 = has!("avx2") && has!("fma") && has!("f16c");
    Features {
        avx2,
        avx512_vnni: avx2
            && has!("avx512f")
            && has!("avx512vl")
            && has!("avx512bw")
            && has!("avx512vnni"),
        // CPUID leaf 7 subleaf 1, EAX bit 4.
        avx_vnni: avx2 && has!("avxvnni"),
        ..Features::default()
    }
}

#[cfg(target_arch = "aarch64")]
fn detect_hardware() -> Features {
    use std::arch::is_aarch64_feature_detected as has;
    let neon = has!("neon");
    Features {
        neon,
        neon_dotprod: neon && has!("dotprod"),
        neon_i8mm: neon && has!("dotprod") && has!("i8mm"),
        ..Features::default()
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_hardware() -> Features {
    Features::default()
}

/// Defines `fn name(args) -> ret { body }` so that the body is compiled three times: portably,
/// with AVX2 + FMA + F16C, and with AVX-512 on top (512-bit vectors), dispatching on
/// [`avx512`] and [`avx2`]. Our exact-rounding code leans on `f32::mul_add`, which without the
/// `fma` target feature is a libm call; inside the SIMD builds it is one instruction and the
/// loops vectorise. Every build computes the same bits: an FMA is exactly rounded either way,
/// and the compiler never reassociates float arithmetic, whatever the vector width.
macro_rules! fma_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw")]
                unsafe fn wide($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn fast($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if $crate::cpu_features::avx512() {
                    // SAFETY: `avx512()` is true only when those features were detected.
                    return unsafe { wide($($arg),*) };
                }
                if $crate::cpu_features::avx2() {
                    // SAFETY: `avx2()` is true only when AVX2, FMA and F16C were all
                    // detected, the features `fast` was compiled for.
                    return unsafe { fast($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
pub(crate) use fma_dispatch;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_override_parses() {
        assert_eq!(SimdOverride::parse(""), Some(SimdOverride::Auto));
        assert_eq!(SimdOverride::parse("scalar"), Some(SimdOverride::Scalar));
        assert_eq!(SimdOverride::parse("avx2"), Some(SimdOverride::Avx2));
        assert_eq!(
            SimdOverride::parse("avx2-unpacked"),
            Some(SimdOverride::Avx2Unpacked)
        );
        assert_eq!(
            SimdOverride::parse("avx2-vnni"),
            Some(SimdOverride::Avx2Vnni)
        );
        assert_eq!(
            SimdOverride::parse("avx512-256"),
            Some(SimdOverride::Avx512In256)
        );
        assert_eq!(SimdOverride::parse("neon"), Some(SimdOverride::Neon));
        assert_eq!(SimdOverride::parse("sse2"), None);
    }

    #[test]
    fn enabled_never_exceeds_the_hardware() {
        let (hw, on) = (hardware(), enabled());
        assert!(!on.avx2 || hw.avx2);
        assert!(!on.avx512_vnni || hw.avx512_vnni);
        assert!(!on.avx_vnni || hw.avx_vnni);
        assert!(!hw.avx_vnni || hw.avx2);
        assert!(!on.neon || hw.neon);
        assert!(!on.neon_dotprod || hw.neon_dotprod);
        assert!(!hw.avx512_vnni || hw.avx2);
        assert!(!hw.neon_dotprod || hw.neon);
        assert!(!on.neon_i8mm || hw.neon_i8mm);
        assert!(!hw.neon_i8mm || hw.neon_dotprod);
    }
}
