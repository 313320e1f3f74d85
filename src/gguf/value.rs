//! The GGUF metadata value model and its decoder.
//!
//! Arrays are stored *typed* (`Array::String(Vec<String>)`, `Array::F32(Vec<f32>)`, …)
//! rather than as `Vec<Value>`: the tokenizer's 49k-entry arrays then cost one
//! allocation per string instead of one enum per element, an empty array keeps
//! its element type, and accessors can hand out plain slices.
//!
//! Decoding is defensive: element counts are checked against the bytes left
//! before any loop or allocation, nesting is limited to [`MAX_ARRAY_DEPTH`],
//! strings must be UTF-8 and bools 0 or 1.

use std::fmt;

use super::error::GgufError;
use super::reader::Reader;

/// Deepest array nesting accepted (an array of arrays is depth 2). No real model
/// nests at all; the limit only stops recursion bombs.
pub const MAX_ARRAY_DEPTH: u32 = 4;

/// The type tag of a metadata value, numbered as in the GGUF spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_u32(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Smallest encoding of one value of this type: the fixed size for scalars,
    /// the length prefix for strings, type + length for arrays. Used to reject
    /// element counts the remaining bytes cannot possibly hold.
    pub fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A typed metadata array. `Array::Array` holds nested arrays, each with its own
/// element type.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<String>),
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer value, widened; `None` for floats, bools, strings, arrays.
    /// (Converters disagree on integer widths: a token id may be u32 in one
    /// file and i32 or u64 in another.)
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// Any integer type whose value fits in a u32.
    pub fn as_u32(&self) -> Option<u32> {
        self.as_i128().and_then(|v| u32::try_from(v).ok())
    }

    /// Any integer type whose value fits in a u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// Any integer type whose value fits in an i32.
    pub fn as_i32(&self) -> Option<i32> {
        self.as_i128().and_then(|v| i32::try_from(v).ok())
    }

    /// Any integer type whose value fits in an i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// f32, or f64 rounded to f32. Integers are not floats: `None`.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A string array as a slice (`.iter().map(String::as_str)` for `&str`s).
    pub fn as_string_array(&self) -> Option<&[String]> {
        match self {
            Value::Array(Array::String(v)) => Some(v),
            _ => None,
        }
    }

    pub fn as_f32_array(&self) -> Option<&[f32]> {
        match self {
            Value::Array(Array::F32(v)) => Some(v),
            _ => None,
        }
    }

    pub fn as_i32_array(&self) -> Option<&[i32]> {
        match self {
            Value::Array(Array::I32(v)) => Some(v),
            _ => None,
        }
    }

    pub fn as_u32_array(&self) -> Option<&[u32]> {
        match self {
            Value::Array(Array::U32(v)) => Some(v),
            _ => None,
        }
    }
}

impl Array {
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a `Value` (clones; for display and generic code).
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }
}

/// Scalars as themselves, strings quoted, arrays as `[string; 49152: "a", "b", …]`
/// (at most 8 elements and 60 characters per string, for `inspect`).
impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{}", quote(s, 60)),
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        write!(f, "[{}; {}", self.elem_type(), self.len())?;
        for i in 0..self.len().min(SHOWN) {
            f.write_str(if i == 0 { ": " } else { ", " })?;
            if let Some(v) = self.get(i) {
                write!(f, "{v}")?;
            }
        }
        if self.len() > SHOWN {
            f.write_str(", …")?;
        }
        f.write_str("]")
    }
}

/// Quotes `s` for messages: control characters escaped, cut after `max` chars,
/// so a hostile key or token cannot flood or garble a terminal.
pub(crate) fn quote(s: &str, max: usize) -> String {
    format!("\"{}\"", escape(s, max))
}

/// `s` with control characters escaped, cut after `max` chars (for names in
/// error messages, which wrap them in single quotes).
pub(crate) fn escape(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i == max {
            out.push('…');
            break;
        }
        out.extend(c.escape_debug());
    }
    out
}

