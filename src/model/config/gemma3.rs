//! Gemma 3's (`gemma3`) hyper-parameters, and gemma-embedding's (`gemma-embedding`, the same
//! stack as an embedding model), as llama.cpp loads them: scaled embeddings and queries, a
//! logit soft-cap, and sliding-window layers with a RoPE table of their own.

use super::{sliding_pattern, HyperParams, Keys, LayerConfig, Mixer, RopeParams, Shape};
use crate::backend::ops::Window;
use anyhow::Result;

/// Gemma 3 27B, the one Gemma 3 with 62 layers: llama.cpp tells it apart by its layer count
/// (`LLM_TYPE_27B`) to scale its queries by the model width per head.
const GEMMA3_27B_LAYERS: usize = 62;

impl HyperParams {
    /// Gemma 3: embeddings scaled by √n_embd, an optional logit soft-cap, scaled queries, and
    /// sliding-window layers with their own RoPE table. gemma-embedding (`embedding`) is the
    /// same stack with symmetric windows (required), the head dimension's query scale at
    /// every size and no logits to cap, as llama.cpp's `llama_model_gemma_embedding`.
    pub(super) fn gemma3(
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
}

#[cfg(test)]
mod tests {
    use super::super::{DenseOutShape, ModelConfig};
    use crate::backend::ops::Window;
    use crate::gguf::{Array, GgufFile, GgufWriter, Value};
    use anyhow::Result;

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
}
