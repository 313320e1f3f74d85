//! Test projector files (llama.cpp's mmproj GGUF, `clip.*` keys), made from the reference
//! model's tensors as the other test models are: a small SigLIP ViT whose blocks are the
//! reference model's 576-wide layers re-laid (its Q rows of another layer as K, its output
//! matrices as V), position and patch rows cut from its token embeddings, and each projector
//! type's head. Matrices are F16, as in real mmproj files; norms and biases F32. Each type's
//! text model is a real one: Gemma 3 270M for `gemma3`; for `idefics3`, SmolVLM's own text
//! model, SmolLM2 (the reference model), with the tokens SmolVLM adds to its vocabulary.

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
/// Idefics3's test head shuffles 4 × 4, as SmolVLM's: 16 rows a view; images are resized to
/// 448 pixels on their longer side, so a photograph is 2 × 2 tiles and an overview.
const IDEFICS3_MERGE: usize = 4;
const IDEFICS3_LONGEST_EDGE: usize = 448;
/// Bumped when the SmolVLM text model's recipe changes.
const SMOLVLM_RECIPE: u32 = 1;
/// What the Idefics3 head's matrix is scaled by (see [`head`]).
const IDEFICS3_FC_SCALE: f32 = 0.006;
/// Qwen3-VL's test ViT: patches of 16 (as the real one), learned positions for a 16 × 16
/// grid (resized to each image's), DeepStack rows from blocks 1 and 2.
const QWEN3VL_PATCH: usize = 16;
const QWEN3VL_GRID: usize = 16;
const QWEN3VL_DEEPSTACK: [bool; BLOCKS] = [false, true, true, false];
/// What the Qwen3-VL mergers' matrices are scaled by (see [`merger`]): the first keeps its
/// GELU's inputs near 1, the second makes rows about as large as Idefics3's test rows (RMS
/// near 0.15, SmolLM2's scale: ten times larger, the logits after an image move with the
/// projector's last bits).
const QWEN3VL_FC_SCALES: [f32; 2] = [0.2, 0.02];
/// Bumped when the Qwen3-VL text model's recipe changes.
const QWEN3VL_TEXT_RECIPE: u32 = 1;
/// Qwen2.5-VL's test ViT: patches of 14 (as the real one), every second block attending over
/// the whole image, the others within windows of llama.cpp's default 112 pixels (4 × 4
/// merged squares: a photograph is several windows, its edges cut short).
const QWEN25VL_PATCH: usize = 14;
const QWEN25VL_FULL_EVERY: u32 = 2;
/// What the Qwen2.5-VL patch kernel is scaled by (see [`build`]).
const QWEN25VL_PATCH_GAIN: f32 = 4.0;
/// What the Qwen2.5-VL merger's matrices are scaled by: the first keeps its GELU near its
/// linear part (with Qwen3-VL's 0.2, rows of grey camera.png came out ten times larger than
/// colourful chelsea.png's), the second brings rows to SmolLM2's scale (RMS 0.06 to 0.24).
const QWEN25VL_FC_SCALES: [f32; 2] = [0.05, 0.1];
/// Bumped when the Qwen2.5-VL text model's recipe changes.
const QWEN25VL_TEXT_RECIPE: u32 = 2;
/// Bumped when a type's recipe changes, so that files made by an older one are not reused.
fn recipe(kind: &str) -> u32 {
    match kind {
        "gemma3" => 3,
        "qwen3vl" => 3,
        "qwen25vl" => 1,
        _ => 4,
    }
}

/// The test projector of `kind` (a `clip.projector_type`), made on first use.
pub fn test_mmproj(kind: &str) -> PathBuf {
    // The head's width is the text model's.
    let text = GgufFile::open(test_vlm_text(kind)).unwrap();
    let arch = text.get_str("general.architecture").unwrap().to_string();
    let text_embd = text.get_u32(&format!("{arch}.embedding_length")).unwrap() as usize;
    made_once(
        &format!("test-mmproj-{kind}.r{}.gguf", recipe(kind)),
        &model_path(),
        |source| build(source, kind, text_embd),
    )
}

/// The text model a test projector of `kind` feeds.
pub fn test_vlm_text(kind: &str) -> PathBuf {
    match kind {
        "gemma3" => gemma3_path(),
        "idefics3" => made_once(
            &format!("test-smolvlm-text.r{SMOLVLM_RECIPE}.gguf"),
            &model_path(),
            smolvlm_text,
        ),
        "qwen3vl" => made_once(
            &format!("test-qwen3vl-text.r{QWEN3VL_TEXT_RECIPE}.gguf"),
            &model_path(),
            qwen3vl_text,
        ),
        "qwen25vl" => made_once(
            &format!("test-qwen2vl-text.r{QWEN25VL_TEXT_RECIPE}.gguf"),
            &model_path(),
            qwen2vl_text,
        ),
        _ => panic!("no test projector of type {kind}"),
    }
}

