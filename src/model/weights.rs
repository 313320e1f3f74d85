//! Weights by name, shape-checked against the config, kept as zero-copy views into the map.
//!
//! Loading is strict: every tensor the family needs must be there with the right shape, and
//! every tensor in the file must be one the family uses. A file with a tensor nothing consumes
//! is refused (naming it), never run with a part of the model ignored.

use super::arch::Optional;
use super::config::{Mixer, ModelConfig, MoeConfig, RopeScaling};
use crate::backend::ops::{
    DeltaNet, DeltaNetShape, ExpertBiases, Experts, LayerNorm, Mat, RopeTable, ShortConv, VecRef,
};
use crate::gguf::GgufFile;
use anyhow::{bail, Context, Result};

/// One block's weights. Shapes in (rows × cols) = (out × in).
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// The norm before the mixer (attention or convolution); an encoder has none.
    pub attn_norm: Option<VecRef>, // [n_embd]
    pub mixer: MixerWeights,
    pub post_attn_norm: Option<VecRef>, // [n_embd] (gemma3)
    /// An encoder's layer norm of the residual after the mixer's output is added
    /// (`attn_output_norm`).
    pub attn_out_norm: Option<LayerNorm>,
    pub ffn_norm: Option<VecRef>, // [n_embd]; an encoder has none
    pub ffn: Ffn,
    pub post_ffn_norm: Option<VecRef>, // [n_embd] (gemma3)
    /// An encoder's layer norm of the residual after the FFN's output is added
    /// (`layer_output_norm`).
    pub out_norm: Option<LayerNorm>,
}

/// What a block mixes positions with (`config::Mixer`).
#[derive(Clone, Debug)]
pub enum MixerWeights {
    Attention(AttentionWeights),
    ShortConv(ShortConvWeights),
    DeltaNet(DeltaNetWeights),
}

impl MixerWeights {
    pub fn matrices(&self) -> Vec<&Mat> {
        match self {
            MixerWeights::Attention(a) => vec![&a.wq, &a.wk, &a.wv, &a.wo],
            MixerWeights::ShortConv(c) => vec![&c.b, &c.c, &c.x, &c.out],
            MixerWeights::DeltaNet(d) => vec![&d.qkv, &d.z, &d.beta, &d.alpha, &d.out],
        }
    }
}

/// A block's attention. Q/K/V may be bands of one fused tensor.
#[derive(Clone, Debug)]
pub struct AttentionWeights {
    pub wq: Mat,            // [n_head·head_dim × n_embd]
    pub wk: Mat,            // [n_head_kv·head_dim × n_embd]
    pub wv: Mat,            // [n_head_kv·head_dim × n_embd]
    pub bq: Option<VecRef>, // Q/K/V biases (qwen2)
    pub bk: Option<VecRef>,
    pub bv: Option<VecRef>,
    pub q_norm: Option<VecRef>, // [head_dim] (qwen3, gemma3)
    pub k_norm: Option<VecRef>, // [head_dim]
    pub wo: Mat,                // [n_embd × n_head·head_dim]
    pub bo: Option<VecRef>,     // [n_embd]
    pub sinks: Option<VecRef>,  // [n_head] (gpt-oss)
    /// `wq` packs a sigmoid output gate beside each head's query (qwen35): it has
    /// 2·n_head·head_dim rows, per head the query's then the gate's.
    pub output_gate: bool,
}

/// A gated DeltaNet (Qwen3.5): the in-projections, the op's vectors and the out-projection.
#[derive(Clone, Debug)]
pub struct DeltaNetWeights {
    pub qkv: Mat,   // [channels × n_embd]: q, k, v (`attn_qkv`)
    pub z: Mat,     // [value_dim × n_embd] (`attn_gate`)
    pub beta: Mat,  // [v_heads × n_embd] (`ssm_beta`)
    pub alpha: Mat, // [v_heads × n_embd] (`ssm_alpha`)
    pub op: DeltaNet,
    pub out: Mat, // [n_embd × value_dim] (`ssm_out`)
}

