//! The transformers edgelm runs, decoders and the encoders that embed: which families there
//! are (`arch`), their hyper-parameters (`config`), their weights (`weights`) and the one
//! forward pass every backend runs (`forward`).

mod adapter;
mod arch;
mod config;
mod forward;
mod weights;

pub use crate::backend::batch::{BatchMeta, Logits};
pub use crate::backend::ops::{
    ExpertShape, Mat, Network, RopeLayout, RopeTable, Shape, VecRef, Widths, Window,
};
pub use arch::{Arch, Family, ARCHITECTURES};
pub use config::{DenseOutShape, LayerConfig, ModelConfig, MoeConfig, Pooling, RopeScaling};
pub(crate) use weights::Binder;
pub use weights::{DenseFfn, DenseOut, EncoderInput, Ffn, LayerWeights, Weights};

use crate::backend::cpu::packed_weights::PackedWeights;
use crate::gguf::GgufFile;
use crate::kv::KvLayout;
use anyhow::Result;
use std::path::Path;
use std::sync::{Arc, OnceLock};

pub struct Model {
    pub file: Arc<GgufFile>,
    pub config: ModelConfig,
    pub weights: Weights,
    /// How the layers share KV block tables (see `kv::KvLayout`).
    pub layout: KvLayout,
    /// The shapes and RoPE tables backends size themselves by, for the context the model runs
    /// at (see [`Model::set_context`]).
    pub shape: Shape,
    /// The matrices packed for the CPU, made when the CPU first runs the model (a model the
    /// GPU runs never pays for them).
    cpu_packed: OnceLock<PackedWeights>,
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
        let layout = config.kv_layout();
        let shape = Shape {
            causal: config.family.causal(),
            widths: Widths {
                embd: config.n_embd,
                q: config.q_dim(),
                kv: config.kv_dim(),
                ff: config.n_ff,
                vocab: config.vocab_size,
                mix: config.mix_width(),
                inner: config.delta_net.map_or(0, |d| d.value_dim()),
                dt_heads: config.delta_net.map_or(0, |d| d.v_heads),
            },
            n_head: config.n_head,
            n_head_kv: config.n_head_kv,
            head_dim: config.head_dim,
            n_rot: config.n_rot,
            rope_layout: config.rope_layout,
            ropes: weights.rope_tables(&config, config.context_length),
            experts: config.moe.map(|m| ExpertShape {
                count: m.n_expert,
                used: m.routing.used,
                ff: m.n_ff_exp,
            }),
            state_floats: config.state_floats(),
            conv_taps: config.short_conv.unwrap_or(0),
            delta_net: config.delta_net,
            mrope: config.rope_sections.map(|s| s.components(config.n_rot)),
            deepstack: config.deepstack_layers,
        };
        Ok(Model {
            file,
            config,
            weights,
            layout,
            shape,
            cpu_packed: OnceLock::new(),
        })
    }

    /// The matrices the CPU computes from in the packed layout (packed on the first call).
    pub fn cpu_packed(&self) -> &PackedWeights {
        self.cpu_packed
            .get_or_init(|| PackedWeights::build(&self.file, &self.weights.matrices()))
    }

    /// Runs the model at a context of `context` tokens (LongRoPE picks its factors by it, as
    /// llama.cpp does by its context size).
    pub fn set_context(&mut self, context: usize) {
        self.shape.ropes = self.weights.rope_tables(&self.config, context);
    }

    /// Size of the model file (what mapping it can make resident).
    pub fn file_bytes(&self) -> usize {
        self.file.file_size() as usize
    }

    /// Bytes of weight data one decoding token reads: every matrix once, but of a mixture of
    /// experts only the router and the experts it picks.
    pub fn weight_bytes(&self) -> usize {
        let used = self.config.moe.map(|m| m.routing.used);
        Self::bytes_of(&self.weights.active_matrices(used))
    }

    /// Bytes of every matrix (of a mixture of experts, every expert's).
    pub fn all_weight_bytes(&self) -> usize {
        Self::bytes_of(&self.weights.matrices())
    }

    fn bytes_of(mats: &[&Mat]) -> usize {
        mats.iter().map(|m| m.rows * m.row_bytes()).sum()
    }

    /// Parameters of the matrices: (all of them, those one token uses).
    pub fn parameters(&self) -> (usize, usize) {
        let count = |mats: Vec<&Mat>| mats.iter().map(|m| m.rows * m.cols).sum::<usize>();
        let used = self.config.moe.map(|m| m.routing.used);
        (
            count(self.weights.matrices()),
            count(self.weights.active_matrices(used)),
        )
    }

    /// Multiply-add FLOPs (2 per weight) of one token through the transformer blocks (of a
    /// mixture of experts, through the experts it picks).
    pub fn block_flops_per_token(&self) -> f64 {
        let (_, active) = self.parameters();
        2.0 * active as f64 - self.output_flops()
    }

    /// FLOPs of one row of logits (the output projection; 0 for a model that only embeds).
    pub fn output_flops(&self) -> f64 {
        let out = self.weights.output.as_ref();
        out.map_or(0.0, |o| 2.0 * (o.rows * o.cols) as f64)
    }

    /// Whether the model can generate text: it has an output head (an encoder only embeds).
    pub fn generates(&self) -> bool {
        self.weights.output.is_some()
    }

    /// A pooled vector as the model hands it out, before it is normalised: through its dense
    /// projections where it has them (gemma-embedding), else as it is.
    pub fn project_pooled(&self, pooled: Vec<f32>) -> Vec<f32> {
        match &self.weights.dense_out {
            Some(d) => d.apply(&self.weights.arena, &pooled),
            None => pooled,
        }
    }

    /// Attention FLOPs of one query token over `ctx` positions (K·Q and P·V, every layer;
    /// a windowed layer reads at most its window).
    pub fn attention_flops(&self, ctx: usize) -> f64 {
        let c = &self.config;
        let positions: usize = c
            .layers
            .iter()
            .map(|l| l.window.map_or(ctx, |w| w.span(ctx)))
            .sum();
        4.0 * (c.n_head * c.head_dim * positions) as f64
    }
}
