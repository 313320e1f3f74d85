//! Hyper-parameters read from GGUF metadata (`{arch}.*` keys), with the defaults llama.cpp
//! applies, resolved per layer: which RoPE table (if any) and which attention window.

mod dense_out;
mod pooling;
mod qwen35;

pub use dense_out::DenseOutShape;
pub use pooling::Pooling;
pub use qwen35::imrope_turned_pairs;

use super::arch::{Family, SUPPORTED};
use crate::backend::ops::{Activation, DeltaNetShape, RopeLayout, Routing, Window};
use crate::gguf::GgufFile;
use crate::kv::{KvLayout, KvType, PageGeometry};
use anyhow::{bail, Context, Result};

/// How RoPE angles are scaled (`rope.scaling.type`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions interpolated by `freq_scale` (1 / `rope.scaling.factor`).
    Linear,
    /// Phi-3's per-pair factors, long or short by the context (`rope_factors_long/short`).
    LongRope,
    /// YaRN: low-frequency pairs interpolated by `freq_scale`, high-frequency ones kept, a
    /// ramp between, and the magnitude scaled.
    Yarn,
}

/// The parameters of one RoPE table before its factors (which are weights) are attached.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    pub base: f32,
    pub freq_scale: f32,
    pub mscale: f32,
    /// With YaRN scaling: the context the model was trained with before it (the ramp's
    /// corner dimensions follow from it).
    pub yarn_original_context: Option<usize>,
}

/// ggml's YaRN ramp edges (llama.cpp's defaults: `yarn_beta_fast`, `yarn_beta_slow`).
const YARN_BETA_FAST: f32 = 32.0;
const YARN_BETA_SLOW: f32 = 1.0;

