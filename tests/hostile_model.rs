//! Loading a damaged model end to end (GGUF parse → config → weights → tokenizer) must give
//! an error or a model, never a panic. The GGUF parser has its own, larger mutation suite
//! (src/gguf/hostile_tests.rs); this one covers everything built on top of it.

mod common;

use common::model_path;
use edgelm::gguf::GgufFile;
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

fn load(bytes: Vec<u8>) -> Result<(), String> {
    let file = Arc::new(GgufFile::from_bytes(bytes).map_err(|e| e.to_string())?);
    let model = Model::from_file(file.clone()).map_err(|e| e.to_string())?;
    let tok = Tokenizer::from_gguf(&file).map_err(|e| e.to_string())?;
    // A model that loads must also tokenize and stay within its own vocabulary.
    let ids = tok
        .encode("Hello, world!", true)
        .map_err(|e| e.to_string())?;
    assert!(ids.iter().all(|&i| (i as usize) < model.config.vocab_size));
    Ok(())
}

#[test]
fn damaged_real_model_loads_or_fails_cleanly() {
    let original = std::fs::read(model_path()).unwrap();
    // The metadata and tensor table live in the first ~1.8 MB; mutate there.
    let header_len = 1_785_664.min(original.len());
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut loaded, mut failed, mut panics) = (0, 0, Vec::new());
    for variant in 0..240 {
        let mut bytes = original.clone();
        let what = match variant % 4 {
            0 => {
                let at = (next() as usize) % header_len;
                bytes[at] ^= 1 << (next() % 8);
                format!("bit flip at {at}")
            }
            1 => {
                let at = (next() as usize) % (header_len - 8);
                bytes[at..at + 8].copy_from_slice(&next().to_le_bytes());
                format!("u64 overwrite at {at}")
            }
            2 => {
                let len = (next() as usize) % original.len();
                bytes.truncate(len);
                format!("truncated to {len}")
            }
            _ => {
                // Zero a run of bytes: counts, lengths and ids become 0.
                let at = (next() as usize) % (header_len - 64);
                bytes[at..at + 64].fill(0);
                format!("zeroed 64 bytes at {at}")
            }
        };
        match catch_unwind(AssertUnwindSafe(|| load(bytes))) {
            Ok(Ok(())) => loaded += 1,
            Ok(Err(_)) => failed += 1,
            Err(_) => panics.push(what),
        }
    }
    eprintln!(
        "{loaded} variants loaded, {failed} failed with an error, {} panicked",
        panics.len()
    );
    assert!(panics.is_empty(), "panics: {panics:?}");
    assert!(
        failed > 60,
        "the mutations should break many loads ({failed} did)"
    );
}

/// Loading is strict: a file with a part edgelm would ignore, without a part it needs, or with
/// a part of the wrong shape is refused, and the error names the tensor (or key).
#[test]
fn strict_loading_names_what_does_not_fit() {
    use edgelm::gguf::Value;
    use edgelm::quant::GgmlType;
    let load_err = |path: std::path::PathBuf| match Model::load(&path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => format!("{e:#}"),
    };
    let extra = common::edited_model("extra-tensor.gguf", |_, t| {
        t.push((
            "blk.0.attn_extra.weight".into(),
            vec![576],
            GgmlType::F32,
            vec![0u8; 576 * 4],
        ))
    });
    let e = load_err(extra);
    assert!(e.contains("blk.0.attn_extra.weight"), "{e}");
    assert!(e.contains("not used"), "{e}");

    let missing = common::edited_model("missing-tensor.gguf", |_, t| {
        t.retain(|x| x.0 != "blk.3.ffn_up.weight")
    });
    let e = load_err(missing);
    assert!(e.contains("blk.3.ffn_up.weight"), "{e}");

    let misshapen = common::edited_model("misshapen-tensor.gguf", |_, t| {
        let norm = t
            .iter_mut()
            .find(|x| x.0 == "blk.2.ffn_norm.weight")
            .unwrap();
        norm.1 = vec![288];
        norm.3.truncate(288 * 4);
    });
    let e = load_err(misshapen);
    assert!(e.contains("blk.2.ffn_norm.weight"), "{e}");

    // A bias the family does not have (llama.cpp's qwen3 loader has no attn_output.bias).
    let bias = common::edited_model("unexpected-bias.gguf", |kv, t| {
        for (k, v) in kv.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("qwen3".into());
            }
            if let Some(rest) = k.strip_prefix("llama.") {
                *k = format!("qwen3.{rest}");
            }
        }
        for i in 0..30 {
            for n in ["attn_q_norm", "attn_k_norm"] {
                t.push((
                    format!("blk.{i}.{n}.weight"),
                    vec![64],
                    GgmlType::F32,
                    vec![0u8; 256],
                ));
            }
        }
        t.push((
            "blk.0.attn_output.bias".into(),
            vec![576],
            GgmlType::F32,
            vec![0u8; 576 * 4],
        ));
    });
    let e = load_err(bias);
    assert!(e.contains("blk.0.attn_output.bias"), "{e}");

    let unknown = common::edited_model("unknown-arch.gguf", |kv, _| {
        for (k, v) in kv.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("mamba".into());
            }
        }
    });
    let e = load_err(unknown);
    assert!(e.contains("unsupported architecture 'mamba'"), "{e}");
}

