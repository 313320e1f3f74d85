//! Reading a LoRA adapter in llama.cpp's GGUF format (`general.type = adapter`,
//! `adapter.type = lora`, `adapter.lora.alpha`, a `NAME.lora_a` / `NAME.lora_b` pair per base
//! matrix `NAME`), checked strictly against the model it adapts: its architecture, each base
//! matrix's name and shape, and types edgelm reads. Anything else is refused in one line, so
//! that a model never runs with part of an adapter ignored (llama.cpp skips norm vectors; an
//! adapter with them is refused here).

use super::weights::Ffn;
use super::{Mat, Model};
use crate::backend::adapter::{Adapter, LowRank};
use crate::backend::cpu::gemm::DenseMatrix;
use crate::gguf::{GgufFile, TensorInfo};
use crate::quant::{dequantize_row, GgmlType};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::Path;

const LORA_A: &str = ".lora_a";
const LORA_B: &str = ".lora_b";

impl Model {
    /// Reads the adapter at `path` for this model, to be selected as `name`, its updates
    /// multiplied by `scale` (llama.cpp's `--lora-scaled`).
    pub fn load_adapter(&self, path: &Path, name: &str, scale: f32) -> Result<Adapter> {
        self.read_adapter(path, name, scale)
            .with_context(|| format!("adapter {}", path.display()))
    }

