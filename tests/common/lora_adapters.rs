//! Test LoRA adapters in llama.cpp's GGUF format, made for a base model from its own tensors:
//! each adapted matrix `W` gets `A` = `rank` of its own rows (so `A·x` reads features the
//! model computes) and a pseudo-random `B`, sized so that `scale · B·A` is a set share of `W`
//! (large enough to move the logits well past any rounding, small enough that the model stays
//! a language model whose distances mean something).

use super::kept;
use edgelm::gguf::{GgufFile, GgufWriter, Value};
use edgelm::quant::{dequantize_row, quantize_row, GgmlType};
use std::path::{Path, PathBuf};

/// What an adapter adapts and how.
#[derive(Clone, Debug)]
pub struct AdapterSpec {
    /// Its file name's stem (the adapter's name).
    pub name: &'static str,
    pub rank: usize,
    /// The base tensors' kinds it adapts (`attn_q`, `ffn_down`, `output`, ...), every layer.
    pub targets: &'static [&'static str],
    /// `adapter.lora.alpha` (0: none, the scale alone).
    pub alpha: f32,
    /// The type A and B are stored in.
    pub ty: GgmlType,
    /// `‖scale · B·A‖ / ‖W‖` for the scale the adapter is run with ([`AdapterSpec::scale`]).
    pub share: f32,
    /// The scale it is meant to be run with (`--lora-scaled`).
    pub scale: f32,
}

impl AdapterSpec {
    /// The factor llama.cpp multiplies `B·A` by.
    fn factor(&self) -> f32 {
        match self.alpha {
            0.0 => self.scale,
            a => self.scale * a / self.rank as f32,
        }
    }
}

/// The test adapters: every attention and FFN matrix at rank 8 in F16 with an alpha; the
/// attention at rank 64 in F32 without one; the FFN at rank 32 in Q8_0; Q and V at rank 16 in
/// F16, scaled down. Each moves the model well past rounding: on 4 chunks of
/// tests/data/gpl-2.txt the reference model's perplexity of 16.3 becomes 24 to 57, Gemma 3
/// 270M's 14.7 becomes 28 to 68; llama.cpp's own q8_0 cache stays under 0.02 KLD with each.
pub const TEST_ADAPTERS: [AdapterSpec; 4] = [
    AdapterSpec {
        name: "all-r8",
        rank: 8,
        targets: ALL_BLOCK_MATRICES,
        alpha: 16.0,
        ty: GgmlType::F16,
        share: 0.15,
        scale: 0.75,
    },
    AdapterSpec {
        name: "attn-r64",
        rank: 64,
        targets: &["attn_q", "attn_k", "attn_v", "attn_output"],
        alpha: 0.0,
        ty: GgmlType::F32,
        share: 0.2,
        scale: 1.5,
    },
    AdapterSpec {
        name: "ffn-r32",
        rank: 32,
        targets: &["ffn_gate", "ffn_up", "ffn_down"],
        alpha: 32.0,
        ty: GgmlType::Q8_0,
        share: 0.15,
        scale: 1.0,
    },
    AdapterSpec {
        name: "qv-r16",
        rank: 16,
        targets: &["attn_q", "attn_v"],
        alpha: 32.0,
        ty: GgmlType::F16,
        share: 0.3,
        scale: 0.5,
    },
];

/// Every attention and FFN matrix.
pub const ALL_BLOCK_MATRICES: &[&str] = &[
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// The adapter `spec` for `base` (made on first use and when `base` is newer), in
/// target/test-models.
pub fn test_adapter(base: &Path, spec: &AdapterSpec) -> PathBuf {
    let stem = base.file_stem().unwrap().to_string_lossy();
    let dir = super::repo_root().join("target/test-models");
    let path = dir.join(format!("lora-{}-{stem}.r1.gguf", spec.name));
    kept(&path, &[base], || build(base, spec))
}

fn build(base: &Path, spec: &AdapterSpec) -> Vec<u8> {
    let file = GgufFile::open(base).unwrap();
    let arch = file.architecture().unwrap().to_string();
    let mut w = GgufWriter::new()
        .kv("general.architecture", Value::String(arch))
        .kv("general.type", Value::String("adapter".into()))
        .kv("adapter.type", Value::String("lora".into()));
    if spec.alpha != 0.0 {
        w = w.kv("adapter.lora.alpha", Value::F32(spec.alpha));
    }
    let mut rng = Rng::new(spec.name);
    for t in file.tensors() {
        let kind = t.name.split('.').rev().nth(1).unwrap_or("");
        let adapted = t.dims.len() == 2 && spec.targets.contains(&kind);
        if !adapted || !t.name.ends_with(".weight") {
            continue;
        }
        let (cols, rows) = (t.dims[0] as usize, t.dims[1] as usize);
        let weights = dequantized(&file, &t.name);
        // A: rows spread over W, each scaled to unit length.
        let mut a = Vec::with_capacity(spec.rank * cols);
        for j in 0..spec.rank {
            let row = &weights[(j * rows / spec.rank) * cols..][..cols];
            let norm = row.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
            a.extend(row.iter().map(|v| v / norm));
        }
        // B random: ‖B·A‖ ≈ ‖B‖ (A's rows are unit vectors, nearly orthogonal).
        let w_norm = weights.iter().map(|v| v * v).sum::<f32>().sqrt();
        let sigma =
            spec.share * w_norm / (spec.factor().abs() * ((rows * spec.rank) as f32).sqrt());
        let b: Vec<f32> = (0..rows * spec.rank)
            .map(|_| rng.normal() * sigma)
            .collect();
        let base_name = t.name.clone();
        w = w.tensor(
            format!("{base_name}.lora_a"),
            &[cols as u64, spec.rank as u64],
            spec.ty,
            encode(&a, cols, spec.ty),
        );
        w = w.tensor(
            format!("{base_name}.lora_b"),
            &[spec.rank as u64, rows as u64],
            spec.ty,
            encode(&b, spec.rank, spec.ty),
        );
    }
    w.to_bytes()
}

/// Tensor `name` of `file` as f32.
fn dequantized(file: &GgufFile, name: &str) -> Vec<f32> {
    let t = file.tensors().iter().find(|t| t.name == name).unwrap();
    let cols = t.dims[0] as usize;
    let data = file.tensor_data(t);
    let row_bytes = t.row_bytes() as usize;
    let mut out = vec![0f32; t.n_elements() as usize];
    for (dst, src) in out.chunks_exact_mut(cols).zip(data.chunks_exact(row_bytes)) {
        dequantize_row(t.ty, src, dst).unwrap();
    }
    out
}

/// Rows of `cols` f32 values as `ty`.
fn encode(values: &[f32], cols: usize, ty: GgmlType) -> Vec<u8> {
    match ty {
        GgmlType::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        GgmlType::F16 => values
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        _ => values
            .chunks_exact(cols)
            .flat_map(|row| {
                let mut out = vec![0u8; ty.row_bytes(cols as u64).unwrap() as usize];
                quantize_row(ty, row, &mut out);
                out
            })
            .collect(),
    }
}

/// A deterministic generator per adapter name.
struct Rng(u64);

impl Rng {
    fn new(name: &str) -> Rng {
        Rng(name.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        }))
    }

    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    /// Roughly normal, unit standard deviation (a sum of four uniforms).
    fn normal(&mut self) -> f32 {
        1.73 * (0..4).map(|_| self.uniform()).sum::<f32>()
    }
}
