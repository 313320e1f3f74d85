//! LFM2's (`lfm2`) short convolutions: the layers a per-layer `attention.head_count_kv` gives
//! 0 KV heads, and how many positions each convolution spans (`shortconv.l_cache`).

use super::{Family, Keys, Shape};
use anyhow::{bail, Result};

/// The most positions a short convolution may span (LFM2's is 3): its state is that many
/// rows less one, per layer and sequence.
const MAX_SHORT_CONV: usize = 16;

/// `shortconv.l_cache`, required where a family with short convolutions has such a layer,
/// and refused where none can be.
pub(super) fn short_conv(family: Family, k: &Keys<'_>, shape: &Shape) -> Result<Option<usize>> {
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

#[cfg(test)]
mod tests {
    use super::super::{Mixer, ModelConfig};
    use crate::gguf::{Array, GgufFile, GgufWriter, Value};
    use anyhow::Result;

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
