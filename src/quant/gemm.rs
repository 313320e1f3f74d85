//! Matrix-multiply panels: `rows` weight rows × `toks` activation rows in one call, so the
//! fast paths can tile (unpack a weight block once for several tokens, run several FMA
//! chains side by side). Every output is bit-identical to the per-pair dot of its order
//! ([`super::vec_dot`] for `Order::Lanes`, `order::dot` for the peer's other orders): tiling
//! changes the speed, never the numbers.

use super::order::Order;
use super::packed::{self, Out, PackedFn, GROUP};
use super::{vec_dot, GgmlType};

#[cfg(target_arch = "aarch64")]
use super::arm;
#[cfg(target_arch = "x86_64")]
use super::x86::{self, panel::PanelFn};

/// Which panel kernels this CPU runs: "avx512-vnni", "avx2-vnni" (its EVEX stand-in
/// "avx2-vnni-evex"), "avx2", "avx2-unpacked", "avx512-vnni-256", on aarch64 "neon-i8mm",
/// "neon-dotprod" or "neon" (packed kernels, per-pair dots for what is not packed), or
/// "none" (per-pair dots).
pub fn gemm_level() -> &'static str {
    panels().name
}

struct Panels {
    name: &'static str,
    #[cfg(target_arch = "x86_64")]
    q4_1: Option<PanelFn>,
    #[cfg(target_arch = "x86_64")]
    q8_0: Option<PanelFn>,
    #[cfg(target_arch = "x86_64")]
    q5_0: Option<PanelFn>,
    #[cfg(target_arch = "x86_64")]
    mxfp4: Option<PanelFn>,
    /// The peer-order kernels (`order`'s repacked and tiled dots), all types in one.
    #[cfg(target_arch = "x86_64")]
    order: Option<OrderFn>,
    /// The packed kernels by type and order, where this level computes from packed matrices.
    packed: Option<PackedKernels>,
}

/// A level's packed kernel for a type in an order, where it has one.
type PackedKernels = fn(GgmlType, Order) -> Option<PackedFn>;

/// `x86::order::panel`'s signature: `gemm`'s, one `order` kernel for every type.
#[cfg(target_arch = "x86_64")]
type OrderFn = unsafe fn(GgmlType, Order, usize, &[u8], usize, &[u8], usize, &mut [f32]);

const NONE: Panels = Panels {
    name: "none",
    #[cfg(target_arch = "x86_64")]
    q4_1: None,
    #[cfg(target_arch = "x86_64")]
    q8_0: None,
    #[cfg(target_arch = "x86_64")]
    q5_0: None,
    #[cfg(target_arch = "x86_64")]
    mxfp4: None,
    #[cfg(target_arch = "x86_64")]
    order: None,
    packed: None,
};

/// NEON: the packed kernels in the chain order (`vmull_s8` and pairwise adds), the per-pair
/// dots for what is not packed.
#[cfg(target_arch = "aarch64")]
const NEON: Panels = Panels {
    name: "neon",
    packed: Some(arm::packed::neon::kernel),
};

/// NEON with `sdot` (dotprod): the same kernels with the by-element `sdot`.
#[cfg(target_arch = "aarch64")]
const NEON_DOTPROD: Panels = Panels {
    name: "neon-dotprod",
    packed: Some(arm::packed::dotprod::kernel),
};

/// NEON with `smmla` (i8mm): two tokens' passes over the legacy quants with `smmla`, the
/// `sdot` kernels for the rest.
#[cfg(target_arch = "aarch64")]
const NEON_I8MM: Panels = Panels {
    name: "neon-i8mm",
    packed: Some(arm::packed::i8mm::kernel),
};

/// AVX2 on row-major weights (`EDGELM_SIMD=avx2-unpacked`, for comparison): the 4 × 2 tiles
/// and the peer-order kernels.
#[cfg(target_arch = "x86_64")]
const AVX2_UNPACKED: Panels = Panels {
    name: "avx2-unpacked",
    q4_1: Some(x86::panel::avx2::q4_1),
    q8_0: Some(x86::panel::avx2::q8_0),
    q5_0: Some(x86::panel::avx2::q5_0),
    mxfp4: Some(x86::panel::avx2::mxfp4),
    order: Some(x86::order::panel),
    packed: None,
};

