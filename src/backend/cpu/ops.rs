//! Element-wise and row-wise ops of a Llama block, written to match ggml's CPU numerics.

use crate::model::RopeLayout;

/// `out = x / rms(x) * w` for each row of `x`, as ggml computes it: each square in f32,
/// summed in f64, the mean rounded to f32, then `x · scale` and `· w` as two roundings.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let n = w.len();
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let mut sum = 0.0f64;
        for &v in xr {
            sum += (v * v) as f64;
        }
        let mean = (sum / n as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// Precomputed RoPE rotation angles for one position, in ggml's order of operations
/// (theta multiplied by theta_scale pair by pair, in f32) so that we match its rounding.
pub fn rope_cos_sin(
    pos: usize,
    n_rot: usize,
    base: f32,
    freq_factors: Option<&[f32]>,
    cs: &mut [(f32, f32)],
) {
    let theta_scale = base.powf(-2.0 / n_rot as f32);
    let mut theta = pos as f32;
    for (i, c) in cs.iter_mut().enumerate().take(n_rot / 2) {
        let ff = freq_factors.map_or(1.0, |f| f[i]);
        let t = theta / ff;
        *c = (t.cos(), t.sin());
        theta *= theta_scale;
    }
}

fma_dispatch! {
/// Rotates every head of one token's Q or K vector (`x` = n_heads × head_dim).
/// `x0·c - x1·s` is evaluated as one fused multiply-add over a rounded product, the way
/// GCC contracts ggml's C expression (the peer's bits, again).
pub fn rope_apply(
    x: &mut [f32],
    head_dim: usize,
    n_rot: usize,
    layout: RopeLayout,
    cs: &[(f32, f32)],
) {
    for head in x.chunks_exact_mut(head_dim) {
        match layout {
            RopeLayout::Normal => {
                for (i, &(c, s)) in cs.iter().enumerate().take(n_rot / 2) {
                    let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                    head[2 * i] = x0.mul_add(c, -(x1 * s));
                    head[2 * i + 1] = x0.mul_add(s, x1 * c);
                }
            }
            RopeLayout::Neox => {
                let half = n_rot / 2;
                for (i, &(c, s)) in cs.iter().enumerate().take(half) {
                    let (x0, x1) = (head[i], head[i + half]);
                    head[i] = x0.mul_add(c, -(x1 * s));
                    head[i + half] = x0.mul_add(s, x1 * c);
                }
            }
        }
    }
}
}

fma_dispatch! {
/// SwiGLU: `gate = silu(gate) * up`, in place, with ggml's vectorised exp (see `expf_v`).
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + expf_v(0.0 - *g)) * u;
    }
}
}

/// ggml-cpu's vectorised `expf` (`ggml_v_expf`, after ARM's optimized routine): a degree-5
/// polynomial on the reduced argument, scaled by 2^n. Within 1.5 ulp of `expf`, but not the
/// same bits, and the peer uses it for SiLU and softmax; we evaluate the very same fused
/// operations one value at a time so our activations round exactly as the peer's do.
#[inline(always)]
pub fn expf_v(x: f32) -> f32 {
    let r = f32::from_bits(0x4B40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3FB8_AA3B), r); // log2(e)
    let n = z - r;
    // b = x - n·ln2_hi - n·ln2_lo, as two fused steps
    let b = (-n).mul_add(
        f32::from_bits(0x35BF_BE8E),                  // 0x1.7f7d1cp-20
        (-n).mul_add(f32::from_bits(0x3F31_7200), x), // 0x1.62e4p-1
    );
    let u = b * b;
    let j = f32::from_bits(0x3C07_2010) // 0x1.0e4020p-7
        .mul_add(b, f32::from_bits(0x3D2B_9F17)) // 0x1.573e2ep-5
        .mul_add(
            u,
            f32::from_bits(0x3E2A_AF33).mul_add(b, f32::from_bits(0x3EFF_FEDB)), // 0x1.555e66p-3, 0x1.fffdb6p-2
        )
        .mul_add(u, f32::from_bits(0x3F7F_FFF6).mul_add(b, 1.0)); // 0x1.ffffecp-1
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    scalef(j, n)
}