impl RopeParams {
    /// Per-pair divisors of the angle that turn YaRN into a plain table with `freq_scale` 1:
    /// ggml's `rope_yarn` mixes the interpolated angle (`freq_scale · θ`) and the extrapolated
    /// one (θ) by a ramp over the pairs, which is θ times `freq_scale · (1 − r) + r`.
    /// `None` without YaRN.
    pub fn yarn_divisors(&self, n_rot: usize) -> Option<Vec<f32>> {
        let original = self.yarn_original_context? as f32;
        let corr_dim = |beta: f32| {
            n_rot as f32 * (original / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.base.ln())
        };
        let low = corr_dim(YARN_BETA_FAST).floor().max(0.0);
        let high = corr_dim(YARN_BETA_SLOW).ceil().min(n_rot as f32 - 1.0);
        Some(
            (0..n_rot / 2)
                .map(|i| {
                    let y = (i as f32 - low) / (high - low).max(0.001);
                    let ramp = 1.0 - y.clamp(0.0, 1.0);
                    1.0 / (self.freq_scale * (1.0 - ramp) + ramp)
                })
                .collect(),
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerConfig {
    /// Index into `ModelConfig::ropes`, or `None` for a layer without RoPE.
    pub rope: Option<usize>,
    /// The positions near a query it sees (`None`: no sliding window).
    pub window: Option<Window>,
    pub mixer: Mixer,
}

/// What a block mixes the positions with, between its first norm and the residual add.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    /// Attention over the KV pages.
    Attention,
    /// A gated short convolution (LFM2) over a per-sequence state of the last few positions,
    /// which lives in the pool's state slots, not in KV pages.
    ShortConv,
    /// A gated DeltaNet (Qwen3.5): a causal convolution over q, k and v, then the gated delta
    /// rule, both carried in the pool's state slots.
    DeltaNet,
}

/// The most positions a short convolution may span (LFM2's is 3): its state is that many
/// rows less one, per layer and sequence.
const MAX_SHORT_CONV: usize = 16;

/// A mixture-of-experts FFN's shape and routing (the same in every layer).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Each expert's FFN width (`expert_feed_forward_length`).
    pub n_ff_exp: usize,
    pub routing: Routing,
}

/// More experts than any released model has: a header asking for more is refused before
/// anything is sized by it.
const MAX_EXPERTS: usize = 1024;

impl MoeConfig {
    /// The experts of a `family` that has them, checked against each other.
    fn read(family: Family, k: &Keys<'_>, n_ff: usize) -> Result<Option<MoeConfig>> {
        let Some((gating, normalize)) = family.experts() else {
            return Ok(None);
        };
        let n_expert = k.req("expert_count")?;
        let used = k.req("expert_used_count")?;
        if n_expert > MAX_EXPERTS {
            bail!("{} = {n_expert} is implausible", k.name("expert_count"));
        }
        if used > n_expert {
            bail!(
                "{} = {used} is more than the {n_expert} experts there are",
                k.name("expert_used_count")
            );
        }
        // llama.cpp's default when the key is absent: the dense width split over the picks.
        let n_ff_exp = match k.u32("expert_feed_forward_length")? {
            Some(0) | None => n_ff / used,
            Some(v) => v,
        };
        if n_ff_exp == 0 || n_ff_exp > 1 << 20 {
            bail!(
                "{} = {n_ff_exp} is implausible",
                k.name("expert_feed_forward_length")
            );
        }
        let scale = k.f32("expert_weights_scale")?.unwrap_or(0.0);
        Ok(Some(MoeConfig {
            n_expert,
            n_ff_exp,
            routing: Routing {
                used,
                gating,
                normalize,
                scale: if scale == 0.0 { 1.0 } else { scale },
            },
        }))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// `general.architecture` as the file says it.
    pub arch: String,
    pub family: Family,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (the rest pass through).
    pub n_rot: usize,
    pub rope_layout: RopeLayout,
    pub rope_scaling: RopeScaling,
    /// The context the model was trained with before RoPE scaling (LongRoPE picks its long
    /// factors beyond it).
    pub rope_original_context: usize,
    pub ropes: Vec<RopeParams>,
    pub layers: Vec<LayerConfig>,
    /// ε of the norms: RMS norms (`attention.layer_norm_rms_epsilon`), or an encoder's layer
    /// norms (`attention.layer_norm_epsilon`).
    pub rms_eps: f32,
    pub activation: Activation,
    /// Multiplies Q·K before the softmax.
    pub attn_scale: f32,
    /// Multiplies Q after RoPE (Gemma and Phi-3 scale the queries rather than Q·K; which one is
    /// scaled changes how Q rounds into f16 attention).
    pub query_scale: f32,
    /// Multiplies the token embeddings (Gemma: √n_embd; Granite: `embedding_scale`).
    pub embed_scale: f32,
    /// Multiplies each block's attention and FFN outputs before the residual add (Granite).
    pub residual_scale: f32,
    /// Multiplies the logits (Granite: 1 / `logit_scale`).
    pub logit_scale: f32,
    /// `cap · tanh(logits / cap)` (Gemma's optional `final_logit_softcapping`).
    pub final_softcap: Option<f32>,
    /// The experts of every FFN, in a mixture-of-experts family.
    pub moe: Option<MoeConfig>,
    /// Positions a short-convolution layer spans (`shortconv.l_cache`), in a family that has
    /// them and a model with at least one such layer.
    pub short_conv: Option<usize>,
    /// The gated DeltaNet layers' shape, in a model that has them (Qwen3.5).
    pub delta_net: Option<DeltaNetShape>,
    /// Qwen3.5's M-RoPE sections (`rope.dimension_sections`): which rotated pairs a text
    /// token's position turns ([`imrope_turned_pairs`]).
    pub rope_sections: Option<[usize; 4]>,
    /// Multi-token-prediction layers stored after the trunk (`nextn_predict_layers`), which
    /// edgelm loads past without running (it does not draft with them).
    pub mtp_layers: usize,
    /// How an embedding request pools the prompt's hidden states (`pooling_type`).
    pub pooling: Pooling,
    /// The dense projections of a pooled vector, where the family has them and the file
    /// gives their widths (gemma-embedding).
    pub dense_out: Option<DenseOutShape>,
    /// An encoder's token types (`tokenizer.ggml.token_type_count`; every input is type 0);
    /// 0 in a decoder.
    pub token_types: usize,
    pub context_length: usize,
    pub vocab_size: usize,
}

/// Typed access to `{arch}.*` keys with errors that name the key.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn name(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn u32(&self, k: &str) -> Result<Option<usize>> {
        let full = self.name(k);
        match self.file.get(&full) {
            None => Ok(None),
            Some(v) => match v.as_u32() {
                Some(x) => Ok(Some(x as usize)),
                None if v.as_array().is_some() => {
                    bail!("{full} has a value per layer, which edgelm does not implement")
                }
                None => bail!("{full} is not an unsigned integer"),
            },
        }
    }

    fn req(&self, k: &str) -> Result<usize> {
        match self.u32(k)? {
            Some(0) => bail!("{} is 0", self.name(k)),
            Some(v) => Ok(v),
            None => bail!("GGUF has no {}", self.name(k)),
        }
    }

    fn f32(&self, k: &str) -> Result<Option<f32>> {
        let full = self.name(k);
        match self.file.get(&full) {
            None => Ok(None),
            Some(v) => match v.as_f32() {
                Some(x) if x.is_finite() => Ok(Some(x)),
                _ => bail!("{full} is not a finite number"),
            },
        }
    }

    fn bool(&self, k: &str) -> Result<Option<bool>> {
        let full = self.name(k);
        match self.file.get(&full) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .with_context(|| format!("{full} is not a boolean")),
        }
    }

    fn str(&self, k: &str) -> Option<&str> {
        self.file.get_str(&self.name(k))
    }
}

/// Gemma 3 27B, the one Gemma 3 with 62 layers: llama.cpp tells it apart by its layer count
/// (`LLM_TYPE_27B`) to scale its queries by the model width per head.
const GEMMA3_27B_LAYERS: usize = 62;

/// The model's dimensions, checked against each other and against sizes no real model has.
struct Shape {
    n_layers: usize,
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    head_dim: usize,
    n_rot: usize,
    /// Per layer, whether it attends (a hybrid's other layers have 0 KV heads).
    attends: Vec<bool>,
}