/// AVX2 alone: the packed kernels in 256-bit registers with `vpdpbusd` emulated exactly
/// (faster than [`AVX2_UNPACKED`] in prefill and decode, docs/cpu-kernels.md), the AVX2
/// panels for what is not packed.
#[cfg(target_arch = "x86_64")]
const AVX2: Panels = Panels {
    name: "avx2",
    packed: Some(x86::packed_avx2::plain::kernel),
    ..AVX2_UNPACKED
};

/// AVX2 with AVX-VNNI: the packed kernels in 256-bit registers, the AVX2 panels for what is
/// not packed.
#[cfg(target_arch = "x86_64")]
const AVX2_VNNI: Panels = Panels {
    name: "avx2-vnni",
    packed: Some(x86::packed_avx2::vex::kernel),
    ..AVX2
};

/// [`AVX2_VNNI`] with the EVEX form of its `vpdpbusd`, for `EDGELM_SIMD=avx2-vnni` on CPUs
/// with AVX-512 VNNI but not AVX-VNNI: the same kernels, runnable there.
#[cfg(target_arch = "x86_64")]
const AVX2_VNNI_EVEX: Panels = Panels {
    name: "avx2-vnni-evex",
    packed: Some(x86::packed_avx2::evex::kernel),
    ..AVX2
};

/// AVX-512 VNNI in 256-bit registers only (the 512-bit panels' fallback for short groups;
/// `EDGELM_SIMD=avx512-256` selects it alone, for comparison).
#[cfg(target_arch = "x86_64")]
const VNNI_256: Panels = Panels {
    name: "avx512-vnni-256",
    q4_1: Some(x86::panel::vnni::q4_1),
    q8_0: Some(x86::panel::vnni::q8_0),
    q5_0: Some(x86::panel::vnni::q5_0),
    mxfp4: Some(x86::panel::vnni::mxfp4),
    order: Some(x86::order::panel),
    packed: None,
};

#[cfg(target_arch = "x86_64")]
const VNNI: Panels = Panels {
    name: "avx512-vnni",
    q4_1: Some(x86::panel_avx512::q4_1),
    q8_0: Some(x86::panel_avx512::q8_0),
    q5_0: Some(x86::panel_avx512::q5_0),
    mxfp4: Some(x86::panel_avx512::mxfp4),
    order: Some(x86::order::panel),
    packed: Some(avx512_packed),
};

/// The fastest panels [`crate::cpu_features::enabled`] allows (the per-pair dot elsewhere).
fn detect() -> &'static Panels {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::cpu_features::{enabled, simd_override, SimdOverride};
        let cpu = enabled();
        if cpu.avx512_vnni {
            return if simd_override() == SimdOverride::Avx512In256 {
                &VNNI_256
            } else {
                &VNNI
            };
        }
        if cpu.avx2 && cpu.avx_vnni {
            return &AVX2_VNNI;
        }
        if cpu.avx2 && simd_override() == SimdOverride::Avx2Vnni {
            use crate::cpu_features::hardware;
            // AVX-512 VNNI includes the 256-bit `vpdpbusd` (VL), the EVEX kernels' features.
            if hardware().avx512_vnni {
                return &AVX2_VNNI_EVEX;
            }
        }
        if cpu.avx2 && simd_override() == SimdOverride::Avx2Unpacked {
            return &AVX2_UNPACKED;
        }
        if cpu.avx2 {
            return &AVX2;
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        let cpu = crate::cpu_features::enabled();
        if cpu.neon_i8mm {
            return &NEON_I8MM;
        }
        if cpu.neon_dotprod {
            return &NEON_DOTPROD;
        }
        if cpu.neon {
            return &NEON;
        }
    }
    &NONE
}

fn panels() -> &'static Panels {
    static P: std::sync::OnceLock<&'static Panels> = std::sync::OnceLock::new();
    P.get_or_init(detect)
}

/// Whether this CPU computes from packed matrices (`quant::packed`): it has kernels for them
/// (AVX-512 VNNI, AVX2 with a 256-bit `vpdpbusd`, or AVX2 alone, which emulates it; not
/// `EDGELM_SIMD=avx2-unpacked`; on aarch64 NEON, with `sdot`, `smmla` or neither). Elsewhere
/// matrices stay as the file has them.
pub fn packs() -> bool {
    panels().packed.is_some()
}

/// Whether this CPU computes matrices of `ty` from packed copies: [`packs`], with kernels for
/// `ty` (a level may cover fewer types than the layout does).
pub fn packs_type(ty: GgmlType) -> bool {
    panels()
        .packed
        .is_some_and(|kernels| kernels(ty, Order::Chain).is_some())
}

