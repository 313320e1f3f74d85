//! Weights by name, shape-checked against the config, kept as zero-copy views into the map.

use super::config::ModelConfig;
use crate::gguf::GgufFile;
use crate::quant::{self, GgmlType};
use anyhow::{bail, Context, Result};

/// A 2-D weight matrix in the file: `rows` output rows of `cols` values each (ggml's
/// dims = [cols, rows]); the bytes stay in the memory map.
#[derive(Clone, Debug)]
pub struct Mat {
    pub name: String,
    pub ty: GgmlType,
    pub cols: usize,
    pub rows: usize,
    /// Index into `GgufFile::tensors()`.
    tensor: usize,
}

impl Mat {
    pub fn data<'a>(&self, file: &'a GgufFile) -> &'a [u8] {
        file.tensor_data(&file.tensors()[self.tensor])
    }

    pub fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.cols as u64)
            .expect("checked at load") as usize
    }
}

/// One transformer block's weights. Shapes in (rows × cols) = (out × in).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,  // [n_embd]
    pub wq: Mat,              // [n_head*head_dim × n_embd]
    pub wk: Mat,              // [n_head_kv*head_dim × n_embd]
    pub wv: Mat,              // [n_head_kv*head_dim × n_embd]
    pub wo: Mat,              // [n_embd × n_head*head_dim]
    pub bq: Option<Vec<f32>>, // qwen2 biases
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub ffn_norm: Vec<f32>, // [n_embd]
    pub w_gate: Mat,        // [n_ff × n_embd]
    pub w_up: Mat,          // [n_ff × n_embd]
    pub w_down: Mat,        // [n_embd × n_ff]
}

#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: Mat,       // [vocab × n_embd]
    pub output_norm: Vec<f32>, // [n_embd]
    /// The output projection; the embedding matrix itself when the model ties them.
    pub output: Mat, // [vocab × n_embd]
    /// Per-dimension RoPE frequency factors (Llama 3.1 style), if the model has them.
    pub rope_freqs: Option<Vec<f32>>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights> {
        let e = cfg.n_embd;
        let token_embd = mat(file, "token_embd.weight", e, cfg.vocab_size)?;
        let output = if file.tensor("output.weight").is_some() {
            mat(file, "output.weight", e, cfg.vocab_size)?
        } else {
            token_embd.clone()
        };
        let rope_freqs = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(file, "rope_freqs.weight", cfg.n_rot / 2)?),
            None => None,
        };
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let opt_vec = |s: &str, len| -> Result<Option<Vec<f32>>> {
                match file.tensor(&n(s)) {
                    Some(_) => vector(file, &n(s), len).map(Some),
                    None => Ok(None),
                }
            };
            layers.push(LayerWeights {
                attn_norm: vector(file, &n("attn_norm.weight"), e)?,
                wq: mat(file, &n("attn_q.weight"), e, cfg.q_dim())?,
                wk: mat(file, &n("attn_k.weight"), e, cfg.kv_dim())?,
                wv: mat(file, &n("attn_v.weight"), e, cfg.kv_dim())?,
                wo: mat(file, &n("attn_output.weight"), cfg.q_dim(), e)?,
                bq: opt_vec("attn_q.bias", cfg.q_dim())?,
                bk: opt_vec("attn_k.bias", cfg.kv_dim())?,
                bv: opt_vec("attn_v.bias", cfg.kv_dim())?,
                ffn_norm: vector(file, &n("ffn_norm.weight"), e)?,
                w_gate: mat(file, &n("ffn_gate.weight"), e, cfg.n_ff)?,
                w_up: mat(file, &n("ffn_up.weight"), e, cfg.n_ff)?,
                w_down: mat(file, &n("ffn_down.weight"), cfg.n_ff, e)?,
            });
        }
        Ok(Weights {
            token_embd,
            output_norm: vector(file, "output_norm.weight", e)?,
            output,
            rope_freqs,
            layers,
        })
    }
}

fn tensor_index(file: &GgufFile, name: &str) -> Result<usize> {
    file.tensors()
        .iter()
        .position(|t| t.name == name)
        .with_context(|| format!("model has no tensor '{name}'"))
}

fn mat(file: &GgufFile, name: &str, cols: usize, rows: usize) -> Result<Mat> {
    let idx = tensor_index(file, name)?;
    let info = &file.tensors()[idx];
    let dims: Vec<u64> = info.dims.clone();
    if dims.len() > 2 && dims[2..].iter().any(|&d| d != 1) || dims.len() < 2 {
        bail!("tensor '{name}' has dims {dims:?}, expected [{cols}, {rows}]");
    }
    if dims[0] != cols as u64 || dims[1] != rows as u64 {
        bail!("tensor '{name}' has dims {dims:?}, expected [{cols}, {rows}]");
    }
    if !quant::is_supported(info.ty) {
        bail!(
            "tensor '{name}' has type {} which edgelm cannot compute with",
            info.ty
        );
    }
    Ok(Mat {
        name: name.to_owned(),
        ty: info.ty,
        cols,
        rows,
        tensor: idx,
    })
}

/// A small 1-D tensor (norm weights, biases), dequantized to f32 once at load.
fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let idx = tensor_index(file, name)?;
    let info = &file.tensors()[idx];
    if info.n_elements() != len as u64 {
        bail!(
            "tensor '{name}' has {} values, expected {len}",
            info.n_elements()
        );
    }
    let mut out = vec![0f32; len];
    quant::dequantize_row(info.ty, file.tensor_data(info), &mut out)
        .with_context(|| format!("tensor '{name}'"))?;
    Ok(out)
}