/// `j · 2^n` for integral `n` (AVX-512's `scalef`), exact unless it over/underflows.
#[inline(always)]
fn scalef(j: f32, n: f32) -> f32 {
    let n = n as i32;
    // Split the exponent so neither factor overflows on its own.
    let half = n / 2;
    j * pow2(half) * pow2(n - half)
}

#[inline(always)]
fn pow2(e: i32) -> f32 {
    if e < -126 {
        // Subnormal powers of two.
        return f32::from_bits(1u32 << (e + 149).clamp(0, 22));
    }
    f32::from_bits(((e.clamp(-126, 127) + 127) as u32) << 23)
}

/// Width of the Walsh-Hadamard rotation applied to K, V and Q when KV pages are quantized.
pub const HADAMARD_DIM: usize = 64;

/// Rotates every 64-value chunk of `x` by the orthonormal Walsh-Hadamard matrix (a fast
/// transform, scaled by 1/8). The matrix is its own inverse and preserves dot products, so
/// rotating Q and K leaves Q·K unchanged, and rotating V then the attention output leaves
/// the output unchanged; what it changes is that outlier channels are spread over the whole
/// chunk before K and V are quantized into pages (llama.cpp does the same for its quantized
/// caches), which is what keeps q4_0 pages usable.
pub fn hadamard_64(x: &mut [f32]) {
    for chunk in x.chunks_exact_mut(HADAMARD_DIM) {
        let mut h = 1;
        while h < HADAMARD_DIM {
            for i in (0..HADAMARD_DIM).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (chunk[j], chunk[j + h]);
                    chunk[j] = a + b;
                    chunk[j + h] = a - b;
                }
            }
            h *= 2;
        }
        for v in chunk.iter_mut() {
            *v *= 0.125; // 1/sqrt(64)
        }
    }
}

pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    for (a, &b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds a bias vector to every row.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rmsnorm_unit_rows() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0f32; 4];
        rmsnorm(&x, &[1.0; 4], 0.0, &mut out);
        // rms = sqrt(25/4) = 2.5
        assert!((out[0] - 1.2).abs() < 1e-6 && (out[1] - 1.6).abs() < 1e-6);
    }

    #[test]
    fn expf_v_is_close_to_expf() {
        for i in -2000..2000 {
            let x = i as f32 * 0.0437;
            let (a, b) = (expf_v(x), x.exp());
            assert!(((a - b) / b).abs() < 4e-7, "{x}: {a} vs {b}");
        }
        assert_eq!(expf_v(0.0), 1.0);
        assert_eq!(expf_v(-200.0), 0.0);
        assert_eq!(expf_v(200.0), f32::INFINITY);
    }

    #[test]
    fn hadamard_is_orthonormal_and_its_own_inverse() {
        let x: Vec<f32> = (0..128)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.1)
            .collect();
        let y: Vec<f32> = (0..128)
            .map(|i| ((i * 11 % 7) as f32 - 3.0) * 0.5)
            .collect();
        let (mut hx, mut hy) = (x.clone(), y.clone());
        hadamard_64(&mut hx);
        hadamard_64(&mut hy);
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        assert!((dot(&x, &y) - dot(&hx, &hy)).abs() < 1e-3);
        hadamard_64(&mut hx);
        for (a, b) in x.iter().zip(&hx) {
            assert!((a - b).abs() < 1e-5);
        }
        // An outlier is spread evenly over its chunk.
        let mut spike = vec![0f32; 64];
        spike[5] = 8.0;
        hadamard_64(&mut spike);
        assert!(spike.iter().all(|v| v.abs() == 1.0));
    }

    #[test]
    fn rope_position_zero_is_identity_and_norm_preserving() {
        let mut cs = vec![(0f32, 0f32); 4];
        rope_cos_sin(0, 8, 10_000.0, None, &mut cs);
        let orig: Vec<f32> = (0..8).map(|i| i as f32 - 3.5).collect();
        for layout in [RopeLayout::Normal, RopeLayout::Neox] {
            let mut x = orig.clone();
            rope_apply(&mut x, 8, 8, layout, &cs);
            assert_eq!(x, orig);
        }
        rope_cos_sin(17, 8, 10_000.0, None, &mut cs);
        let mut x = orig.clone();
        rope_apply(&mut x, 8, 8, RopeLayout::Neox, &cs);
        let n = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>();
        assert!((n(&x) - n(&orig)).abs() < 1e-3);
        assert_ne!(x, orig);
    }
}
