//! Qwen3.5's (`qwen35`) hyper-parameters, read as llama.cpp's `llama_model_qwen35` loads them:
//! the gated DeltaNet's dimensions (`ssm.*`), which layers are DeltaNet and which attend
//! (`attention.recurrent_layers`, else every `full_attention_interval`-th attends), the
//! multi-token-prediction layers beyond the trunk (`nextn_predict_layers`) and the M-RoPE
//! sections of the attention layers (`rope.dimension_sections`).

use super::mrope::MropeSections;
use super::{Keys, Shape};
use crate::backend::ops::DeltaNetShape;
use anyhow::{bail, Context, Result};

/// The longest convolution edgelm takes (Qwen3.5's is 4): its state is that many rows less one.
const MAX_CONV_KERNEL: usize = 16;

/// What a `qwen35` file adds to the plain shape.
pub(super) struct Qwen35 {
    pub delta_net: DeltaNetShape,
    /// Per trunk layer, whether it is a gated DeltaNet (the others attend).
    pub recurrent: Vec<bool>,
    pub sections: MropeSections,
    /// Multi-token-prediction layers after the trunk (`blk.{n_layers + i}.*`).
    pub mtp_layers: usize,
}

impl Qwen35 {
    /// Reads the family's keys and takes the multi-token-prediction layers off `shape`'s layer
    /// count (`block_count` counts them; the trunk is the rest).
    pub fn read(k: &Keys<'_>, shape: &mut Shape) -> Result<Qwen35> {
        let all = shape.n_layers;
        let mtp_layers = k.u32("nextn_predict_layers")?.unwrap_or(0);
        if mtp_layers >= all {
            bail!(
                "{} = {mtp_layers} leaves no trunk of the {all} layers",
                k.name("nextn_predict_layers")
            );
        }
        shape.n_layers = all - mtp_layers;
        shape.attends.truncate(shape.n_layers);
        let recurrent = recurrent_layers(k, all, shape.n_layers)?;
        if recurrent.iter().all(|&r| r) {
            bail!(
                "every layer of the {} is a DeltaNet: no layer attends",
                k.arch
            );
        }
        Ok(Qwen35 {
            delta_net: delta_net_shape(k)?,
            recurrent,
            sections: MropeSections::read(k, shape.n_rot, true)?,
            mtp_layers,
        })
    }
}

/// The DeltaNet's dimensions, checked against each other: `ssm.state_size` is the key and
/// value head dimension, `ssm.group_count` the key heads, `ssm.time_step_rank` the value heads
/// (a multiple of the key heads), `ssm.inner_size` their value width.
fn delta_net_shape(k: &Keys<'_>) -> Result<DeltaNetShape> {
    let taps = k.req("ssm.conv_kernel")?;
    if !(2..=MAX_CONV_KERNEL).contains(&taps) {
        bail!(
            "{} = {taps}: a convolution spans 2 to {MAX_CONV_KERNEL} positions",
            k.name("ssm.conv_kernel")
        );
    }
    let head_dim = k.req("ssm.state_size")?;
    let k_heads = k.req("ssm.group_count")?;
    let v_heads = k.req("ssm.time_step_rank")?;
    let inner = k.req("ssm.inner_size")?;
    if head_dim > 1024 || v_heads > 1024 {
        bail!("implausible DeltaNet: {v_heads} value heads of {head_dim}");
    }
    if !v_heads.is_multiple_of(k_heads) {
        bail!(
            "{} = {v_heads} value heads is not a multiple of {} = {k_heads} key heads",
            k.name("ssm.time_step_rank"),
            k.name("ssm.group_count")
        );
    }
    if inner != v_heads * head_dim {
        bail!(
            "{} = {inner} is not {v_heads} value heads of {head_dim} ({})",
            k.name("ssm.inner_size"),
            k.name("ssm.state_size")
        );
    }
    Ok(DeltaNetShape {
        head_dim,
        k_heads,
        v_heads,
        taps,
    })
}

