//! The dot products that score a query against K rows: ggml's f16 order (what the peer's
//! per-row path computes on f16 pages) and a plain f32 one (quantized pages), and GCC's
//! 16-lane reduction order both the f16 dot and the tiled softmax's sums follow.

/// GCC's `_mm512_reduce_add_ps` order: halves, quarters, then pairs.
#[inline(always)]
pub(super) fn reduce_add_16(v: &[f32]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|l| v[l + 8] + v[l]);
    let t4: [f32; 4] = std::array::from_fn(|l| t8[l + 4] + t8[l]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// Dot product of two f16-valued rows in ggml's AVX-512 order: four accumulators of 16
/// lanes fed 64 values at a time, folded pairwise, then the lanes reduced as GCC's
/// `_mm512_reduce_add_ps` does; a tail beyond whole 64s is added in f64.
#[inline(always)]
pub(super) fn dot_f16_ggml(x: &[f32], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: the CPU has AVX2 and FMA.
        return unsafe { dot_f16_ggml_avx2(x, y) };
    }
    dot_f16_ggml_scalar(x, y)
}

/// The portable form of [`dot_f16_ggml`], written lane by lane.
fn dot_f16_ggml_scalar(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len();
    let main = n - n % 64;
    let mut acc = [[0f32; 16]; 4];
    for (xc, yc) in x[..main].chunks_exact(64).zip(y[..main].chunks_exact(64)) {
        for (j, a) in acc.iter_mut().enumerate() {
            for (l, lane) in a.iter_mut().enumerate() {
                *lane = xc[j * 16 + l].mul_add(yc[j * 16 + l], *lane);
            }
        }
    }
    let v: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    let head = if main > 0 {
        reduce_add_16(&v) as f64
    } else {
        0.0
    };
    dot_tail(head, &x[main..], &y[main..])
}

/// Adds the products past the whole 64s in f64, as ggml does.
#[inline(always)]
fn dot_tail(mut sum: f64, x: &[f32], y: &[f32]) -> f32 {
    for (&a, &b) in x.iter().zip(y) {
        sum += (a * b) as f64;
    }
    sum as f32
}

/// [`dot_f16_ggml`] in AVX2: each 16-lane accumulator is two 8-lane registers, so every lane
/// sees the same FMA chain and the reduction the same additions as the scalar form. (LLVM
/// does not vectorise the scalar form: it unrolls the 16 lanes into scalar FMAs.)
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f16_ggml_avx2(x: &[f32], y: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = x.len().min(y.len());
    let main = n - n % 64;
    let (xp, yp) = (x.as_ptr(), y.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 8];
    let mut base = 0;
    while base < main {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: base + 8k + 8 <= main <= both lengths.
            let (xv, yv) = unsafe {
                (
                    _mm256_loadu_ps(xp.add(base + 8 * k)),
                    _mm256_loadu_ps(yp.add(base + 8 * k)),
                )
            };
            *a = _mm256_fmadd_ps(xv, yv, *a);
        }
        base += 64;
    }
    // acc[2j] holds lanes 0..8 of accumulator j, acc[2j + 1] lanes 8..16.
    let lo = _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6]));
    let hi = _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7]));
    let t8 = _mm256_add_ps(hi, lo);
    let t4 = _mm_add_ps(_mm256_extractf128_ps::<1>(t8), _mm256_castps256_ps128(t8));
    let mut l = [0f32; 4];
    // SAFETY: `l` holds four f32.
    unsafe { _mm_storeu_ps(l.as_mut_ptr(), t4) };
    let head = if main > 0 {
        ((l[0] + l[2]) + (l[1] + l[3])) as f64
    } else {
        0.0
    };
    dot_tail(head, &x[main..n], &y[main..n])
}
/// A dot product in eight independent partial sums (so it vectorises without reassociation
/// being needed).
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    for (a, b) in xc.zip(yc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn f16_dot_simd_matches_scalar_bit_for_bit() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            f16::from_f32(((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0).to_f32()
        };
        for n in [1, 7, 63, 64, 65, 100, 128, 130, 256] {
            let x: Vec<f32> = (0..n).map(|_| next()).collect();
            let y: Vec<f32> = (0..n).map(|_| next()).collect();
            let want = dot_f16_ggml_scalar(&x, &y);
            assert_eq!(dot_f16_ggml(&x, &y).to_bits(), want.to_bits(), "n = {n}");
        }
    }

    #[test]
    fn f16_dot_order_is_a_dot_product() {
        let x: Vec<f32> = (0..200).map(|i| (i % 13) as f32 * 0.25).collect();
        let y: Vec<f32> = (0..200).map(|i| 1.0 - (i % 7) as f32 * 0.125).collect();
        let want: f64 = x.iter().zip(&y).map(|(a, b)| (a * b) as f64).sum();
        assert!((dot_f16_ggml(&x, &y) as f64 - want).abs() < 1e-3);
    }
}