impl Shape {
    /// The dimensions the file declares, refused when implausible or inconsistent.
    fn read(k: &Keys<'_>) -> Result<Shape> {
        let n_layers = k.req("block_count")?;
        let n_embd = k.req("embedding_length")?;
        let n_ff = k.req("feed_forward_length")?;
        let n_head = k.req("attention.head_count")?;
        // Before anything is sized by these: a hostile header must not ask for gigabytes
        // (a per-layer table of 2^28 layers) before the weights could refute it.
        if n_layers > 1024 || n_embd > 65_536 || n_ff > 1 << 20 || n_head > 1024 {
            bail!(
                "implausible model shape: {n_layers} layers, n_embd {n_embd}, n_ff {n_ff}, {n_head} heads"
            );
        }
        let (n_head_kv, attends) = kv_heads(k, n_layers, n_head)?;
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            bail!("attention.head_count {n_head} is not a multiple of head_count_kv {n_head_kv}");
        }
        let head_dim = head_dim(k, n_embd, n_head)?;
        let n_rot = k.u32("rope.dimension_count")?.unwrap_or(head_dim);
        if n_rot > head_dim || !n_rot.is_multiple_of(2) {
            bail!("rope.dimension_count {n_rot} does not fit head dimension {head_dim}");
        }
        Ok(Shape {
            n_layers,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            attends,
        })
    }
}

/// `attention.head_count_kv`: one count for every layer (default `n_head`), or one per layer,
/// where a hybrid's layers without attention have 0 and the others one common count. Returns
/// that count and which layers attend.
fn kv_heads(k: &Keys<'_>, n_layers: usize, n_head: usize) -> Result<(usize, Vec<bool>)> {
    let key = k.name("attention.head_count_kv");
    let Some(arr) = k.file.get(&key).and_then(|v| v.as_array()) else {
        return Ok((
            k.u32("attention.head_count_kv")?.unwrap_or(n_head),
            vec![true; n_layers],
        ));
    };
    if arr.len() != n_layers {
        bail!("{key} has {} entries for {n_layers} layers", arr.len());
    }
    let counts: Vec<usize> = (0..n_layers)
        .map(|i| arr.get(i).and_then(|v| v.as_u32()).map(|v| v as usize))
        .collect::<Option<_>>()
        .with_context(|| format!("{key} is not an array of unsigned integers"))?;
    let mut attending = counts.iter().copied().filter(|&c| c > 0);
    let Some(n_head_kv) = attending.next() else {
        bail!("{key} is 0 in every layer: no layer attends");
    };
    if attending.any(|c| c != n_head_kv) {
        bail!("{key} has different counts on different layers ({counts:?}), which edgelm does not implement");
    }
    Ok((n_head_kv, counts.iter().map(|&c| c > 0).collect()))
}

/// The head dimension: `attention.key_length`, or the width split over the heads; the value
/// length, when given, must be the same.
fn head_dim(k: &Keys<'_>, n_embd: usize, n_head: usize) -> Result<usize> {
    let head_dim = match k.u32("attention.key_length")? {
        Some(d) => d,
        None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
        None => bail!("embedding_length {n_embd} is not a multiple of head_count {n_head}"),
    };
    if let Some(v) = k.u32("attention.value_length")? {
        if v != head_dim {
            bail!(
                "{} ({v}) differs from the key length ({head_dim}), which edgelm does not implement",
                k.name("attention.value_length")
            );
        }
    }
    if head_dim == 0 || head_dim % 2 != 0 || head_dim > 1024 {
        bail!("unsupported head dimension {head_dim}");
    }
    Ok(head_dim)
}

/// The global layers' RoPE: how it is scaled, its table and the context it was trained with.
struct GlobalRope {
    scaling: RopeScaling,
    params: RopeParams,
    original_context: usize,
}

impl GlobalRope {
    fn read(k: &Keys<'_>, context_length: usize) -> Result<GlobalRope> {
        let scaling = match k.str("rope.scaling.type").unwrap_or("linear") {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear,
            "longrope" => RopeScaling::LongRope,
            "yarn" => RopeScaling::Yarn,
            other => bail!(
                "{} = '{other}' is not implemented (edgelm does none, linear, longrope and yarn)",
                k.name("rope.scaling.type")
            ),
        };
        let factor = match k.f32("rope.scaling.factor")? {
            Some(f) => Some(f),
            None => k.f32("rope.scale_linear")?,
        };
        let freq_scale = match (scaling, factor) {
            (RopeScaling::None, _) | (_, None) | (_, Some(0.0)) => 1.0,
            (_, Some(f)) => 1.0 / f,
        };
        let original_context = k
            .u32("rope.scaling.original_context_length")?
            .unwrap_or(context_length);
        let attn_factor = k.f32("rope.scaling.attn_factor")?.unwrap_or(1.0);
        let yarn = scaling == RopeScaling::Yarn;
        let params = RopeParams {
            base: k.f32("rope.freq_base")?.unwrap_or(10_000.0),
            freq_scale,
            mscale: if yarn {
                attn_factor * yarn_mscale(k, 1.0 / freq_scale)?
            } else {
                attn_factor
            },
            yarn_original_context: yarn.then_some(original_context),
        };
        Ok(GlobalRope {
            scaling,
            params,
            original_context,
        })
    }
}

