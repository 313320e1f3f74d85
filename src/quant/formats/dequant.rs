//! Scalar dequantization of one row into f32, following ggml-quants.c
//! (`dequantize_row_*`) operation for operation, so results are bit-identical
//! to llama.cpp's reference (Rust never fuses `a * b + c` into an FMA).
//!
//! Not on the hot path (the engine dots quantized rows directly); used for
//! embeddings lookup, debugging and as part of the test oracle.

use crate::cpu_features::fma_dispatch;
use crate::quant::formats::blocks::*;
use crate::quant::GgmlType;

/// Dequantizes `dst.len()` values. Lengths were checked by the caller
/// (`quant::dequantize_row`); returns false for types we cannot decode.
pub(crate) fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    use GgmlType::*;
    match ty {
        F32 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        F16 => {
            // SAFETY: any bit pattern is a valid u16.
            let (pre, bits, post) = unsafe { src[..dst.len() * 2].align_to::<u16>() };
            if pre.is_empty() && post.is_empty() && cfg!(target_endian = "little") {
                // Vectorised (F16C / NEON) when the CPU has it: K/V pages decode through here.
                use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
                bits.reinterpret_cast::<half::f16>()
                    .convert_to_f32_slice(dst);
            } else {
                for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                    *d = f16_to_f32([s[0], s[1]]);
                }
            }
        }
        BF16 => {
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = bf16_to_f32([s[0], s[1]]);
            }
        }
        Q4_0 => q4_0(cast(src), dst),
        Q4_1 => q4_1(cast(src), dst),
        Q5_0 => q5_0(cast(src), dst),
        Q5_1 => q5_1(cast(src), dst),
        Q8_0 => q8_0(cast(src), dst),
        Q8_1 => q8_1(cast(src), dst),
        Q4_K => q4_k(cast(src), dst),
        Q5_K => q5_k(cast(src), dst),
        Q6_K => q6_k(cast(src), dst),
        Q8_K => q8_k(cast(src), dst),
        MXFP4 => mxfp4(cast(src), dst),
        Q2_K | Q3_K | I8 | I16 | I32 | I64 | F64 => return false,
    }
    true
}

fma_dispatch! {
// Also compiled for AVX2: quantized K/V pages decode through here on every attention read.
fn q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for j in 0..QK / 2 {
            let x0 = (b.qs[j] & 0x0F) as i32 - 8;
            let x1 = (b.qs[j] >> 4) as i32 - 8;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}
}

fn q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        let m = f16_to_f32(b.m);
        for j in 0..QK / 2 {
            let x0 = (b.qs[j] & 0x0F) as i32;
            let x1 = (b.qs[j] >> 4) as i32;
            y[j] = x0 as f32 * d + m;
            y[j + QK / 2] = x1 as f32 * d + m;
        }
    }
}

fn q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((b.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((b.qs[j] >> 4) | xh_1) as i32 - 16;
            y[j] = x0 as f32 * d;
            y[j + QK / 2] = x1 as f32 * d;
        }
    }
}

fn q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        let m = f16_to_f32(b.m);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..QK / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((b.qs[j] & 0x0F) | xh_0) as i32;
            let x1 = ((b.qs[j] >> 4) | xh_1) as i32;
            y[j] = x0 as f32 * d + m;
            y[j + QK / 2] = x1 as f32 * d + m;
        }
    }
}

fma_dispatch! {
// Also compiled for AVX2: quantized K/V pages decode through here on every attention read.
fn q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, &q) in y.iter_mut().zip(b.qs.iter()) {
            *y = q as f32 * d;
        }
    }
}
}

/// ggml has no `dequantize_row_q8_1`; this is the obvious definition
/// (`s` is redundant and ignored).
fn q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = f16_to_f32(b.d);
        for (y, &q) in y.iter_mut().zip(b.qs.iter()) {
            *y = q as f32 * d;
        }
    }
}

