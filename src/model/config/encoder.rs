//! What an encoder's file (`bert`, `nomic-bert`) must declare beyond a decoder's, as llama.cpp's
//! loader requires it: its layer norms' ε, attention that is not causal, and its token-type
//! count.

use super::Keys;
use crate::gguf::GgufFile;
use anyhow::{bail, Context, Result};

/// ε of an encoder's layer norms (required), once its attention is checked bidirectional.
pub(super) fn layer_norm_eps(k: &Keys<'_>) -> Result<f32> {
    bidirectional(k)?;
    let key = "attention.layer_norm_epsilon";
    k.f32(key)?
        .with_context(|| format!("GGUF has no {}", k.name(key)))
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
/// loader requires to be there and non-zero.
pub(super) fn token_types(file: &GgufFile) -> Result<usize> {
    const KEY: &str = "tokenizer.ggml.token_type_count";
    match file.get_u32(KEY) {
        Some(0) | None => {
            bail!("an encoder needs {KEY} (its token-type count), which is 0 or absent")
        }
        Some(n) if n > 1024 => bail!("{KEY} = {n} is implausible"),
        Some(n) => Ok(n as usize),
    }
}

#[cfg(test)]
mod tests {
    use super::super::ModelConfig;
    use crate::backend::ops::RopeLayout;
    use crate::gguf::{Array, GgufFile, GgufWriter, Value};

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
}
