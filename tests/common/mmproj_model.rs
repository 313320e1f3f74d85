//! Test projector files (llama.cpp's mmproj GGUF, `clip.*` keys), made from the reference
//! model's tensors as the other test models are: a small SigLIP ViT whose blocks are the
//! reference model's 576-wide layers re-laid (its Q rows of another layer as K, its output
//! matrices as V), position and patch rows cut from its token embeddings, and each projector
//! type's head. Matrices are F16, as in real mmproj files; norms and biases F32.

use super::test_models::{made_once, vector, Tensor};
use super::{gemma3_path, model_path};
use edgelm::gguf::{Array, GgufFile, GgufWriter, Value};
use edgelm::quant::GgmlType;
use std::path::{Path, PathBuf};

/// The test ViT: 224-pixel images in patches of 14 (16 × 16 patches), 4 blocks.
pub const MMPROJ_IMAGE_SIZE: usize = 224;
const PATCH: usize = 14;
const BLOCKS: usize = 4;
/// Gemma 3's test head pools 2 × 2 (a real one 4 × 4 of 64 × 64 patches): 64 rows an image.
const GEMMA3_MERGE: usize = 2;
/// Bumped when the recipe changes, so that files made by an older one are not reused.
const RECIPE: u32 = 3;

/// The test projector of `kind` (a `clip.projector_type`), made on first use.
pub fn test_mmproj(kind: &str) -> PathBuf {
    assert_eq!(kind, "gemma3", "no test projector of type {kind}");
    // The head's width is the text model's: Gemma 3 270M's.
    let text = GgufFile::open(gemma3_path()).unwrap();
    let text_embd = text.get_u32("gemma3.embedding_length").unwrap() as usize;
    made_once(
        &format!("test-mmproj-{kind}.r{RECIPE}.gguf"),
        &model_path(),
        |source| build(source, text_embd),
    )
}

/// Dequantized values of tensor `name` of `file`.
fn values(file: &GgufFile, name: &str) -> Vec<f32> {
    let t = file.tensors().iter().find(|t| t.name == name).unwrap();
    let mut out = vec![0.0; t.n_elements() as usize];
    edgelm::quant::dequantize_row(t.ty, file.tensor_data(t), &mut out).unwrap();
    out
}

fn f16_tensor(name: &str, dims: &[usize], values: &[f32]) -> Tensor {
    assert_eq!(dims.iter().product::<usize>(), values.len(), "{name}");
    let bytes = values
        .iter()
        .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
        .collect();
    let dims = dims.iter().map(|&d| d as u64).collect();
    (name.into(), dims, GgmlType::F16, bytes)
}

fn f32_tensor(name: &str, values: &[f32]) -> Tensor {
    f32_matrix(name, &[values.len()], values)
}

fn f32_matrix(name: &str, dims: &[usize], values: &[f32]) -> Tensor {
    assert_eq!(dims.iter().product::<usize>(), values.len(), "{name}");
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let dims = dims.iter().map(|&d| d as u64).collect();
    (name.into(), dims, GgmlType::F32, bytes)
}

fn build(source: &Path, text_embd: usize) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let e = file.get_u32("llama.embedding_length").unwrap() as usize;
    let n_ff = file.get_u32("llama.feed_forward_length").unwrap() as usize;
    let n_head = file.get_u32("llama.attention.head_count").unwrap() as usize;
    let layers = file.get_u32("llama.block_count").unwrap() as usize;
    let embd = values(&file, "token_embd.weight");
    // Runs of token-embedding values, from well inside the vocabulary.
    let run = |first_token: usize, n: usize| embd[first_token * e..][..n].to_vec();
    let side = MMPROJ_IMAGE_SIZE / PATCH;
    let mut t: Vec<Tensor> = vec![
        f16_tensor(
            "v.patch_embd.weight",
            &[PATCH, PATCH, 3, e],
            &run(1000, 3 * PATCH * PATCH * e),
        ),
        vector("v.patch_embd.bias", e, 0.0, 0.02),
        // F32, as llama.cpp's converter keeps it (ggml adds it to f32 rows).
        f32_matrix(
            "v.position_embd.weight",
            &[e, side * side],
            &run(3000, side * side * e),
        ),
    ];
    for b in 0..BLOCKS {
        let src = |k: &str, l: usize| values(&file, &format!("blk.{l}.{k}.weight"));
        let name = |k: &str| format!("v.blk.{b}.{k}");
        let other = (b + layers / 2) % layers;
        for (k, w, rows, cols) in [
            ("attn_q", src("attn_q", b), e, e),
            ("attn_k", src("attn_q", other), e, e),
            ("attn_v", src("attn_output", b), e, e),
            ("attn_out", src("attn_output", other), e, e),
            ("ffn_up", src("ffn_up", b), n_ff, e),
            ("ffn_down", src("ffn_down", b), e, n_ff),
        ] {
            t.push(f16_tensor(&name(&format!("{k}.weight")), &[cols, rows], &w));
            t.push(vector(&name(&format!("{k}.bias")), rows, 0.0, 0.02));
        }
        t.push(f32_tensor(&name("ln1.weight"), &src("attn_norm", b)));
        t.push(vector(&name("ln1.bias"), e, 0.0, 0.02));
        t.push(f32_tensor(&name("ln2.weight"), &src("ffn_norm", b)));
        t.push(vector(&name("ln2.bias"), e, 0.0, 0.02));
    }
    t.push(f32_tensor(
        "v.post_ln.weight",
        &values(&file, "output_norm.weight"),
    ));
    t.push(vector("v.post_ln.bias", e, 0.0, 0.02));
    t.push(vector("mm.soft_emb_norm.weight", e, 1.0, 0.1));
    // Stored as ggml multiplies by its transpose: text_embd values a row, e rows. Scaled so
    // that an image's rows are about as large as the text model's scaled token embeddings
    // (RMS near 1): three times larger, the text model turns chaotic after an image
    // (llama.cpp's own q8_0 cache then moves its logits by a mean KLD near 0.1).
    let projection: Vec<f32> = run(6000, text_embd * e).iter().map(|v| v / 3.0).collect();
    t.push(f16_tensor(
        "mm.input_projection.weight",
        &[text_embd, e],
        &projection,
    ));

    let f32s = |v: [f32; 3]| Value::Array(Array::F32(v.to_vec()));
    let keys: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("clip".into())),
        ("clip.projector_type", Value::String("gemma3".into())),
        ("clip.has_vision_encoder", Value::Bool(true)),
        ("clip.use_gelu", Value::Bool(true)),
        ("clip.vision.embedding_length", Value::U32(e as u32)),
        ("clip.vision.feed_forward_length", Value::U32(n_ff as u32)),
        ("clip.vision.block_count", Value::U32(BLOCKS as u32)),
        ("clip.vision.projection_dim", Value::U32(text_embd as u32)),
        (
            "clip.vision.attention.head_count",
            Value::U32(n_head as u32),
        ),
        ("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-6)),
        (
            "clip.vision.image_size",
            Value::U32(MMPROJ_IMAGE_SIZE as u32),
        ),
        ("clip.vision.patch_size", Value::U32(PATCH as u32)),
        ("clip.vision.image_mean", f32s([0.5; 3])),
        ("clip.vision.image_std", f32s([0.5; 3])),
        (
            "clip.vision.projector.scale_factor",
            Value::U32(GEMMA3_MERGE as u32),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in keys {
        w = w.kv(k, v);
    }
    for (name, dims, ty, bytes) in t {
        w = w.tensor(name, &dims, ty, bytes);
    }
    w.to_bytes()
}
