//! The ggml tensor element types a GGUF file may name, with their block geometry.
//!
//! Numbering follows ggml's `enum ggml_type`; the sizes are bytes per block of
//! `block_elems` values, exactly as stored in the file.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    Q8_K,
    I8,
    I16,
    I32,
    I64,
    F64,
    BF16,
    /// OCP microscaling FP4: 32 E2M1 values with one shared E8M0 scale (gpt-oss's experts).
    MXFP4,
}

impl GgmlType {
    /// Maps ggml's numeric type id; `None` for ids we do not know (or cannot compute with).
    pub fn from_u32(id: u32) -> Option<GgmlType> {
        use GgmlType::*;
        Some(match id {
            0 => F32,
            1 => F16,
            2 => Q4_0,
            3 => Q4_1,
            6 => Q5_0,
            7 => Q5_1,
            8 => Q8_0,
            9 => Q8_1,
            10 => Q2_K,
            11 => Q3_K,
            12 => Q4_K,
            13 => Q5_K,
            14 => Q6_K,
            15 => Q8_K,
            24 => I8,
            25 => I16,
            26 => I32,
            27 => I64,
            28 => F64,
            30 => BF16,
            39 => MXFP4,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q5_0 => 6,
            Q5_1 => 7,
            Q8_0 => 8,
            Q8_1 => 9,
            Q2_K => 10,
            Q3_K => 11,
            Q4_K => 12,
            Q5_K => 13,
            Q6_K => 14,
            Q8_K => 15,
            I8 => 24,
            I16 => 25,
            I32 => 26,
            I64 => 27,
            F64 => 28,
            BF16 => 30,
            MXFP4 => 39,
        }
    }

    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            BF16 => "BF16",
            MXFP4 => "MXFP4",
        }
    }

    /// Values per block (1 for plain element types).
    pub fn block_elems(self) -> usize {
        use GgmlType::*;
        match self {
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | MXFP4 => 32,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K => 256,
            _ => 1,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        use GgmlType::*;
        match self {
            F32 | I32 => 4,
            F16 | BF16 | I16 => 2,
            I8 => 1,
            I64 | F64 => 8,
            MXFP4 => 17,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
        }
    }

    /// Bytes of a row of `n` values, or `None` when `n` is not a whole number of blocks
    /// (or the size overflows).
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !n.is_multiple_of(be) {
            return None;
        }
        (n / be).checked_mul(self.block_bytes() as u64)
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for id in 0..64 {
            if let Some(t) = GgmlType::from_u32(id) {
                assert_eq!(t.id(), id);
            }
        }
        assert_eq!(GgmlType::from_u32(4), None, "Q4_2 was removed from ggml");
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576), Some(18 * 20));
        assert_eq!(GgmlType::Q4_K.row_bytes(576), None);
        assert_eq!(GgmlType::F16.row_bytes(3), Some(6));
    }
}
