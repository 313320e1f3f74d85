//! The `bert` test model: an encoder made from the reference model's tensors (SmolLM2-135M),
//! as llama.cpp's converter lays out a BERT. Its first `BERT_LAYERS` blocks keep their Q/K/V,
//! output, up and down matrices (the gate and the RMS norms go), gain biases, post layer
//! norms near 1 and small biases; position and token-type embeddings are small deterministic
//! f32 tables. The vocabulary is the reference BPE vocabulary turned into WordPiece pieces
//! (a piece after a space starts a word: "▁" + its text; the others continue one) with
//! [PAD], [UNK], [CLS], [SEP] and [MASK] in place of the first five tokens. It is no good
//! encoder; it is one whose every part matters, run by edgelm and by llama.cpp on one file.

use super::model_path;
use super::test_models::{made_once, raw_tensor, scaled_q4_1, vector, Tensor};
use edgelm::gguf::{Array, GgufFile, GgufWriter, Value};
use std::path::{Path, PathBuf};

/// Blocks kept (all-MiniLM-L6's count).
const BERT_LAYERS: usize = 6;
/// Trained positions (`bert.context_length`, the rows of `position_embd`).
pub const BERT_CONTEXT: usize = 512;
const TOKEN_TYPES: usize = 2;
/// Scales the query rows: the reference model's Q and K, made for RMS-normed inputs, score
/// a layer-normed residual (larger) so sharply that attention is near an argmax, where the
/// f16 rounding both engines do flips which position wins on some inputs (a chaotic model).
const QUERY_SCALE: f32 = 0.125;
/// Bumped when the recipe changes, so files made by an older one are not reused.
const RECIPE: u32 = 4;
/// The special tokens, at ids 0.. (BERT's order).
const SPECIALS: [&str; 5] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];

/// The `bert` test model pooled by `pooling` (llama.cpp's number: 1 mean, 2 cls), made on
/// first use beside the other test models.
pub fn bert_test_model(pooling: u32) -> PathBuf {
    let name = format!("test-bert-pool{pooling}.r{RECIPE}.gguf");
    made_once(&name, &model_path(), |source| build(source, pooling))
}

fn build(source: &Path, pooling: u32) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let u32_key = |k: &str| file.get_u32(&format!("llama.{k}")).unwrap();
    let n_embd = u32_key("embedding_length") as usize;
    encoder_gguf(
        &file,
        "bert",
        bert_keys(&file, pooling),
        tensors(&file, n_embd),
    )
}

/// An encoder test model's file: `arch`, its `keys` (under `{arch}.`), the reference model's
/// vocabulary as WordPiece, and `tensors`.
pub(super) fn encoder_gguf(
    file: &GgufFile,
    arch: &str,
    keys: Vec<(&'static str, Value)>,
    tensors: Vec<Tensor>,
) -> Vec<u8> {
    let mut w = GgufWriter::new()
        .kv("general.architecture", Value::String(arch.into()))
        .kv("general.name", Value::String("edgelm test model".into()));
    for (k, v) in keys {
        w = w.kv(format!("{arch}.{k}"), v);
    }
    for (k, v) in vocabulary(file) {
        w = w.kv(k, v);
    }
    for (name, dims, ty, bytes) in tensors {
        w = w.tensor(name, &dims, ty, bytes);
    }
    w.to_bytes()
}

fn bert_keys(file: &GgufFile, pooling: u32) -> Vec<(&'static str, Value)> {
    encoder_keys(file, BERT_LAYERS, BERT_CONTEXT, pooling)
}

/// An encoder test model's hyper-parameters: `layers` blocks over `context` positions, the
/// reference model's widths and heads, bidirectional, pooled by `pooling`.
pub(super) fn encoder_keys(
    file: &GgufFile,
    layers: usize,
    context: usize,
    pooling: u32,
) -> Vec<(&'static str, Value)> {
    let copy = |k: &str| Value::U32(file.get_u32(&format!("llama.{k}")).unwrap());
    vec![
        ("block_count", Value::U32(layers as u32)),
        ("context_length", Value::U32(context as u32)),
        ("embedding_length", copy("embedding_length")),
        ("feed_forward_length", copy("feed_forward_length")),
        ("attention.head_count", copy("attention.head_count")),
        ("attention.head_count_kv", copy("attention.head_count_kv")),
        ("attention.layer_norm_epsilon", Value::F32(1e-12)),
        ("attention.causal", Value::Bool(false)),
        ("pooling_type", Value::U32(pooling)),
    ]
}

/// The WordPiece vocabulary's keys (see the module's comment).
pub(super) fn vocabulary(file: &GgufFile) -> Vec<(&'static str, Value)> {
    let bpe = file
        .get("tokenizer.ggml.tokens")
        .and_then(|v| v.as_string_array())
        .unwrap();
    // Every string once (llama.cpp refuses a vocabulary that repeats one): a piece already
    // there keeps its BPE form, or failing that a name of its own.
    let mut seen: std::collections::HashSet<String> =
        SPECIALS.iter().map(|s| s.to_string()).collect();
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| s.to_string()).collect();
    for (i, t) in bpe.iter().enumerate().skip(SPECIALS.len()) {
        let piece = [word_piece(t), t.clone(), format!("[DUP{i}]")]
            .into_iter()
            .find(|p| !seen.contains(p))
            .unwrap();
        seen.insert(piece.clone());
        tokens.push(piece);
    }
    let mut types = vec![1i32; tokens.len()];
    for (i, s) in SPECIALS.iter().enumerate() {
        types[i] = if *s == "[UNK]" { 2 } else { 3 };
    }
    let id = |v: u32| Value::U32(v);
    vec![
        ("tokenizer.ggml.model", Value::String("bert".into())),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ("tokenizer.ggml.token_type_count", id(TOKEN_TYPES as u32)),
        ("tokenizer.ggml.padding_token_id", id(0)),
        ("tokenizer.ggml.unknown_token_id", id(1)),
        ("tokenizer.ggml.bos_token_id", id(2)),
        ("tokenizer.ggml.cls_token_id", id(2)),
        ("tokenizer.ggml.seperator_token_id", id(3)),
        ("tokenizer.ggml.mask_token_id", id(4)),
    ]
}

