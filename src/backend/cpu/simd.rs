//! Compiling a scalar-written kernel twice: once portable, once for AVX2+FMA, picked at run
//! time. Our exact-rounding code leans on `f32::mul_add`, which without the `fma` target
//! feature is a libm call; inside an AVX2+FMA function it is one instruction and the loops
//! vectorise. Both builds compute the same bits (an FMA is exactly rounded either way).

use std::sync::OnceLock;

/// True when this CPU has AVX2 and FMA (cached after the first call).
#[inline]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub fn has_avx2_fma() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            std::env::var_os("EDGELM_SIMD").is_none_or(|v| v != "scalar")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Defines `fn name(args) -> ret { body }` so that the body is compiled both portably and with
/// AVX2+FMA enabled, dispatching on [`has_avx2_fma`].
macro_rules! fma_dispatch {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma,f16c")]
                unsafe fn fast($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if $crate::backend::cpu::simd::has_avx2_fma() {
                    // SAFETY: the CPU has the features `fast` was compiled for.
                    return unsafe { fast($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}
