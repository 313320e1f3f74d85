//! The `gemma-embedding` test model: Gemma 3 270M (`gemma3_path`) relabelled as llama.cpp's
//! converter writes an EmbeddingGemma: `general.architecture` gemma-embedding, the `gemma3.*`
//! keys under `gemma-embedding.*`, its first `LAYERS` blocks, mean pooling, EOS appended to
//! every input (`add_eos_token`), a 2048-position context, and small deterministic f32 dense
//! projections (n_embd → 2·n_embd → n_embd). Every tensor kept is one gemma-embedding loads
//! (it ties its output to the embeddings); the sliding window, symmetric, is narrowed to
//! `GEMMA_EMBEDDING_TEST_WINDOW`.

use super::gemma3_path;
use super::test_models::{made_once, vector, Tensor};
use edgelm::gguf::{GgufFile, GgufWriter, Value};
use std::path::{Path, PathBuf};

const ARCH: &str = "gemma-embedding";
/// The sliding window, symmetric: 64 positions either side, so that most long texts of the
/// tests cross it many times (Gemma 3 270M's 512 reaches 256 either side, which only the
/// longest inputs one step computes cross, and moves them by less than the bar).
pub const GEMMA_EMBEDDING_TEST_WINDOW: u32 = 128;
/// EmbeddingGemma's trained context.
const CONTEXT: u32 = 2048;
/// Blocks kept: the first six (five symmetric-window layers and a global one). All 18 of
/// Gemma 3 270M amplify rounding so much that llama.cpp's own flash-attention and plain
/// attention paths differ by a cosine of 0.997 on short inputs (a chaotic model, for a bar
/// of 0.999); six differ by less than 0.0004.
const LAYERS: usize = 6;
/// Bumped when the recipe changes, so files made by an older one are not reused.
const RECIPE: u32 = 7;

/// The test model, with dense projections or without, made on first use beside the other
/// test models.
pub fn gemma_embedding_test_model(dense: bool) -> PathBuf {
    let kind = if dense { "dense" } else { "plain" };
    let name = format!("test-gemma-embedding-{kind}.r{RECIPE}.gguf");
    // One builder at a time: the tests of one binary ask for it at once.
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    made_once(&name, &gemma3_path(), |source| build(source, dense))
}

fn build(source: &Path, dense: bool) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let n_embd = file.get_u32("gemma3.embedding_length").unwrap() as usize;
    let hidden = 2 * n_embd;
    let mut w = GgufWriter::new().kv("general.architecture", Value::String(ARCH.into()));
    for (key, value) in file.metadata() {
        let value = match key.as_str() {
            "general.architecture" => continue,
            "general.name" => Value::String("edgelm test model".into()),
            "gemma3.context_length" => Value::U32(CONTEXT),
            "gemma3.block_count" => Value::U32(LAYERS as u32),
            "gemma3.attention.sliding_window" => Value::U32(GEMMA_EMBEDDING_TEST_WINDOW),
            // EmbeddingGemma's inputs end with EOS.
            "tokenizer.ggml.add_eos_token" => Value::Bool(true),
            _ => value.clone(),
        };
        let key = match key.strip_prefix("gemma3.") {
            Some(rest) => format!("{ARCH}.{rest}"),
            None => key.clone(),
        };
        w = w.kv(key, value);
    }
    w = w.kv(format!("{ARCH}.pooling_type"), Value::U32(1));
    if dense {
        for (k, v) in [
            ("dense_2_feat_in", n_embd),
            ("dense_2_feat_out", hidden),
            ("dense_3_feat_in", hidden),
            ("dense_3_feat_out", n_embd),
        ] {
            w = w.kv(format!("{ARCH}.{k}"), Value::U32(v as u32));
        }
    }
    for t in file.tensors() {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next());
        if layer.is_some_and(|l| l.parse::<usize>().unwrap() >= LAYERS) {
            continue;
        }
        w = w.tensor(t.name.clone(), &t.dims, t.ty, file.tensor_data(t).to_vec());
    }
    if dense {
        for (name, dims, ty, bytes) in dense_tensors(n_embd, hidden) {
            w = w.tensor(name, &dims, ty, bytes);
        }
    }
    w.to_bytes()
}

/// `dense_2.weight` ([n_embd, hidden] in ggml's dims) and `dense_3.weight` ([hidden, n_embd]),
/// roughly normal with a spread of 1/√(columns): each keeps its input's scale.
fn dense_tensors(n_embd: usize, hidden: usize) -> Vec<Tensor> {
    [
        ("dense_2.weight", n_embd, hidden),
        ("dense_3.weight", hidden, n_embd),
    ]
    .into_iter()
    .map(|(name, cols, rows)| {
        let mut t = vector(name, cols * rows, 0.0, 1.0 / (cols as f32).sqrt());
        t.1 = vec![cols as u64, rows as u64];
        t
    })
    .collect()
}