fn q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let min = f16_to_f32(b.dmin);
        let (sc, m) = unpack_scale_min_k4(&b.scales);
        // Each 32 bytes of qs hold two sub-blocks: low nibbles then high.
        for (j, (q, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let d1 = d * sc[2 * j] as f32;
            let m1 = min * m[2 * j] as f32;
            let d2 = d * sc[2 * j + 1] as f32;
            let m2 = min * m[2 * j + 1] as f32;
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0xF) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

fn q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        let min = f16_to_f32(b.dmin);
        let (sc, m) = unpack_scale_min_k4(&b.scales);
        let qh = &b.qh;
        // Bit 2j of qh[l] is the 5th bit of value l of sub-block 2j.
        let mut u1 = 1u8;
        let mut u2 = 2u8;
        for (j, (ql, y)) in
            b.qs.chunks_exact(32)
                .zip(y.chunks_exact_mut(64))
                .enumerate()
        {
            let d1 = d * sc[2 * j] as f32;
            let m1 = min * m[2 * j] as f32;
            let d2 = d * sc[2 * j + 1] as f32;
            let m2 = min * m[2 * j + 1] as f32;
            for l in 0..32 {
                let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
                y[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                y[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

fn q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(b.d);
        // Two halves of 128 values; each uses 64 bytes of ql, 32 of qh, 8 scales.
        for h in 0..2 {
            let ql = &b.ql[64 * h..64 * h + 64];
            let qh = &b.qh[32 * h..32 * h + 32];
            let sc = &b.scales[8 * h..8 * h + 8];
            let y = &mut y[128 * h..128 * h + 128];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                y[l] = d * sc[is] as f32 * q1 as f32;
                y[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                y[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                y[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}

/// `dequantize_row_q8_K`: plain d * q.
fn q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d();
        for (y, &q) in y.iter_mut().zip(b.qs.iter()) {
            *y = d * q as f32;
        }
    }
}

/// `dequantize_row_mxfp4`: the table value of each nibble times half the block's scale.
fn mxfp4(x: &[BlockMxfp4], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = e8m0_to_f32_half(b.e);
        for (j, &q) in b.qs.iter().enumerate() {
            y[j] = KVALUES_MXFP4[(q & 0x0F) as usize] as f32 * d;
            y[j + QK / 2] = KVALUES_MXFP4[(q >> 4) as usize] as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::quant::test_util::{from_hex, hex_f32s};
    use crate::quant::testdata::vectors::DEQUANT;
    use crate::quant::{dequantize_row, GgmlType, QuantError};

    /// Every oracle row (gguf-py's numpy dequantizers) must be reproduced
    /// bit for bit: both sides do the same f32 operations in the same order.
    #[test]
    fn matches_gguf_py_oracle_bitwise() {
        let mut seen = std::collections::HashSet::new();
        for v in DEQUANT {
            let ty = GgmlType::from_u32(v.ty).unwrap();
            seen.insert(ty);
            let raw = from_hex(v.raw);
            let want = hex_f32s(v.want);
            assert_eq!(want.len(), v.n);
            let mut got = vec![0f32; v.n];
            dequantize_row(ty, &raw, &mut got).unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{ty} elem {i}: got {g} want {w}");
            }
        }
        use GgmlType::*;
        for t in [F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K] {
            assert!(seen.contains(&t), "no oracle vectors for {t}");
        }
    }

    #[test]
    fn f32_is_a_copy_and_lengths_are_checked() {
        let v = [1.5f32, -2.0, 3.25];
        let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut out = [0f32; 3];
        dequantize_row(GgmlType::F32, &raw, &mut out).unwrap();
        assert_eq!(out, v);
        let mut out4 = [0f32; 4];
        assert!(matches!(
            dequantize_row(GgmlType::F32, &raw, &mut out4),
            Err(QuantError::BadLength {
                elems: 4,
                bytes: 12,
                ..
            })
        ));
        let mut out33 = [0f32; 33];
        assert!(dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out33).is_err());
        assert!(matches!(
            dequantize_row(GgmlType::Q2_K, &[0u8; 84], &mut [0f32; 256]),
            Err(QuantError::Unsupported(GgmlType::Q2_K))
        ));
    }

    #[test]
    fn q8_k_and_q8_1_decode() {
        use crate::quant::formats::blocks::{cast_mut, BlockQ8K};
        let mut raw = vec![0u8; 292];
        {
            let b = &mut cast_mut::<BlockQ8K>(&mut raw)[0];
            b.d = 0.5f32.to_le_bytes();
            b.qs[3] = -7;
        }
        let mut out = vec![0f32; 256];
        dequantize_row(GgmlType::Q8_K, &raw, &mut out).unwrap();
        assert_eq!(out[3], -3.5);
        assert_eq!(out.iter().filter(|&&x| x != 0.0).count(), 1);

        let mut raw = vec![0u8; 36];
        raw[0..2].copy_from_slice(&half::f16::from_f32(0.25).to_bits().to_le_bytes());
        raw[4 + 31] = 8;
        let mut out = vec![0f32; 32];
        dequantize_row(GgmlType::Q8_1, &raw, &mut out).unwrap();
        assert_eq!(out[31], 2.0);
    }
}
