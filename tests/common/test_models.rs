//! One test GGUF per architecture, made from the reference model's tensors (SmolLM2-135M,
//! Q4_1): the same weights re-laid and re-labelled as llama.cpp's converter writes each family,
//! with the parts the family adds (biases, Q/K norms, post-norms, fused tensors, RoPE factors,
//! scales, sliding windows) filled with small deterministic values. They are not good language
//! models; they are models whose every part matters, run by edgelm and by llama.cpp (the KLD
//! tests) or by two edgelm backends (the CUDA tests) on the same file.

use super::{model_path, repo_root};
use edgelm::gguf::{GgufFile, GgufWriter, Value};
use edgelm::quant::GgmlType;
use std::path::{Path, PathBuf};

/// The architectures [`test_model`] makes (the reference model itself is `llama` with tied
/// output; its `llama` test model adds what Llama 3.x adds).
pub const TEST_ARCHS: [&str; 7] = [
    "llama", "qwen2", "qwen3", "phi3", "smollm3", "granite", "gemma3",
];

/// Bumped when a recipe changes, so files made by an older one are not reused.
const RECIPE: u32 = 1;

/// The sliding window of the `gemma3` test model: short enough that a 512-token chunk crosses
/// it many times (the real Gemma 3's 512 never matters at `-c 512`).
pub const GEMMA3_TEST_WINDOW: u32 = 96;