/// A mixture of experts whose counts or expert tensors do not agree is refused with one line
/// naming what is wrong, and a truncated one never loads: never a panic, never a model that
/// routes to experts it does not have.
#[test]
fn hostile_expert_models_are_refused_with_a_clear_error() {
    use edgelm::gguf::Value;
    let moe = common::test_model("qwen3moe");
    let refused = |name: &str, key: &str, value: Option<Value>, tensor: Option<(&str, u64)>| {
        let path = common::edited_copy(&moe, name, |kvs, tensors| {
            if let Some(v) = value {
                kvs.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
            }
            if let Some((t, experts)) = tensor {
                let t = tensors.iter_mut().find(|x| x.0 == t).unwrap();
                let per_expert = t.3.len() / t.1[2] as usize;
                t.1[2] = experts;
                t.3.truncate(per_expert * experts as usize);
            }
        });
        match Model::load(&path) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => format!("{e:#}"),
        }
    };
    let e = refused(
        "moe-no-experts.gguf",
        "qwen3moe.expert_count",
        Some(Value::U32(0)),
        None,
    );
    assert!(e.contains("qwen3moe.expert_count is 0"), "{e}");
    let e = refused(
        "moe-none-used.gguf",
        "qwen3moe.expert_used_count",
        Some(Value::U32(0)),
        None,
    );
    assert!(e.contains("qwen3moe.expert_used_count is 0"), "{e}");
    let e = refused(
        "moe-too-many-used.gguf",
        "qwen3moe.expert_used_count",
        Some(Value::U32(9)),
        None,
    );
    assert!(e.contains("9 is more than the 8 experts"), "{e}");
    let e = refused(
        "moe-huge.gguf",
        "qwen3moe.expert_count",
        Some(Value::U32(1 << 30)),
        None,
    );
    assert!(e.contains("implausible"), "{e}");
    let e = refused(
        "moe-short-down.gguf",
        "",
        None,
        Some(("blk.5.ffn_down_exps.weight", 7)),
    );
    assert!(
        e.contains("blk.5.ffn_down_exps.weight") && e.contains("one matrix per expert"),
        "{e}"
    );
    let e = refused(
        "moe-count-disagrees.gguf",
        "qwen3moe.expert_count",
        Some(Value::U32(6)),
        None,
    );
    assert!(
        e.contains("ffn_gate_inp.weight") || e.contains("_exps.weight"),
        "{e}"
    );

    // Truncated anywhere in the expert data: refused by the file layer, never read past.
    let bytes = std::fs::read(&moe).unwrap();
    for cut in [bytes.len() - 1, bytes.len() * 3 / 4, bytes.len() / 2] {
        let mut short = bytes.clone();
        short.truncate(cut);
        match catch_unwind(AssertUnwindSafe(|| load(short))) {
            Ok(Ok(())) => panic!("a model cut at {cut} of {} loaded", bytes.len()),
            Ok(Err(e)) => assert!(!e.is_empty()),
            Err(_) => panic!("a model cut at {cut} panicked"),
        }
    }
}

