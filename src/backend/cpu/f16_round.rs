//! Fast f32 → nearest f16 value (kept in an f32), the rounding ggml's f16 accumulators apply
//! after every update. Bit arithmetic instead of a full conversion: this sits in the inner
//! loop of attention.

/// The f16 value nearest to `x` (ties to even), returned as f32; ±inf beyond f16's range.
#[inline(always)]
pub fn round_to_f16(x: f32) -> f32 {
    let bits = x.to_bits();
    let abs = bits & 0x7FFF_FFFF;
    if abs >= 0x4780_0000 {
        // ≥ 65536 (or inf/nan): beyond f16's largest finite value once rounded.
        if abs > 0x7F80_0000 {
            return x; // NaN stays NaN
        }
        // 65520 and above round to infinity; below that, the normal path is still right.
        return f32::from_bits((bits & 0x8000_0000) | 0x7F80_0000);
    }
    if abs < 0x3880_0000 {
        // |x| < 2^-14: f16 subnormals are multiples of 2^-24.
        const SCALE: f32 = 16_777_216.0; // 2^24
        return (x * SCALE).round_ties_even() / SCALE;
    }
    // Normal range: keep 10 of the 23 mantissa bits, rounding the dropped 13 to nearest even.
    let lsb = (bits >> 13) & 1;
    let rounded = (bits + 0x0FFF + lsb) & !0x1FFF;
    let y = f32::from_bits(rounded);
    if y.abs() > 65504.0 {
        return f32::from_bits((bits & 0x8000_0000) | 0x7F80_0000);
    }
    y
}

/// `acc[i] = round_to_f16(acc[i] * s)` for the whole row.
#[inline]
pub fn scale_round(acc: &mut [f32], s: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        return unsafe { x86::fma_round(acc, None, s) };
    }
    acc.iter_mut().for_each(|a| *a = round_to_f16(*a * s));
}

/// `acc[i] = round_to_f16(v[i]·vs + acc[i])` (one fused multiply-add, then the rounding).
#[inline]
pub fn fma_round(acc: &mut [f32], v: &[f32], vs: f32) {
    assert_eq!(acc.len(), v.len());
    #[cfg(target_arch = "x86_64")]
    if crate::cpu_features::avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
        return unsafe { x86::fma_round(acc, Some(v), vs) };
    }
    for (a, &x) in acc.iter_mut().zip(v) {
        *a = round_to_f16(x.mul_add(vs, *a));
    }
}

/// F16C does the rounding in two instructions per 8 values: `vcvtps2ph` (round to nearest
/// even, overflow to infinity, subnormals kept) and back.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::round_to_f16;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn fma_round(acc: &mut [f32], v: Option<&[f32]>, s: f32) {
        let n = acc.len();
        let main = n - n % 8;
        let sv = _mm256_set1_ps(s);
        for i in (0..main).step_by(8) {
            // SAFETY: i + 8 <= main <= acc.len() (and v.len() == acc.len()).
            unsafe {
                let pa = acc.as_mut_ptr().add(i);
                let a = _mm256_loadu_ps(pa);
                let r = match v {
                    Some(v) => _mm256_fmadd_ps(_mm256_loadu_ps(v.as_ptr().add(i)), sv, a),
                    None => _mm256_mul_ps(a, sv),
                };
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(r);
                _mm256_storeu_ps(pa, _mm256_cvtph_ps(h));
            }
        }
        for i in main..n {
            acc[i] = round_to_f16(match v {
                Some(v) => v[i].mul_add(s, acc[i]),
                None => acc[i] * s,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn row_forms_agree_with_the_scalar_rounding() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 14) as f32 - 512.0
        };
        for n in [1, 7, 8, 13, 64, 67] {
            let acc: Vec<f32> = (0..n).map(|_| next()).collect();
            let v: Vec<f32> = (0..n).map(|_| next()).collect();
            for s in [0.37f32, 1e-6, 300.0, 1e4] {
                let mut a = acc.clone();
                fma_round(&mut a, &v, s);
                let mut b = acc.clone();
                scale_round(&mut b, s);
                for i in 0..n {
                    assert_eq!(
                        a[i].to_bits(),
                        round_to_f16(v[i].mul_add(s, acc[i])).to_bits()
                    );
                    assert_eq!(b[i].to_bits(), round_to_f16(acc[i] * s).to_bits());
                }
            }
        }
    }

    #[test]
    fn agrees_with_a_full_conversion() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let check = |x: f32| {
            let want = f16::from_f32(x).to_f32();
            let got = round_to_f16(x);
            assert!(
                got == want || (got.is_nan() && want.is_nan()),
                "{x:e}: {got:e} vs {want:e}"
            );
        };
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let x = f32::from_bits(state as u32);
            check(x);
            // Values in the interesting range too, not just arbitrary bit patterns.
            check((state >> 40) as f32 / (1u64 << 20) as f32 - 8.0);
        }
        for x in [
            0.0,
            -0.0,
            65504.0,
            65519.0,
            65520.0,
            6.1e-5,
            5.96e-8,
            2.98e-8,
            1e-9,
            1.0 + 1.0 / 2048.0,
        ] {
            check(x);
            check(-x);
        }
    }
}