/// Most elements reserved up front for a count read from the file. Counts are
/// already bounded by the bytes left, but an element in memory can be larger
/// than its encoding (a 24-byte `String` per 8-byte empty string), so a hostile
/// count in a multi-GB file could still ask for tens of GB at once. Beyond this
/// the vector grows as elements are actually decoded, each of which consumes
/// file bytes, keeping memory proportional to what was really parsed.
pub(crate) fn prealloc(count: usize) -> usize {
    count.min(1 << 18)
}

/// What is being decoded, formatted only when an error needs it.
pub(crate) type Ctx<'a> = &'a dyn Fn() -> String;

/// Reads a GGUF string (u64 length + UTF-8 bytes).
pub(crate) fn read_string(r: &mut Reader<'_>, ctx: Ctx<'_>) -> Result<String, GgufError> {
    let bytes = r.string_bytes().map_err(|s| s.context(ctx()))?;
    match std::str::from_utf8(bytes) {
        Ok(s) => Ok(s.to_owned()),
        Err(e) => {
            let start = r.pos() - bytes.len() as u64;
            Err(GgufError::malformed(
                ctx(),
                start + e.valid_up_to() as u64,
                format!(
                    "string of {} bytes starting at offset {start} is not valid UTF-8",
                    bytes.len()
                ),
            ))
        }
    }
}

/// Reads a value type tag.
pub(crate) fn read_type(r: &mut Reader<'_>, ctx: Ctx<'_>) -> Result<ValueType, GgufError> {
    let at = r.pos();
    let id = r.u32().map_err(|s| s.context(format!("{} type", ctx())))?;
    ValueType::from_u32(id).ok_or_else(|| {
        GgufError::malformed(
            ctx(),
            at,
            format!("unknown value type id {id} (valid: 0..=12)"),
        )
    })
}

/// Reads one value of type `ty`; `depth` is the number of arrays around it.
pub(crate) fn read_value(
    r: &mut Reader<'_>,
    ty: ValueType,
    depth: u32,
    ctx: Ctx<'_>,
) -> Result<Value, GgufError> {
    let short = |s: super::reader::Short| s.context(format!("{} ({ty} value)", ctx()));
    Ok(match ty {
        ValueType::U8 => Value::U8(r.u8().map_err(short)?),
        ValueType::I8 => Value::I8(r.i8().map_err(short)?),
        ValueType::U16 => Value::U16(r.u16().map_err(short)?),
        ValueType::I16 => Value::I16(r.i16().map_err(short)?),
        ValueType::U32 => Value::U32(r.u32().map_err(short)?),
        ValueType::I32 => Value::I32(r.i32().map_err(short)?),
        ValueType::F32 => Value::F32(r.f32().map_err(short)?),
        ValueType::U64 => Value::U64(r.u64().map_err(short)?),
        ValueType::I64 => Value::I64(r.i64().map_err(short)?),
        ValueType::F64 => Value::F64(r.f64().map_err(short)?),
        ValueType::Bool => Value::Bool(read_bool(r, ctx)?),
        ValueType::String => Value::String(read_string(r, ctx)?),
        ValueType::Array => Value::Array(read_array(r, depth + 1, ctx)?),
    })
}

fn read_bool(r: &mut Reader<'_>, ctx: Ctx<'_>) -> Result<bool, GgufError> {
    let at = r.pos();
    match r
        .u8()
        .map_err(|s| s.context(format!("{} (bool value)", ctx())))?
    {
        0 => Ok(false),
        1 => Ok(true),
        b => Err(GgufError::malformed(
            ctx(),
            at,
            format!("bool byte is {b}, expected 0 or 1"),
        )),
    }
}

