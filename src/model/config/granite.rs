//! Granite's (`granite`) hyper-parameters, as llama.cpp loads them: its four scales and a switch
//! that turns RoPE off.

use super::{HyperParams, Keys};
use anyhow::{bail, Context, Result};

impl HyperParams {
    /// Granite: its logit, residual, embedding and attention scales, and RoPE switched off by
    /// `rope.scaling.finetuned = false`.
    pub(super) fn granite(&mut self, k: &Keys<'_>) -> Result<()> {
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