/// gpt-oss: a file without its attention sinks, with expert biases of the wrong size, or with
/// its MXFP4 expert data cut short is refused with an error naming what is wrong.
#[test]
fn hostile_gpt_oss_models_are_refused_with_a_clear_error() {
    let oss = common::test_model("gpt-oss");
    let refused = |name: &str, edit: &dyn Fn(&mut Vec<common::TensorEntry>)| {
        let path = common::edited_copy(&oss, name, |_, tensors| edit(tensors));
        match Model::load(&path) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => format!("{e:#}"),
        }
    };
    let e = refused("oss-no-sinks.gguf", &|t| {
        t.retain(|x| x.0 != "blk.3.attn_sinks.weight")
    });
    assert!(e.contains("blk.3.attn_sinks.weight"), "{e}");
    let e = refused("oss-short-bias.gguf", &|t| {
        let b = t
            .iter_mut()
            .find(|x| x.0 == "blk.1.ffn_up_exps.bias")
            .unwrap();
        b.1 = vec![b.1[0], 7];
        b.3.truncate(b.3.len() / 8 * 7);
    });
    assert!(e.contains("blk.1.ffn_up_exps.bias"), "{e}");
    let e = refused("oss-not-mxfp4-sized.gguf", &|t| {
        let x = t
            .iter_mut()
            .find(|x| x.0 == "blk.2.ffn_gate_exps.weight")
            .unwrap();
        x.1[0] = 560; // not whole blocks of 32
    });
    assert!(e.contains("blk.2.ffn_gate_exps.weight"), "{e}");

    let bytes = std::fs::read(&oss).unwrap();
    for cut in [bytes.len() - 17, bytes.len() * 2 / 3] {
        let mut short = bytes.clone();
        short.truncate(cut);
        match catch_unwind(AssertUnwindSafe(|| load(short))) {
            Ok(Ok(())) => panic!("a gpt-oss file cut at {cut} loaded"),
            Ok(Err(e)) => assert!(!e.is_empty()),
            Err(_) => panic!("a gpt-oss file cut at {cut} panicked"),
        }
    }
}

/// LFM2: a convolution length the kernels do not have, a per-layer KV head count that marks an
/// attention layer as a convolution (its attention tensors then unused), or a convolution layer
/// without its out-projection is refused with an error naming what is wrong.
/// An edit of a test model's metadata and tensors.
type Edit<'a> = &'a dyn Fn(&mut Vec<(String, edgelm::gguf::Value)>, &mut Vec<common::TensorEntry>);

#[test]
fn hostile_hybrid_models_are_refused_with_a_clear_error() {
    use edgelm::gguf::{Array, Value};
    let lfm2 = common::test_model("lfm2");
    let refused = |name: &str, edit: Edit<'_>| {
        let path = common::edited_copy(&lfm2, name, |kvs, tensors| edit(kvs, tensors));
        match Model::load(&path) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => format!("{e:#}"),
        }
    };
    let set = |kvs: &mut Vec<(String, Value)>, key: &str, v: Value| {
        kvs.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
    };
    let e = refused("lfm2-l-cache.gguf", &|kvs, _| {
        set(kvs, "lfm2.shortconv.l_cache", Value::U32(4))
    });
    assert!(
        e.contains("shortconv.conv.weight") && e.contains("expected [4, 576]"),
        "{e}"
    );
    let e = refused("lfm2-no-conv.gguf", &|kvs, _| {
        set(kvs, "lfm2.shortconv.l_cache", Value::U32(1))
    });
    assert!(e.contains("lfm2.shortconv.l_cache = 1"), "{e}");
    let e = refused("lfm2-layer-kinds.gguf", &|kvs, _| {
        let heads = kvs
            .iter()
            .find(|(k, _)| k == "lfm2.attention.head_count_kv")
            .unwrap()
            .1
            .clone();
        let Value::Array(Array::I32(mut v)) = heads else {
            panic!("{heads:?}")
        };
        v[0] = 0;
        set(
            kvs,
            "lfm2.attention.head_count_kv",
            Value::Array(Array::I32(v)),
        );
    });
    assert!(e.contains("blk.0.shortconv.in_proj.weight"), "{e}");
    let e = refused("lfm2-no-out-proj.gguf", &|_, t| {
        t.retain(|x| x.0 != "blk.5.shortconv.out_proj.weight")
    });
    assert!(e.contains("blk.5.shortconv.out_proj.weight"), "{e}");
}

