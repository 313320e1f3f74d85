//! gpt-oss's (`gpt-oss`) hyper-parameters, as llama.cpp loads them: alternating sliding-window
//! layers, with a RoPE base of their own where the file gives one.

use super::{sliding_pattern, HyperParams, Keys, LayerConfig, Mixer, RopeParams, Shape};
use crate::backend::ops::Window;
use anyhow::Result;

impl HyperParams {
    /// gpt-oss: a sliding window (`attention.sliding_window`, required) on every other layer
    /// (the even ones, by default), with the global RoPE table unless `rope.freq_base_swa`
    /// gives the local layers a base of their own.
    pub(super) fn gpt_oss(
        &mut self,
        k: &Keys<'_>,
        shape: &Shape,
        global: RopeParams,
    ) -> Result<()> {
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
}
