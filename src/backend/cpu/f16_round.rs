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

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

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