/// A Qwen3.5 file whose DeltaNet does not fit is refused naming what is wrong: a convolution
/// kernel the tensor does not have, value heads that do not make the inner size, value heads
/// that do not share the key heads evenly, a layer list of the wrong length, a missing
/// decay; and a multi-token-prediction layer is passed over while a tensor nobody knows in it
/// is still refused.
#[test]
fn hostile_qwen35_models_are_refused_with_a_clear_error() {
    use edgelm::gguf::{Array, Value};
    let qwen35 = common::test_model("qwen35");
    let load = |name: &str, edit: Edit<'_>| {
        let path = common::edited_copy(&qwen35, name, |kvs, tensors| edit(kvs, tensors));
        Model::load(&path).map_err(|e| format!("{e:#}"))
    };
    let refused = |name: &str, edit: Edit<'_>| match load(name, edit) {
        Ok(_) => panic!("{name} loaded"),
        Err(e) => e,
    };
    let set = |kvs: &mut Vec<(String, Value)>, key: &str, v: Value| {
        kvs.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
    };
    let e = refused("qwen35-kernel.gguf", &|kvs, _| {
        set(kvs, "qwen35.ssm.conv_kernel", Value::U32(3))
    });
    assert!(
        e.contains("blk.5.ssm_conv1d.weight") && e.contains("[3, 768]"),
        "{e}"
    );
    let e = refused("qwen35-inner.gguf", &|kvs, _| {
        set(kvs, "qwen35.ssm.inner_size", Value::U32(320))
    });
    assert!(e.contains("qwen35.ssm.inner_size = 320"), "{e}");
    let e = refused("qwen35-heads.gguf", &|kvs, _| {
        set(kvs, "qwen35.ssm.time_step_rank", Value::U32(4));
        set(kvs, "qwen35.ssm.inner_size", Value::U32(256));
    });
    assert!(e.contains("not a multiple of"), "{e}");
    let e = refused("qwen35-layers.gguf", &|kvs, _| {
        let flags = vec![false; 29];
        let key = "qwen35.attention.recurrent_layers";
        set(kvs, key, Value::Array(Array::Bool(flags)))
    });
    assert!(e.contains("29 entries for 30 layers"), "{e}");
    let e = refused("qwen35-no-decay.gguf", &|_, t| {
        t.retain(|x| x.0 != "blk.11.ssm_a")
    });
    assert!(e.contains("blk.11.ssm_a"), "{e}");

    // One multi-token-prediction layer after the 30 of the trunk: accounted for, not run.
    let mtp = |kvs: &mut Vec<(String, Value)>, t: &mut Vec<common::TensorEntry>| {
        set(kvs, "qwen35.block_count", Value::U32(31));
        kvs.push(("qwen35.nextn_predict_layers".into(), Value::U32(1)));
        let key = "qwen35.attention.recurrent_layers";
        let Some((_, Value::Array(Array::Bool(flags)))) = kvs.iter_mut().find(|(k, _)| k == key)
        else {
            panic!("no {key}")
        };
        flags.push(false);
        let copies: Vec<_> = t
            .iter()
            .filter(|x| x.0.starts_with("blk.0."))
            .map(|x| {
                (
                    x.0.replace("blk.0.", "blk.30."),
                    x.1.clone(),
                    x.2,
                    x.3.clone(),
                )
            })
            .collect();
        t.extend(copies);
        let norm = t.iter().find(|x| x.0 == "blk.30.attn_norm.weight").unwrap();
        let enorm = (
            "blk.30.nextn.enorm.weight".to_string(),
            norm.1.clone(),
            norm.2,
            norm.3.clone(),
        );
        t.push(enorm);
    };
    let model = load("qwen35-mtp.gguf", &|kvs, t| mtp(kvs, t)).unwrap();
    assert_eq!((model.config.n_layers, model.config.mtp_layers), (30, 1));
    let e = refused("qwen35-mtp-unknown.gguf", &|kvs, t| {
        mtp(kvs, t);
        let norm = t.iter().find(|x| x.0 == "blk.30.attn_norm.weight").unwrap();
        let odd = (
            "blk.30.nextn.odd.weight".to_string(),
            norm.1.clone(),
            norm.2,
            norm.3.clone(),
        );
        t.push(odd);
    });
    assert!(e.contains("blk.30.nextn.odd.weight"), "{e}");
}

