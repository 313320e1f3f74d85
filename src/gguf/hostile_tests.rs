//! Hostile-input tests: thousands of corrupted GGUF images, each of which must
//! come back as `Ok` or `Err` — never a panic, never an out-of-bounds tensor.
//!
//! Two bases are mutated: a small synthetic file from [`GgufWriter`] using every
//! value type, nested arrays and several tensor types; and the real reference
//! model (read into memory once, mutated in place and restored, so no variant
//! copies 98 MB). The writer's [`Layout`] tells where every count, length, type
//! tag, dim and offset lives, so targeted mutations hit real fields; for the real
//! model the writer first re-creates the file byte for byte, which also proves
//! the writer lays data out exactly like gguf-py.
//!
//! Every variant runs under `catch_unwind`; a panic is recorded with the
//! variant's description and the test fails listing them.

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::tensor::tensor_slice;
use super::value::{Array, Value};
use super::writer::{FieldKind, GgufWriter, Layout};
use super::{summarize, test_model_path, GgufFile, GgufHeader};
use crate::quant::GgmlType;

/// Deterministic xorshift64* so every run mutates the same bytes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[derive(Default)]
struct Stats {
    ok: usize,
    err: usize,
    panics: Vec<String>,
}

impl Stats {
    fn total(&self) -> usize {
        self.ok + self.err + self.panics.len()
    }

    fn record(&mut self, label: &dyn Fn() -> String, outcome: std::thread::Result<bool>) {
        match outcome {
            Ok(true) => self.ok += 1,
            Ok(false) => self.err += 1,
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                self.panics.push(format!("{}: {msg}", label()));
            }
        }
    }

    /// Owned image through the public API; on success touch every tensor and
    /// render the summary and every value (hostile metadata must not break them).
    fn run_owned(&mut self, label: &dyn Fn() -> String, bytes: Vec<u8>) {
        let outcome = catch_unwind(AssertUnwindSafe(|| match GgufFile::from_bytes(bytes) {
            Ok(f) => {
                for t in f.tensors() {
                    let d = f.tensor_data(t);
                    assert_eq!(d.len() as u64, t.size);
                    assert!(t.offset % f.alignment() == 0 && t.offset >= f.data_offset());
                }
                let _ = summarize(&f).to_string();
                for (_, v) in f.metadata() {
                    let _ = v.to_string();
                }
                true
            }
            Err(e) => {
                assert!(!e.to_string().is_empty());
                false
            }
        }));
        self.record(label, outcome);
    }

    /// Borrowed image (the in-place-mutated real model): header parse plus the
    /// same range check `tensor_data` uses.
    fn run_slice(&mut self, label: &dyn Fn() -> String, bytes: &[u8]) {
        let outcome = catch_unwind(AssertUnwindSafe(|| match GgufHeader::parse(bytes) {
            Ok(h) => {
                for t in h.tensors() {
                    let d = tensor_slice(bytes, t).expect("parsed tensor outside the file");
                    assert_eq!(d.len() as u64, t.size);
                }
                true
            }
            Err(_) => false,
        }));
        self.record(label, outcome);
    }

    fn check(&self, what: &str, min_err_share: f64) {
        assert!(
            self.panics.is_empty(),
            "{what}: {} of {} variants panicked:\n{}",
            self.panics.len(),
            self.total(),
            self.panics.join("\n")
        );
        let share = self.err as f64 / self.total() as f64;
        assert!(
            share >= min_err_share,
            "{what}: only {}/{} variants were rejected; are the mutations real?",
            self.err,
            self.total()
        );
    }
}

/// Overwrites `buf[at..]` with `bytes`, runs the variant, restores the bytes.
fn mutate(s: &mut Stats, buf: &mut [u8], at: usize, bytes: &[u8], label: &dyn Fn() -> String) {
    let end = (at + bytes.len()).min(buf.len());
    let saved = buf[at..end].to_vec();
    buf[at..end].copy_from_slice(&bytes[..end - at]);
    s.run_slice(label, buf);
    buf[at..end].copy_from_slice(&saved);
}