/// The magnitude YaRN scales cos and sin by at scaling `factor`, as llama.cpp sets its
/// `yarn_attn_factor` and ggml's `rope_yarn` multiplies it: `0.1 · ln(factor) + 1`, divided by
/// the same with `rope.scaling.yarn_log_multiplier` where the file gives one.
fn yarn_mscale(k: &Keys<'_>, factor: f32) -> Result<f32> {
    let mscale = |m: f32| {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * m * factor.ln() + 1.0
        }
    };
    Ok(match k.f32("rope.scaling.yarn_log_multiplier")? {
        Some(log_mul) if log_mul != 0.0 => mscale(1.0) / mscale(log_mul),
        _ => mscale(1.0),
    })
}

/// What a family changes on top of the plain llama model: further RoPE tables, per-layer RoPE
/// and windows, and the scales.
struct HyperParams {
    ropes: Vec<RopeParams>,
    layers: Vec<LayerConfig>,
    attn_scale: f32,
    query_scale: f32,
    embed_scale: f32,
    residual_scale: f32,
    logit_scale: f32,
    final_softcap: Option<f32>,
}

impl HyperParams {
    /// The hyper-parameters of `family`: the llama defaults with what the family changes.
    fn read(family: Family, k: &Keys<'_>, shape: &Shape, global: RopeParams) -> Result<Self> {
        let mut hp = HyperParams::llama(shape, global);
        match family {
            Family::Gemma3 => hp.gemma3(k, shape, global, false)?,
            Family::GemmaEmbedding => hp.gemma3(k, shape, global, true)?,
            Family::Smollm3 => hp.smollm3(),
            Family::Granite => hp.granite(k)?,
            Family::Phi3 => hp.scale_queries(hp.attn_scale),
            // Absolute position embeddings instead of RoPE.
            Family::Bert => hp.layers.iter_mut().for_each(|l| l.rope = None),
            Family::NomicBert => {}
            Family::GptOss => hp.gpt_oss(k, shape, global)?,
            Family::Llama
            | Family::Qwen2
            | Family::Qwen3
            | Family::Qwen3Moe
            | Family::Lfm2
            | Family::Qwen35 => {}
        }
        for (layer, &attends) in hp.layers.iter_mut().zip(&shape.attends) {
            if !attends {
                *layer = LayerConfig {
                    rope: None,
                    window: None,
                    mixer: Mixer::ShortConv,
                };
            }
        }
        Ok(hp)
    }

    /// Makes the layers `recurrent` marks gated DeltaNets (no RoPE, no window).
    fn delta_net_layers(&mut self, recurrent: &[bool]) {
        for (layer, &r) in self.layers.iter_mut().zip(recurrent) {
            if r {
                *layer = LayerConfig {
                    rope: None,
                    window: None,
                    mixer: Mixer::DeltaNet,
                };
            }
        }
    }

    /// The llama defaults: the global RoPE table in every layer, no window, Q·K scaled by
    /// 1/√head_dim and nothing else scaled.
    fn llama(shape: &Shape, global: RopeParams) -> HyperParams {
        HyperParams {
            ropes: vec![global],
            layers: vec![
                LayerConfig {
                    rope: Some(0),
                    window: None,
                    mixer: Mixer::Attention,
                };
                shape.n_layers
            ],
            attn_scale: 1.0 / (shape.head_dim as f32).sqrt(),
            query_scale: 1.0,
            embed_scale: 1.0,
            residual_scale: 1.0,
            logit_scale: 1.0,
            final_softcap: None,
        }
    }

    /// Scales the queries by `scale` instead of Q·K (Gemma, Phi-3).
    fn scale_queries(&mut self, scale: f32) {
        self.query_scale = scale;
        self.attn_scale = 1.0;
    }

    /// Gemma 3: embeddings scaled by √n_embd, an optional logit soft-cap, scaled queries, and
    /// sliding-window layers with their own RoPE table. gemma-embedding (`embedding`) is the
    /// same stack with symmetric windows (required), the head dimension's query scale at
    /// every size and no logits to cap, as llama.cpp's `llama_model_gemma_embedding`.
    fn gemma3(
        &mut self,
        k: &Keys<'_>,
        shape: &Shape,
        global: RopeParams,
        embedding: bool,
    ) -> Result<()> {
        self.embed_scale = (shape.n_embd as f32).sqrt();
        if !embedding {
            self.final_softcap = k.f32("final_logit_softcapping")?.filter(|&c| c != 0.0);
        }
        // Gemma scales the queries: by the model width per head for Gemma 3 27B, by the head
        // dimension for the others (llama.cpp's `f_attention_scale`).
        let query_scale = if shape.n_layers == GEMMA3_27B_LAYERS && !embedding {
            1.0 / ((shape.n_embd / shape.n_head) as f32).sqrt()
        } else {
            self.attn_scale
        };
        self.scale_queries(query_scale);
        let window = match embedding {
            true => Window::Symmetric(k.req("attention.sliding_window")?),
            false => match k.u32("attention.sliding_window")?.filter(|&w| w > 0) {
                Some(w) => Window::Trailing(w),
                None => return Ok(()),
            },
        };
        // Local layers have their own RoPE base and no scaling.
        self.ropes.push(RopeParams {
            base: k.f32("rope.freq_base_swa")?.unwrap_or(10_000.0),
            freq_scale: 1.0,
            mscale: global.mscale,
            yarn_original_context: None,
        });
        for (l, local) in sliding_pattern(k, shape.n_layers, 6)?
            .into_iter()
            .enumerate()
        {
            if local {
                self.layers[l] = LayerConfig {
                    rope: Some(1),
                    window: Some(window),
                    mixer: Mixer::Attention,
                };
            }
        }
        Ok(())
    }