/// A bert file that does not fit is refused naming what is wrong: a missing post-norm bias,
/// position embeddings shorter than its context, a token-type table of the wrong width, an
/// output head or a reranker's classifier (tensors an encoder that only embeds never reads),
/// causal attention, no token-type count.
#[test]
fn hostile_bert_models_are_refused_with_a_clear_error() {
    use edgelm::gguf::Value;
    let bert = common::bert_test_model(1);
    let refused = |name: &str, edit: Edit<'_>| {
        let path = common::edited_copy(&bert, name, |kvs, tensors| edit(kvs, tensors));
        match Model::load(&path) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => format!("{e:#}"),
        }
    };
    let e = refused("bert-no-norm-bias.gguf", &|_, t| {
        t.retain(|x| x.0 != "blk.3.layer_output_norm.bias")
    });
    assert!(e.contains("blk.3.layer_output_norm.bias"), "{e}");
    let e = refused("bert-short-positions.gguf", &|_, t| {
        let p = t
            .iter_mut()
            .find(|x| x.0 == "position_embd.weight")
            .unwrap();
        p.1[1] = 256;
        p.3.truncate(p.3.len() / 2);
    });
    assert!(
        e.contains("position_embd.weight") && e.contains("expected [576, 512]"),
        "{e}"
    );
    let e = refused("bert-token-types.gguf", &|kvs, _| {
        let k = kvs
            .iter_mut()
            .find(|(k, _)| k == "tokenizer.ggml.token_type_count");
        k.unwrap().1 = Value::U32(3);
    });
    assert!(
        e.contains("token_types.weight") && e.contains("[576, 3]"),
        "{e}"
    );
    for extra in ["output.weight", "cls.weight"] {
        let e = refused("bert-extra.gguf", &|_, t| {
            let mut x = t
                .iter()
                .find(|x| x.0 == "blk.0.attn_output.weight")
                .unwrap()
                .clone();
            x.0 = extra.into();
            t.push(x);
        });
        assert!(e.contains(extra) && e.contains("not used"), "{e}");
    }
    let e = refused("bert-causal.gguf", &|kvs, _| {
        let k = kvs.iter_mut().find(|(k, _)| k == "bert.attention.causal");
        k.unwrap().1 = Value::Bool(true);
    });
    assert!(e.contains("bert.attention.causal is not false"), "{e}");
    let e = refused("bert-no-types.gguf", &|kvs, _| {
        kvs.retain(|(k, _)| k != "tokenizer.ggml.token_type_count")
    });
    assert!(e.contains("tokenizer.ggml.token_type_count"), "{e}");
}