/// Values that break counts, lengths, dims and offsets in interesting ways.
fn nasty_values(rng: &mut Rng, file_len: usize) -> Vec<u64> {
    vec![
        0,
        1,
        3,
        5,
        13,
        31,
        255,
        0xffff,
        0xffff_ffff,
        1 << 32,
        1 << 40,
        1 << 62,
        1 << 63,
        i64::MAX as u64,
        u64::MAX,
        u64::MAX - 31,
        file_len as u64,
        file_len as u64 + 1,
        rng.next(),
    ]
}

fn patch(buf: &mut [u8], at: usize, width: usize, v: u64) {
    if let Some(dst) = buf.get_mut(at..at + width) {
        dst.copy_from_slice(&v.to_le_bytes()[..width]);
    }
}

fn synthetic_writer() -> GgufWriter {
    GgufWriter::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("general.alignment", Value::U32(64))
        .kv("general.name", Value::String("hostile ✓".into()))
        .kv("llama.block_count", Value::U32(2))
        .kv("llama.context_length", Value::U64(128))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F64(1e-5))
        .kv("t.i8", Value::I8(-1))
        .kv("t.u16", Value::U16(7))
        .kv("t.i16", Value::I16(-7))
        .kv("t.i64", Value::I64(-1))
        .kv("t.bool", Value::Bool(true))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec![
                "<s>".into(),
                "</s>".into(),
                "a".into(),
                "é".into(),
            ])),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![3, 3, 1, 1])),
        )
        .kv(
            "tokenizer.ggml.scores",
            Value::Array(Array::F32(vec![0.0, 0.0, -1.0, -2.0])),
        )
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["a é".into()])),
        )
        .kv("tokenizer.ggml.bos_token_id", Value::U32(0))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(1))
        .kv(
            "t.nested",
            Value::Array(Array::Array(vec![
                Array::U8(vec![1, 2]),
                Array::Bool(vec![true]),
                Array::Array(vec![Array::U64(vec![9])]),
            ])),
        )
        .tensor(
            "token_embd.weight",
            &[32, 4],
            GgmlType::Q8_0,
            vec![1; 4 * 34],
        )
        .tensor("norm", &[8], GgmlType::F32, vec![2; 32])
        .tensor("half", &[4, 2], GgmlType::F16, vec![3; 16])
        .tensor("q4", &[32], GgmlType::Q4_0, vec![4; 18])
        .tensor("k", &[256], GgmlType::Q4_K, vec![5; 144])
}

