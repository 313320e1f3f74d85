//! SmolLM3's (`smollm3`) hyper-parameters: llama's, with RoPE off in every fourth layer.

use super::HyperParams;

impl HyperParams {
    /// SmolLM3: every fourth layer has no RoPE (llama.cpp's `n_no_rope_layer_step`).
    pub(super) fn smollm3(&mut self) {
        for (l, layer) in self.layers.iter_mut().enumerate() {
            if (l + 1) % 4 == 0 {
                layer.rope = None;
            }
        }
    }
}