    /// [`Model::load_adapter`] without the file's name in its errors.
    fn read_adapter(&self, path: &Path, name: &str, scale: f32) -> Result<Adapter> {
        // Its message already says what went wrong (its source too, which `?` would repeat).
        let file = GgufFile::open(path).map_err(|e| anyhow::anyhow!("{e}"))?;
        self.check_adapter_header(&file)?;
        let alpha = alpha(&file)?;
        if !scale.is_finite() {
            bail!("scale {scale} is not a number");
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (scale.to_bits(), alpha.to_bits()).hash(&mut hasher);
        let mut updates = Vec::new();
        for (base, (a, b)) in pairs(&file)? {
            let (mats, rows) = self.adaptable(&base)?;
            let rank = check_shapes(&base, a, b, mats[0].cols, rows)?;
            let (a_bytes, b_bytes) = (file.tensor_data(a), file.tensor_data(b));
            (&base, a_bytes, b_bytes).hash(&mut hasher);
            // alpha 0 means "no alpha": the scale alone (llama.cpp's `get_scale`).
            let factor = match alpha {
                0.0 => scale,
                _ => scale * alpha / rank as f32,
            };
            for m in mats {
                let down = band(a, a_bytes, 0, rank)?;
                let up = band(b, b_bytes, m.first_row, m.rows)?;
                let scale = factor;
                updates.push((m, LowRank { down, up, scale }));
            }
        }
        if updates.is_empty() {
            bail!("it holds no LoRA tensors");
        }
        Ok(Adapter::new(name.to_string(), hasher.finish(), updates))
    }

    /// The general keys: an adapter, of type LoRA, for this model's architecture.
    fn check_adapter_header(&self, file: &GgufFile) -> Result<()> {
        let general = file.get_str("general.type").unwrap_or("");
        if general != "adapter" {
            bail!("general.type is '{general}', not 'adapter': not an adapter file");
        }
        let kind = file.get_str("adapter.type").unwrap_or("");
        if kind != "lora" {
            bail!("adapter.type is '{kind}': only LoRA adapters are supported");
        }
        let (ours, base) = (file.architecture(), self.file.architecture());
        if ours != base {
            bail!(
                "an adapter for architecture {}, the model is {}",
                ours.unwrap_or("(none)"),
                base.unwrap_or("(none)")
            );
        }
        if file.get("adapter.alora_invocation_tokens").is_some() {
            bail!("activated LoRA (adapter.alora_invocation_tokens) is not supported");
        }
        Ok(())
    }

    /// The matrices of the forward pass that read base tensor `name` (several where it is a
    /// fused tensor's bands), and the tensor's rows. Only plain matrix products take an
    /// update: attention, the mixers', dense FFNs' and the output projection.
    fn adaptable(&self, name: &str) -> Result<(Vec<&Mat>, usize)> {
        let tensors = self.file.tensors();
        let Some(index) = tensors.iter().position(|t| t.name == name) else {
            bail!("'{name}': the model has no such tensor (an adapter for another model?)");
        };
        if name == "token_embd.weight" {
            bail!("'{name}': adapters of the token embeddings are not supported");
        }
        let w = &self.weights;
        let mut mats: Vec<&Mat> = w.output.iter().collect();
        for l in &w.layers {
            mats.extend(l.mixer.matrices());
            if let Ffn::Dense(_) = l.ffn {
                mats.extend(l.ffn.matrices(None));
            }
        }
        mats.retain(|m| m.tensor == index);
        if mats.is_empty() {
            bail!(
                "'{name}': edgelm applies adapters to attention, mixer, dense FFN and output \
                 matrices only"
            );
        }
        let t = &tensors[index];
        Ok((mats, t.dims.get(1).copied().unwrap_or(1) as usize))
    }
}

/// `adapter.lora.alpha` (0 where absent, as llama.cpp).
fn alpha(file: &GgufFile) -> Result<f32> {
    let Some(v) = file.get("adapter.lora.alpha") else {
        return Ok(0.0);
    };
    match file.get_f32("adapter.lora.alpha") {
        Some(a) if a.is_finite() => Ok(a),
        _ => bail!("adapter.lora.alpha is {v:?}, not a finite f32"),
    }
}

/// Each base tensor's `lora_a` and `lora_b`, by the base tensor's name; any other tensor, or
/// half a pair, is refused.
fn pairs(file: &GgufFile) -> Result<BTreeMap<String, (&TensorInfo, &TensorInfo)>> {
    let mut halves: BTreeMap<String, (Option<&TensorInfo>, Option<&TensorInfo>)> = BTreeMap::new();
    for t in file.tensors() {
        if let Some(base) = t.name.strip_suffix(LORA_A) {
            halves.entry(base.to_string()).or_default().0 = Some(t);
        } else if let Some(base) = t.name.strip_suffix(LORA_B) {
            halves.entry(base.to_string()).or_default().1 = Some(t);
        } else {
            bail!(
                "tensor '{}' is not a LoRA pair's half (NAME{LORA_A} / NAME{LORA_B})",
                t.name
            );
        }
    }
    halves
        .into_iter()
        .map(|(base, pair)| match pair {
            (Some(a), Some(b)) => Ok((base, (a, b))),
            (Some(_), None) => bail!("'{base}' has {LORA_A} but no {LORA_B}"),
            _ => bail!("'{base}' has {LORA_B} but no {LORA_A}"),
        })
        .collect()
}

/// A is [rank × cols] and B [rows × rank] (ggml dims `[cols, rank]` and `[rank, rows]`) for a
/// base matrix of `rows` × `cols`: returns the rank.
fn check_shapes(
    base: &str,
    a: &TensorInfo,
    b: &TensorInfo,
    cols: usize,
    rows: usize,
) -> Result<usize> {
    let (cols, rows) = (cols as u64, rows as u64);
    let (&[a0, a1], &[b0, b1]) = (a.dims.as_slice(), b.dims.as_slice()) else {
        bail!(
            "'{base}': lora_a {:?} and lora_b {:?} are not both 2-D",
            a.dims,
            b.dims
        );
    };
    if a0 != cols || b1 != rows {
        bail!(
            "'{base}': lora_a {:?} and lora_b {:?} do not fit the model's {cols} × {rows} \
             matrix (an adapter for another model?)",
            a.dims,
            b.dims
        );
    }
    if a1 != b0 || a1 == 0 {
        bail!(
            "'{base}': lora_a's rank {a1} and lora_b's {b0} differ (or are 0): lora_a must \
             be [cols, rank] and lora_b [rank, rows]"
        );
    }
    if a1 > cols.min(rows) {
        bail!("'{base}': rank {a1} exceeds the matrix's smaller side ({cols} × {rows})");
    }
    Ok(a1 as usize)
}

/// Rows `first..first + rows` of tensor `t` (its data `bytes`) as a dense matrix: F16, BF16
/// and F32 as they are, any other type edgelm reads dequantized to f32.
fn band(t: &TensorInfo, bytes: &[u8], first: usize, rows: usize) -> Result<DenseMatrix> {
    let depth = t.dims[0] as usize;
    let row_bytes = t.row_bytes() as usize;
    let raw = &bytes[first * row_bytes..(first + rows) * row_bytes];
    if let Some(m) = DenseMatrix::pack(t.ty, raw, rows, depth) {
        return Ok(m);
    }
    let mut values = vec![0f32; rows * depth];
    for (dst, src) in values
        .chunks_exact_mut(depth)
        .zip(raw.chunks_exact(row_bytes))
    {
        dequantize_row(t.ty, src, dst).with_context(|| format!("tensor '{}'", t.name))?;
    }
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Ok(DenseMatrix::pack(GgmlType::F32, &bytes, rows, depth).expect("F32 packs"))
}
