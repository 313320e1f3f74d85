//! Architecture hyper-parameters read from GGUF metadata (`{arch}.*` keys).

use crate::gguf::GgufFile;
use crate::kv::{KvType, PageGeometry};
use anyhow::{bail, Context, Result};

/// How RoPE pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs (x[2i], x[2i+1]): llama's GGUF convention (the converter permutes Q/K).
    Normal,
    /// Halves (x[i], x[i + n_rot/2]): GPT-NeoX style, used by qwen2 and others.
    Neox,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: String,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (the rest pass through).
    pub n_rot: usize,
    pub rope_theta: f32,
    pub rope_layout: RopeLayout,
    pub rms_eps: f32,
    pub context_length: usize,
    pub vocab_size: usize,
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let arch = file
            .architecture()
            .context("GGUF has no general.architecture")?
            .to_owned();
        let rope_layout = match arch.as_str() {
            "llama" | "mistral" | "granite" => RopeLayout::Normal,
            "qwen2" | "qwen3" => RopeLayout::Neox,
            other => bail!("unsupported architecture '{other}' (supported: llama, mistral, qwen2)"),
        };
        let key = |k: &str| format!("{arch}.{k}");
        let req = |k: &str| -> Result<usize> {
            let full = key(k);
            let v = file
                .get_u32(&full)
                .with_context(|| format!("GGUF has no {full}"))? as usize;
            if v == 0 {
                bail!("{full} is 0");
            }
            Ok(v)
        };
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = file
            .get_u32(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            bail!("attention.head_count {n_head} is not a multiple of head_count_kv {n_head_kv}");
        }
        let head_dim = match file.get_u32(&key("attention.key_length")) {
            Some(d) => d as usize,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => bail!("embedding_length {n_embd} is not a multiple of head_count {n_head}"),
        };
        if head_dim == 0 || head_dim % 2 != 0 || head_dim > 1024 {
            bail!("unsupported head dimension {head_dim}");
        }
        let n_rot = file
            .get_u32(&key("rope.dimension_count"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            bail!("rope.dimension_count {n_rot} does not fit head dimension {head_dim}");
        }
        let vocab_size = file
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_string_array())
            .map(|t| t.len())
            .context("GGUF has no tokenizer.ggml.tokens")?;
        let cfg = ModelConfig {
            n_layers: req("block_count")?,
            n_ff: req("feed_forward_length")?,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            rope_theta: file.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0),
            rope_layout,
            rms_eps: file
                .get_f32(&key("attention.layer_norm_rms_epsilon"))
                .unwrap_or(1e-5),
            context_length: file
                .get_u32(&key("context_length"))
                .map(|v| v as usize)
                .unwrap_or(2048),
            vocab_size,
            arch,
        };
        if cfg.n_layers > 1024 || cfg.n_embd > 65_536 || cfg.n_ff > 1 << 20 {
            bail!("implausible model shape: {cfg:?}");
        }
        Ok(cfg)
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// The KV page geometry for this model: only its KV heads are stored (GQA).
    pub fn page_geometry(&self, kv_type: KvType, block_tokens: usize) -> PageGeometry {
        PageGeometry {
            layers: self.n_layers,
            kv_heads: self.n_head_kv,
            head_dim: self.head_dim,
            block_tokens,
            kv_type,
        }
    }
}
