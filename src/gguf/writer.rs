//! Builds GGUF v3 (or v2) byte buffers: small synthetic models for unit tests
//! across the crate, and the raw material of the hostile-input tests.
//!
//! The writer is deliberately *not* a validator: it writes whatever it is given
//! (a bad alignment value, bytes that do not match the dims, 5-deep arrays) so
//! tests can produce broken files. It lays data out exactly as gguf-py does —
//! tensor data back to back in insertion order, each padded to the alignment —
//! so re-writing a real model's header reproduces the original bytes.
//!
//! [`GgufWriter::to_bytes_with_layout`] also reports where every count, length,
//! type tag, dim and offset field was written, so mutation tests can aim.

use super::value::{Array, Value};
use crate::quant::GgmlType;

/// Which header field a [`Field`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldKind {
    /// u32 version at offset 4.
    Version,
    /// u64 tensor count.
    TensorCount,
    /// u64 metadata entry count.
    KvCount,
    /// u64 length of a metadata key.
    KeyLen,
    /// u32 type tag of a metadata value.
    ValueType,
    /// u64 length of a string value (also array elements).
    StringLen,
    /// u32 element type tag of an array.
    ArrayType,
    /// u64 element count of an array.
    ArrayLen,
    /// u64 length of a tensor name.
    TensorNameLen,
    /// u32 dimension count of a tensor.
    NDims,
    /// u64 one dimension of a tensor.
    Dim,
    /// u32 ggml type id of a tensor.
    TensorType,
    /// u64 data offset of a tensor (relative to the data section).
    TensorOffset,
}

impl FieldKind {
    /// Width of the field in bytes.
    pub fn width(self) -> usize {
        match self {
            FieldKind::Version
            | FieldKind::ValueType
            | FieldKind::ArrayType
            | FieldKind::NDims
            | FieldKind::TensorType => 4,
            _ => 8,
        }
    }
}

/// A field written at `offset` (absolute in the buffer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    pub kind: FieldKind,
    pub offset: usize,
}

/// Where the writer put each header field, in write order.
#[derive(Clone, Debug, Default)]
pub struct Layout {
    pub fields: Vec<Field>,
    /// Start of the (aligned) tensor data section.
    pub data_offset: usize,
}

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    bytes: Vec<u8>,
}

/// A GGUF file under construction.
pub struct GgufWriter {
    version: u32,
    kvs: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufWriter {
    /// An empty GGUF v3 file.
    pub fn new() -> Self {
        GgufWriter {
            version: 3,
            kvs: Vec::new(),
            tensors: Vec::new(),
        }
    }

    /// Sets the version field (2 and 3 share one layout; others make invalid files).
    pub fn version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }

    /// Appends a metadata entry (duplicates are written as given).
    pub fn kv(mut self, key: impl Into<String>, value: Value) -> Self {
        self.kvs.push((key.into(), value));
        self
    }

    /// Appends a tensor; `dims` in ggml order (`dims[0]` = row length). The
    /// bytes are written as given, even when they do not match dims and type.
    pub fn tensor(
        mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
        bytes: Vec<u8>,
    ) -> Self {
        self.tensors.push(PendingTensor {
            name: name.into(),
            dims: dims.to_vec(),
            ty,
            bytes,
        });
        self
    }

    /// The alignment the data is laid out with: `general.alignment` when it is a
    /// usable power of two, else GGUF's default of 32.
    pub fn alignment(&self) -> usize {
        self.kvs
            .iter()
            .rev()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u32())
            .filter(|a| a.is_power_of_two())
            .map_or(32, |a| a as usize)
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.to_bytes_with_layout().0
    }

    pub fn to_bytes_with_layout(&self) -> (Vec<u8>, Layout) {
        let mut w = Out {
            buf: Vec::new(),
            layout: Layout::default(),
        };
        let align = self.alignment();
        w.buf.extend_from_slice(b"GGUF");
        w.u32(FieldKind::Version, self.version);
        w.u64(FieldKind::TensorCount, self.tensors.len() as u64);
        w.u64(FieldKind::KvCount, self.kvs.len() as u64);
        for (key, value) in &self.kvs {
            w.string(FieldKind::KeyLen, key);
            w.u32(FieldKind::ValueType, value.value_type().id());
            w.value(value);
        }
        let mut rel = 0usize;
        for t in &self.tensors {
            w.string(FieldKind::TensorNameLen, &t.name);
            w.u32(FieldKind::NDims, t.dims.len() as u32);
            for &d in &t.dims {
                w.u64(FieldKind::Dim, d);
            }
            w.u32(FieldKind::TensorType, t.ty.id());
            w.u64(FieldKind::TensorOffset, rel as u64);
            rel = (rel + t.bytes.len()).next_multiple_of(align);
        }
        w.pad(align);
        w.layout.data_offset = w.buf.len();
        w.buf.reserve(rel);
        for t in &self.tensors {
            w.buf.extend_from_slice(&t.bytes);
            w.pad(align);
        }
        (w.buf, w.layout)
    }
}

