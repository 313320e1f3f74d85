//! Quantized math: ggml block formats, (de)quantization and the row dot
//! products the matmuls are built from.
//!
//! Layout of this module:
//! - `types`     — `GgmlType` and block geometry (shared with the GGUF loader);
//! - `blocks`    — `#[repr(C)]` block structs and the sound `&[u8]` → blocks cast;
//! - `dequant`   — scalar dequantization (ggml-quants.c);
//! - `quantize`  — activation quantization into the vec-dot types (`*_ref`);
//! - `dot_ref`   — scalar reference dot products (ggml-cpu generic code);
//! - `simd_x86` / `simd_arm` — AVX2+FMA / NEON fast paths.
//!
//! The dot kernels are chosen once per process (CPU feature detection is
//! cached in a `OnceLock` table of function pointers), so `vec_dot` costs a
//! match on the type plus an indirect call on top of the kernel itself.

use std::fmt;
use std::sync::OnceLock;

mod blocks;
mod dequant;
mod dot_ref;
mod gemm;
#[cfg(target_arch = "x86_64")]
mod gemm_avx512;
#[cfg(target_arch = "x86_64")]
mod gemm_x86;
pub mod order;
#[cfg(target_arch = "x86_64")]
mod order_x86;
mod quantize;
#[cfg(target_arch = "aarch64")]
mod simd_arm;
#[cfg(target_arch = "x86_64")]
mod simd_x86;
pub mod types;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod testdata {
    pub mod vectors;
}

pub use gemm::{gemm, gemm_level};
pub use order::{order, Order};
pub use types::GgmlType;

impl GgmlType {
    /// The format activations must be quantized into before being dotted
    /// with a weight row of this type (ggml's `vec_dot_type`). Only
    /// meaningful for types where [`is_supported`] is true; the others map
    /// to what ggml would use (Q2_K/Q3_K → Q8_K) or to F32.
    pub fn vec_dot_type(self) -> GgmlType {
        use GgmlType::*;
        match self {
            Q4_0 | Q5_0 | Q8_0 => Q8_0,
            Q4_1 | Q5_1 | Q8_1 => Q8_1,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => Q8_K,
            F16 => F16,
            BF16 => BF16,
            F32 | I8 | I16 | I32 | I64 | F64 => F32,
        }
    }
}

/// Errors of the fallible entry points (only `dequantize_row`: the hot
/// paths treat misuse as a caller bug and panic).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuantError {
    /// We have no decoder for this type.
    Unsupported(GgmlType),
    /// `bytes` is not the size of a row of `elems` values of `ty` (or
    /// `elems` is not a whole number of blocks).
    BadLength {
        ty: GgmlType,
        elems: usize,
        bytes: usize,
    },
}

impl fmt::Display for QuantError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QuantError::Unsupported(t) => write!(f, "unsupported tensor type {t}"),
            QuantError::BadLength { ty, elems, bytes } => match ty.row_bytes(*elems as u64) {
                Some(want) => write!(f, "a {ty} row of {elems} values is {want} bytes, got {bytes}"),
                None => write!(
                    f,
                    "{elems} values is not a whole number of {ty} blocks ({} values each; {bytes} bytes given)",
                    ty.block_elems()
                ),
            },
        }
    }
}

impl std::error::Error for QuantError {}

/// True when we can both dequantize this type and dot it (as weights)
/// against its [`GgmlType::vec_dot_type`]. (`dequantize_row` additionally
/// accepts the activation-only types Q8_1 and Q8_K.)
pub fn is_supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q4_K | Q5_K | Q6_K
    )
}

/// Bytes of a row of `n` values, `None` if `n` is not whole blocks.
#[inline(always)]
fn row_len(ty: GgmlType, n: usize) -> Option<usize> {
    let be = ty.block_elems();
    if !n.is_multiple_of(be) {
        return None;
    }
    (n / be).checked_mul(ty.block_bytes())
}

/// Dequantize `dst.len()` values from `src` (which must be exactly
/// `ty.row_bytes(dst.len())` bytes). Bit-identical to ggml's
/// `dequantize_row_*`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if row_len(ty, dst.len()) != Some(src.len()) {
        if !is_supported(ty) && !matches!(ty, GgmlType::Q8_1 | GgmlType::Q8_K) {
            return Err(QuantError::Unsupported(ty));
        }
        return Err(QuantError::BadLength {
            ty,
            elems: dst.len(),
            bytes: src.len(),
        });
    }
    if dequant::dequantize(ty, src, dst) {
        Ok(())
    } else {
        Err(QuantError::Unsupported(ty))
    }
}