/// Which trunk layers are DeltaNets: `attention.recurrent_layers` (one boolean per layer, the
/// multi-token-prediction ones included and false), else all but every
/// `full_attention_interval`-th (default 4), as llama.cpp decides.
fn recurrent_layers(k: &Keys<'_>, all: usize, trunk: usize) -> Result<Vec<bool>> {
    let key = k.name("attention.recurrent_layers");
    if let Some(v) = k.file.get(&key) {
        let arr = v
            .as_array()
            .with_context(|| format!("{key} is not an array"))?;
        let flags: Vec<bool> = (0..arr.len())
            .map(|i| arr.get(i).and_then(|x| x.as_bool()))
            .collect::<Option<_>>()
            .with_context(|| format!("{key} is not an array of booleans"))?;
        if flags.len() != all {
            bail!("{key} has {} entries for {all} layers", flags.len());
        }
        if flags[trunk..].iter().any(|&r| r) {
            bail!("{key} makes a multi-token-prediction layer recurrent");
        }
        return Ok(flags[..trunk].to_vec());
    }
    let interval = k.u32("full_attention_interval")?.unwrap_or(4);
    if interval == 0 {
        bail!("{} is 0", k.name("full_attention_interval"));
    }
    Ok((0..trunk).map(|l| (l + 1) % interval != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::super::{Mixer, ModelConfig};
    use super::*;
    use crate::gguf::{Array, GgufFile, GgufWriter, Value};

    /// A Qwen3.5 header of `layers` layers (the last `mtp` of them multi-token prediction),
    /// DeltaNets of 2 key heads and 4 value heads of 16; `extra` keys set over the defaults.
    fn header(layers: u32, mtp: u32, extra: Vec<(&str, Value)>) -> Result<ModelConfig> {
        let mut keys: Vec<(&str, Value)> = vec![
            ("block_count", Value::U32(layers)),
            ("nextn_predict_layers", Value::U32(mtp)),
            ("embedding_length", Value::U32(64)),
            ("feed_forward_length", Value::U32(128)),
            ("attention.head_count", Value::U32(4)),
            ("attention.head_count_kv", Value::U32(2)),
            ("rope.dimension_count", Value::U32(8)),
            (
                "rope.dimension_sections",
                Value::Array(Array::I32(vec![2, 1, 1, 0])),
            ),
            ("ssm.conv_kernel", Value::U32(4)),
            ("ssm.state_size", Value::U32(16)),
            ("ssm.group_count", Value::U32(2)),
            ("ssm.time_step_rank", Value::U32(4)),
            ("ssm.inner_size", Value::U32(64)),
        ];
        for (k, v) in extra {
            match keys.iter_mut().find(|(name, _)| *name == k) {
                Some(slot) => slot.1 = v,
                None => keys.push((k, v)),
            }
        }
        let mut w = GgufWriter::new()
            .kv("general.architecture", Value::String("qwen35".into()))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(); 8])),
            );
        for (k, v) in keys {
            w = w.kv(format!("qwen35.{k}"), v);
        }
        ModelConfig::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap())
    }

    fn deltas(cfg: &ModelConfig) -> Vec<bool> {
        cfg.layers
            .iter()
            .map(|l| l.mixer == Mixer::DeltaNet)
            .collect()
    }

    /// Every fourth layer attends by default; the state is per DeltaNet layer 3 rows of the
    /// 2·32 + 64 channels and 4 matrices of 16 × 16.
    #[test]
    fn every_fourth_layer_attends_unless_the_file_lists_them() {
        let cfg = header(8, 0, vec![]).unwrap();
        let want = [true, true, true, false, true, true, true, false];
        assert_eq!(deltas(&cfg), want);
        assert_eq!(cfg.state_floats(), 6 * (3 * 128 + 4 * 16 * 16));
        assert_eq!(cfg.kv_layout().groups[0].layers, [3, 7]);
        let cfg = header(6, 0, vec![("full_attention_interval", Value::U32(3))]).unwrap();
        assert_eq!(deltas(&cfg), [true, true, false, true, true, false]);
        let listed = vec![false, true, true, false, false];
        let key = (
            "attention.recurrent_layers",
            Value::Array(Array::Bool(listed)),
        );
        let cfg = header(5, 1, vec![key]).unwrap();
        assert_eq!((cfg.n_layers, cfg.mtp_layers), (4, 1));
        assert_eq!(deltas(&cfg), [false, true, true, false]);
    }

    #[test]
    fn layer_patterns_that_do_not_fit_are_refused() {
        let refused = |r: Result<ModelConfig>, what: &str| {
            let e = r.unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        };
        let key = |v: Vec<bool>| ("attention.recurrent_layers", Value::Array(Array::Bool(v)));
        refused(
            header(4, 0, vec![key(vec![true; 3])]),
            "3 entries for 4 layers",
        );
        refused(header(4, 0, vec![key(vec![true; 4])]), "no layer attends");
        refused(
            header(4, 1, vec![key(vec![false, true, true, true])]),
            "multi-token-prediction layer recurrent",
        );
        refused(header(4, 4, vec![]), "leaves no trunk");
        refused(
            header(4, 0, vec![("ssm.conv_kernel", Value::U32(1))]),
            "2 to 16 positions",
        );
        refused(
            header(
                4,
                0,
                vec![(
                    "rope.dimension_sections",
                    Value::Array(Array::I32(vec![3, 2])),
                )],
            ),
            "2 entries, not 4",
        );
        refused(
            header(
                4,
                0,
                vec![(
                    "rope.dimension_sections",
                    Value::Array(Array::I32(vec![3, 2, 0, 0])),
                )],
            ),
            "does not fit the 4 rotated pairs",
        );
    }
}