    /// gpt-oss: a sliding window (`attention.sliding_window`, required) on every other layer
    /// (the even ones, by default), with the global RoPE table unless `rope.freq_base_swa`
    /// gives the local layers a base of their own.
    fn gpt_oss(&mut self, k: &Keys<'_>, shape: &Shape, global: RopeParams) -> Result<()> {
        let window = k.req("attention.sliding_window")?;
        let local_rope = match k.f32("rope.freq_base_swa")? {
            Some(base) if base != global.base => {
                self.ropes.push(RopeParams { base, ..global });
                1
            }
            _ => 0,
        };
        for (l, local) in sliding_pattern(k, shape.n_layers, 2)?
            .into_iter()
            .enumerate()
        {
            if local {
                self.layers[l] = LayerConfig {
                    rope: Some(local_rope),
                    window: Some(Window::Trailing(window)),
                    mixer: Mixer::Attention,
                };
            }
        }
        Ok(())
    }

    /// SmolLM3: every fourth layer has no RoPE (llama.cpp's `n_no_rope_layer_step`).
    fn smollm3(&mut self) {
        for (l, layer) in self.layers.iter_mut().enumerate() {
            if (l + 1) % 4 == 0 {
                layer.rope = None;
            }
        }
    }

    /// Granite: its logit, residual, embedding and attention scales, and RoPE switched off by
    /// `rope.scaling.finetuned = false`.
    fn granite(&mut self, k: &Keys<'_>) -> Result<()> {
        let scale = k
            .f32("logit_scale")?
            .with_context(|| format!("GGUF has no {}", k.name("logit_scale")))?;
        if scale == 0.0 {
            bail!("{} is 0", k.name("logit_scale"));
        }
        self.logit_scale = 1.0 / scale;
        self.residual_scale = k
            .f32("residual_scale")?
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0);
        self.embed_scale = k
            .f32("embedding_scale")?
            .filter(|&s| s != 0.0)
            .unwrap_or(1.0);
        if let Some(s) = k.f32("attention.scale")?.filter(|&s| s != 0.0) {
            self.attn_scale = s;
        }
        if k.bool("rope.scaling.finetuned")? == Some(false) {
            self.layers.iter_mut().for_each(|l| l.rope = None);
        }
        Ok(())
    }
}