/// Quantize activations `src` into the vec-dot format `dot_ty` (one of
/// Q8_0, Q8_1, Q8_K, F16, BF16, F32); `dst` must be
/// `dot_ty.row_bytes(src.len())` bytes. Byte-identical to ggml's
/// `quantize_row_*_ref`.
///
/// # Panics
/// On any other `dot_ty`, or when the lengths do not match (both are
/// caller bugs: the sizes follow from the model's shapes).
pub fn quantize_row(dot_ty: GgmlType, src: &[f32], dst: &mut [u8]) {
    let want = row_len(dot_ty, src.len());
    assert!(
        want == Some(dst.len()),
        "quantize_row({dot_ty}): {} values need {want:?} bytes, dst has {}",
        src.len(),
        dst.len()
    );
    assert!(
        quantize::quantize(dot_ty, src, dst),
        "quantize_row: {dot_ty} is not a vec-dot type"
    );
}

/// A dot kernel: `(n, weight row bytes, activation row bytes)`, both slices
/// exactly sized. `unsafe` because SIMD kernels require CPU features; a
/// table only ever holds kernels whose features were detected.
type DotFn = unsafe fn(usize, &[u8], &[u8]) -> f32;

/// One implementation per supported weight type.
struct Kernels {
    name: &'static str,
    q4_0: DotFn,
    q4_1: DotFn,
    q5_0: DotFn,
    q5_1: DotFn,
    q8_0: DotFn,
    q4_k: DotFn,
    q5_k: DotFn,
    q6_k: DotFn,
    f16: DotFn,
    bf16: DotFn,
    f32: DotFn,
}

const SCALAR: Kernels = Kernels {
    name: "scalar",
    q4_0: dot_ref::q4_0_q8_0,
    q4_1: dot_ref::q4_1_q8_1,
    q5_0: dot_ref::q5_0_q8_0,
    q5_1: dot_ref::q5_1_q8_1,
    q8_0: dot_ref::q8_0_q8_0,
    q4_k: dot_ref::q4_k_q8_k,
    q5_k: dot_ref::q5_k_q8_k,
    q6_k: dot_ref::q6_k_q8_k,
    f16: dot_ref::f16_f16,
    bf16: dot_ref::bf16_bf16,
    f32: dot_ref::f32_f32,
};

static KERNELS: OnceLock<&'static Kernels> = OnceLock::new();

/// Picks the best table for this CPU. `EDGELM_SIMD=scalar` forces the
/// reference kernels (for diagnosing suspected SIMD bugs in the field).
fn detect() -> &'static Kernels {
    if std::env::var_os("EDGELM_SIMD").is_some_and(|v| v == "scalar") {
        return &SCALAR;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            return &simd_x86::AVX2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::env::var_os("EDGELM_SIMD").is_none_or(|v| v != "neon")
            && std::arch::is_aarch64_feature_detected!("dotprod")
        {
            return &simd_arm::NEON_DOTPROD;
        }
        if std::arch::is_aarch64_feature_detected!("neon") {
            return &simd_arm::NEON;
        }
    }
    &SCALAR
}

#[inline(always)]
fn kernels() -> &'static Kernels {
    KERNELS.get_or_init(detect)
}

#[cold]
#[inline(never)]
fn unsupported_dot(ty: GgmlType) -> ! {
    panic!("vec_dot: weight type {ty} is not supported (check quant::is_supported first)")
}

#[inline(always)]
fn dot_with(k: &Kernels, ty: GgmlType, n: usize, w_row: &[u8], x_q: &[u8]) -> f32 {
    use GgmlType::*;
    let f = match ty {
        Q4_0 => k.q4_0,
        Q4_1 => k.q4_1,
        Q5_0 => k.q5_0,
        Q5_1 => k.q5_1,
        Q8_0 => k.q8_0,
        Q4_K => k.q4_k,
        Q5_K => k.q5_k,
        Q6_K => k.q6_k,
        F16 => k.f16,
        BF16 => k.bf16,
        F32 => k.f32,
        _ => unsupported_dot(ty),
    };
    let vt = ty.vec_dot_type();
    debug_assert!(
        n.is_multiple_of(ty.block_elems()) && n.is_multiple_of(vt.block_elems()),
        "{ty}: n={n} is not whole blocks"
    );
    // Plain multiplications (no checked arithmetic) keep this branch-free;
    // the slicing below is the real bounds check, and makes the kernels
    // unable to read out of bounds whatever `n` says.
    let wb = n / ty.block_elems() * ty.block_bytes();
    let xb = n / vt.block_elems() * vt.block_bytes();
    debug_assert_eq!(w_row.len(), wb, "{ty}: weight row of {n} values");
    debug_assert_eq!(x_q.len(), xb, "{vt}: activation row of {n} values");
    let (w, x) = (&w_row[..wb], &x_q[..xb]);
    // SAFETY: `k` is either SCALAR (safe fns) or a table `detect()` returned
    // after checking that this CPU has the features its kernels need; the
    // kernels only touch memory inside the two slices.
    unsafe { f(n, w, x) }
}