#[test]
fn hostile_synthetic_variants() {
    let (base, layout) = synthetic_writer().to_bytes_with_layout();
    assert!(
        GgufFile::from_bytes(base.clone()).is_ok(),
        "base file must parse"
    );
    let header_end = layout.data_offset;
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut s = Stats::default();

    // (1) Truncation at every length: only cuts inside the final padding may parse.
    for len in 0..base.len() {
        s.run_owned(
            &|| format!("synthetic: truncated to {len} bytes"),
            base[..len].to_vec(),
        );
    }
    let truncations = s.total();
    assert!(
        s.err >= truncations - 64,
        "truncation inside the data must be rejected"
    );

    // (2) Random byte flips in the header.
    for _ in 0..500 {
        let (at, x) = (rng.below(header_end), (rng.below(255) + 1) as u8);
        let mut b = base.clone();
        b[at] ^= x;
        s.run_owned(&|| format!("synthetic: byte {at} ^= {x:#04x}"), b);
    }

    // (3) Random u64 overwrites anywhere in the header.
    for _ in 0..300 {
        let (at, v) = (rng.below(header_end), rng.next() >> rng.below(64));
        let mut b = base.clone();
        patch(&mut b, at, 8, v);
        s.run_owned(&|| format!("synthetic: u64 {v:#x} at {at}"), b);
    }

    // (4) Every layout field set to every nasty value: counts, key/string/name
    // lengths, array lengths, n_dims, dims, offsets, value and tensor type ids.
    for field in &layout.fields {
        for v in nasty_values(&mut rng, base.len()) {
            let mut b = base.clone();
            patch(&mut b, field.offset, field.kind.width(), v);
            s.run_owned(
                &|| format!("synthetic: {:?} at {} = {v:#x}", field.kind, field.offset),
                b,
            );
        }
    }

    // (5) Every type id 0..=40 (and huge ones) in every value/array/tensor type field.
    for field in layout.fields.iter().filter(|f| {
        matches!(
            f.kind,
            FieldKind::ValueType | FieldKind::ArrayType | FieldKind::TensorType
        )
    }) {
        for id in (0..=40).chain([u32::MAX, 0x8000_0000]) {
            let mut b = base.clone();
            patch(&mut b, field.offset, 4, id.into());
            s.run_owned(
                &|| format!("synthetic: {:?} at {} = {id}", field.kind, field.offset),
                b,
            );
        }
    }

    // (6) Alignment values, in several integer types.
    for v in [
        0u64,
        1,
        2,
        3,
        6,
        1 << 16,
        1 << 31,
        0xffff_ffff,
        1 << 32,
        u64::MAX,
    ] {
        for value in [
            Value::U32(v as u32),
            Value::U64(v),
            Value::I64(v as i64),
            Value::U8(v as u8),
        ] {
            // Written under a same-length decoy key (so the writer lays data out
            // with the default alignment instead of padding to 2 GiB), then renamed.
            let mut b = GgufWriter::new()
                .kv("general.alignmenX", value.clone())
                .tensor("x", &[4], GgmlType::F32, vec![0; 16])
                .to_bytes();
            b[24 + 8 + 16] = b't';
            s.run_owned(&|| format!("synthetic: alignment {value:?}"), b);
        }
    }

    // (7) Nesting bombs: hand-encoded arrays of arrays, 5 to 100k deep, with
    // honest and with huge counts; and a wide array of empty arrays.
    for (depth, count) in [
        (5usize, 1u64),
        (6, 1),
        (64, 1),
        (100_000, 1),
        (100_000, u64::MAX),
        (3, 1 << 60),
    ] {
        let mut b = GgufWriter::new().to_bytes()[..24].to_vec();
        patch(&mut b, 16, 8, 1);
        b.extend_from_slice(&4u64.to_le_bytes());
        b.extend_from_slice(b"bomb");
        b.extend_from_slice(&9u32.to_le_bytes());
        for _ in 0..depth {
            b.extend_from_slice(&9u32.to_le_bytes());
            b.extend_from_slice(&count.to_le_bytes());
        }
        s.run_owned(
            &|| format!("synthetic: nesting bomb depth {depth} count {count}"),
            b,
        );
    }
    let wide = Value::Array(Array::Array(vec![Array::U8(vec![]); 10_000]));
    s.run_owned(
        &|| "synthetic: 10k empty arrays".into(),
        GgufWriter::new().kv("wide", wide.clone()).to_bytes(),
    );
    let deep = (0..8).fold(Array::U8(vec![1]), |a, _| Array::Array(vec![a]));
    s.run_owned(
        &|| "synthetic: writer-built 9-deep array".into(),
        GgufWriter::new()
            .kv("deep", Value::Array(deep.clone()))
            .to_bytes(),
    );

    // (8) Every version number that means something, and byte-swapped ones.
    for v in [
        0u32,
        1,
        2,
        3,
        4,
        5,
        u32::MAX,
        1u32.to_be(),
        2u32.to_be(),
        3u32.to_be(),
    ] {
        let mut b = base.clone();
        patch(&mut b, 4, 4, v.into());
        s.run_owned(&|| format!("synthetic: version {v:#x}"), b);
    }

    eprintln!(
        "synthetic: {} variants, {} ok, {} rejected",
        s.total(),
        s.ok,
        s.err
    );
    assert!(s.total() >= 1000);
    s.check("synthetic", 0.6);
}

