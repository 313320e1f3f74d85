//! The `nomic-bert` test model: an encoder made from the reference model's tensors
//! (SmolLM2-135M) as llama.cpp's converter lays out nomic-embed-text: its first
//! `NOMIC_LAYERS` blocks keep their Q/K/V (fused into `attn_qkv`, the query rows scaled),
//! output, gate, up and down matrices; the output gains a small bias; each post layer norm
//! takes the weights of the reference model's RMS norm before what the normed stream feeds
//! next (with a small bias); a small deterministic token-type table; no position embeddings
//! (NeoX RoPE instead); the bert test model's WordPiece vocabulary. It is no good encoder; it
//! is one whose every part matters, run by edgelm and by llama.cpp on one file.

use super::bert_model::{encoder_gguf, encoder_keys};
use super::model_path;
use super::test_models::{made_once, raw_tensor, scaled_q4_1, stack, vector, Tensor};
use edgelm::gguf::{GgufFile, Value};
use std::path::{Path, PathBuf};

const ARCH: &str = "nomic-bert";
/// Blocks kept: with six, llama.cpp's own flash-attention and plain attention paths differ
/// by a cosine of 0.996 on short inputs (a chaotic model, for a bar of 0.999); with three, by
/// less than 0.0007.
const NOMIC_LAYERS: usize = 3;
/// nomic-embed-text's trained context.
pub const NOMIC_CONTEXT: usize = 2048;
const TOKEN_TYPES: usize = 2;
/// Scales the query rows, as in the bert test model: at full strength the reference model's
/// Q·K on a layer-normed residual is near an argmax (a chaotic model).
const QUERY_SCALE: f32 = 0.125;
/// Bumped when the recipe changes, so files made by an older one are not reused.
const RECIPE: u32 = 6;

/// The `nomic-bert` test model, mean-pooled, made on first use beside the other test models.
pub fn nomic_bert_test_model() -> PathBuf {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    made_once(
        &format!("test-nomic-bert.r{RECIPE}.gguf"),
        &model_path(),
        build,
    )
}

fn build(source: &Path) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let n_embd = file.get_u32("llama.embedding_length").unwrap() as usize;
    let mut keys = encoder_keys(&file, NOMIC_LAYERS, NOMIC_CONTEXT, 1);
    // nomic-bert rotates its queries and keys: RoPE's base, among the hyper-parameters.
    keys.insert(keys.len() - 1, ("rope.freq_base", Value::F32(1000.0)));
    encoder_gguf(&file, ARCH, keys, tensors(&file, n_embd))
}

/// The tensors (see the module's comment).
fn tensors(file: &GgufFile, n_embd: usize) -> Vec<Tensor> {
    let raw = |name: &str| raw_tensor(file, name);
    let mut types = vector("token_types.weight", n_embd * TOKEN_TYPES, 0.0, 0.03);
    types.1 = vec![n_embd as u64, TOKEN_TYPES as u64];
    // A layer norm's weight: the reference model's RMS norm before what the normed stream
    // feeds next, so each block's matrices see inputs of the scale they were made for.
    let norm_weight = |into: &str, from: &str| -> Tensor {
        let mut t = raw(from);
        t.0 = into.into();
        t
    };
    let mut out = vec![
        raw("token_embd.weight"),
        types,
        norm_weight("token_embd_norm.weight", "blk.0.attn_norm.weight"),
        vector("token_embd_norm.bias", n_embd, 0.0, 0.02),
    ];
    for l in 0..NOMIC_LAYERS {
        let name = |k: &str| format!("blk.{l}.{k}");
        let mut q = raw(&name("attn_q.weight"));
        q.3 = scaled_q4_1(&q.3, QUERY_SCALE);
        let (k, v) = (raw(&name("attn_k.weight")), raw(&name("attn_v.weight")));
        out.push(stack(&name("attn_qkv.weight"), &[q, k, v]));
        out.push(raw(&name("attn_output.weight")));
        out.push(vector(&name("attn_output.bias"), n_embd, 0.0, 0.02));
        for k in ["ffn_gate", "ffn_up", "ffn_down"] {
            out.push(raw(&name(&format!("{k}.weight"))));
        }
        let next = match l + 1 {
            n if n < NOMIC_LAYERS => format!("blk.{n}.attn_norm.weight"),
            _ => "output_norm.weight".to_string(),
        };
        for (norm, from) in [
            ("attn_output_norm", name("ffn_norm.weight")),
            ("layer_output_norm", next),
        ] {
            out.push(norm_weight(&name(&format!("{norm}.weight")), &from));
            out.push(vector(&name(&format!("{norm}.bias")), n_embd, 0.0, 0.02));
        }
    }
    out
}
