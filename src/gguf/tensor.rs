//! Tensor descriptors and the zero-copy view of their bytes.

use crate::quant::GgmlType;

/// Largest number of dimensions a GGUF tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// Longest tensor name in bytes (the GGUF spec's limit).
pub const MAX_TENSOR_NAME: usize = 64;

/// One tensor as described by the header, checked: every dim ≥ 1, the row
/// length a whole number of blocks, `size` exact and `[offset, offset + size)`
/// inside the file and aligned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml order: `dims[0]` is the row length (the fastest-varying axis).
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: u64,
    /// Bytes of data.
    pub size: u64,
}

impl TensorInfo {
    /// Total number of values (fits in an i64: checked at parse time).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Number of rows: the product of `dims[1..]` (1 for a vector).
    pub fn rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes of one row (`dims[0]` values).
    pub fn row_bytes(&self) -> u64 {
        self.size / self.rows().max(1)
    }
}

/// A tensor's descriptor together with its bytes, borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

/// `info`'s bytes within `file`, or `None` when the range is outside it (which
/// the header parser rules out for the infos it produced).
pub(crate) fn tensor_slice<'a>(file: &'a [u8], info: &TensorInfo) -> Option<&'a [u8]> {
    let start = usize::try_from(info.offset).ok()?;
    let end = start.checked_add(usize::try_from(info.size).ok()?)?;
    file.get(start..end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_rows_and_slices() {
        let t = TensorInfo {
            name: "w".into(),
            dims: vec![64, 3, 2],
            ty: GgmlType::Q8_0,
            offset: 4,
            size: 6 * 68,
        };
        assert_eq!(t.n_elements(), 384);
        assert_eq!(t.rows(), 6);
        assert_eq!(t.row_bytes(), 68);
        let file = vec![0u8; 4 + 6 * 68];
        assert_eq!(tensor_slice(&file, &t).map(<[u8]>::len), Some(408));
        assert_eq!(tensor_slice(&file[..411], &t), None);
        let far = TensorInfo {
            offset: u64::MAX,
            ..t
        };
        assert_eq!(tensor_slice(&file, &far), None);
    }
}