/// The test model of `arch`, made on first use (in `EDGELM_TEST_MODELS`, default
/// target/test-models) and remade when the reference model is newer.
pub fn test_model(arch: &str) -> PathBuf {
    assert!(TEST_ARCHS.contains(&arch), "no test model for {arch}");
    let dir = std::env::var_os("EDGELM_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/test-models"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("test-{arch}.r{RECIPE}.gguf"));
    let source = model_path();
    if !is_newer(&path, &source) {
        let bytes = build(&source, arch);
        // Written beside and renamed, so a test running at the same time never reads half.
        let tmp = dir.join(format!(".test-{arch}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, bytes).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

fn is_newer(a: &Path, b: &Path) -> bool {
    let t = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    matches!((t(a), t(b)), (Some(x), Some(y)) if x >= y)
}

/// A tensor to write: name, ggml dims, type, bytes.
type Tensor = (String, Vec<u64>, GgmlType, Vec<u8>);

fn build(source: &Path, arch: &str) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let old = file.architecture().unwrap().to_string();
    let u32_key = |k: &str| {
        file.get_u32(&format!("{old}.{k}"))
            .unwrap_or_else(|| panic!("{old}.{k}"))
    };
    let n_embd = u32_key("embedding_length") as usize;
    let head_dim = n_embd / u32_key("attention.head_count") as usize;

    let mut kvs: Vec<(String, Value)> = Vec::new();
    for (key, value) in file.metadata() {
        let key = match key.as_str() {
            "general.architecture" => continue,
            // Not the family's name: llama.cpp special-cases vocabularies by model name
            // ("phi3" there means a Phi-3 vocabulary, which this one is not).
            "general.name" => {
                kvs.push((key.clone(), Value::String("edgelm test model".into())));
                continue;
            }
            k => match k.strip_prefix(&format!("{old}.")) {
                Some(rest) => format!("{arch}.{rest}"),
                None => k.to_string(),
            },
        };
        kvs.push((key, value.clone()));
    }
    kvs.insert(
        0,
        ("general.architecture".into(), Value::String(arch.into())),
    );
    let mut key = |k: &str, v: Value| kvs.push((format!("{arch}.{k}"), v));

    let raw = |name: &str| -> Tensor {
        let t = file
            .tensors()
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no {name} in the reference model"));
        (
            t.name.clone(),
            t.dims.clone(),
            t.ty,
            file.tensor_data(t).to_vec(),
        )
    };
    let mut out: Vec<Tensor> = Vec::new();
    for t in file.tensors() {
        let parts: Vec<&str> = t.name.split('.').collect();
        let layer = (parts[0] == "blk").then(|| parts[1].parse::<usize>().unwrap());
        let kind = parts.get(2).copied().unwrap_or("");
        let tensor = raw(&t.name);
        if let (Some(l), "phi3") = (layer, arch) {
            // Fused QKV and gate/up, gate rows first (llama.cpp splits ffn_up in halves).
            match kind {
                "attn_k" | "attn_v" | "ffn_gate" => continue,
                "attn_q" => {
                    let parts =
                        ["attn_q", "attn_k", "attn_v"].map(|p| raw(&format!("blk.{l}.{p}.weight")));
                    out.push(stack(&format!("blk.{l}.attn_qkv.weight"), &parts));
                    continue;
                }
                "ffn_up" => {
                    let gate = raw(&format!("blk.{l}.ffn_gate.weight"));
                    out.push(stack(&t.name, &[gate, tensor]));
                    continue;
                }
                _ => {}
            }
        }
        let rows = tensor.1.get(1).copied().unwrap_or(1) as usize;
        out.push(tensor);
        let Some(l) = layer else { continue };
        let name = |k: &str| format!("blk.{l}.{k}.weight");
        match (arch, kind) {
            ("qwen2", "attn_q" | "attn_k" | "attn_v") => {
                out.push(vector(&format!("blk.{l}.{kind}.bias"), rows, 0.0, 0.05))
            }
            ("qwen3" | "gemma3", "attn_q") => {
                out.push(vector(&name("attn_q_norm"), head_dim, 1.0, 0.1));
                out.push(vector(&name("attn_k_norm"), head_dim, 1.0, 0.1));
            }
            ("gemma3", "ffn_norm") => {
                out.push(vector(&name("post_attention_norm"), n_embd, 1.0, 0.1));
                out.push(vector(&name("post_ffw_norm"), n_embd, 1.0, 0.1));
            }
            _ => {}
        }
    }
    match arch {
        "llama" => {
            // Llama 3.1's per-pair RoPE frequency factors and an untied output matrix.
            out.push(vector("rope_freqs.weight", head_dim / 2, 1.5, 0.4));
            let mut output = raw("token_embd.weight");
            output.0 = "output.weight".into();
            out.push(output);
        }
        "phi3" => {
            out.push(vector("rope_factors_long.weight", head_dim / 2, 2.0, 0.3));
            out.push(vector("rope_factors_short.weight", head_dim / 2, 1.2, 0.1));
            key("rope.scaling.type", Value::String("longrope".into()));
            key("rope.scaling.attn_factor", Value::F32(1.19));
            key("rope.scaling.original_context_length", Value::U32(4096));
        }
        "granite" => {
            // Mild scales: every one changes the output, none flattens it to noise.
            key("embedding_scale", Value::F32(1.25));
            key("residual_scale", Value::F32(0.9));
            key("attention.scale", Value::F32(0.11));
            key("logit_scale", Value::F32(1.5));
        }
        "gemma3" => {
            key("attention.sliding_window", Value::U32(GEMMA3_TEST_WINDOW));
            key("attention.key_length", Value::U32(head_dim as u32));
            key("attention.value_length", Value::U32(head_dim as u32));
        }
        _ => {}
    }
    let mut w = GgufWriter::new();
    for (k, v) in kvs {
        w = w.kv(k, v);
    }
    for (name, dims, ty, bytes) in out {
        w = w.tensor(name, &dims, ty, bytes);
    }
    w.to_bytes()
}

/// Tensors of the same type and row length, their rows stacked in order.
fn stack(name: &str, parts: &[Tensor]) -> Tensor {
    let rows: u64 = parts.iter().map(|p| p.1[1]).sum();
    let bytes = parts.iter().flat_map(|p| p.3.iter().copied()).collect();
    (name.into(), vec![parts[0].1[0], rows], parts[0].2, bytes)
}

/// An f32 vector of `n` values around `center`, deterministic per name.
fn vector(name: &str, n: usize, center: f32, spread: f32) -> Tensor {
    let mut state = name.bytes().fold(0x9e37_79b9_7f4a_7c15u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    };
    let bytes = (0..n)
        // A sum of four uniforms: roughly normal, standard deviation about 0.58.
        .map(|_| center + spread * 1.7 * (0..4).map(|_| uniform()).sum::<f32>())
        .flat_map(f32::to_le_bytes)
        .collect();
    (name.into(), vec![n as u64], GgmlType::F32, bytes)
}