/// Qwen's image markers, added to SmolLM2's vocabulary for the Qwen-VL text models.
const QWEN_VISION_TOKENS: [&str; 3] = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"];

/// A Qwen2.5-VL text model (architecture `qwen2vl`: qwen2's blocks, M-RoPE sections in runs)
/// made of SmolLM2's tensors, with Qwen's image markers in its vocabulary.
fn qwen2vl_text(source: &Path) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let head_dim = file.get_u32("llama.embedding_length").unwrap()
        / file.get_u32("llama.attention.head_count").unwrap();
    let pairs = head_dim as i32 / 2;
    // Qwen2.5-VL's 16, 24, 24 of 64 pairs, in proportion to this model's pairs.
    let sections = vec![pairs / 4, pairs * 3 / 8, pairs * 3 / 8, 0];
    let keys = vec![(
        "qwen2vl.rope.dimension_sections".to_string(),
        Value::Array(Array::I32(sections)),
    )];
    let added = QWEN_VISION_TOKENS.map(String::from);
    let bytes = with_tokens(&file, &added, Some(("qwen2vl", keys)), Vec::new());
    neox_rows(&GgufFile::from_bytes(bytes).unwrap(), head_dim as usize)
}

/// `file` with each head's Q and K rows in NeoX order: llama.cpp's converter interleaves
/// each head's rows for Llama's RoPE (the first half's row i beside the second half's), so
/// SmolLM2's tensors under a NeoX-RoPE architecture are SmolLM2 again only with the rows
/// put back: the text model then writes sense, and its greedy answers are not near ties.
fn neox_rows(file: &GgufFile, head_dim: usize) -> Vec<u8> {
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w = w.kv(key.clone(), value.clone());
    }
    for t in file.tensors() {
        let mut bytes = file.tensor_data(t).to_vec();
        if t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_k.weight") {
            let row = bytes.len() / t.dims[1] as usize;
            let original = bytes.clone();
            for head in 0..t.dims[1] as usize / head_dim {
                for i in 0..head_dim {
                    // NeoX row i takes the interleaved row 2i (first half) or 2(i - half) + 1.
                    let half = head_dim / 2;
                    let from = match i < half {
                        true => 2 * i,
                        false => 2 * (i - half) + 1,
                    };
                    let (to, from) = ((head * head_dim + i) * row, (head * head_dim + from) * row);
                    bytes[to..to + row].copy_from_slice(&original[from..from + row]);
                }
            }
        }
        w = w.tensor(t.name.clone(), &t.dims, t.ty, bytes);
    }
    w.to_bytes()
}

/// A Qwen3-VL text model (architecture `qwen3vl`: qwen3's per-head Q and K norms, M-RoPE
/// sections, DeepStack rows for its first layers) made of SmolLM2's tensors, its Q and K
/// norms all ones, with Qwen's image markers in its vocabulary.
fn qwen3vl_text(source: &Path) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let head_dim = file.get_u32("llama.embedding_length").unwrap()
        / file.get_u32("llama.attention.head_count").unwrap();
    let deepstack = QWEN3VL_DEEPSTACK.iter().filter(|&&d| d).count() as u32;
    let pairs = head_dim as i32 / 2;
    let keys = vec![
        (
            "qwen3vl.n_deepstack_layers".to_string(),
            Value::U32(deepstack),
        ),
        (
            "qwen3vl.rope.dimension_sections".to_string(),
            // Qwen3-VL's 24, 20, 20 of 64 pairs, in proportion to this model's pairs.
            Value::Array(Array::I32(vec![
                pairs * 3 / 8,
                pairs * 5 / 16,
                pairs * 5 / 16,
                0,
            ])),
        ),
    ];
    let layers = file.get_u32("llama.block_count").unwrap() as usize;
    let mut norms = Vec::new();
    for l in 0..layers {
        for k in ["attn_q_norm", "attn_k_norm"] {
            norms.push(f32_tensor(
                &format!("blk.{l}.{k}.weight"),
                &vec![1.0; head_dim as usize],
            ));
        }
    }
    let added = QWEN_VISION_TOKENS.map(String::from);
    with_tokens(&file, &added, Some(("qwen3vl", keys)), norms)
}