/// Reads an array body (element type, u64 count, elements); `depth` counts this array.
pub(crate) fn read_array(r: &mut Reader<'_>, depth: u32, ctx: Ctx<'_>) -> Result<Array, GgufError> {
    let at = r.pos();
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::malformed(
            ctx(),
            at,
            format!("arrays nested {depth} deep; at most {MAX_ARRAY_DEPTH} levels are accepted"),
        ));
    }
    let elem = read_type(r, &|| format!("{} array element", ctx()))?;
    let count = r
        .u64()
        .map_err(|s| s.context(format!("{} array length", ctx())))?;
    // Fail fast on counts the file cannot hold, before looping or allocating:
    // every element needs at least `min_encoded_size` bytes.
    let min = count.saturating_mul(elem.min_encoded_size());
    r.require(min).map_err(|s| {
        s.context(format!(
            "{} (array of {count} {elem} elements, at least {min} bytes)",
            ctx()
        ))
    })?;
    // `count <= remaining bytes`, so it fits in usize and bounds the allocation.
    let n = count as usize;

    macro_rules! scalars {
        ($variant:ident, $read:ident) => {{
            let mut v = Vec::with_capacity(prealloc(n));
            for _ in 0..n {
                v.push(
                    r.$read()
                        .map_err(|s| s.context(format!("{} array element", ctx())))?,
                );
            }
            Array::$variant(v)
        }};
    }
    Ok(match elem {
        ValueType::U8 => Array::U8(r.bytes(count).map_err(|s| s.context(ctx()))?.to_vec()),
        ValueType::I8 => scalars!(I8, i8),
        ValueType::U16 => scalars!(U16, u16),
        ValueType::I16 => scalars!(I16, i16),
        ValueType::U32 => scalars!(U32, u32),
        ValueType::I32 => scalars!(I32, i32),
        ValueType::F32 => scalars!(F32, f32),
        ValueType::U64 => scalars!(U64, u64),
        ValueType::I64 => scalars!(I64, i64),
        ValueType::F64 => scalars!(F64, f64),
        ValueType::Bool => {
            let mut v = Vec::with_capacity(prealloc(n));
            for i in 0..n {
                v.push(read_bool(r, &|| format!("{} element {i}", ctx()))?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(prealloc(n));
            for i in 0..n {
                v.push(read_string(r, &|| format!("{} element {i}", ctx()))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(prealloc(n));
            for i in 0..n {
                v.push(read_array(r, depth + 1, &|| {
                    format!("{} element {i}", ctx())
                })?);
            }
            Array::Array(v)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx() -> String {
        "metadata key #0 'k'".to_string()
    }

    #[test]
    fn type_ids_round_trip() {
        for id in 0..20 {
            if let Some(t) = ValueType::from_u32(id) {
                assert_eq!(t.id(), id);
            } else {
                assert!(id > 12);
            }
        }
    }

    #[test]
    fn integer_accessors_accept_any_width_that_fits() {
        assert_eq!(Value::U8(7).as_u32(), Some(7));
        assert_eq!(Value::I32(7).as_u32(), Some(7));
        assert_eq!(Value::I32(-1).as_u32(), None);
        assert_eq!(Value::U64(1 << 32).as_u32(), None);
        assert_eq!(Value::U64(1 << 32).as_u64(), Some(1 << 32));
        assert_eq!(Value::I64(-5).as_i32(), Some(-5));
        assert_eq!(Value::I64(-5).as_u64(), None);
        assert_eq!(Value::U64(u64::MAX).as_i64(), None);
        assert_eq!(Value::F32(1.0).as_u32(), None);
        assert_eq!(Value::Bool(true).as_u32(), None);
        assert_eq!(Value::String("1".into()).as_u32(), None);
    }

    #[test]
    fn float_string_bool_and_array_accessors() {
        assert_eq!(Value::F32(1.5).as_f32(), Some(1.5));
        assert_eq!(Value::F64(1.5).as_f32(), Some(1.5));
        assert_eq!(Value::F32(1.5).as_f64(), Some(1.5));
        assert_eq!(Value::U32(1).as_f32(), None);
        assert_eq!(Value::Bool(true).as_bool(), Some(true));
        assert_eq!(Value::String("x".into()).as_str(), Some("x"));
        let toks = Value::Array(Array::String(vec!["a".into(), "b".into()]));
        assert_eq!(
            toks.as_string_array()
                .unwrap()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(toks.as_f32_array(), None);
        assert_eq!(
            Value::Array(Array::F32(vec![1.0])).as_f32_array(),
            Some(&[1.0f32][..])
        );
        assert_eq!(
            Value::Array(Array::I32(vec![-1])).as_i32_array(),
            Some(&[-1][..])
        );
        assert_eq!(
            Value::Array(Array::U32(vec![1])).as_u32_array(),
            Some(&[1][..])
        );
        assert_eq!(toks.as_array().map(Array::len), Some(2));
        assert_eq!(toks.to_string(), "[string; 2: \"a\", \"b\"]");
        let many = Value::Array(Array::U8((0..10).collect()));
        assert_eq!(many.to_string(), "[u8; 10: 0, 1, 2, 3, 4, 5, 6, 7, …]");
    }

    #[test]
    fn quote_escapes_and_truncates() {
        assert_eq!(quote("a\nb", 10), "\"a\\nb\"");
        assert_eq!(quote("abcdef", 3), "\"abc…\"");
    }

    fn enc_array(elem: u32, count: u64, body: &[u8]) -> Vec<u8> {
        let mut b = elem.to_le_bytes().to_vec();
        b.extend_from_slice(&count.to_le_bytes());
        b.extend_from_slice(body);
        b
    }

    #[test]
    fn huge_array_count_fails_fast_with_context() {
        let buf = enc_array(4, u64::MAX / 2, &[0; 16]);
        let e = read_array(&mut Reader::new(&buf), 1, &ctx)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "truncated file: metadata key #0 'k' (array of 9223372036854775807 u32 elements"
            ),
            "{e}"
        );
        assert!(e.contains("at offset 12, file has 28"), "{e}");
    }

    #[test]
    fn invalid_utf8_names_the_element() {
        let mut body = 2u64.to_le_bytes().to_vec();
        body.extend_from_slice(b"ok");
        body.extend_from_slice(&2u64.to_le_bytes());
        body.extend_from_slice(&[0xff, 0xfe]);
        let buf = enc_array(8, 2, &body);
        let e = read_array(&mut Reader::new(&buf), 1, &ctx)
            .unwrap_err()
            .to_string();
        assert_eq!(e, "metadata key #0 'k' element 1 at offset 30: string of 2 bytes starting at offset 30 is not valid UTF-8");
    }

    #[test]
    fn bad_bool_and_bad_type() {
        let buf = enc_array(7, 2, &[1, 2]);
        let e = read_array(&mut Reader::new(&buf), 1, &ctx)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "metadata key #0 'k' element 1 at offset 13: bool byte is 2, expected 0 or 1"
        );
        let buf = enc_array(13, 0, &[]);
        let e = read_array(&mut Reader::new(&buf), 1, &ctx)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown value type id 13"), "{e}");
    }

    #[test]
    fn nesting_limit() {
        // depth-4 nesting (4 array headers, innermost empty u8) is fine; 5 is not.
        let mut ok = Vec::new();
        for _ in 0..3 {
            ok.extend_from_slice(&enc_array(9, 1, &[]));
        }
        ok.extend_from_slice(&enc_array(0, 0, &[]));
        assert!(read_array(&mut Reader::new(&ok), 1, &ctx).is_ok());
        let mut bomb = Vec::new();
        for _ in 0..4 {
            bomb.extend_from_slice(&enc_array(9, 1, &[]));
        }
        bomb.extend_from_slice(&enc_array(0, 0, &[]));
        let e = read_array(&mut Reader::new(&bomb), 1, &ctx)
            .unwrap_err()
            .to_string();
        assert!(e.contains("arrays nested 5 deep"), "{e}");
        assert!(e.contains("element 0 element 0 element 0 element 0"), "{e}");
    }
}