struct Out {
    buf: Vec<u8>,
    layout: Layout,
}

impl Out {
    fn mark(&mut self, kind: FieldKind) {
        self.layout.fields.push(Field {
            kind,
            offset: self.buf.len(),
        });
    }

    fn u32(&mut self, kind: FieldKind, v: u32) {
        self.mark(kind);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn u64(&mut self, kind: FieldKind, v: u64) {
        self.mark(kind);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn string(&mut self, kind: FieldKind, s: &str) {
        self.u64(kind, s.len() as u64);
        self.buf.extend_from_slice(s.as_bytes());
    }

    fn pad(&mut self, align: usize) {
        let n = self.buf.len().next_multiple_of(align);
        self.buf.resize(n, 0);
    }

    fn value(&mut self, v: &Value) {
        let b = &mut self.buf;
        match v {
            Value::U8(x) => b.push(*x),
            Value::I8(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::U16(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => b.push(u8::from(*x)),
            Value::String(s) => self.string(FieldKind::StringLen, s),
            Value::Array(a) => self.array(a),
            Value::U64(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => b.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => b.extend_from_slice(&x.to_le_bytes()),
        }
    }

    fn array(&mut self, a: &Array) {
        self.u32(FieldKind::ArrayType, a.elem_type().id());
        self.u64(FieldKind::ArrayLen, a.len() as u64);
        macro_rules! le {
            ($v:expr) => {
                for x in $v {
                    self.buf.extend_from_slice(&x.to_le_bytes());
                }
            };
        }
        match a {
            Array::U8(v) => self.buf.extend_from_slice(v),
            Array::I8(v) => le!(v),
            Array::U16(v) => le!(v),
            Array::I16(v) => le!(v),
            Array::U32(v) => le!(v),
            Array::I32(v) => le!(v),
            Array::F32(v) => le!(v),
            Array::Bool(v) => self.buf.extend(v.iter().map(|&x| u8::from(x))),
            Array::String(v) => {
                for s in v {
                    self.string(FieldKind::StringLen, s);
                }
            }
            Array::Array(v) => {
                for inner in v {
                    self.array(inner);
                }
            }
            Array::U64(v) => le!(v),
            Array::I64(v) => le!(v),
            Array::F64(v) => le!(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_layout() {
        let (b, layout) = GgufWriter::new().to_bytes_with_layout();
        assert_eq!(&b[..4], b"GGUF");
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 3);
        assert_eq!(b.len(), 32, "24-byte header padded to 32");
        assert_eq!(layout.data_offset, 32);
        assert_eq!(
            layout.fields,
            vec![
                Field {
                    kind: FieldKind::Version,
                    offset: 4
                },
                Field {
                    kind: FieldKind::TensorCount,
                    offset: 8
                },
                Field {
                    kind: FieldKind::KvCount,
                    offset: 16
                },
            ]
        );
    }

    #[test]
    fn tensor_data_is_aligned_and_padded() {
        let w = GgufWriter::new()
            .kv("general.alignment", Value::U32(64))
            .tensor("a", &[3], GgmlType::F32, vec![1; 12])
            .tensor("b", &[2], GgmlType::F16, vec![2; 4]);
        assert_eq!(w.alignment(), 64);
        let (b, layout) = w.to_bytes_with_layout();
        assert_eq!(layout.data_offset % 64, 0);
        assert_eq!(b.len(), layout.data_offset + 128);
        assert_eq!(&b[layout.data_offset..layout.data_offset + 12], &[1; 12]);
        assert_eq!(
            &b[layout.data_offset + 64..layout.data_offset + 68],
            &[2; 4]
        );
        let offsets: Vec<u64> = layout
            .fields
            .iter()
            .filter(|f| f.kind == FieldKind::TensorOffset)
            .map(|f| u64::from_le_bytes(b[f.offset..f.offset + 8].try_into().unwrap()))
            .collect();
        assert_eq!(offsets, [0, 64]);
    }

    #[test]
    fn unusable_alignment_falls_back_to_32() {
        assert_eq!(
            GgufWriter::new()
                .kv("general.alignment", Value::U32(3))
                .alignment(),
            32
        );
        assert_eq!(
            GgufWriter::new()
                .kv("general.alignment", Value::U32(0))
                .alignment(),
            32
        );
        assert_eq!(
            GgufWriter::new()
                .kv("general.alignment", Value::U64(16))
                .alignment(),
            16
        );
    }
}