/// SmolVLM's text model: SmolLM2 with the tokens SmolVLM's processor writes around an
/// image's views (special tokens, as the converter types them), each given the embedding
/// row of an ordinary token.
fn smolvlm_text(source: &Path) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let mut added: Vec<String> = ["<fake_token_around_image>", "<image>", "<global-img>"]
        .map(String::from)
        .to_vec();
    for row in 1..=6 {
        added.extend((1..=6).map(|col| format!("<row_{row}_col_{col}>")));
    }
    added.push("<end_of_utterance>".into());
    with_tokens(&file, &added, None, Vec::new())
}

/// `file` (SmolLM2) with `added` control tokens at the end of its vocabulary, each given the
/// embedding row of an ordinary token; `arch`: another architecture's name for its `llama.*`
/// keys, and keys of its own; `extra`: tensors it adds.
fn with_tokens(
    file: &GgufFile,
    added: &[String],
    arch: Option<(&str, Vec<(String, Value)>)>,
    extra: Vec<Tensor>,
) -> Vec<u8> {
    let mut w = GgufWriter::new();
    let renamed = |key: &str| match (&arch, key.strip_prefix("llama.")) {
        (Some((name, _)), Some(rest)) => format!("{name}.{rest}"),
        _ => key.to_string(),
    };
    for (key, value) in file.metadata() {
        let value = match (key.as_str(), value) {
            ("general.architecture", _) if arch.is_some() => {
                Value::String(arch.as_ref().unwrap().0.into())
            }
            ("tokenizer.ggml.tokens", Value::Array(Array::String(t))) => {
                Value::Array(Array::String(t.iter().chain(added).cloned().collect()))
            }
            ("tokenizer.ggml.token_type", Value::Array(Array::I32(t))) => {
                let control = std::iter::repeat_n(3, added.len());
                Value::Array(Array::I32(t.iter().copied().chain(control).collect()))
            }
            (k, _) if k.starts_with("tokenizer.ggml.") && k.ends_with('s') => {
                assert!(k == "tokenizer.ggml.merges", "{k} would need rows too");
                value.clone()
            }
            _ => value.clone(),
        };
        w = w.kv(renamed(key), value);
    }
    for (key, value) in arch.map(|a| a.1).unwrap_or_default() {
        w = w.kv(key, value);
    }
    for (name, dims, ty, bytes) in extra {
        w = w.tensor(name, &dims, ty, bytes);
    }
    for t in file.tensors() {
        let mut bytes = file.tensor_data(t).to_vec();
        let mut dims = t.dims.clone();
        if t.name == "token_embd.weight" {
            let row = bytes.len() / dims[1] as usize;
            for i in 0..added.len() {
                let from = (2000 + 37 * i) * row;
                bytes.extend_from_within(from..from + row);
            }
            dims[1] += added.len() as u64;
        }
        w = w.tensor(t.name.clone(), &dims, t.ty, bytes);
    }
    w.to_bytes()
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

fn build(source: &Path, kind: &str, text_embd: usize) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let e = file.get_u32("llama.embedding_length").unwrap() as usize;
    let n_ff = file.get_u32("llama.feed_forward_length").unwrap() as usize;
    let n_head = file.get_u32("llama.attention.head_count").unwrap() as usize;
    let layers = file.get_u32("llama.block_count").unwrap() as usize;
    let embd = values(&file, "token_embd.weight");
    // Runs of token-embedding values, from well inside the vocabulary.
    let run = |first_token: usize, n: usize| embd[first_token * e..][..n].to_vec();
    let (qwen, qwen25) = (kind == "qwen3vl", kind == "qwen25vl");
    let (patch, side) = match kind {
        "qwen3vl" => (QWEN3VL_PATCH, QWEN3VL_GRID),
        // Qwen2.5-VL's converter writes an image size of 560 (it has no learned positions).
        "qwen25vl" => (QWEN25VL_PATCH, 560 / QWEN25VL_PATCH),
        _ => (PATCH, MMPROJ_IMAGE_SIZE / PATCH),
    };
    let kernel = 3 * patch * patch * e;
    // Without learned positions, a Qwen2.5-VL row differs from the next by its pixels alone:
    // a larger kernel keeps them from drowning in what every row's blocks add alike.
    let gain = if qwen25 { QWEN25VL_PATCH_GAIN } else { 1.0 };
    let patch_kernel: Vec<f32> = run(1000, kernel).iter().map(|v| v * gain).collect();
    let mut t: Vec<Tensor> = vec![f16_tensor(
        "v.patch_embd.weight",
        &[patch, patch, 3, e],
        &patch_kernel,
    )];
    if !qwen25 {
        t.push(vector("v.patch_embd.bias", e, 0.0, 0.02));
        // F32, as llama.cpp's converter keeps it (ggml adds it to f32 rows).
        t.push(f32_matrix(
            "v.position_embd.weight",
            &[e, side * side],
            &run(3000, side * side * e),
        ));
    }
    if qwen || qwen25 {
        // The kernel's second frame (a still image is both frames).
        t.push(f16_tensor(
            "v.patch_embd.weight.1",
            &[patch, patch, 3, e],
            &run(9000, kernel),
        ));
    }
    for b in 0..BLOCKS {
        let src = |k: &str, l: usize| values(&file, &format!("blk.{l}.{k}.weight"));
        let name = |k: &str| format!("v.blk.{b}.{k}");
        let other = (b + layers / 2) % layers;
        let (q, k, v) = (
            src("attn_q", b),
            src("attn_q", other),
            src("attn_output", b),
        );
        let mut matrices = vec![
            ("attn_out", src("attn_output", other), e, e),
            ("ffn_up", src("ffn_up", b), n_ff, e),
            ("ffn_down", src("ffn_down", b), e, n_ff),
        ];
        match qwen {
            true => matrices.push(("attn_qkv", [q, k, v].concat(), 3 * e, e)),
            false => matrices.extend([
                ("attn_q", q, e, e),
                ("attn_k", k, e, e),
                ("attn_v", v, e, e),
            ]),
        }
        if qwen25 {
            matrices.push(("ffn_gate", src("ffn_gate", b), n_ff, e));
        }
        for (k, w, rows, cols) in matrices {
            t.push(f16_tensor(&name(&format!("{k}.weight")), &[cols, rows], &w));
            t.push(vector(&name(&format!("{k}.bias")), rows, 0.0, 0.02));
        }
        if qwen && QWEN3VL_DEEPSTACK.get(b) == Some(&true) {
            let ds = |k: &str| format!("v.deepstack.{b}.{k}");
            t.push(vector(&ds("norm.weight"), 4 * e, 1.0, 0.1));
            t.push(vector(&ds("norm.bias"), 4 * e, 0.0, 0.02));
            merger(
                &run,
                12_000 + 3000 * b,
                [&ds("fc1"), &ds("fc2")],
                4 * e,
                text_embd,
                QWEN3VL_FC_SCALES,
                &mut t,
            );
        }
        t.push(f32_tensor(&name("ln1.weight"), &src("attn_norm", b)));
        t.push(f32_tensor(&name("ln2.weight"), &src("ffn_norm", b)));
        // Qwen2.5-VL's norms are RMS norms: a weight alone.
        if !qwen25 {
            t.push(vector(&name("ln1.bias"), e, 0.0, 0.02));
            t.push(vector(&name("ln2.bias"), e, 0.0, 0.02));
        }
    }
    // Idefics3's rows are its patches' rows side by side, unpooled: with the reference
    // model's final norm (a few large weights) every row of a photograph leans the same way.
    t.push(match kind {
        "gemma3" => f32_tensor("v.post_ln.weight", &values(&file, "output_norm.weight")),
        _ => vector("v.post_ln.weight", e, 1.0, 0.1),
    });
    if !qwen25 {
        t.push(vector("v.post_ln.bias", e, 0.0, 0.02));
    }
    let mut head_keys = head(kind, &run, e, text_embd, &mut t);

    let f32s = |v: [f32; 3]| Value::Array(Array::F32(v.to_vec()));
    let mut keys: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("clip".into())),
        (
            "clip.projector_type",
            Value::String(projector_type(kind).into()),
        ),
        ("clip.has_vision_encoder", Value::Bool(true)),
        // Qwen2.5-VL's FFN is SwiGLU, the others' GELU.
        match qwen25 {
            true => ("clip.use_silu", Value::Bool(true)),
            false => ("clip.use_gelu", Value::Bool(true)),
        },
        ("clip.vision.embedding_length", Value::U32(e as u32)),
        ("clip.vision.feed_forward_length", Value::U32(n_ff as u32)),
        ("clip.vision.block_count", Value::U32(BLOCKS as u32)),
        ("clip.vision.projection_dim", Value::U32(text_embd as u32)),
        (
            "clip.vision.attention.head_count",
            Value::U32(n_head as u32),
        ),
        ("clip.vision.attention.layer_norm_epsilon", Value::F32(1e-6)),
        ("clip.vision.image_size", Value::U32((side * patch) as u32)),
        ("clip.vision.patch_size", Value::U32(patch as u32)),
        ("clip.vision.image_mean", f32s([0.5; 3])),
        ("clip.vision.image_std", f32s([0.5; 3])),
    ];
    keys.append(&mut head_keys);
    let mut w = GgufWriter::new();
    for (k, v) in keys {
        w = w.kv(k, v);
    }
    for (name, dims, ty, bytes) in t {
        w = w.tensor(name, &dims, ty, bytes);
    }
    w.to_bytes()
}