/// The AVX-512 VNNI packed kernels.
#[cfg(target_arch = "x86_64")]
fn avx512_packed(ty: GgmlType, order: Order) -> Option<PackedFn> {
    use GgmlType::*;
    Some(match (ty, order) {
        (Q8_0, Order::Lanes) => x86::packed_avx512::q8_0,
        (Q4_0, Order::Lanes) => x86::packed_avx512::q4_0,
        (Q4_0, Order::Repacked | Order::Chain) => x86::packed_avx512::q4_0_chain,
        (Q4_1, Order::Chain) => x86::packed_avx512::q4_1_chain,
        (Q5_0, Order::Chain) => x86::packed_avx512::q5_0_chain,
        (Q8_0, Order::Chain) => x86::packed_avx512::q8_0_chain,
        (Q4_K, Order::Chain) => x86::packed_k_avx512::q4_k_chain,
        (Q6_K, Order::Chain) => x86::packed_k_avx512::q6_k_tiled,
        (Q4_1, Order::Lanes) => x86::packed_avx512::q4_1,
        (Q5_0, Order::Lanes) => x86::packed_avx512::q5_0,
        (Q4_K, Order::Repacked) => x86::packed_k_avx512::q4_k_repacked,
        (Q6_K, Order::Lanes) => x86::packed_k_avx512::q6_k_lanes,
        (Q6_K, Order::Tiled) => x86::packed_k_avx512::q6_k_tiled,
        _ => return None,
    })
}

/// [`gemm`] over `groups` groups of a packed matrix `w` (`quant::packed`): every row of them,
/// the last group's padding rows included, against every token, into
/// `out[t * groups * GROUP + r]`, each value exactly what [`gemm`] gives for the row unpacked.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed(
    ty: GgmlType,
    order: Order,
    n: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: &mut [f32],
) {
    let stride = groups * GROUP;
    assert!(out.len() >= toks * stride);
    // SAFETY: `out` holds every token's rows and is borrowed exclusively.
    unsafe { gemm_packed_to(ty, order, n, w, groups, x, toks, out.as_mut_ptr(), stride) }
}

/// [`gemm_packed`] into row `r` of token `t` at `out + t * stride + r`: straight into a
/// larger matrix's rows, without a copy.
///
/// # Safety
/// Every such float (`r < groups * GROUP`, `t < toks`) must be writable and not accessed by
/// anyone else during the call.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_packed_to(
    ty: GgmlType,
    order: Order,
    n: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: *mut f32,
    stride: usize,
) {
    // SAFETY: the caller's promise.
    unsafe { gemm_packed_with(panels(), ty, order, n, w, groups, x, toks, out, stride) }
}

/// [`gemm_packed_to`] with `p`'s packed kernels.
///
/// # Safety
/// As for [`gemm_packed_to`], and the CPU has the features of `p`'s kernels.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_packed_with(
    p: &Panels,
    ty: GgmlType,
    order: Order,
    n: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: *mut f32,
    stride: usize,
) {
    assert!(w.len() >= groups * packed::group_bytes(ty, n) && stride >= groups * GROUP);
    if let Some(f) = p.packed.and_then(|kernels| kernels(ty, order)) {
        // SAFETY: `p` is `detect`'s choice, made where the CPU has the features its kernels
        // are compiled for, or a test's, which checked; the kernels check the other lengths;
        // `out` is the caller's promise.
        unsafe {
            f(
                n / ty.block_elems(),
                w,
                groups,
                x,
                toks,
                Out { ptr: out, stride },
            )
        };
        return;
    }
    // No kernel here (matrices are packed only where there are: this serves the tests on
    // other CPUs): the rows back in ggml's layout for the row-major panels.
    let rows = groups * GROUP;
    UNPACKED.with_borrow_mut(|(buf, res)| {
        let w_rows = packed::rows_of_groups(ty, n, w, 0..groups, buf);
        res.resize(rows * toks, 0.0);
        gemm(ty, order, n, w_rows, rows, x, toks, res);
        for t in 0..toks {
            // SAFETY: the caller's promise for token t's rows.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.add(t * stride), rows) };
            dst.copy_from_slice(&res[t * rows..(t + 1) * rows]);
        }
    })
}

