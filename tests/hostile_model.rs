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