/// Dot product of one weight row (type `ty`, `n` values) with activations
/// already quantized by `quantize_row(ty.vec_dot_type(), ..)`. Uses the
/// fastest path this CPU has.
///
/// # Panics
/// If `ty` is not supported, or a row is shorter than `n` values need
/// (longer rows are a debug assertion; `n` must be whole blocks).
#[inline]
pub fn vec_dot(ty: GgmlType, n: usize, w_row: &[u8], x_q: &[u8]) -> f32 {
    dot_with(kernels(), ty, n, w_row, x_q)
}

/// f16 values (little-endian bytes) to f32, `dst.len()` of them: the fast path K/V page rows
/// take on every attention read.
///
/// # Panics
/// If `src` holds fewer than `dst.len()` values.
#[inline]
pub fn f16_row_to_f32(src: &[u8], dst: &mut [f32]) {
    assert!(src.len() >= dst.len() * 2, "f16 row too short");
    #[cfg(target_arch = "x86_64")]
    if kernels().name == "avx2" {
        // SAFETY: the avx2 table is only chosen after detecting avx2, fma and f16c.
        return unsafe { simd_x86::f16_row(src, dst) };
    }
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = blocks::f16_to_f32([s[0], s[1]]);
    }
}

/// The scalar reference implementations (what the fast paths are tested
/// against; a faithful transcription of ggml-cpu's generic C code).
pub mod reference {
    use super::GgmlType;

    /// Same contract as [`super::vec_dot`], always using the scalar kernels.
    pub fn vec_dot(ty: GgmlType, n: usize, w_row: &[u8], x_q: &[u8]) -> f32 {
        super::dot_with(&super::SCALAR, ty, n, w_row, x_q)
    }
}

/// Which implementation `vec_dot` uses on this machine: "avx2", "neon" or
/// "scalar" (for logs/diagnostics).
pub fn simd_level() -> &'static str {
    kernels().name
}

#[cfg(test)]
mod tests {
    use super::test_util::{random_row, Rng};
    use super::*;

    const WEIGHT_TYPES: [GgmlType; 11] = {
        use GgmlType::*;
        [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
        ]
    };

    /// The dispatched (SIMD) kernels against the scalar reference on random
    /// rows of many lengths, including odd block counts. The two differ only
    /// in the order f32 partial sums are added, so the bound is relative to
    /// Σ|w·x| (the scale rounding errors are proportional to).
    #[test]
    fn fast_paths_match_reference() {
        let tables = fast_tables();
        eprintln!(
            "checking {:?} against the reference",
            tables.iter().map(|k| k.name).collect::<Vec<_>>()
        );
        for k in tables {
            check_table_against_reference(k);
        }
    }