/// A gated short convolution (LFM2): `in_proj`'s three bands B, C and x, the depthwise kernel
/// (per channel, `l` taps, oldest position first) and the out-projection.
#[derive(Clone, Debug)]
pub struct ShortConvWeights {
    pub b: Mat, // [n_embd × n_embd], band 0 of shortconv.in_proj
    pub c: Mat, // band 1
    pub x: Mat, // band 2
    /// The convolution as the op takes it: its kernel ([n_embd · l]), its length and which
    /// of the model's convolution layers it is (its place in a sequence's state).
    pub conv: ShortConv,
    pub out: Mat, // [n_embd × n_embd]
}

/// A block's feed-forward network.
#[derive(Clone, Debug)]
pub enum Ffn {
    /// One gated FFN.
    Dense(DenseFfn),
    /// A mixture of experts (`model::config::MoeConfig` says how they are routed).
    Experts(Experts),
}

#[derive(Clone, Debug)]
pub struct DenseFfn {
    /// [n_ff × n_embd]; `None` in an ungated FFN (an encoder's: act(up) then down).
    pub gate: Option<Mat>,
    pub up: Mat,   // [n_ff × n_embd]
    pub down: Mat, // [n_embd × n_ff]
    pub b_gate: Option<VecRef>,
    pub b_up: Option<VecRef>,
    pub b_down: Option<VecRef>,
}