impl ModelConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig> {
        let arch = file
            .architecture()
            .context("GGUF has no general.architecture")?
            .to_owned();
        let family = Family::from_arch(&arch).with_context(|| {
            format!(
                "unsupported architecture '{arch}' (supported: {})",
                SUPPORTED.join(", ")
            )
        })?;
        let k = Keys { file, arch: &arch };
        let shape = Shape::read(&k)?;
        let vocab_size = file
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_string_array())
            .map(|t| t.len())
            .context("GGUF has no tokenizer.ggml.tokens")?;
        let context_length = k.u32("context_length")?.unwrap_or(2048);
        let rms_eps = norm_eps(family, &k)?;
        let rope = GlobalRope::read(&k, context_length)?;
        let moe = MoeConfig::read(family, &k, shape.n_ff)?;
        let short_conv = short_conv(family, &k, &shape)?;
        let mut shape = shape;
        let qwen35 = match family {
            Family::Qwen35 => Some(qwen35::Qwen35::read(&k, &mut shape)?),
            _ => None,
        };
        let mut hp = HyperParams::read(family, &k, &shape, rope.params)?;
        if let Some(q) = &qwen35 {
            hp.delta_net_layers(&q.recurrent);
        }
        Ok(ModelConfig {
            family,
            n_layers: shape.n_layers,
            n_embd: shape.n_embd,
            n_ff: shape.n_ff,
            n_head: shape.n_head,
            n_head_kv: shape.n_head_kv,
            head_dim: shape.head_dim,
            n_rot: shape.n_rot,
            rope_layout: family.rope_layout(),
            rope_scaling: rope.scaling,
            rope_original_context: rope.original_context,
            ropes: hp.ropes,
            layers: hp.layers,
            rms_eps,
            activation: family.activation(),
            attn_scale: hp.attn_scale,
            query_scale: hp.query_scale,
            embed_scale: hp.embed_scale,
            residual_scale: hp.residual_scale,
            logit_scale: hp.logit_scale,
            final_softcap: hp.final_softcap,
            moe,
            short_conv,
            delta_net: qwen35.as_ref().map(|q| q.delta_net),
            rope_sections: qwen35.as_ref().map(|q| q.sections),
            mtp_layers: qwen35.as_ref().map_or(0, |q| q.mtp_layers),
            pooling: Pooling::read(&k)?,
            dense_out: match family.dense_out() {
                true => DenseOutShape::read(&k, shape.n_embd)?,
                false => None,
            },
            token_types: token_types(family, file)?,
            context_length,
            vocab_size,
            arch,
        })
    }

    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Values per token of `Buf::Mix`: a DeltaNet's convolution channels, or a query that
    /// packs its output gate (twice the query width); 0 in a model without either.
    pub fn mix_width(&self) -> usize {
        let gate = if self.family.output_gate() {
            2 * self.q_dim()
        } else {
            0
        };
        gate.max(self.delta_net.map_or(0, |d| d.channels()))
    }

    pub fn kv_dim(&self) -> usize {
        self.n_head_kv * self.head_dim
    }

    /// How the layers share block tables (one group unless some layers have windows; layers
    /// that do not attend hold no blocks).
    pub fn kv_layout(&self) -> KvLayout {
        let layers: Vec<_> = self
            .layers
            .iter()
            .map(|l| (l.mixer == Mixer::Attention).then_some(l.window.and_then(Window::trailing)))
            .collect();
        KvLayout::of_layers(&layers)
    }

    /// The short-convolution layers, in order (a layer's index among them is its state's).
    pub fn conv_layers(&self) -> Vec<usize> {
        (0..self.n_layers)
            .filter(|&l| self.layers[l].mixer == Mixer::ShortConv)
            .collect()
    }

    /// The gated DeltaNet layers, in order (a layer's index among them is its state's).
    pub fn delta_net_layers(&self) -> Vec<usize> {
        (0..self.n_layers)
            .filter(|&l| self.layers[l].mixer == Mixer::DeltaNet)
            .collect()
    }

    /// f32 values of one sequence's recurrent state: each short-convolution layer keeps the
    /// B·x rows of its last `short_conv - 1` positions; each gated DeltaNet its convolution's
    /// last rows and its delta rule's matrices. 0 for a model without such layers.
    pub fn state_floats(&self) -> usize {
        let conv = self
            .short_conv
            .map_or(0, |l| self.conv_layers().len() * (l - 1) * self.n_embd);
        let delta = self
            .delta_net
            .map_or(0, |d| self.delta_net_layers().len() * d.floats());
        conv + delta
    }

    /// The KV page geometry for this model: only its KV heads are stored (GQA), and a block
    /// holds one KV group's layers.
    pub fn page_geometry(&self, kv_type: KvType, block_size: usize) -> PageGeometry {
        PageGeometry {
            layers: self.kv_layout().layers_per_group(),
            kv_heads: self.n_head_kv,
            head_dim: self.head_dim,
            block_size,
            kv_type,
        }
    }
}

/// ε of the family's norms: an encoder's layer-norm ε is required (as llama.cpp's loader
/// requires it), a decoder's RMS-norm ε defaults to 1e-5.
fn norm_eps(family: Family, k: &Keys<'_>) -> Result<f32> {
    if family.encoder() {
        bidirectional(k)?;
        let key = "attention.layer_norm_epsilon";
        return k
            .f32(key)?
            .with_context(|| format!("GGUF has no {}", k.name(key)));
    }
    Ok(k.f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5))
}

/// An encoder's `attention.causal`, which must be false: llama.cpp reads the attention's
/// causality from the file (causal without the key), an encoder's converter writes false, and
/// a causal encoder is not implemented here.
fn bidirectional(k: &Keys<'_>) -> Result<()> {
    if k.bool("attention.causal")? != Some(false) {
        bail!(
            "{} is not false: edgelm runs an encoder with bidirectional attention only \
             (llama.cpp's default without the key is causal)",
            k.name("attention.causal")
        );
    }
    Ok(())
}

/// An encoder's token-type count (`tokenizer.ggml.token_type_count`), which llama.cpp's
/// loader requires to be there and non-zero; 0 for a decoder.
fn token_types(family: Family, file: &GgufFile) -> Result<usize> {
    const KEY: &str = "tokenizer.ggml.token_type_count";
    if !family.encoder() {
        return Ok(0);
    }
    match file.get_u32(KEY) {
        Some(0) | None => {
            bail!("an encoder needs {KEY} (its token-type count), which is 0 or absent")
        }
        Some(n) if n > 1024 => bail!("{KEY} = {n} is implausible"),
        Some(n) => Ok(n as usize),
    }
}

/// `shortconv.l_cache`, required where a family with short convolutions has such a layer,
/// and refused where none can be.
fn short_conv(family: Family, k: &Keys<'_>, shape: &Shape) -> Result<Option<usize>> {
    let any = shape.attends.iter().any(|&a| !a);
    if any && !family.short_convolutions() {
        bail!(
            "{} gives layers 0 KV heads: layers without attention are not part of the {} family",
            k.name("attention.head_count_kv"),
            k.arch
        );
    }
    if !any {
        return Ok(None);
    }
    let l = k.req("shortconv.l_cache")?;
    if !(2..=MAX_SHORT_CONV).contains(&l) {
        bail!(
            "{} = {l}: a short convolution spans 2 to {MAX_SHORT_CONV} positions",
            k.name("shortconv.l_cache")
        );
    }
    Ok(Some(l))
}