/// A gemma-embedding file whose dense projections do not fit is refused naming what is
/// wrong: one projection without the other, a projection of the wrong shape, widths that do
/// not chain back to n_embd, tensors without their widths, widths without their tensors, an
/// output head (it only embeds), no sliding window.
#[test]
fn hostile_gemma_embedding_models_are_refused_with_a_clear_error() {
    use edgelm::gguf::Value;
    let model = common::gemma_embedding_test_model(true);
    let refused = |name: &str, edit: Edit<'_>| {
        let path = common::edited_copy(&model, name, |kvs, tensors| edit(kvs, tensors));
        let e = match Model::load(&path) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => format!("{e:#}"),
        };
        std::fs::remove_file(&path).ok();
        e
    };
    let key = |kvs: &mut Vec<(String, Value)>, k: &str, v: Option<u32>| {
        let k = format!("gemma-embedding.{k}");
        kvs.retain(|(name, _)| *name != k);
        if let Some(v) = v {
            kvs.push((k, Value::U32(v)));
        }
    };
    let e = refused("gemb-no-dense3.gguf", &|_, t| {
        t.retain(|x| x.0 != "dense_3.weight")
    });
    assert!(e.contains("dense_3.weight") && e.contains("pair"), "{e}");
    let e = refused("gemb-dense2-shape.gguf", &|_, t| {
        let d = t.iter_mut().find(|x| x.0 == "dense_2.weight").unwrap();
        d.1 = vec![1280, 640];
    });
    assert!(
        e.contains("dense_2.weight") && e.contains("expected [640, 1280]"),
        "{e}"
    );
    let e = refused("gemb-dense-widths.gguf", &|kvs, _| {
        key(kvs, "dense_3_feat_in", Some(1024))
    });
    assert!(e.contains("dense_3_feat_in = 1024"), "{e}");
    let e = refused("gemb-dense-in.gguf", &|kvs, _| {
        key(kvs, "dense_2_feat_in", Some(1280))
    });
    assert!(e.contains("must both be n_embd"), "{e}");
    let e = refused("gemb-dense-no-widths.gguf", &|kvs, _| {
        for k in [
            "dense_2_feat_in",
            "dense_2_feat_out",
            "dense_3_feat_in",
            "dense_3_feat_out",
        ] {
            key(kvs, k, None);
        }
    });
    assert!(e.contains("not their widths"), "{e}");
    let e = refused("gemb-dense-one-width.gguf", &|kvs, _| {
        key(kvs, "dense_3_feat_out", None)
    });
    assert!(e.contains("all four widths"), "{e}");
    let e = refused("gemb-dense-no-tensors.gguf", &|_, t| {
        t.retain(|x| !x.0.starts_with("dense_"))
    });
    assert!(e.contains("neither"), "{e}");
    let e = refused("gemb-output.gguf", &|_, t| {
        let mut x = t
            .iter()
            .find(|x| x.0 == "token_embd.weight")
            .unwrap()
            .clone();
        x.0 = "output.weight".into();
        t.push(x);
    });
    assert!(e.contains("output.weight") && e.contains("not used"), "{e}");
    let e = refused("gemb-no-window.gguf", &|kvs, _| {
        key(kvs, "attention.sliding_window", None)
    });
    assert!(
        e.contains("gemma-embedding.attention.sliding_window"),
        "{e}"
    );
}

/// A nomic-bert file that does not fit is refused naming what is wrong: position embeddings
/// (it places tokens by RoPE), FFN biases (llama.cpp loads them but never adds them), no
/// gate, a separate query matrix beside the fused one.
#[test]
fn hostile_nomic_bert_models_are_refused_with_a_clear_error() {
    let nomic = common::nomic_bert_test_model();
    let refused = |name: &str, edit: Edit<'_>| {
        let path = common::edited_copy(&nomic, name, |kvs, tensors| edit(kvs, tensors));
        match Model::load(&path) {
            Ok(_) => panic!("{name} loaded"),
            Err(e) => format!("{e:#}"),
        }
    };
    let copy_as = |t: &mut Vec<common::TensorEntry>, from: &str, to: &str| {
        let mut x = t.iter().find(|x| x.0 == from).unwrap().clone();
        x.0 = to.into();
        t.push(x);
    };
    let e = refused("nomic-positions.gguf", &|_, t| {
        copy_as(t, "token_embd_norm.weight", "position_embd.weight")
    });
    assert!(
        e.contains("position_embd.weight") && e.contains("not used"),
        "{e}"
    );
    let e = refused("nomic-ffn-bias.gguf", &|_, t| {
        copy_as(t, "blk.1.attn_output.bias", "blk.1.ffn_down.bias")
    });
    assert!(
        e.contains("blk.1.ffn_down.bias") && e.contains("not used"),
        "{e}"
    );
    let e = refused("nomic-no-gate.gguf", &|_, t| {
        t.retain(|x| x.0 != "blk.2.ffn_gate.weight")
    });
    assert!(e.contains("blk.2.ffn_gate.weight"), "{e}");
    let e = refused("nomic-extra-q.gguf", &|_, t| {
        copy_as(t, "blk.0.attn_output.weight", "blk.0.attn_q.weight")
    });
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("not used"),
        "{e}"
    );
}