/// The `clip.projector_type` of the test projector of `kind` (llama.cpp names Qwen3-VL's
/// by its merger).
fn projector_type(kind: &str) -> &str {
    match kind {
        "qwen3vl" => "qwen3vl_merger",
        "qwen25vl" => "qwen2.5vl_merger",
        _ => kind,
    }
}

/// A Qwen-VL merger MLP `names` (fc1: `wide` to `wide`, fc2: `wide` to `out`, biased), its
/// matrices cut from the token embeddings from `first_token` on, scaled by
/// [`QWEN3VL_FC_SCALES`].
fn merger(
    run: &dyn Fn(usize, usize) -> Vec<f32>,
    first_token: usize,
    names: [&str; 2],
    wide: usize,
    out: usize,
    scales: [f32; 2],
    t: &mut Vec<Tensor>,
) {
    let scaled = |v: Vec<f32>, s: f32| v.iter().map(|x| x * s).collect::<Vec<_>>();
    let fc1 = scaled(run(first_token, wide * wide), scales[0]);
    let fc2 = scaled(run(first_token + 1000, wide * out), scales[1]);
    t.push(f16_tensor(
        &format!("{}.weight", names[0]),
        &[wide, wide],
        &fc1,
    ));
    t.push(vector(&format!("{}.bias", names[0]), wide, 0.0, 0.02));
    t.push(f16_tensor(
        &format!("{}.weight", names[1]),
        &[wide, out],
        &fc2,
    ));
    t.push(vector(&format!("{}.bias", names[1]), out, 0.0, 0.02));
}