/// Which layers are local (sliding-window): `attention.sliding_window_pattern` as an array of
/// booleans, or as a period N (the last layer of every N is global), default the family's
/// `period`, as llama.cpp's `load_swa_pattern`.
fn sliding_pattern(k: &Keys<'_>, n_layers: usize, period: usize) -> Result<Vec<bool>> {
    let key = k.name("attention.sliding_window_pattern");
    if let Some(v) = k.file.get(&key) {
        if let Some(arr) = v.as_array() {
            let flags: Option<Vec<bool>> = (0..arr.len())
                .map(|i| arr.get(i).and_then(|x| x.as_bool()))
                .collect();
            let flags = flags.with_context(|| format!("{key} is not an array of booleans"))?;
            if flags.len() != n_layers {
                bail!("{key} has {} entries for {n_layers} layers", flags.len());
            }
            return Ok(flags);
        }
    }
    let period = k.u32("attention.sliding_window_pattern")?.unwrap_or(period);
    Ok((0..n_layers)
        .map(|l| period == 0 || l % period < period - 1)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, GgufWriter, Value};

    fn header(block_count: u32) -> GgufFile {
        let bytes = GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("llama.block_count", Value::U32(block_count))
            .kv("llama.embedding_length", Value::U32(64))
            .kv("llama.feed_forward_length", Value::U32(128))
            .kv("llama.attention.head_count", Value::U32(4))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(); 8])),
            )
            .to_bytes();
        GgufFile::from_bytes(bytes).unwrap()
    }

    /// YaRN as ggml's `rope_yarn` computes it, pair by pair: the extrapolated angle θ, the
    /// interpolated one `freq_scale · θ`, mixed by the ramp between the corner dimensions;
    /// the divisors must give the same angle.
    #[test]
    fn yarn_divisors_give_ggmls_mixed_angle() {
        let (n_rot, base, original, factor) = (64usize, 10_000f32, 4096usize, 8.0f32);
        let p = RopeParams {
            base,
            freq_scale: 1.0 / factor,
            mscale: 1.0,
            yarn_original_context: Some(original),
        };
        let div = p.yarn_divisors(n_rot).unwrap();
        let corr = |beta: f32| {
            n_rot as f32 * (original as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let (low, high) = (corr(32.0).floor().max(0.0), corr(1.0).ceil().min(63.0));
        for (i, d) in div.iter().enumerate() {
            let theta = 1000.0 * base.powf(-2.0 * i as f32 / n_rot as f32);
            let ramp = 1.0 - ((i as f32 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
            let want = theta / factor * (1.0 - ramp) + theta * ramp;
            assert!((theta / d - want).abs() <= 1e-4 * want, "pair {i}");
        }
        // High-frequency pairs keep their angle; the lowest are interpolated in full.
        assert_eq!(div[0], 1.0);
        assert!((div[n_rot / 2 - 1] - factor).abs() < 1e-5);
        // Without YaRN, no divisors.
        let plain = RopeParams {
            yarn_original_context: None,
            ..p
        };
        assert!(plain.yarn_divisors(n_rot).is_none());
    }

    #[test]
    fn a_hostile_layer_count_is_refused_before_anything_is_sized_by_it() {
        // 189 M layers once asked for a 6 GB per-layer table before the shape check ran.
        let err = ModelConfig::from_gguf(&header(189_089_607)).unwrap_err();
        assert!(err.to_string().contains("implausible model shape"), "{err}");
        let cfg = ModelConfig::from_gguf(&header(2)).unwrap();
        assert_eq!(cfg.layers.len(), 2);
    }

    /// A gemma-embedding header of 6 layers, with the dense widths `dense` (2 in, 2 out, 3 in,
    /// 3 out) where given.
    fn gemma_embedding(dense: Option<[u32; 4]>) -> Result<ModelConfig> {
        let arch = "gemma-embedding";
        let mut w = GgufWriter::new()
            .kv("general.architecture", Value::String(arch.into()))
            .kv(format!("{arch}.block_count"), Value::U32(6))
            .kv(format!("{arch}.embedding_length"), Value::U32(64))
            .kv(format!("{arch}.feed_forward_length"), Value::U32(128))
            .kv(format!("{arch}.attention.head_count"), Value::U32(4))
            .kv(format!("{arch}.attention.key_length"), Value::U32(32))
            .kv(format!("{arch}.attention.sliding_window"), Value::U32(512))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(); 8])),
            );
        let names = [
            "dense_2_feat_in",
            "dense_2_feat_out",
            "dense_3_feat_in",
            "dense_3_feat_out",
        ];
        for (k, v) in names.iter().zip(dense.unwrap_or_default()) {
            if dense.is_some() {
                w = w.kv(format!("{arch}.{k}"), Value::U32(v));
            }
        }
        ModelConfig::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap())
    }

    #[test]
    fn gemma_embedding_has_symmetric_windows_and_no_causal_mask() {
        let cfg = gemma_embedding(None).unwrap();
        assert!(!cfg.family.causal() && cfg.family.embeds_only() && !cfg.family.encoder());
        let windows: Vec<_> = cfg.layers.iter().map(|l| l.window).collect();
        let local = Some(Window::Symmetric(512));
        assert_eq!(windows, [local, local, local, local, local, None]);
        assert_eq!(cfg.layers[0].rope, Some(1));
        // A symmetric window reads ahead: the KV layout releases nothing behind it.
        assert_eq!(cfg.kv_layout().num_groups(), 1);
        assert!((cfg.query_scale - 1.0 / 32f32.sqrt()).abs() < 1e-7);
        assert_eq!((cfg.attn_scale, cfg.embed_scale), (1.0, 8.0));
        assert_eq!(cfg.dense_out, None);
        let cfg = gemma_embedding(Some([64, 128, 128, 64])).unwrap();
        assert_eq!(cfg.dense_out, Some(DenseOutShape { hidden: 128 }));
        let refused = |dense, what: &str| {
            let e = gemma_embedding(Some(dense)).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        refused([32, 128, 128, 64], "must both be n_embd");
        refused(
            [64, 128, 96, 64],
            "dense_2's output must be dense_3's input",
        );
    }

    /// nomic-bert: an encoder (layer-norm ε and bidirectional attention required) that keeps
    /// its RoPE, NeoX-style, where bert drops it for position embeddings.
    #[test]
    fn nomic_bert_is_an_encoder_with_rope() {
        let arch = "nomic-bert";
        let bytes = GgufWriter::new()
            .kv("general.architecture", Value::String(arch.into()))
            .kv(format!("{arch}.block_count"), Value::U32(2))
            .kv(format!("{arch}.embedding_length"), Value::U32(64))
            .kv(format!("{arch}.feed_forward_length"), Value::U32(128))
            .kv(format!("{arch}.attention.head_count"), Value::U32(4))
            .kv(
                format!("{arch}.attention.layer_norm_epsilon"),
                Value::F32(1e-12),
            )
            .kv(format!("{arch}.attention.causal"), Value::Bool(false))
            .kv("tokenizer.ggml.token_type_count", Value::U32(2))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(); 8])),
            )
            .to_bytes();
        let cfg = ModelConfig::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap();
        let f = cfg.family;
        assert!(f.encoder() && !f.causal() && !f.absolute_positions() && f.gated_ffn());
        assert_eq!(cfg.rope_layout, RopeLayout::Neox);
        assert!(cfg
            .layers
            .iter()
            .all(|l| l.rope == Some(0) && l.window.is_none()));
        assert_eq!(cfg.token_types, 2);
    }

    /// An LFM2 header: 3 layers whose KV head counts are `kv`, convolutions of `l_cache` taps.
    fn lfm2(arch: &str, kv: Vec<i32>, l_cache: Option<u32>) -> Result<ModelConfig> {
        let mut w = GgufWriter::new()
            .kv("general.architecture", Value::String(arch.into()))
            .kv(format!("{arch}.block_count"), Value::U32(3))
            .kv(format!("{arch}.embedding_length"), Value::U32(64))
            .kv(format!("{arch}.feed_forward_length"), Value::U32(128))
            .kv(format!("{arch}.attention.head_count"), Value::U32(4))
            .kv(
                format!("{arch}.attention.head_count_kv"),
                Value::Array(Array::I32(kv)),
            )
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(); 8])),
            );
        if let Some(l) = l_cache {
            w = w.kv(format!("{arch}.shortconv.l_cache"), Value::U32(l));
        }
        ModelConfig::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap())
    }

    #[test]
    fn a_hybrids_layers_come_from_its_per_layer_kv_heads() {
        let cfg = lfm2("lfm2", vec![0, 2, 0], Some(3)).unwrap();
        let mixers: Vec<Mixer> = cfg.layers.iter().map(|l| l.mixer).collect();
        assert_eq!(
            mixers,
            [Mixer::ShortConv, Mixer::Attention, Mixer::ShortConv]
        );
        assert_eq!((cfg.n_head_kv, cfg.short_conv), (2, Some(3)));
        assert_eq!(cfg.conv_layers(), [0, 2]);
        assert_eq!(cfg.state_floats(), 2 * 2 * 64);
        let layout = cfg.kv_layout();
        assert_eq!(layout.groups.len(), 1);
        assert_eq!(layout.groups[0].layers, [1]);

        let refused = |r: Result<ModelConfig>, what: &str| {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        refused(lfm2("lfm2", vec![0, 2, 0], None), "shortconv.l_cache");
        refused(lfm2("lfm2", vec![0, 2, 0], Some(1)), "2 to 16 positions");
        refused(lfm2("lfm2", vec![0, 2, 4], Some(3)), "different counts");
        refused(lfm2("lfm2", vec![0, 0, 0], Some(3)), "no layer attends");
        refused(lfm2("lfm2", vec![0, 2], Some(3)), "2 entries for 3 layers");
        refused(
            lfm2("llama", vec![0, 2, 2], Some(3)),
            "not part of the llama family",
        );
        // A dense model with a per-layer array of equal counts is plain attention.
        let cfg = lfm2("llama", vec![2, 2, 2], None).unwrap();
        assert!(cfg.layers.iter().all(|l| l.mixer == Mixer::Attention));
        assert_eq!(cfg.state_floats(), 0);
    }
}