thread_local! {
    /// Per-thread scratch for rows unpacked from packed groups and their products (reused,
    /// never shrunk).
    static UNPACKED: std::cell::RefCell<(Vec<u8>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// `out[t * rows + r] = vec_dot(ty, n, w_r, x_t)` for every weight row `r < rows` (each
/// `ty.row_bytes(n)` long in `w`) and activation row `t < toks` (each
/// `ty.vec_dot_type().row_bytes(n)` long in `x`, from [`super::quantize_row`]).
///
/// # Panics
/// If `ty` has no dot product, `n` is not whole blocks or a buffer is too short.
///
/// `order` is how the peer accumulates this product (`order::order`): the repacked and tiled
/// orders have their own kernels (`x86::order`'s with AVX2, else `order::dot` per pair).
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    ty: GgmlType,
    order: Order,
    n: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    toks: usize,
    out: &mut [f32],
) {
    if order != Order::Lanes && super::order::has(ty, order) {
        // The peer-order panels know the peer's orders only; the chain order on row-major
        // weights (only `gemm_packed`'s fallback asks for it) takes `dot` below.
        #[cfg(target_arch = "x86_64")]
        if let Some(f) = panels().order.filter(|_| order != Order::Chain) {
            // SAFETY: as for the panels below (avx2, fma and f16c were detected); the kernels
            // index the slices with bounds checks.
            unsafe { f(ty, order, n, w, rows, x, toks, out) };
            return;
        }
        let w_row = ty.row_bytes(n as u64).expect("row fits") as usize;
        let x_row = ty.vec_dot_type().row_bytes(n as u64).expect("row fits") as usize;
        for t in 0..toks {
            let xt = &x[t * x_row..(t + 1) * x_row];
            for r in 0..rows {
                out[t * rows + r] =
                    super::order::dot(ty, order, t, toks, &w[r * w_row..(r + 1) * w_row], xt);
            }
        }
        return;
    }
    gemm_with(panels(), ty, n, w, rows, x, toks, out)
}

#[allow(clippy::too_many_arguments)]
fn gemm_with(
    p: &Panels,
    ty: GgmlType,
    n: usize,
    w: &[u8],
    rows: usize,
    x: &[u8],
    toks: usize,
    out: &mut [f32],
) {
    let w_row = ty.row_bytes(n as u64).expect("row fits") as usize;
    let x_row = ty.vec_dot_type().row_bytes(n as u64).expect("row fits") as usize;
    assert!(w.len() >= rows * w_row && x.len() >= toks * x_row && out.len() >= rows * toks);
    #[cfg(target_arch = "x86_64")]
    {
        let panel = match ty {
            GgmlType::Q4_1 => p.q4_1,
            GgmlType::Q8_0 => p.q8_0,
            GgmlType::Q5_0 => p.q5_0,
            GgmlType::MXFP4 => p.mxfp4,
            _ => None,
        };
        if let Some(f) = panel {
            assert!(
                n.is_multiple_of(ty.block_elems()),
                "{ty}: n={n} is not whole blocks"
            );
            let nb = n / ty.block_elems();
            // SAFETY: `detect` hands out a panel table only after checking the CPU has the
            // features its kernels are compiled for; the kernels check the slice lengths.
            unsafe { f(nb, &w[..rows * w_row], rows, &x[..toks * x_row], toks, out) };
            return;
        }
    }
    let _ = p;
    for t in 0..toks {
        let xt = &x[t * x_row..(t + 1) * x_row];
        for r in 0..rows {
            out[t * rows + r] = vec_dot(ty, n, &w[r * w_row..(r + 1) * w_row], xt);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row;
    use crate::quant::test_util::{random_row, Rng};

    /// Every tile shape and ragged edge, against the per-pair dot, bit for bit.
    fn check_panels(p: &Panels) {
        let mut rng = Rng::new(0x5eed_0001);
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::MXFP4,
            GgmlType::Q4_0,
            GgmlType::Q6_K,
        ] {
            let be = ty.block_elems().max(ty.vec_dot_type().block_elems());
            for (rows, toks, blocks) in [
                (1, 1, 1),
                (7, 1, 3),
                (8, 1, 18),
                (4, 4, 3),
                (5, 3, 2),
                (9, 7, 5),
                (3, 9, 1),
                (8, 2, 18),
                (4, 8, 3),
                (5, 8, 1),
                (9, 17, 5),
                (64, 16, 18),
                (3, 23, 48),
            ] {
                let n = be * blocks;
                let w: Vec<u8> = (0..rows)
                    .flat_map(|_| random_row(&mut rng, ty, n))
                    .collect();
                let vt = ty.vec_dot_type();
                let x_row = vt.row_bytes(n as u64).unwrap() as usize;
                let mut x = vec![0u8; toks * x_row];
                for t in 0..toks {
                    let v: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
                    quantize_row(vt, &v, &mut x[t * x_row..(t + 1) * x_row]);
                }
                let mut got = vec![f32::NAN; rows * toks];
                gemm_with(p, ty, n, &w, rows, &x, toks, &mut got);
                let w_row = w.len() / rows;
                for t in 0..toks {
                    for r in 0..rows {
                        let want = vec_dot(
                            ty,
                            n,
                            &w[r * w_row..(r + 1) * w_row],
                            &x[t * x_row..(t + 1) * x_row],
                        );
                        assert_eq!(
                            got[t * rows + r].to_bits(),
                            want.to_bits(),
                            "{} {ty} rows={rows} toks={toks} n={n} at ({r},{t}): {} vs {want}",
                            p.name,
                            got[t * rows + r]
                        );
                    }
                }
            }
        }
    }

    /// `p` has a packed kernel for `ty` in `order` wherever a matrix of `height` rows would be
    /// packed and computed in that order, when `ty` is among the types it `covers` (aarch64
    /// computes packed matrices in the chain order alone: `order::prompt_order`).
    fn require_kernel(p: &Panels, covers: &[GgmlType], ty: GgmlType, order: Order, height: usize) {
        let used = cfg!(target_arch = "x86_64") || order == Order::Chain;
        assert!(
            !(used && covers.contains(&ty) && packed::packable(ty, height))
                || p.packed.and_then(|k| k(ty, order)).is_some(),
            "{}: no packed kernel for {ty} in {order:?}",
            p.name
        );
    }

    /// `p`'s packed kernels (the unpacking fallback where it has none) against [`gemm`] on the
    /// unpacked rows, bit for bit, for every small batch and ragged group; `covers` are the
    /// types `p` must have kernels for in every order the test asks for.
    fn check_packed(p: &Panels, covers: &[GgmlType]) {
        let mut rng = Rng::new(0x5eed_0002);
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            for (rows, blocks) in [(1, 1), (16, 3), (21, 5), (40, 2)] {
                let n = ty.block_elems() * blocks;
                let w: Vec<u8> = (0..rows)
                    .flat_map(|_| random_row(&mut rng, ty, n))
                    .collect();
                let groups = packed::groups(rows);
                let mut pw = vec![0u8; packed::packed_bytes(ty, rows, n)];
                packed::pack_groups(ty, n, &w, rows, 0..groups, &mut pw);
                let vt = ty.vec_dot_type();
                let x_row = vt.row_bytes(n as u64).unwrap() as usize;
                for toks in (1..=9).chain([12, 16, 17]) {
                    let mut x = vec![0u8; toks * x_row];
                    for t in 0..toks {
                        let v: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
                        quantize_row(vt, &v, &mut x[t * x_row..(t + 1) * x_row]);
                    }
                    // Each order with the height of a matrix the peer computes in it.
                    let orders = [
                        (crate::quant::order(ty, rows, toks), rows),
                        (crate::quant::order(ty, 8 * rows, toks), 8 * rows),
                        (Order::Chain, 8 * rows),
                    ];
                    for (order, height) in orders {
                        if order == Order::Chain && !crate::quant::order::has(ty, order) {
                            continue;
                        }
                        require_kernel(p, covers, ty, order, height);
                        let mut got = vec![f32::NAN; groups * GROUP * toks];
                        let stride = groups * GROUP;
                        // SAFETY: `got` holds every token's rows; the callers checked the CPU.
                        unsafe {
                            gemm_packed_with(
                                p,
                                ty,
                                order,
                                n,
                                &pw,
                                groups,
                                &x,
                                toks,
                                got.as_mut_ptr(),
                                stride,
                            )
                        };
                        let mut want = vec![0f32; rows * toks];
                        gemm(ty, order, n, &w, rows, &x, toks, &mut want);
                        for t in 0..toks {
                            for r in 0..rows {
                                assert_eq!(
                                    got[t * groups * GROUP + r].to_bits(),
                                    want[t * rows + r].to_bits(),
                                    "{} {ty} {order:?} rows={rows} toks={toks} n={n} at ({r},{t})",
                                    p.name
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// What `gemm_packed` computes with this CPU's kernels, and the unpacking fallback.
    #[test]
    fn packed_products_match_per_pair_dots_bit_for_bit() {
        check_packed(panels(), &[]);
        check_packed(&NONE, &[]);
    }

    const ALL_PACKED: [GgmlType; 6] = packed::TYPES;

    /// The Arm packed kernels at every level this CPU has: plain NEON always, `sdot` where
    /// the CPU has dotprod, `smmla` where it has i8mm (one aarch64 test binary runs under
    /// several emulated CPUs; scripts/test-aarch64.sh checks the lines printed here against
    /// what each CPU has).
    #[cfg(target_arch = "aarch64")]
    #[test]
    fn arm_packed_products_match_per_pair_dots_bit_for_bit() {
        check_packed(&NEON, &ALL_PACKED);
        eprintln!("packed level checked: neon");
        if crate::cpu_features::hardware().neon_dotprod {
            check_packed(&NEON_DOTPROD, &ALL_PACKED);
            eprintln!("packed level checked: neon-dotprod");
        }
        if crate::cpu_features::hardware().neon_i8mm {
            check_packed(&NEON_I8MM, &ALL_PACKED);
            eprintln!("packed level checked: neon-i8mm");
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "this CPU lacks AVX-512 VNNI")]
    fn avx512_vnni_packed_products_match_per_pair_dots_bit_for_bit() {
        assert!(
            crate::cpu_features::hardware().avx512_vnni,
            "this x86-64 CPU lacks AVX-512 VNNI: its packed kernels cannot be compared here"
        );
        check_packed(&VNNI, &ALL_PACKED);
    }

    /// The 256-bit packed kernels in their EVEX build (AVX-512 VNNI + VL), which is their VEX
    /// build's code with the other encoding of `vpdpbusd`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "this CPU lacks AVX-512 VNNI")]
    fn avx2_vnni_evex_packed_products_match_per_pair_dots_bit_for_bit() {
        assert!(
            crate::cpu_features::hardware().avx512_vnni,
            "this x86-64 CPU lacks AVX-512 VNNI: the EVEX build cannot be compared here"
        );
        check_packed(&AVX2_VNNI_EVEX, &ALL_PACKED);
    }

    /// The 256-bit packed kernels with `vpdpbusd` emulated by AVX2 alone (and, unpacking,
    /// the row-major AVX2 panels).
    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(host_avx2), ignore = "this CPU lacks AVX2, FMA or F16C")]
    fn avx2_packed_products_match_per_pair_dots_bit_for_bit() {
        assert!(
            crate::cpu_features::hardware().avx2,
            "this x86-64 CPU lacks AVX2, FMA or F16C: its packed kernels cannot be compared here"
        );
        check_packed(&AVX2, &ALL_PACKED);
        check_packed(&AVX2_UNPACKED, &[]);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(host_avxvnni), ignore = "this CPU lacks AVX-VNNI")]
    fn avx2_vnni_packed_products_match_per_pair_dots_bit_for_bit() {
        assert!(
            crate::cpu_features::hardware().avx_vnni,
            "this x86-64 CPU lacks AVX-VNNI: its packed kernels cannot be compared here"
        );
        check_packed(&AVX2_VNNI, &ALL_PACKED);
    }

    #[test]
    fn per_pair_panels_match_per_pair_dots_bit_for_bit() {
        check_panels(&NONE);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(host_avx2), ignore = "this CPU lacks AVX2, FMA or F16C")]
    fn avx2_panels_match_per_pair_dots_bit_for_bit() {
        assert!(
            crate::cpu_features::hardware().avx2,
            "this x86-64 CPU lacks AVX2, FMA or F16C: the AVX2 panels cannot be compared here"
        );
        check_panels(&AVX2_UNPACKED);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    #[cfg_attr(not(host_avx512vnni), ignore = "this CPU lacks AVX-512 VNNI")]
    fn avx512_vnni_panels_match_per_pair_dots_bit_for_bit() {
        assert!(
            crate::cpu_features::hardware().avx512_vnni,
            "this x86-64 CPU lacks AVX-512 VNNI: its panels cannot be compared here"
        );
        check_panels(&VNNI_256);
        check_panels(&VNNI);
    }
}