/// The head of `kind` (its tensors pushed on `t`): the keys it adds.
fn head(
    kind: &str,
    run: &dyn Fn(usize, usize) -> Vec<f32>,
    e: usize,
    text_embd: usize,
    t: &mut Vec<Tensor>,
) -> Vec<(&'static str, Value)> {
    match kind {
        "gemma3" => {
            t.push(vector("mm.soft_emb_norm.weight", e, 1.0, 0.1));
            // Stored as ggml multiplies by its transpose: text_embd values a row, e rows.
            // Scaled so that an image's rows are about as large as the text model's scaled
            // token embeddings (RMS near 1): three times larger, the text model turns chaotic
            // after an image (llama.cpp's own q8_0 cache then moves its logits by a mean KLD
            // near 0.1).
            let projection: Vec<f32> = run(6000, text_embd * e).iter().map(|v| v / 3.0).collect();
            t.push(f16_tensor(
                "mm.input_projection.weight",
                &[text_embd, e],
                &projection,
            ));
            let merge = Value::U32(GEMMA3_MERGE as u32);
            vec![("clip.vision.projector.scale_factor", merge)]
        }
        "idefics3" => {
            // Each shuffled row is 16 patches' rows side by side. Scaled so that a view's
            // rows are about as large as SmolLM2's token embeddings.
            let wide = e * IDEFICS3_MERGE * IDEFICS3_MERGE;
            let fc: Vec<f32> = run(6000, wide * text_embd)
                .iter()
                .map(|v| v * IDEFICS3_FC_SCALE)
                .collect();
            t.push(f16_tensor("mm.model.fc.weight", &[wide, text_embd], &fc));
            vec![
                (
                    "clip.vision.preproc_image_size",
                    Value::U32(IDEFICS3_LONGEST_EDGE as u32),
                ),
                (
                    "clip.vision.projector.scale_factor",
                    Value::U32(IDEFICS3_MERGE as u32),
                ),
            ]
        }
        "qwen3vl" => {
            let scales = QWEN3VL_FC_SCALES;
            merger(run, 20_000, ["mm.0", "mm.2"], 4 * e, text_embd, scales, t);
            vec![
                ("clip.vision.spatial_merge_size", Value::U32(2)),
                (
                    "clip.vision.is_deepstack_layers",
                    Value::Array(Array::Bool(QWEN3VL_DEEPSTACK.to_vec())),
                ),
            ]
        }
        "qwen25vl" => {
            let scales = QWEN25VL_FC_SCALES;
            merger(run, 20_000, ["mm.0", "mm.2"], 4 * e, text_embd, scales, t);
            vec![
                ("clip.vision.spatial_merge_size", Value::U32(2)),
                ("clip.vision.n_wa_pattern", Value::U32(QWEN25VL_FULL_EVERY)),
            ]
        }
        _ => panic!("no test projector of type {kind}"),
    }
}
