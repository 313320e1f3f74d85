//! Parses and validates everything before the tensor data: magic, version,
//! metadata and tensor infos.
//!
//! The parser trusts nothing in the file. Counts never drive an allocation or a
//! loop beyond what the remaining bytes could hold, all arithmetic is checked,
//! and every tensor is proven to lie, aligned and without overlap, inside the
//! file — so later code can slice tensor data without further checks.

use std::collections::HashMap;

use super::error::GgufError;
use super::reader::Reader;
use super::tensor::{TensorInfo, MAX_DIMS, MAX_TENSOR_NAME};
use super::value::{escape, prealloc, read_string, read_type, read_value, Value};
use crate::quant::GgmlType;

/// GGUF's default data alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// Longest metadata key in bytes (the GGUF spec's limit).
pub const MAX_KEY_LEN: usize = 65535;

/// Smallest possible metadata entry: key length (8), type (4), a u8 value (1).
const MIN_KV_BYTES: u64 = 13;
/// Smallest possible tensor info: name length (8), n_dims (4), one dim (8), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 32;

/// The parsed header of a GGUF file. Fields are read through accessors so the
/// lookup indexes can never go stale.
#[derive(Clone, Debug)]
pub struct GgufHeader {
    version: u32,
    /// Metadata entries in file order.
    metadata: Vec<(String, Value)>,
    /// Tensor infos in file order, with absolute offsets.
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Absolute offset of the tensor data section (aligned).
    data_offset: u64,
    /// Length of the buffer the header was parsed from.
    file_size: u64,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufHeader {
    /// Parses and validates a whole GGUF file image (header and data bounds), in four passes:
    /// the preamble, the metadata, the tensor infos, then where each tensor's data lies.
    pub fn parse(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
        let mut r = Reader::new(bytes);
        let file_len = r.len();
        let preamble = read_preamble(&mut r)?;
        let metadata = read_metadata(&mut r, preamble.kv_count)?;
        let mut infos = read_tensor_infos(&mut r, preamble.tensor_count)?;
        let alignment = metadata.alignment;
        let data_offset = align_up(r.pos(), alignment).ok_or_else(|| {
            GgufError::malformed(
                "tensor data section",
                r.pos(),
                format!("aligning to {alignment} overflows"),
            )
        })?;
        place_tensors(&mut infos, data_offset, alignment, file_len)?;
        check_overlaps(&infos.tensors, &infos.info_offsets)?;

        Ok(GgufHeader {
            version: preamble.version,
            metadata: metadata.entries,
            tensors: infos.tensors,
            alignment,
            data_offset,
            file_size: file_len,
            key_index: metadata.key_index,
            tensor_index: infos.tensor_index,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Metadata entries in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// Tensor infos in file order, with absolute offsets.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset of the (aligned) tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Length of the buffer the header was parsed from.
    pub fn file_size(&self) -> u64 {
        self.file_size
    }

    /// The metadata value for `key` (hash lookup).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index
            .get(key)
            .and_then(|&i| self.metadata.get(i))
            .map(|(_, v)| v)
    }

    /// The tensor info named `name` (hash lookup).
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index
            .get(name)
            .and_then(|&i| self.tensors.get(i))
    }
}

/// What the fixed-size start of the file says: the version and how many entries follow.
struct Preamble {
    version: u32,
    kv_count: usize,
    tensor_count: usize,
}

/// Reads the magic, version and the two counts, and proves the counts could fit in the
/// bytes left (each entry has a minimum size), so no later loop or allocation is driven by a
/// count the file cannot back.
fn read_preamble(r: &mut Reader<'_>) -> Result<Preamble, GgufError> {
    let magic = r.bytes(4).map_err(|s| s.context("magic"))?;
    check_magic(magic)?;
    let version = r.u32().map_err(|s| s.context("version"))?;
    check_version(version)?;
    let tensor_count = r.u64().map_err(|s| s.context("tensor count"))?;
    let kv_count = r.u64().map_err(|s| s.context("metadata entry count"))?;
    let min = kv_count
        .saturating_mul(MIN_KV_BYTES)
        .saturating_add(tensor_count.saturating_mul(MIN_TENSOR_INFO_BYTES));
    r.require(min).map_err(|s| {
        s.context(format!("header with {kv_count} metadata entries and {tensor_count} tensor infos (at least {min} bytes)"))
    })?;
    // Both counts are now bounded by the file length, so they fit in usize
    // (allocations are further capped by `prealloc`).
    Ok(Preamble {
        version,
        kv_count: kv_count as usize,
        tensor_count: tensor_count as usize,
    })
}

/// The metadata section: entries in file order, their index by key, and the data alignment
/// (`general.alignment`, else [`DEFAULT_ALIGNMENT`]).
struct Metadata {
    entries: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    alignment: u64,
}

/// Reads `kv_count` metadata entries, rejecting bad keys, duplicates and an alignment that is
/// not a power of two.
fn read_metadata(r: &mut Reader<'_>, kv_count: usize) -> Result<Metadata, GgufError> {
    let mut entries = Vec::with_capacity(prealloc(kv_count));
    let mut key_index = HashMap::with_capacity(prealloc(kv_count));
    let mut alignment = DEFAULT_ALIGNMENT;
    for i in 0..kv_count {
        let at = r.pos();
        let key = read_string(r, &|| format!("metadata key #{i}"))?;
        let ctx = || format!("metadata key #{i} '{}'", escape(&key, 80));
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(GgufError::malformed(
                ctx(),
                at,
                format!("key length {} is outside 1..={MAX_KEY_LEN}", key.len()),
            ));
        }
        let ty = read_type(r, &ctx)?;
        let value_at = r.pos();
        let value = read_value(r, ty, 0, &ctx)?;
        if key == "general.alignment" {
            alignment = match value.as_u32() {
                Some(a) if a.is_power_of_two() => a.into(),
                _ => {
                    return Err(GgufError::malformed(
                        ctx(),
                        value_at,
                        format!("alignment {value} is not a nonzero power of two that fits in u32"),
                    ))
                }
            };
        }
        if let Some(&first) = key_index.get(&key) {
            return Err(GgufError::malformed(
                ctx(),
                at,
                format!("duplicate metadata key (first seen as key #{first})"),
            ));
        }
        key_index.insert(key.clone(), i);
        entries.push((key, value));
    }
    Ok(Metadata {
        entries,
        key_index,
        alignment,
    })
}

/// The tensor-info section. `tensors` have no offset or size yet ([`place_tensors`] fills
/// them); `info_offsets[j]` is where tensor `j`'s info starts (for error messages) and
/// `rel_offsets[j]` its data offset as written, relative to the data section.
struct TensorInfos {
    tensors: Vec<TensorInfo>,
    info_offsets: Vec<u64>,
    rel_offsets: Vec<u64>,
    tensor_index: HashMap<String, usize>,
}

/// Reads `tensor_count` tensor infos, rejecting bad names, duplicates, bad dimensions and
/// unknown types.
fn read_tensor_infos(r: &mut Reader<'_>, tensor_count: usize) -> Result<TensorInfos, GgufError> {
    let mut infos = TensorInfos {
        tensors: Vec::with_capacity(prealloc(tensor_count)),
        info_offsets: Vec::with_capacity(prealloc(tensor_count)),
        rel_offsets: Vec::with_capacity(prealloc(tensor_count)),
        tensor_index: HashMap::with_capacity(prealloc(tensor_count)),
    };
    for j in 0..tensor_count {
        let at = r.pos();
        let (info, rel) = read_tensor_info(r, j)?;
        if let Some(&first) = infos.tensor_index.get(&info.name) {
            return Err(GgufError::malformed(
                format!("tensor #{j} '{}'", escape(&info.name, 80)),
                at,
                format!("duplicate tensor name (first seen as tensor #{first})"),
            ));
        }
        infos.tensor_index.insert(info.name.clone(), j);
        infos.tensors.push(info);
        infos.info_offsets.push(at);
        infos.rel_offsets.push(rel);
    }
    Ok(infos)
}

/// Reads tensor `j`'s info (name, dimensions, type) and its relative data offset.
fn read_tensor_info(r: &mut Reader<'_>, j: usize) -> Result<(TensorInfo, u64), GgufError> {
    let at = r.pos();
    let name = read_string(r, &|| format!("tensor #{j} name"))?;
    let ctx = || format!("tensor #{j} '{}'", escape(&name, 80));
    if name.is_empty() || name.len() > MAX_TENSOR_NAME {
        return Err(GgufError::malformed(
            ctx(),
            at,
            format!(
                "name length {} is outside 1..={MAX_TENSOR_NAME}",
                name.len()
            ),
        ));
    }
    let nd_at = r.pos();
    let n_dims = r
        .u32()
        .map_err(|s| s.context(format!("{} dimension count", ctx())))?;
    if n_dims == 0 || n_dims as usize > MAX_DIMS {
        return Err(GgufError::malformed(
            ctx(),
            nd_at,
            format!("{n_dims} dimensions; 1..={MAX_DIMS} are supported"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        let dim_at = r.pos();
        let dim = r
            .u64()
            .map_err(|s| s.context(format!("{} dim {d}", ctx())))?;
        if dim == 0 || dim > i64::MAX as u64 {
            return Err(GgufError::malformed(
                ctx(),
                dim_at,
                format!("dim {d} is {dim}; each dim must be in 1..=i64::MAX"),
            ));
        }
        dims.push(dim);
    }
    let ty_at = r.pos();
    let ty_id = r.u32().map_err(|s| s.context(format!("{} type", ctx())))?;
    let ty = GgmlType::from_u32(ty_id).ok_or_else(|| {
        GgufError::malformed(
            ctx(),
            ty_at,
            format!("unknown or unsupported ggml type id {ty_id}"),
        )
    })?;
    let rel = r
        .u64()
        .map_err(|s| s.context(format!("{} data offset", ctx())))?;
    let info = TensorInfo {
        name,
        dims,
        ty,
        offset: 0,
        size: 0,
    };
    Ok((info, rel))
}

/// Gives every tensor its absolute offset and byte size, proving each is a whole number of
/// blocks per row, aligned, and inside the file (`data_offset` is the aligned start of the
/// data section, `file_len` the file's length).
fn place_tensors(
    infos: &mut TensorInfos,
    data_offset: u64,
    alignment: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    for (j, t) in infos.tensors.iter_mut().enumerate() {
        let at = infos.info_offsets[j];
        let rel = infos.rel_offsets[j];
        let ctx = || format!("tensor #{j} '{}'", escape(&t.name, 80));
        let size = tensor_bytes(t).map_err(|why| GgufError::malformed(ctx(), at, why))?;
        if !rel.is_multiple_of(alignment) {
            return Err(GgufError::malformed(
                ctx(),
                at,
                format!("data offset {rel} is not a multiple of the alignment {alignment}"),
            ));
        }
        let start = data_offset.checked_add(rel);
        let end = start.and_then(|s| s.checked_add(size));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len => {
                t.offset = start;
                t.size = size;
            }
            _ => {
                return Err(GgufError::malformed(
                    ctx(),
                    at,
                    format!(
                        "data of {size} bytes at data offset {rel} (absolute {}) ends past the end of the file ({file_len} bytes)",
                        data_offset as u128 + rel as u128
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// The byte size of `t`'s data, or why it has none: an element count beyond i64, a row that
/// is not whole blocks of its type, or a size that overflows.
fn tensor_bytes(t: &TensorInfo) -> Result<u64, String> {
    let n_elements = t
        .dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= i64::MAX as u64);
    if n_elements.is_none() {
        return Err(format!("element count of dims {:?} overflows i64", t.dims));
    }
    let row = t.ty.row_bytes(t.dims[0]).ok_or_else(|| {
        format!(
            "row length {} is not a multiple of {}'s block size {}",
            t.dims[0],
            t.ty,
            t.ty.block_elems()
        )
    })?;
    t.dims[1..]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| {
            format!(
                "byte size of {} tensor with dims {:?} overflows",
                t.ty, t.dims
            )
        })
}

fn check_magic(magic: &[u8]) -> Result<(), GgufError> {
    if magic == b"GGUF" {
        return Ok(());
    }
    let hint = match magic {
        b"FUGG" => " (byte-swapped: a big-endian GGUF written by an old converter? only little-endian is supported)",
        b"lmgg" | b"fmgg" | b"tjgg" => " (legacy GGML/GGMF/GGJT file; re-convert the model to GGUF)",
        _ => "",
    };
    Err(GgufError::BadMagic {
        found: magic.escape_ascii().to_string(),
        hint,
    })
}

fn check_version(version: u32) -> Result<(), GgufError> {
    match version {
        2 | 3 => Ok(()),
        1 => Err(GgufError::UnsupportedVersion {
            version,
            reason: "GGUF v1 used 32-bit counts and is not supported; re-convert the model with a current converter",
        }),
        v if (1..=3).contains(&v.swap_bytes()) => Err(GgufError::BigEndian { version: v.swap_bytes() }),
        _ => Err(GgufError::UnsupportedVersion { version, reason: "only versions 2 and 3 are supported" }),
    }
}

/// Rejects tensors sharing bytes: a sign of a corrupt or hostile file (and two
/// weights aliasing each other would be silently wrong).
fn check_overlaps(tensors: &[TensorInfo], info_offsets: &[u64]) -> Result<(), GgufError> {
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    for pair in order.windows(2) {
        let (a, b) = (&tensors[pair[0]], &tensors[pair[1]]);
        if b.offset < a.offset + a.size {
            return Err(GgufError::malformed(
                format!("tensor #{} '{}'", pair[1], escape(&b.name, 80)),
                info_offsets[pair[1]],
                format!(
                    "data [{}, {}) overlaps tensor '{}' at [{}, {})",
                    b.offset,
                    b.offset + b.size,
                    escape(&a.name, 80),
                    a.offset,
                    a.offset + a.size
                ),
            ));
        }
    }
    Ok(())
}

/// `pos` rounded up to a multiple of `align` (a power of two), or `None` on overflow.
fn align_up(pos: u64, align: u64) -> Option<u64> {
    pos.checked_next_multiple_of(align)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::value::Array;
    use crate::gguf::writer::{FieldKind, GgufWriter};

    fn err(bytes: &[u8]) -> String {
        GgufHeader::parse(bytes).unwrap_err().to_string()
    }

    fn put_u64(b: &mut [u8], at: usize, v: u64) {
        b[at..at + 8].copy_from_slice(&v.to_le_bytes());
    }

    fn put_u32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn all_types() -> Vec<(String, Value)> {
        vec![
            ("t.u8".into(), Value::U8(200)),
            ("t.i8".into(), Value::I8(-100)),
            ("t.u16".into(), Value::U16(60000)),
            ("t.i16".into(), Value::I16(-30000)),
            ("t.u32".into(), Value::U32(4_000_000_000)),
            ("t.i32".into(), Value::I32(-2_000_000_000)),
            ("t.f32".into(), Value::F32(-1.25e-5)),
            ("t.bool".into(), Value::Bool(true)),
            ("t.string".into(), Value::String("héllo ✓".into())),
            ("t.empty_string".into(), Value::String(String::new())),
            ("t.u64".into(), Value::U64(u64::MAX)),
            ("t.i64".into(), Value::I64(i64::MIN)),
            ("t.f64".into(), Value::F64(std::f64::consts::PI)),
            ("a.u8".into(), Value::Array(Array::U8(vec![1, 2, 255]))),
            ("a.i8".into(), Value::Array(Array::I8(vec![-1, 2]))),
            ("a.u16".into(), Value::Array(Array::U16(vec![1, 65535]))),
            ("a.i16".into(), Value::Array(Array::I16(vec![-1, 2]))),
            ("a.u32".into(), Value::Array(Array::U32(vec![7, 8, 9]))),
            ("a.i32".into(), Value::Array(Array::I32(vec![-7, 8]))),
            (
                "a.f32".into(),
                Value::Array(Array::F32(vec![0.5, -0.0, f32::INFINITY])),
            ),
            (
                "a.bool".into(),
                Value::Array(Array::Bool(vec![true, false])),
            ),
            (
                "a.string".into(),
                Value::Array(Array::String(vec!["a".into(), "".into(), "ü".into()])),
            ),
            ("a.u64".into(), Value::Array(Array::U64(vec![u64::MAX]))),
            ("a.i64".into(), Value::Array(Array::I64(vec![i64::MIN, 0]))),
            ("a.f64".into(), Value::Array(Array::F64(vec![1e300]))),
            ("a.empty".into(), Value::Array(Array::F32(vec![]))),
            (
                "a.nested".into(),
                Value::Array(Array::Array(vec![
                    Array::U32(vec![1]),
                    Array::String(vec!["x".into()]),
                    Array::Array(vec![Array::Array(vec![Array::Bool(vec![])])]),
                ])),
            ),
        ]
    }

    #[test]
    fn every_value_type_round_trips_in_v2_and_v3() {
        for version in [2, 3] {
            let mut w = GgufWriter::new().version(version);
            for (k, v) in all_types() {
                w = w.kv(k, v);
            }
            let h = GgufHeader::parse(&w.to_bytes()).unwrap();
            assert_eq!(h.version, version);
            assert_eq!(h.metadata, all_types());
            for (k, v) in all_types() {
                assert_eq!(h.get(&k), Some(&v), "{k}");
            }
            assert_eq!(h.get("missing"), None);
            assert_eq!(h.alignment, 32);
            assert!(h.tensors.is_empty());
        }
    }

    fn two_tensor_writer() -> GgufWriter {
        GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .tensor("a", &[32, 2], GgmlType::Q8_0, vec![7; 68])
            .tensor("b", &[5], GgmlType::F32, vec![9; 20])
    }

    #[test]
    fn tensors_are_located_and_sized() {
        let bytes = two_tensor_writer().to_bytes();
        let h = GgufHeader::parse(&bytes).unwrap();
        assert_eq!(h.data_offset % 32, 0);
        let a = h.tensor_info("a").unwrap();
        assert_eq!(
            (a.dims.as_slice(), a.ty, a.size, a.offset),
            (&[32u64, 2][..], GgmlType::Q8_0, 68, h.data_offset)
        );
        let b = h.tensor_info("b").unwrap();
        assert_eq!((b.size, b.offset), (20, h.data_offset + 96));
        assert_eq!(&bytes[b.offset as usize..][..20], &[9; 20]);
        assert!(h.tensor_info("c").is_none());
    }

    #[test]
    fn custom_alignment_is_honoured() {
        for align in [1u32, 8, 64, 4096] {
            let bytes = two_tensor_writer()
                .kv("general.alignment", Value::U32(align))
                .to_bytes();
            let h = GgufHeader::parse(&bytes).unwrap();
            assert_eq!(h.alignment, align as u64);
            assert_eq!(h.data_offset % align as u64, 0);
            assert_eq!(
                h.tensors[1].offset,
                h.data_offset + 68u64.next_multiple_of(align as u64)
            );
        }
    }

    #[test]
    fn bad_alignment_values_are_rejected() {
        for bad in [
            Value::U32(0),
            Value::U32(3),
            Value::U64(1 << 40),
            Value::String("32".into()),
            Value::I32(-32),
        ] {
            let e = err(&two_tensor_writer()
                .kv("general.alignment", bad.clone())
                .to_bytes());
            assert!(
                e.contains("metadata key #1 'general.alignment'")
                    && e.contains("not a nonzero power of two"),
                "{bad:?}: {e}"
            );
        }
    }

    #[test]
    fn magic_and_version_errors() {
        assert_eq!(
            err(b""),
            "truncated file: magic needs 4 bytes at offset 0, file has 0"
        );
        assert!(
            err(b"GGML\x03\0\0\0").starts_with("not a GGUF file: magic at offset 0 is \"GGML\"")
        );
        assert!(err(b"tjgg\x03\0\0\0").contains("legacy GGML/GGMF/GGJT"));
        let mut v3 = GgufWriter::new().to_bytes();
        put_u32(&mut v3, 4, 1);
        assert!(
            err(&v3).contains("unsupported GGUF version 1 at offset 4: GGUF v1 used 32-bit counts")
        );
        put_u32(&mut v3, 4, 4);
        assert!(err(&v3).contains("unsupported GGUF version 4"));
        put_u32(&mut v3, 4, 3u32.to_be());
        assert!(err(&v3).starts_with("big-endian GGUF file"), "{}", err(&v3));
        assert!(err(&v3[..6]).contains("version needs 4 bytes at offset 4, file has 6"));
    }

    #[test]
    fn hostile_counts_fail_fast() {
        let good = two_tensor_writer().to_bytes();
        let mut b = good.clone();
        put_u64(&mut b, 8, 1 << 62);
        let e = err(&b);
        assert!(e.starts_with("truncated file: header with 1 metadata entries and 4611686018427387904 tensor infos"), "{e}");
        let mut b = good.clone();
        put_u64(&mut b, 16, u64::MAX);
        assert!(err(&b).contains("18446744073709551615 metadata entries"));
    }

    #[test]
    fn truncated_string_names_the_key() {
        let bytes = GgufWriter::new()
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["abc".into(); 3])),
            )
            .to_bytes();
        let end = 24 + (8 + 21) + 4 + (4 + 8) + 3 * (8 + 3);
        let cut = end - 2; // inside the last string's bytes
        let e = err(&bytes[..cut]);
        assert!(e.starts_with("truncated file: metadata key #0 'tokenizer.ggml.tokens' element 2 needs 3 bytes at offset"), "{e}");
    }

    #[test]
    fn duplicates_are_rejected() {
        let e = err(&GgufWriter::new()
            .kv("x", Value::U8(1))
            .kv("x", Value::U8(2))
            .to_bytes());
        assert_eq!(
            e,
            "metadata key #1 'x' at offset 38: duplicate metadata key (first seen as key #0)"
        );
        let e = err(&two_tensor_writer()
            .tensor("a", &[1], GgmlType::F32, vec![0; 4])
            .to_bytes());
        assert!(
            e.starts_with("tensor #2 'a' at offset")
                && e.ends_with("duplicate tensor name (first seen as tensor #0)"),
            "{e}"
        );
    }

    #[test]
    fn bad_keys_and_names() {
        let e = err(&GgufWriter::new().kv("", Value::U8(1)).to_bytes());
        assert!(e.contains("key length 0 is outside"), "{e}");
        let e = err(&GgufWriter::new()
            .tensor("n".repeat(65), &[1], GgmlType::F32, vec![0; 4])
            .to_bytes());
        assert!(e.contains("name length 65 is outside 1..=64"), "{e}");
        let mut b = GgufWriter::new().kv("k", Value::U8(1)).to_bytes();
        b[32] = 0xff; // the key's single byte
        let e = err(&b);
        assert!(e.contains("metadata key #0 at offset 32: string of 1 bytes starting at offset 32 is not valid UTF-8"), "{e}");
    }

    fn field(w: &GgufWriter, kind: FieldKind, nth: usize) -> (Vec<u8>, usize) {
        let (b, l) = w.to_bytes_with_layout();
        let at = l
            .fields
            .iter()
            .filter(|f| f.kind == kind)
            .nth(nth)
            .unwrap()
            .offset;
        (b, at)
    }

    #[test]
    fn bad_tensor_infos() {
        let w = two_tensor_writer();
        let cases: Vec<(FieldKind, usize, u64, &str)> = vec![
            (
                FieldKind::NDims,
                0,
                0,
                "tensor #0 'a' at offset 78: 0 dimensions; 1..=4 are supported",
            ),
            (FieldKind::NDims, 0, 5, "5 dimensions"),
            (
                FieldKind::Dim,
                1,
                0,
                "dim 1 is 0; each dim must be in 1..=i64::MAX",
            ),
            (FieldKind::Dim, 1, u64::MAX, "dim 1 is 18446744073709551615"),
            (
                FieldKind::Dim,
                0,
                16,
                "row length 16 is not a multiple of Q8_0's block size 32",
            ),
            (
                FieldKind::Dim,
                1,
                3,
                "tensor #1 'b' at offset 110: data [256, 276) overlaps tensor 'a' at [160, 262)",
            ),
            (FieldKind::Dim, 1, 1 << 50, "ends past the end of the file"),
            (
                FieldKind::Dim,
                1,
                1 << 58,
                "element count of dims [32, 288230376151711744] overflows i64",
            ),
            (
                FieldKind::TensorType,
                0,
                4,
                "unknown or unsupported ggml type id 4",
            ),
            (
                FieldKind::TensorOffset,
                1,
                8,
                "data offset 8 is not a multiple of the alignment 32",
            ),
            (FieldKind::TensorOffset, 1, 0, "overlaps tensor 'a'"),
            (
                FieldKind::TensorOffset,
                1,
                u64::MAX - 31,
                "ends past the end of the file",
            ),
            (
                FieldKind::TensorOffset,
                1,
                4096,
                "ends past the end of the file",
            ),
        ];
        for (kind, nth, v, want) in cases {
            let (mut b, at) = field(&w, kind, nth);
            if kind.width() == 4 {
                put_u32(&mut b, at, v as u32);
            } else {
                put_u64(&mut b, at, v);
            }
            let e = err(&b);
            assert!(e.contains(want), "{kind:?} = {v}: {e}");
        }
        // Overflowing element count across dims.
        let e = err(&GgufWriter::new()
            .tensor("big", &[1 << 32, 1 << 32], GgmlType::F32, vec![])
            .to_bytes());
        assert!(
            e.contains("element count of dims [4294967296, 4294967296] overflows i64"),
            "{e}"
        );
    }

    #[test]
    fn empty_file_needs_no_padding() {
        let b = GgufWriter::new().kv("k", Value::U8(1)).to_bytes();
        let end = 24 + 8 + 1 + 4 + 1;
        let h = GgufHeader::parse(&b[..end]).unwrap();
        assert_eq!(h.data_offset, 64);
        assert_eq!(h.file_size, end as u64);
    }
}
