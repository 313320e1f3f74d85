//! An encoder's tensors (bert, nomic-bert), as llama.cpp's `load_arch_tensors` creates them:
//! position (bert) and token-type embeddings with their layer norm, and per block the
//! attention (the decoders' binding), two post-norms with biases and the FFN (ungated in
//! bert, SwiGLU in nomic-bert).

use super::{slice, Binder, EncoderInput, Ffn, LayerWeights, MixerWeights};
use crate::backend::ops::{LayerNorm, VecRef};
use crate::model::arch::Optional;
use crate::model::config::{Mixer, ModelConfig};
use anyhow::{bail, Result};

impl Binder<'_> {
    /// An encoder's input embeddings beyond the tokens'; `None` for a decoder.
    pub(super) fn encoder_input(&mut self, cfg: &ModelConfig) -> Result<Option<EncoderInput>> {
        if !cfg.family.encoder() {
            return Ok(None);
        }
        let e = cfg.n_embd;
        let positions = match cfg.family.absolute_positions() {
            true => Some(self.mat("position_embd.weight", e, cfg.context_length)?),
            false => None,
        };
        Ok(Some(EncoderInput {
            positions,
            token_type: self.token_type_row(cfg)?,
            norm: self.layer_norm("token_embd_norm", e)?,
        }))
    }

    /// Row 0 of `token_types` ([n_embd, token_type_count]), the type of every input; the
    /// table itself is optional, as in llama.cpp.
    fn token_type_row(&mut self, cfg: &ModelConfig) -> Result<Option<VecRef>> {
        const NAME: &str = "token_types.weight";
        let Some(idx) = self.index(NAME) else {
            return Ok(None);
        };
        let dims = &self.file.tensors()[idx].dims;
        let want = [cfg.n_embd as u64, cfg.token_types as u64];
        if dims.len() < 2 || dims[2..].iter().any(|&d| d != 1) || dims[..2] != want {
            bail!("tensor '{NAME}' has dims {dims:?}, expected {want:?}");
        }
        let table = self.vector(NAME, cfg.n_embd * cfg.token_types)?;
        Ok(Some(slice(table, 0, cfg.n_embd)))
    }

    /// `{name}.weight` and `{name}.bias`, both required.
    fn layer_norm(&mut self, name: &str, len: usize) -> Result<LayerNorm> {
        Ok(LayerNorm {
            weight: self.vector(&format!("{name}.weight"), len)?,
            bias: self.vector(&format!("{name}.bias"), len)?,
        })
    }

    /// Block `i` of an encoder: attention, `attn_output_norm`, the FFN, `layer_output_norm`.
    pub(super) fn encoder_layer(
        &mut self,
        cfg: &ModelConfig,
        opt: &Optional,
        i: usize,
    ) -> Result<LayerWeights> {
        if cfg.layers[i].mixer != Mixer::Attention || cfg.moe.is_some() {
            bail!("an encoder's blocks attend and have dense FFNs");
        }
        let e = cfg.n_embd;
        let n = |s: &str| format!("blk.{i}.{s}");
        let mixer = MixerWeights::Attention(self.attention(cfg, opt, i)?);
        let attn_out_norm = Some(self.layer_norm(&n("attn_output_norm"), e)?);
        let ffn = Ffn::Dense(self.dense_ffn(cfg, opt, i)?);
        Ok(LayerWeights {
            attn_norm: None,
            mixer,
            post_attn_norm: None,
            attn_out_norm,
            ffn_norm: None,
            ffn,
            post_ffn_norm: None,
            out_norm: Some(self.layer_norm(&n("layer_output_norm"), e)?),
        })
    }
}