/// A byte-level BPE token as a WordPiece piece: its text, "▁" in place of a leading space;
/// a token that is not whole UTF-8 text stays as it is (no input can produce it).
fn word_piece(token: &str) -> String {
    let bytes: Option<Vec<u8>> = token.chars().map(byte_of).collect();
    match bytes.and_then(|b| String::from_utf8(b).ok()) {
        Some(text) => match text.strip_prefix(' ') {
            Some(rest) => format!("\u{2581}{rest}"),
            None => text,
        },
        None => token.to_string(),
    }
}

/// GPT-2's byte-level alphabet, backwards: the byte a character of a BPE token stands for.
fn byte_of(c: char) -> Option<u8> {
    let kept =
        |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let c = c as u32;
    if c < 256 && kept(c) {
        return Some(c as u8);
    }
    // The other bytes are shifted to 256.. in order.
    let shifted: Vec<u32> = (0..256).filter(|&b| !kept(b)).collect();
    shifted.get(c.checked_sub(256)? as usize).map(|&b| b as u8)
}

/// The tensors (see the module's comment).
fn tensors(file: &GgufFile, n_embd: usize) -> Vec<Tensor> {
    let raw = |name: &str| raw_tensor(file, name);
    let table = |name: &str, rows: usize, spread: f32| {
        let mut t = vector(name, n_embd * rows, 0.0, spread);
        t.1 = vec![n_embd as u64, rows as u64];
        t
    };
    let mut out = vec![
        raw("token_embd.weight"),
        table("position_embd.weight", BERT_CONTEXT, 0.03),
        table("token_types.weight", TOKEN_TYPES, 0.03),
        vector("token_embd_norm.weight", n_embd, 1.0, 0.1),
        vector("token_embd_norm.bias", n_embd, 0.0, 0.02),
    ];
    for l in 0..BERT_LAYERS {
        let name = |k: &str| format!("blk.{l}.{k}");
        for (k, bias) in [
            ("attn_q", 0.05),
            ("attn_k", 0.05),
            ("attn_v", 0.05),
            ("attn_output", 0.02),
            ("ffn_up", 0.05),
            ("ffn_down", 0.02),
        ] {
            let mut m = raw(&name(&format!("{k}.weight")));
            if k == "attn_q" {
                m.3 = scaled_q4_1(&m.3, QUERY_SCALE);
            }
            let rows = m.1[1] as usize;
            out.push(m);
            out.push(vector(&name(&format!("{k}.bias")), rows, 0.0, bias));
        }
        for norm in ["attn_output_norm", "layer_output_norm"] {
            out.push(vector(&name(&format!("{norm}.weight")), n_embd, 1.0, 0.1));
            out.push(vector(&name(&format!("{norm}.bias")), n_embd, 0.0, 0.02));
        }
    }
    out
}
