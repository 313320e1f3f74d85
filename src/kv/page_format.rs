//! How one KV head's vector for one token (a "row" of `head_dim` values) is stored in a page.

use crate::quant::{self, GgmlType};
use std::fmt;
use std::str::FromStr;

/// Width of the Walsh-Hadamard rotation of quantized pages (see [`KvType::rotated`]).
pub const HADAMARD_DIM: usize = 64;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvType {
    F16,
    Q8_0,
    Q4_0,
}

impl KvType {
    pub fn ggml(self) -> GgmlType {
        match self {
            KvType::F16 => GgmlType::F16,
            KvType::Q8_0 => GgmlType::Q8_0,
            KvType::Q4_0 => GgmlType::Q4_0,
        }
    }

    /// Bytes of one row of `head_dim` values, scales included; `None` if `head_dim` is not a
    /// whole number of quantization blocks.
    pub fn row_bytes(self, head_dim: usize) -> Option<usize> {
        self.ggml().row_bytes(head_dim as u64).map(|b| b as usize)
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Q8_0 => "q8_0",
            KvType::Q4_0 => "q4_0",
        }
    }

    /// Stores `src` (one head's K or V for one token) into `dst` (`row_bytes` long).
    pub fn encode_row(self, src: &[f32], dst: &mut [u8]) {
        match self {
            KvType::F16 => quant::f32_row_to_f16(src, dst),
            KvType::Q8_0 => quant::quantize_row(GgmlType::Q8_0, src, dst),
            KvType::Q4_0 => quantize_row_q4_0(src, dst),
        }
    }

    /// Whether pages of this type hold K and V rotated by the Walsh-Hadamard transform over
    /// every [`HADAMARD_DIM`] values (the one rule every backend follows): quantized pages do,
    /// when the head splits into whole chunks. The rotation is orthonormal and its own inverse,
    /// so rotating Q with K leaves Q·K unchanged and rotating the attention output back undoes
    /// it on V; what it changes is that outlier channels are spread over the chunk before K and
    /// V are quantized (llama.cpp does the same for its quantized caches), which keeps q4_0
    /// pages usable.
    pub fn rotated(self, head_dim: usize) -> bool {
        self != KvType::F16 && head_dim.is_multiple_of(HADAMARD_DIM)
    }

    /// Reads a row back into f32 (`dst.len()` = head_dim).
    pub fn decode_row(self, src: &[u8], dst: &mut [f32]) {
        if self == KvType::F16 {
            return quant::f16_row_to_f32(src, dst);
        }
        quant::dequantize_row(self.ggml(), src, dst).expect("page rows have the format's size");
    }
}

/// ggml's reference Q4_0 rounding: the value of largest magnitude maps to -8, d = max / -8.
fn quantize_row_q4_0(src: &[f32], dst: &mut [u8]) {
    for (x, block) in src.chunks_exact(32).zip(dst.chunks_exact_mut(18)) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        block[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
        for j in 0..16 {
            let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
            block[2 + j] = q(x[j]) | (q(x[j + 16]) << 4);
        }
    }
}

impl FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            "q4_0" | "q4" => Ok(KvType::Q4_0),
            other => Err(format!(
                "unknown KV type '{other}' (expected f16, q8_0 or q4_0)"
            )),
        }
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_within_format_precision() {
        let src: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13)
            .collect();
        for (ty, tol) in [
            (KvType::F16, 1e-3),
            (KvType::Q8_0, 0.02),
            (KvType::Q4_0, 0.2),
        ] {
            let mut bytes = vec![0u8; ty.row_bytes(64).unwrap()];
            ty.encode_row(&src, &mut bytes);
            let mut back = vec![0f32; 64];
            ty.decode_row(&bytes, &mut back);
            for (a, b) in src.iter().zip(&back) {
                assert!((a - b).abs() <= tol, "{ty}: {a} vs {b}");
            }
        }
        assert_eq!(KvType::F16.row_bytes(64), Some(128));
        assert_eq!(KvType::Q8_0.row_bytes(64), Some(68));
        assert_eq!(KvType::Q4_0.row_bytes(64), Some(36));
    }
}