impl Ffn {
    /// The FFN's matrices a token reads: all of a dense FFN; of a mixture, the router and
    /// `used` experts' (of equal size, so the first `used`), or every expert's when `None`.
    pub fn matrices(&self, used: Option<usize>) -> Vec<&Mat> {
        match self {
            Ffn::Dense(d) => d.gate.iter().chain([&d.up, &d.down]).collect(),
            Ffn::Experts(x) => x
                .matrices()
                .take(used.map_or(usize::MAX, |k| 1 + 3 * k))
                .collect(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Weights {
    pub token_embd: Mat, // [vocab × n_embd]
    /// An encoder's position and token-type embeddings and their norm.
    pub encoder: Option<EncoderInput>,
    /// [n_embd]; an encoder has none (its last block ends with a norm).
    pub output_norm: Option<VecRef>,
    /// The output projection; the embedding matrix itself when the model ties them; `None`
    /// for an encoder, which only embeds.
    pub output: Option<Mat>, // [vocab × n_embd]
    pub output_bias: Option<VecRef>, // [vocab]
    /// Per-pair RoPE frequency factors: Llama 3.1's `rope_freqs`, or LongRoPE's long and
    /// short factors (the context picks one: [`Weights::rope_tables`]).
    pub rope_freqs: Option<VecRef>,
    pub rope_long: Option<VecRef>,
    pub rope_short: Option<VecRef>,
    pub layers: Vec<LayerWeights>,
    /// The dense projections of a pooled vector (gemma-embedding), where the file has them.
    pub dense_out: Option<DenseOut>,
    /// Every small vector (norms, biases, factors), dequantized to f32 once.
    pub arena: Vec<f32>,
}

/// What an encoder adds to its token embeddings before the first block.
#[derive(Clone, Debug)]
pub struct EncoderInput {
    /// Absolute position embeddings (`position_embd`), one row per trained position; none
    /// where RoPE places the tokens (nomic-bert).
    pub positions: Option<Mat>, // [context_length × n_embd]
    /// Row 0 of `token_types` (every input is of type 0), where the model has the table.
    pub token_type: Option<VecRef>, // [n_embd]
    /// The layer norm of the summed embeddings (`token_embd_norm`).
    pub norm: LayerNorm,
}

/// An embedding model's projections of its pooled vector: n_embd → `hidden` → n_embd, both
/// row-major f32 in the arena (see `dense_out.rs`).
#[derive(Clone, Copy, Debug)]
pub struct DenseOut {
    pub hidden: usize,
    pub dense_2: VecRef, // [hidden × n_embd]
    pub dense_3: VecRef, // [n_embd × hidden]
}

mod binder;
mod dense_out;
mod encoder;

pub(crate) use binder::Binder;

/// Rows `first..first + rows` of `m` as a matrix of their own.
fn band(m: &Mat, first: usize, rows: usize, what: &str) -> Mat {
    Mat {
        name: format!("{}[{what}]", m.name),
        rows,
        first_row: m.first_row + first,
        ..m.clone()
    }
}

/// Values `first..first + len` of `v`.
fn slice(v: VecRef, first: usize, len: usize) -> VecRef {
    VecRef {
        offset: v.offset + first,
        len,
    }
}

/// RoPE frequency factors (see [`Weights::rope_freqs`]).
struct RopeFactors {
    freqs: Option<VecRef>,
    long: Option<VecRef>,
    short: Option<VecRef>,
}

/// A layer's attention input projections and their biases.
struct Qkv {
    wq: Mat,
    wk: Mat,
    wv: Mat,
    bq: Option<VecRef>,
    bk: Option<VecRef>,
    bv: Option<VecRef>,
}

impl Binder<'_> {
    /// The RoPE factors the family reads. Phi-3 reads LongRoPE factors whatever the scaling
    /// type; the Llama family reads them with LongRoPE scaling and `rope_freqs` otherwise.
    fn rope_factors(&mut self, cfg: &ModelConfig, opt: &Optional) -> Result<RopeFactors> {
        let half_rot = cfg.n_rot / 2;
        let longrope = cfg.rope_scaling == RopeScaling::LongRope;
        let phi3 = cfg.family == super::arch::Family::Phi3;
        let mut f = RopeFactors {
            freqs: None,
            long: None,
            short: None,
        };
        if self.allowed("rope_freqs.weight", opt.rope_factors && !longrope && !phi3)? {
            f.freqs = self.opt_vector("rope_freqs.weight", half_rot)?;
        }
        let factors = opt.rope_factors && (longrope || phi3);
        self.allowed("rope_factors_short.weight", factors)?;
        if self.allowed("rope_factors_long.weight", factors)? {
            f.long = self.opt_vector("rope_factors_long.weight", half_rot)?;
            f.short = self.opt_vector("rope_factors_short.weight", half_rot)?;
        }
        Ok(f)
    }

    /// Block `i`'s weights, bound in a fixed order (the arena's layout follows it).
    fn layer(&mut self, cfg: &ModelConfig, opt: &Optional, i: usize) -> Result<LayerWeights> {
        let fam = cfg.family;
        if fam.encoder() {
            return self.encoder_layer(cfg, opt, i);
        }
        let e = cfg.n_embd;
        let n = |s: &str| format!("blk.{i}.{s}");
        let attn_norm = Some(self.vector(&n("attn_norm.weight"), e)?);
        let mixer = match cfg.layers[i].mixer {
            Mixer::Attention => MixerWeights::Attention(self.attention(cfg, opt, i)?),
            Mixer::ShortConv => MixerWeights::ShortConv(self.short_conv(cfg, i)?),
            Mixer::DeltaNet => MixerWeights::DeltaNet(self.delta_net(cfg, i)?),
        };
        let post_attn_norm = if fam.post_norms() {
            Some(self.vector(&n("post_attention_norm.weight"), e)?)
        } else {
            None
        };
        let ffn_norm = Some(self.vector(&n(&format!("{}.weight", fam.ffn_norm_name())), e)?);
        let ffn = match cfg.moe {
            Some(moe) => Ffn::Experts(self.moe_ffn(cfg, moe, i)?),
            None => Ffn::Dense(self.dense_ffn(cfg, opt, i)?),
        };
        let post_ffn_norm = if fam.post_norms() {
            Some(self.vector(&n("post_ffw_norm.weight"), e)?)
        } else {
            None
        };
        Ok(LayerWeights {
            attn_norm,
            mixer,
            post_attn_norm,
            attn_out_norm: None,
            ffn_norm,
            ffn,
            post_ffn_norm,
            out_norm: None,
        })
    }

    /// Block `i`'s attention: Q/K/V (+ biases), Q/K norms, output (+ bias), sinks.
    fn attention(
        &mut self,
        cfg: &ModelConfig,
        opt: &Optional,
        i: usize,
    ) -> Result<AttentionWeights> {
        let fam = cfg.family;
        let (e, qd) = (cfg.n_embd, cfg.q_dim());
        let n = |s: &str| format!("blk.{i}.{s}");
        let output_gate = fam.output_gate();
        let q_rows = if output_gate { 2 * qd } else { qd };
        let qkv = self.qkv(cfg, i, q_rows)?;
        let (q_norm, k_norm) = if fam.qk_norm() {
            (
                Some(self.vector(&n("attn_q_norm.weight"), cfg.head_dim)?),
                Some(self.vector(&n("attn_k_norm.weight"), cfg.head_dim)?),
            )
        } else {
            (None, None)
        };
        let wo = self.mat(&n("attn_output.weight"), qd, e)?;
        let bo = self.allowed_vector(&n("attn_output.bias"), opt.attn_out_bias, e)?;
        let sinks = if fam.attention_sinks() {
            Some(self.vector(&n("attn_sinks.weight"), cfg.n_head)?)
        } else {
            None
        };
        Ok(AttentionWeights {
            wq: qkv.wq,
            wk: qkv.wk,
            wv: qkv.wv,
            bq: qkv.bq,
            bk: qkv.bk,
            bv: qkv.bv,
            q_norm,
            k_norm,
            wo,
            bo,
            sinks,
            output_gate,
        })
    }

    /// Block `i`'s gated DeltaNet (`attn_qkv`, `attn_gate`, `ssm_*`), shaped as llama.cpp's
    /// loader creates them.
    fn delta_net(&mut self, cfg: &ModelConfig, i: usize) -> Result<DeltaNetWeights> {
        let e = cfg.n_embd;
        let d = cfg
            .delta_net
            .context("a DeltaNet layer without the ssm.* dimensions")?;
        let n = |s: &str| format!("blk.{i}.{s}");
        let index = cfg.delta_net_layers().iter().position(|&l| l == i);
        let op = DeltaNet {
            index: index.with_context(|| format!("layer {i} is not a DeltaNet layer"))?,
            shape: d,
            kernel: self.conv_kernel(&n("ssm_conv1d.weight"), d)?,
            dt_bias: self.vector(&n("ssm_dt.bias"), d.v_heads)?,
            a: self.vector(&n("ssm_a"), d.v_heads)?,
            norm: self.vector(&n("ssm_norm.weight"), d.head_dim)?,
            eps: cfg.rms_eps,
        };
        Ok(DeltaNetWeights {
            qkv: self.mat(&n("attn_qkv.weight"), e, d.channels())?,
            z: self.mat(&n("attn_gate.weight"), e, d.value_dim())?,
            beta: self.mat(&n("ssm_beta.weight"), e, d.v_heads)?,
            alpha: self.mat(&n("ssm_alpha.weight"), e, d.v_heads)?,
            op,
            out: self.mat(&n("ssm_out.weight"), d.value_dim(), e)?,
        })
    }

    /// A DeltaNet's convolution kernel, [taps, channels] in ggml's dims (taps per channel).
    fn conv_kernel(&mut self, name: &str, d: DeltaNetShape) -> Result<VecRef> {
        let dims = self
            .index(name)
            .map(|idx| self.file.tensors()[idx].dims.clone())
            .with_context(|| format!("model has no tensor '{name}'"))?;
        let want = [d.taps as u64, d.channels() as u64];
        if dims.len() < 2 || dims[2..].iter().any(|&x| x != 1) || dims[..2] != want {
            bail!(
                "tensor '{name}' has dims {dims:?}, expected {want:?} (ssm.conv_kernel taps \
                 over the q, k and v channels)"
            );
        }
        self.vector(name, d.taps * d.channels())
    }

    /// Accounts for the multi-token-prediction layers after the trunk without loading them:
    /// edgelm does not draft with them. Only the tensors llama.cpp's loader knows for such a
    /// layer are passed over; anything else there is still refused by [`Binder::finish`].
    fn skip_mtp_layers(&mut self, cfg: &ModelConfig) {
        const MTP_TENSORS: &[&str] = &[
            "attn_norm.weight",
            "post_attention_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_qkv.weight",
            "attn_output.weight",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
            "nextn.eh_proj.weight",
            "nextn.enorm.weight",
            "nextn.hnorm.weight",
            "nextn.embed_tokens.weight",
            "nextn.shared_head_head.weight",
            "nextn.shared_head_norm.weight",
        ];
        let mut skipped = 0;
        for l in cfg.n_layers..cfg.n_layers + cfg.mtp_layers {
            for t in MTP_TENSORS {
                if let Some(idx) = self.index(&format!("blk.{l}.{t}")) {
                    self.used[idx] = true;
                    skipped += 1;
                }
            }
        }
        if skipped > 0 {
            log::info!(
                "{} multi-token-prediction layer(s) ({skipped} tensors) not loaded: edgelm \
                 does not draft with them",
                cfg.mtp_layers
            );
        }
    }

    /// Block `i`'s short convolution (`shortconv.in_proj`, `.conv`, `.out_proj`).
    fn short_conv(&mut self, cfg: &ModelConfig, i: usize) -> Result<ShortConvWeights> {
        let e = cfg.n_embd;
        let l = cfg
            .short_conv
            .context("a short-convolution layer without shortconv.l_cache")?;
        if cfg.q_dim() != e {
            bail!(
                "a hybrid with short convolutions needs n_head·head_dim = n_embd (it has {} and {e})",
                cfg.q_dim()
            );
        }
        let n = |s: &str| format!("blk.{i}.{s}");
        let in_proj = self.mat(&n("shortconv.in_proj.weight"), e, 3 * e)?;
        let name = n("shortconv.conv.weight");
        let dims = self
            .index(&name)
            .map(|idx| self.file.tensors()[idx].dims.clone())
            .with_context(|| format!("model has no tensor '{name}'"))?;
        if dims.len() < 2 || dims[2..].iter().any(|&d| d != 1) || dims[..2] != [l as u64, e as u64]
        {
            bail!("tensor '{name}' has dims {dims:?}, expected [{l}, {e}]");
        }
        let index = cfg.conv_layers().iter().position(|&c| c == i);
        Ok(ShortConvWeights {
            b: band(&in_proj, 0, e, "b"),
            c: band(&in_proj, e, e, "c"),
            x: band(&in_proj, 2 * e, e, "x"),
            conv: ShortConv {
                index: index.with_context(|| format!("layer {i} is not a convolution layer"))?,
                kernel: self.vector(&name, l * e)?,
                taps: l,
            },
            out: self.mat(&n("shortconv.out_proj.weight"), e, e)?,
        })
    }

    /// Block `i`'s mixture of experts: the router, the experts' 3-D tensors and, where the
    /// family has them, the router's and the experts' biases (one row per expert).
    fn moe_ffn(&mut self, cfg: &ModelConfig, moe: MoeConfig, i: usize) -> Result<Experts> {
        let (e, ff, n_exp) = (cfg.n_embd, moe.n_ff_exp, moe.n_expert);
        let n = |s: &str| format!("blk.{i}.{s}");
        let router = self.mat(&n("ffn_gate_inp.weight"), e, n_exp)?;
        let biases = cfg.family.expert_biases();
        let router_bias = self.allowed_vector(&n("ffn_gate_inp.bias"), biases, n_exp)?;
        let gate = self.experts(&n("ffn_gate_exps.weight"), e, ff, n_exp)?;
        let up = self.experts(&n("ffn_up_exps.weight"), e, ff, n_exp)?;
        let down = self.experts(&n("ffn_down_exps.weight"), ff, e, n_exp)?;
        let biases = if biases {
            let rows = |b: &mut Self, name: &str, len: usize| -> Result<Vec<VecRef>> {
                let all = b.vector(&n(name), len * n_exp)?;
                Ok((0..n_exp).map(|x| slice(all, x * len, len)).collect())
            };
            let g = rows(self, "ffn_gate_exps.bias", ff)?;
            let u = rows(self, "ffn_up_exps.bias", ff)?;
            let d = rows(self, "ffn_down_exps.bias", e)?;
            Some(
                (0..n_exp)
                    .map(|x| ExpertBiases {
                        gate: g[x],
                        up: u[x],
                        down: d[x],
                    })
                    .collect(),
            )
        } else {
            for b in [
                "ffn_gate_exps.bias",
                "ffn_up_exps.bias",
                "ffn_down_exps.bias",
            ] {
                self.allowed(&n(b), false)?;
            }
            None
        };
        Ok(Experts {
            router,
            router_bias,
            biases,
            gate,
            up,
            down,
        })
    }

    /// Block `i`'s FFN: gate and up fused in one tensor or apart, or (an encoder's) no gate;
    /// with their biases.
    fn dense_ffn(&mut self, cfg: &ModelConfig, opt: &Optional, i: usize) -> Result<DenseFfn> {
        let (e, ff) = (cfg.n_embd, cfg.n_ff);
        let n = |s: &str| format!("blk.{i}.{s}");
        let gated = cfg.family.gated_ffn();
        let (gate, up) = if cfg.family.fused_gate_up() {
            let up = self.mat(&n("ffn_up.weight"), e, 2 * ff)?;
            (Some(band(&up, 0, ff, "gate")), band(&up, ff, ff, "up"))
        } else if gated {
            (
                Some(self.mat(&n("ffn_gate.weight"), e, ff)?),
                self.mat(&n("ffn_up.weight"), e, ff)?,
            )
        } else {
            (None, self.mat(&n("ffn_up.weight"), e, ff)?)
        };
        Ok(DenseFfn {
            gate,
            up,
            down: self.mat(&n("ffn_down.weight"), ff, e)?,
            b_gate: self.allowed_vector(&n("ffn_gate.bias"), opt.ffn_biases && gated, ff)?,
            b_up: self.allowed_vector(&n("ffn_up.bias"), opt.ffn_biases, ff)?,
            b_down: self.allowed_vector(&n("ffn_down.bias"), opt.ffn_biases, e)?,
        })
    }

    /// Block `i`'s Q/K/V: one fused tensor (and its bias) or three, as llama.cpp's
    /// `create_tensor_qkv` accepts for every family; separate biases when there is no fused one.
    /// `qd`: the query rows (twice n_head·head_dim where the query packs an output gate).
    fn qkv(&mut self, cfg: &ModelConfig, i: usize, qd: usize) -> Result<Qkv> {
        let (e, kvd) = (cfg.n_embd, cfg.kv_dim());
        let n = |s: &str| format!("blk.{i}.{s}");
        let mut qkv = if let Some(fused) = self.opt_mat(&n("attn_qkv.weight"), e, qd + 2 * kvd)? {
            let bias = self.opt_vector(&n("attn_qkv.bias"), qd + 2 * kvd)?;
            Qkv {
                wq: band(&fused, 0, qd, "q"),
                wk: band(&fused, qd, kvd, "k"),
                wv: band(&fused, qd + kvd, kvd, "v"),
                bq: bias.map(|v| slice(v, 0, qd)),
                bk: bias.map(|v| slice(v, qd, kvd)),
                bv: bias.map(|v| slice(v, qd + kvd, kvd)),
            }
        } else {
            Qkv {
                wq: self.mat(&n("attn_q.weight"), e, qd)?,
                wk: self.mat(&n("attn_k.weight"), e, kvd)?,
                wv: self.mat(&n("attn_v.weight"), e, kvd)?,
                bq: None,
                bk: None,
                bv: None,
            }
        };
        if qkv.bq.is_none() {
            qkv.bq = self.opt_vector(&n("attn_q.bias"), qd)?;
            qkv.bk = self.opt_vector(&n("attn_k.bias"), kvd)?;
            qkv.bv = self.opt_vector(&n("attn_v.bias"), kvd)?;
        }
        Ok(qkv)
    }
}

impl Weights {
    pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights> {
        let mut b = Binder::new(file);
        let opt: Optional = cfg.family.optional();
        let e = cfg.n_embd;
        let token_embd = b.mat("token_embd.weight", e, cfg.vocab_size)?;
        let encoder = b.encoder_input(cfg)?;
        let output = if cfg.family.embeds_only() {
            b.allowed("output.weight", false)?;
            None
        } else {
            Some(match b.opt_mat("output.weight", e, cfg.vocab_size)? {
                Some(m) => m,
                None => token_embd.clone(),
            })
        };
        let output_bias = b.allowed_vector("output.bias", opt.output_bias, cfg.vocab_size)?;
        let output_norm = match cfg.family.encoder() {
            true => None,
            false => Some(b.vector(cfg.family.output_norm_name(), e)?),
        };
        let rope = b.rope_factors(cfg, &opt)?;
        let layers = (0..cfg.n_layers)
            .map(|i| b.layer(cfg, &opt, i))
            .collect::<Result<Vec<_>>>()?;
        b.skip_mtp_layers(cfg);
        let dense_out = b.dense_out(cfg)?;
        let arena = b.finish(&format!("architecture '{}'", cfg.arch))?;
        Ok(Weights {
            token_embd,
            encoder,
            output_norm,
            output,
            output_bias,
            rope_freqs: rope.freqs,
            rope_long: rope.long,
            rope_short: rope.short,
            layers,
            dense_out,
            arena,
        })
    }

    /// The RoPE tables of `cfg` for a context of `context` tokens, their factors attached
    /// (LongRoPE uses its long factors beyond the original training context, as llama.cpp).
    pub fn rope_tables(&self, cfg: &ModelConfig, context: usize) -> Vec<RopeTable> {
        let mut tables = self.scaled_rope_tables(cfg, context);
        if let (Some(sections), Some(global)) = (cfg.rope_sections, tables.first_mut()) {
            // M-RoPE for text: the pairs no section turns keep angle 0, which an infinite
            // divisor gives (position · θ / ∞ = 0: cos 1, sin 0).
            let turned = sections.turned_pairs(cfg.n_rot);
            let mut factors = global.factors.take().unwrap_or(vec![1.0; turned.len()]);
            for (f, &t) in factors.iter_mut().zip(&turned) {
                if !t {
                    *f = f32::INFINITY;
                }
            }
            global.factors = Some(factors);
        }
        tables
    }

    /// [`Weights::rope_tables`] before Qwen3.5's M-RoPE sections.
    fn scaled_rope_tables(&self, cfg: &ModelConfig, context: usize) -> Vec<RopeTable> {
        let factors = self.rope_freqs.or(if context > cfg.rope_original_context {
            self.rope_long
        } else {
            self.rope_short
        });
        cfg.ropes
            .iter()
            .enumerate()
            .map(|(i, p)| {
                // Only the global table takes the file's factors (Gemma's local one has none).
                let file = (i == 0)
                    .then(|| factors.map(|f| f.of(&self.arena).to_vec()))
                    .flatten();
                match p.yarn_divisors(cfg.n_rot) {
                    // YaRN's interpolation is per pair: folded into the divisors, on top of
                    // the file's factors (which divide the extrapolated angle, as in ggml).
                    Some(yarn) => RopeTable {
                        base: p.base,
                        freq_scale: 1.0,
                        mscale: p.mscale,
                        factors: Some(match file {
                            Some(f) => f.iter().zip(&yarn).map(|(f, y)| f * y).collect(),
                            None => yarn,
                        }),
                    },
                    None => RopeTable {
                        base: p.base,
                        freq_scale: p.freq_scale,
                        mscale: p.mscale,
                        factors: file,
                    },
                }
            })
            .collect()
    }

    /// Every matrix a step multiplies by (the output projection included).
    pub fn matrices(&self) -> Vec<&Mat> {
        self.active_matrices(None)
    }

    /// The matrices one token reads: all of a dense model's; of a mixture of experts, the
    /// router and `used` experts per layer (`None`: every expert).
    pub fn active_matrices(&self, used: Option<usize>) -> Vec<&Mat> {
        let mut all: Vec<&Mat> = self.output.iter().collect();
        for l in &self.layers {
            all.extend(l.mixer.matrices());
            all.extend(l.ffn.matrices(used));
        }
        all
    }
}
