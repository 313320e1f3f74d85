//! The Llama-family decoder: config, weights and the batched forward pass over paged KV.

mod batch;
mod config;
mod forward;
mod weights;

pub use batch::{BatchMeta, Logits};
pub use config::{ModelConfig, RopeLayout};
pub use weights::{LayerWeights, Mat, Weights};

use crate::gguf::GgufFile;
use anyhow::Result;
use std::path::Path;
use std::sync::Arc;

pub struct Model {
    pub file: Arc<GgufFile>,
    pub config: ModelConfig,
    pub weights: Weights,
}

impl Model {
    pub fn load(path: &Path) -> Result<Model> {
        let file = GgufFile::open(path)
            .map_err(|e| anyhow::anyhow!("cannot load model {}: {e}", path.display()))?;
        Self::from_file(Arc::new(file))
    }

    pub fn from_file(file: Arc<GgufFile>) -> Result<Model> {
        let config = ModelConfig::from_gguf(&file)?;
        let weights = Weights::load(&file, &config)?;
        Ok(Model {
            file,
            config,
            weights,
        })
    }

    /// Size of the model file (what mapping it can make resident).
    pub fn file_bytes(&self) -> usize {
        self.file.file_size() as usize
    }

    /// Bytes of weight data a decode step reads (every matrix once).
    pub fn weight_bytes(&self) -> usize {
        let w = &self.weights;
        let mut total = w.output.rows * w.output.row_bytes();
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                total += m.rows * m.row_bytes();
            }
        }
        total
    }

    /// Multiply-add FLOPs (2 per weight) of one token through the transformer blocks.
    pub fn block_flops_per_token(&self) -> f64 {
        let w = &self.weights;
        let mut macs = 0usize;
        for l in &w.layers {
            for m in [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down] {
                macs += m.rows * m.cols;
            }
        }
        2.0 * macs as f64
    }

    /// FLOPs of one row of logits (the output projection).
    pub fn output_flops(&self) -> f64 {
        2.0 * (self.weights.output.rows * self.weights.output.cols) as f64
    }

    /// Attention FLOPs of one query token over `ctx` positions (K·Q and P·V, every layer).
    pub fn attention_flops(&self, ctx: usize) -> f64 {
        let c = &self.config;
        4.0 * (c.n_layers * c.n_head * c.head_dim * ctx) as f64
    }
}
