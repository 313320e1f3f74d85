//! Test helpers: a tiny deterministic PRNG, random (but sane) weight rows,
//! and hex decoding for the generated oracle vectors.

use super::blocks::*;
use super::GgmlType;

/// xorshift64* — deterministic, dependency-free, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * (self.f32() * 0.5 + 0.5)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.u64() as u8;
        }
    }
}

/// A random weight row of `n` values of `ty`: random quant bits, with the
/// f16 scales set to small finite values (so no inf/NaN) of either sign
/// where ggml allows a sign.
pub fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    use GgmlType::*;
    let bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
    let mut out = vec![0u8; bytes];
    match ty {
        F32 => {
            for c in out.chunks_exact_mut(4) {
                c.copy_from_slice(&rng.f32().to_le_bytes());
            }
            return out;
        }
        F16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f32_to_f16(rng.f32()));
            }
            return out;
        }
        BF16 => {
            for c in out.chunks_exact_mut(2) {
                c.copy_from_slice(&f32_to_bf16(rng.f32()));
            }
            return out;
        }
        _ => {}
    }
    rng.fill(&mut out);
    let d = |rng: &mut Rng| {
        f32_to_f16(rng.range(0.001, 0.05) * if rng.u64() & 1 == 0 { 1.0 } else { -1.0 })
    };
    match ty {
        Q4_0 => cast_mut::<BlockQ4_0>(&mut out)
            .iter_mut()
            .for_each(|b| b.d = d(rng)),
        Q4_1 => cast_mut::<BlockQ4_1>(&mut out).iter_mut().for_each(|b| {
            b.d = d(rng);
            b.m = d(rng);
        }),
        Q5_0 => cast_mut::<BlockQ5_0>(&mut out)
            .iter_mut()
            .for_each(|b| b.d = d(rng)),
        Q5_1 => cast_mut::<BlockQ5_1>(&mut out).iter_mut().for_each(|b| {
            b.d = d(rng);
            b.m = d(rng);
        }),
        Q8_0 => cast_mut::<BlockQ8_0>(&mut out)
            .iter_mut()
            .for_each(|b| b.d = d(rng)),
        Q4_K => cast_mut::<BlockQ4K>(&mut out).iter_mut().for_each(|b| {
            b.d = d(rng);
            b.dmin = d(rng);
        }),
        Q5_K => cast_mut::<BlockQ5K>(&mut out).iter_mut().for_each(|b| {
            b.d = d(rng);
            b.dmin = d(rng);
        }),
        Q6_K => cast_mut::<BlockQ6K>(&mut out)
            .iter_mut()
            .for_each(|b| b.d = d(rng)),
        // Scales of 2^-10 to 2^-2 (the exponent of the halved table).
        MXFP4 => cast_mut::<BlockMxfp4>(&mut out)
            .iter_mut()
            .for_each(|b| b.e = 118 + (rng.u64() % 9) as u8),
        _ => panic!("random_row: {ty} not handled"),
    }
    out
}

pub fn from_hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2));
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// f32s written as 8-hex-digit bit patterns (`{:08x}` of `to_bits`).
pub fn hex_f32s(s: &str) -> Vec<f32> {
    assert!(s.len().is_multiple_of(8));
    (0..s.len())
        .step_by(8)
        .map(|i| f32::from_bits(u32::from_str_radix(&s[i..i + 8], 16).unwrap()))
        .collect()
}
