//! Regenerates the GGUF seeds of `corpus/gguf_parse` with the crate's own GGUF writer:
//! a tiny model that passes `Model::from_file` (tokenizer and chat template included), a
//! v2 variant, a header-only file, and truncations of the model.
//!
//! cargo +nightly run --example make_seeds   (from fuzz/)

use edgelm::gguf::{Array, GgufWriter, Value};
use edgelm::quant::GgmlType;

fn f32s(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| (0.01 * i as f32).to_le_bytes())
        .collect()
}

fn tiny_model() -> GgufWriter {
    // n_embd 8, 2 heads of 4, 1 KV head, n_ff 16, one block, a 5-token gpt2 vocabulary.
    let (e, ff, kv, vocab) = (8u64, 16u64, 4u64, 5u64);
    let mut w = GgufWriter::new()
        .kv("general.architecture", Value::String("llama".into()))
        .kv("general.alignment", Value::U32(32))
        .kv("general.name", Value::String("fuzz seed".into()))
        .kv("llama.block_count", Value::U32(1))
        .kv("llama.context_length", Value::U32(64))
        .kv("llama.embedding_length", Value::U32(e as u32))
        .kv("llama.feed_forward_length", Value::U32(ff as u32))
        .kv("llama.attention.head_count", Value::U32(2))
        .kv("llama.attention.head_count_kv", Value::U32(1))
        .kv("llama.rope.freq_base", Value::F32(10000.0))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("tokenizer.ggml.model", Value::String("gpt2".into()))
        .kv("tokenizer.ggml.pre", Value::String("smollm".into()))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(
                ["<|im_start|>", "<|im_end|>", "a", "b", "ab"]
                    .map(String::from)
                    .to_vec(),
            )),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![3, 3, 1, 1, 1])),
        )
        .kv(
            "tokenizer.ggml.merges",
            Value::Array(Array::String(vec!["a b".into()])),
        )
        .kv("tokenizer.ggml.bos_token_id", Value::U32(0))
        .kv("tokenizer.ggml.eos_token_id", Value::U32(1))
        .kv(
            "tokenizer.chat_template",
            Value::String(
                "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}".into(),
            ),
        )
        .tensor("token_embd.weight", &[e, vocab], GgmlType::F32, f32s((e * vocab) as usize))
        .tensor("output_norm.weight", &[e], GgmlType::F32, f32s(e as usize));
    for (name, dims) in [
        ("attn_norm.weight", vec![e]),
        ("attn_q.weight", vec![e, e]),
        ("attn_k.weight", vec![e, kv]),
        ("attn_v.weight", vec![e, kv]),
        ("attn_output.weight", vec![e, e]),
        ("ffn_norm.weight", vec![e]),
        ("ffn_gate.weight", vec![e, ff]),
        ("ffn_up.weight", vec![e, ff]),
        ("ffn_down.weight", vec![ff, e]),
    ] {
        let n: u64 = dims.iter().product();
        w = w.tensor(
            format!("blk.0.{name}"),
            &dims,
            GgmlType::F32,
            f32s(n as usize),
        );
    }
    w
}

fn main() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/gguf_parse");
    std::fs::create_dir_all(&dir).unwrap();
    let model = tiny_model().to_bytes();
    let file = edgelm::gguf::GgufFile::from_bytes(model.clone()).expect("seed parses");
    edgelm::model::Model::from_file(std::sync::Arc::new(file)).expect("seed loads as a model");
    std::fs::write(dir.join("tiny-model"), &model).unwrap();
    std::fs::write(
        dir.join("tiny-model-v2"),
        tiny_model().version(2).to_bytes(),
    )
    .unwrap();
    std::fs::write(
        dir.join("header-only"),
        GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .to_bytes(),
    )
    .unwrap();
    for cut in [4, 8, 24, 100, 1000, model.len() / 2, model.len() - 1] {
        std::fs::write(dir.join(format!("tiny-model-trunc-{cut}")), &model[..cut]).unwrap();
    }
    println!("{} bytes of model seed in {}", model.len(), dir.display());
}