    /// Every fast table this CPU can run (so a machine with dotprod tests plain NEON too).
    fn fast_tables() -> Vec<&'static Kernels> {
        #[allow(unused_mut)]
        let mut v: Vec<&'static Kernels> = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::is_x86_feature_detected!("f16c")
        {
            v.push(&simd_x86::AVX2);
        }
        #[cfg(target_arch = "aarch64")]
        {
            v.push(&simd_arm::NEON);
            if std::arch::is_aarch64_feature_detected!("dotprod") {
                v.push(&simd_arm::NEON_DOTPROD);
            }
        }
        v
    }

    fn check_table_against_reference(k: &Kernels) {
        let mut rng = Rng::new(0x5eed);
        for ty in WEIGHT_TYPES {
            let vt = ty.vec_dot_type();
            let unit = ty.block_elems().max(vt.block_elems()).max(32);
            for blocks in [1usize, 2, 3, 7, 9, 18, 33] {
                for _rep in 0..4 {
                    let n = blocks * unit;
                    let w = random_row(&mut rng, ty, n);
                    let act: Vec<f32> = (0..n).map(|_| rng.f32() * 4.0).collect();
                    let mut xq = vec![0u8; vt.row_bytes(n as u64).unwrap() as usize];
                    quantize_row(vt, &act, &mut xq);

                    let mut wf = vec![0f32; n];
                    let mut xf = vec![0f32; n];
                    dequantize_row(ty, &w, &mut wf).unwrap();
                    dequantize_row(vt, &xq, &mut xf).unwrap();
                    let scale: f64 = wf
                        .iter()
                        .zip(&xf)
                        .map(|(&a, &b)| (a as f64 * b as f64).abs())
                        .sum();

                    let fast = dot_with(k, ty, n, &w, &xq);
                    let slow = reference::vec_dot(ty, n, &w, &xq);
                    let err = (fast as f64 - slow as f64).abs();
                    assert!(
                        err <= 1e-5 * scale + 1e-6 || err <= 1e-5 * (slow as f64).abs(),
                        "{ty} [{}] n={n}: fast {fast} ref {slow} (Σ|wx| {scale})",
                        k.name
                    );
                }
            }
        }
    }

    #[test]
    fn f16_rows_convert_exactly() {
        let mut rng = Rng::new(7);
        for n in [0usize, 1, 7, 8, 9, 64, 67] {
            let mut src = vec![0u8; 2 * n];
            rng.fill(&mut src);
            let mut got = vec![0f32; n];
            f16_row_to_f32(&src, &mut got);
            for (i, g) in got.iter().enumerate() {
                let want = blocks::f16_to_f32([src[2 * i], src[2 * i + 1]]);
                assert!(g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()));
            }
        }
    }

    #[test]
    fn zero_length_and_zero_rows() {
        for ty in WEIGHT_TYPES {
            assert_eq!(vec_dot(ty, 0, &[], &[]), 0.0);
            let vt = ty.vec_dot_type();
            let n = ty.block_elems().max(vt.block_elems()).max(32);
            let w = vec![0u8; row_len(ty, n).unwrap()];
            let x = vec![0u8; row_len(vt, n).unwrap()];
            assert_eq!(vec_dot(ty, n, &w, &x), 0.0, "{ty}");
        }
    }

    #[test]
    fn simd_level_is_stable_and_named() {
        let l = simd_level();
        assert!(
            ["avx2", "neon", "neon-dotprod", "scalar"].contains(&l),
            "{l}"
        );
        assert_eq!(l, simd_level());
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx2")
            && std::is_x86_feature_detected!("fma")
            && std::env::var_os("EDGELM_SIMD").is_none()
        {
            assert_eq!(l, "avx2");
        }
        #[cfg(target_arch = "aarch64")]
        if std::env::var_os("EDGELM_SIMD").is_none() {
            let dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
            assert_eq!(l, if dotprod { "neon-dotprod" } else { "neon" });
        }
    }

    #[test]
    fn vec_dot_types() {
        use GgmlType::*;
        assert_eq!(Q4_0.vec_dot_type(), Q8_0);
        assert_eq!(Q5_0.vec_dot_type(), Q8_0);
        assert_eq!(Q8_0.vec_dot_type(), Q8_0);
        assert_eq!(Q4_1.vec_dot_type(), Q8_1);
        assert_eq!(Q5_1.vec_dot_type(), Q8_1);
        for t in [Q4_K, Q5_K, Q6_K] {
            assert_eq!(t.vec_dot_type(), Q8_K);
        }
        assert_eq!(F16.vec_dot_type(), F16);
        assert_eq!(BF16.vec_dot_type(), BF16);
        assert_eq!(F32.vec_dot_type(), F32);
        for t in WEIGHT_TYPES {
            assert!(is_supported(t));
        }
        assert!(!is_supported(Q2_K) && !is_supported(Q8_K) && !is_supported(I8));
    }

    #[test]
    #[should_panic(expected = "not supported")]
    fn vec_dot_panics_on_unsupported() {
        vec_dot(GgmlType::Q2_K, 256, &[0; 84], &[0; 292]);
    }

    #[test]
    #[should_panic]
    fn vec_dot_panics_on_short_rows() {
        // 64 values of Q4_0 need 36 bytes: the slice bound check catches it
        // (in release builds too, where the debug_asserts are gone).
        vec_dot(GgmlType::Q4_0, 64, &[0; 18], &[0; 68]);
    }

    #[test]
    fn errors_display() {
        let e = QuantError::BadLength {
            ty: GgmlType::Q4_0,
            elems: 64,
            bytes: 18,
        };
        assert_eq!(e.to_string(), "a Q4_0 row of 64 values is 36 bytes, got 18");
        let e = QuantError::BadLength {
            ty: GgmlType::Q4_K,
            elems: 100,
            bytes: 18,
        };
        assert!(e.to_string().contains("not a whole number"));
        assert_eq!(
            QuantError::Unsupported(GgmlType::I8).to_string(),
            "unsupported tensor type I8"
        );
        // anyhow's `.context()` in the engine needs these bounds.
        fn is_anyhow_compatible<E: std::error::Error + Send + Sync + 'static>(_: &E) {}
        is_anyhow_compatible(&e);
    }
}