#[test]
fn hostile_real_model_variants() {
    let path = test_model_path();
    let original = std::fs::read(&path).expect("read reference model");
    let f = GgufFile::from_bytes(original.clone()).expect("reference model parses");

    // Re-create the file with the writer: the result must be byte-identical,
    // which both tests the writer and yields the real file's field layout.
    let mut w = GgufWriter::new().version(f.version());
    for (k, v) in f.metadata() {
        w = w.kv(k.clone(), v.clone());
    }
    for t in f.tensors() {
        w = w.tensor(t.name.clone(), &t.dims, t.ty, f.tensor_data(t).to_vec());
    }
    let (rewritten, layout): (Vec<u8>, Layout) = w.to_bytes_with_layout();
    assert_eq!(layout.data_offset as u64, f.data_offset());
    assert!(
        rewritten == original,
        "writer does not reproduce the reference model byte for byte"
    );
    drop((rewritten, f));

    let mut buf = original;
    let len = buf.len();
    let header_end = layout.data_offset;
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let mut s = Stats::default();

    // (1) Truncations: every length up to 64, a spread over the header, a few in the data.
    let mut cuts: Vec<usize> = (0..64).collect();
    cuts.extend((0..120).map(|i| 64 + i * (header_end - 64) / 120));
    cuts.extend([header_end - 1, header_end, header_end + 1, len / 2, len - 1]);
    for cut in cuts {
        let outcome = catch_unwind(AssertUnwindSafe(|| GgufHeader::parse(&buf[..cut]).is_ok()));
        s.record(&|| format!("real: truncated to {cut} bytes"), outcome);
    }
    assert_eq!(
        s.ok, 0,
        "every truncation of the real model must be rejected"
    );

    // (2) Random byte flips in the header region.
    for _ in 0..300 {
        let (at, x) = (rng.below(header_end), (rng.below(255) + 1) as u8);
        let b = [buf[at] ^ x];
        mutate(&mut s, &mut buf, at, &b, &|| {
            format!("real: byte {at} ^= {x:#04x}")
        });
    }

    // (3) Random u64 overwrites in the header region.
    for _ in 0..150 {
        let (at, v) = (rng.below(header_end), rng.next() >> rng.below(64));
        mutate(&mut s, &mut buf, at, &v.to_le_bytes(), &|| {
            format!("real: u64 {v:#x} at {at}")
        });
    }

    // (4) Targeted fields, each set to two random nasty values: every
    // metadata-section field except the ~98k token/merge string lengths, a
    // sample of those, and a sample of the tensor-info fields.
    let first_tensor = layout
        .fields
        .iter()
        .position(|f| f.kind == FieldKind::TensorNameLen)
        .unwrap_or(layout.fields.len());
    let (meta, infos) = layout.fields.split_at(first_tensor);
    let strings: Vec<_> = meta
        .iter()
        .filter(|f| f.kind == FieldKind::StringLen)
        .collect();
    let mut targets: Vec<_> = meta
        .iter()
        .filter(|f| f.kind != FieldKind::StringLen)
        .collect();
    for _ in 0..60 {
        targets.push(strings[rng.below(strings.len())]);
        targets.push(&infos[rng.below(infos.len())]);
    }
    for field in targets {
        let values = nasty_values(&mut rng, len);
        for _ in 0..2 {
            let v = values[rng.below(values.len())];
            let bytes = v.to_le_bytes();
            mutate(
                &mut s,
                &mut buf,
                field.offset,
                &bytes[..field.kind.width()],
                &|| format!("real: {:?} at {} = {v:#x}", field.kind, field.offset),
            );
        }
    }

    eprintln!(
        "real model: {} variants, {} ok, {} rejected",
        s.total(),
        s.ok,
        s.err
    );
    assert!(s.total() >= 1000, "only {} variants", s.total());
    s.check("real model", 0.5);
}
