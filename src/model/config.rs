//! Hyper-parameters read from GGUF metadata (`{arch}.*` keys), with the defaults llama.cpp
//! applies, resolved per layer: which RoPE table (if any) and which attention window.

mod dense_out;
mod encoder;
mod gemma3;
mod gpt_oss;
mod granite;
mod lfm2;
mod mrope;
mod pooling;
mod qwen35;
mod smollm3;

pub use dense_out::DenseOutShape;
pub use mrope::MropeSections;
pub use pooling::Pooling;

use super::arch::{Arch, Family};
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
    /// The M-RoPE sections of Qwen3.5, Qwen3-VL (interleaved) and Qwen2.5-VL (in runs):
    /// which rotated pairs a text token's position turns, and which an image position's row
    /// and column turn ([`MropeSections`]).
    pub rope_sections: Option<MropeSections>,
    /// Qwen3-VL: the first layers that each add an image position's next DeepStack row to
    /// their output (`n_deepstack_layers`); an image row is `n_embd` times one more wide.
    pub deepstack_layers: usize,
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
            | Family::Qwen2Vl
            | Family::Qwen3
            | Family::Qwen3Vl
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
                Arch::names()
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
        let short_conv = lfm2::short_conv(family, &k, &shape)?;
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
            rope_sections: mrope_sections(family, &k, shape.n_rot, qwen35.as_ref())?,
            deepstack_layers: match family {
                Family::Qwen3Vl => deepstack_layers(&k, shape.n_layers)?,
                _ => 0,
            },
            mtp_layers: qwen35.as_ref().map_or(0, |q| q.mtp_layers),
            pooling: Pooling::read(&k)?,
            dense_out: match family.dense_out() {
                true => DenseOutShape::read(&k, shape.n_embd)?,
                false => None,
            },
            token_types: match family.encoder() {
                true => encoder::token_types(file)?,
                false => 0,
            },
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

/// Qwen3-VL's `n_deepstack_layers`: the first layers that add DeepStack rows, at most all.
/// The M-RoPE sections of a family that has them: Qwen3-VL interleaves them (as Qwen3.5,
/// read with its other keys), Qwen2-VL lays them in runs.
fn mrope_sections(
    family: Family,
    k: &Keys<'_>,
    n_rot: usize,
    qwen35: Option<&qwen35::Qwen35>,
) -> Result<Option<MropeSections>> {
    Ok(match family {
        Family::Qwen3Vl => Some(MropeSections::read(k, n_rot, true)?),
        Family::Qwen2Vl => Some(MropeSections::read(k, n_rot, false)?),
        _ => qwen35.map(|q| q.sections),
    })
}

fn deepstack_layers(k: &Keys<'_>, n_layers: usize) -> Result<usize> {
    let n = k.u32("n_deepstack_layers")?.unwrap_or(0);
    if n > n_layers {
        bail!(
            "{} is {n}, past the {n_layers} layers",
            k.name("n_deepstack_layers")
        );
    }
    Ok(n)
}

/// ε of the family's norms: an encoder's layer-norm ε is required (as llama.cpp's loader
/// requires it), a decoder's RMS-norm ε defaults to 1e-5.
fn norm_eps(family: Family, k: &Keys<'_>) -> Result<f32> {
    if family.encoder() {
        return encoder::layer_norm_eps(k);
    }
    Ok(k.f32("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5))
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
}
