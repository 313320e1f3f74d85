//! One test GGUF per architecture, made from the reference model's tensors (SmolLM2-135M,
//! Q4_1): the same weights re-laid and re-labelled as llama.cpp's converter writes each family,
//! with the parts the family adds (biases, Q/K norms, post-norms, fused tensors, RoPE factors,
//! scales, sliding windows) filled with small deterministic values. They are not good language
//! models; they are models whose every part matters, run by edgelm and by llama.cpp (the KLD
//! tests) or by two edgelm backends (the CUDA tests) on the same file.

use super::{kept, model_path, repo_root};
use edgelm::gguf::{Array, GgufFile, GgufWriter, Value};
use edgelm::quant::GgmlType;
use std::path::{Path, PathBuf};

/// The architectures [`test_model`] makes (the reference model itself is `llama` with tied
/// output; its `llama` test model adds what Llama 3.x adds).
pub const TEST_ARCHS: [&str; 11] = [
    "llama", "qwen2", "qwen3", "qwen3moe", "phi3", "smollm3", "granite", "gemma3", "gpt-oss",
    "lfm2", "qwen35",
];

/// Every this many layers of the `lfm2` test model, the last is a short convolution of
/// `LFM2_TAPS` taps (5, 11, ...); the others attend. (The reference model loses too much
/// without its attention for a real LFM2's two convolution layers in three: its logits turn
/// chaotic, and llama.cpp's own q8_0 cache then moves them by more than any bar could use.)
const LFM2_CONV_EVERY: usize = 6;
const LFM2_TAPS: usize = 3;
/// How much of a convolution layer's output reaches the residual stream.
const LFM2_OUT_SCALE: f32 = 0.25;

/// Whether layer `l` of the `lfm2` test model is a short convolution.
fn lfm2_conv(l: usize) -> bool {
    l % LFM2_CONV_EVERY == LFM2_CONV_EVERY - 1
}

/// Every this many layers of the `qwen35` test model, the last is a gated DeltaNet (5, 11,
/// ...); the others attend. (A real Qwen3.5 has three in four; the reference model, trained
/// to attend everywhere, turns chaotic long before that.)
const QWEN35_DELTA_EVERY: usize = 6;
/// The DeltaNet's shape: 3 key heads (the reference model's K rows) shared by 6 value heads of
/// 64, a convolution of 4 taps (Qwen3.5's).
const QWEN35_TAPS: usize = 4;
const QWEN35_K_HEADS: usize = 3;
const QWEN35_V_HEADS: usize = 6;
/// How much of a DeltaNet layer's output reaches the residual stream.
const QWEN35_OUT_SCALE: f32 = 0.25;
/// Rotated dimensions of each 64-wide head, and their M-RoPE sections (pairs 6 + 4 + 4 of 16:
/// interleaved, they leave pair 13 unturned, which a real Qwen3.5's [11, 11, 10] never does).
const QWEN35_ROT: usize = 32;
const QWEN35_SECTIONS: [i32; 4] = [6, 4, 4, 0];

/// Whether layer `l` of the `qwen35` test model is a gated DeltaNet.
fn qwen35_delta(l: usize) -> bool {
    l % QWEN35_DELTA_EVERY == QWEN35_DELTA_EVERY - 1
}

/// Bumped when a recipe changes, so files made by an older one are not reused.
const RECIPE: u32 = 2;

/// The `qwen3moe` test model's experts. Each dense FFN is cut in `TEST_SLICES` slices of its
/// width, and every slice is two experts (e and e + `TEST_SLICES`) that differ in strength.
/// The router's row for expert e + `TEST_SLICES` is the negated row of expert e, so of each
/// pair exactly one has a positive logit and the top `TEST_EXPERTS_USED` picks one expert of
/// each pair: together they compute about the dense FFN (a model as good as the reference
/// one), and which one of a pair a token picks, and with what weight, changes the output.
const TEST_SLICES: usize = 4;
pub const TEST_EXPERTS: usize = 2 * TEST_SLICES;
pub const TEST_EXPERTS_USED: usize = TEST_SLICES;

/// The sliding window of the `gemma3` test model: short enough that a 512-token chunk crosses
/// it many times (the real Gemma 3's 512 never matters at `-c 512`).
pub const GEMMA3_TEST_WINDOW: u32 = 96;

/// The test model of `arch`, made on first use (in `EDGELM_TEST_MODELS`, default
/// target/test-models) and remade when the reference model is newer.
pub fn test_model(arch: &str) -> PathBuf {
    assert!(TEST_ARCHS.contains(&arch), "no test model for {arch}");
    made_once(
        &format!("test-{arch}.r{RECIPE}.gguf"),
        &model_path(),
        |source| build(source, arch),
    )
}

/// The test model of `arch` cut to its first `layers` layers, with `block_count` and every
/// per-layer array cut alike. For the CUDA emulator, whose runs take seconds per layer: six
/// layers keep every kind of layer a test model has (lfm2's convolution, qwen35's DeltaNet and
/// gemma3's global layer are each layer 5, smollm3's layer without RoPE is layer 3).
pub fn test_model_cut(arch: &str, layers: usize) -> PathBuf {
    made_once(
        &format!("test-{arch}.r{RECIPE}.layers{layers}.gguf"),
        &test_model(arch),
        |source| cut(source, layers),
    )
}

fn cut(source: &Path, layers: usize) -> Vec<u8> {
    let file = GgufFile::open(source).unwrap();
    let count_key = format!("{}.block_count", file.architecture().unwrap());
    let all = file.get_u32(&count_key).unwrap() as usize;
    assert!(layers <= all, "{source:?} has {all} layers, not {layers}");
    let mut w = GgufWriter::new();
    for (k, v) in file.metadata() {
        let v = match v {
            _ if *k == count_key => Value::U32(layers as u32),
            Value::Array(a) => Value::Array(per_layer_cut(a, all, layers)),
            v => v.clone(),
        };
        w = w.kv(k.clone(), v);
    }
    for t in file.tensors() {
        if layer_of(&t.name).is_none_or(|l| l < layers) {
            let (name, dims, ty, bytes) = raw_tensor(&file, &t.name);
            w = w.tensor(name, &dims, ty, bytes);
        }
    }
    w.to_bytes()
}

/// The layer a tensor named `blk.L.…` belongs to; none for the others.
fn layer_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    Some(rest.split('.').next().unwrap().parse().unwrap())
}

/// `a` cut to its first `layers` entries if it has one per layer (`all` of them), else `a`.
fn per_layer_cut(a: &Array, all: usize, layers: usize) -> Array {
    fn first<T: Clone>(v: &[T], n: usize) -> Vec<T> {
        v[..n].to_vec()
    }
    match a {
        Array::I32(v) if v.len() == all => Array::I32(first(v, layers)),
        Array::U32(v) if v.len() == all => Array::U32(first(v, layers)),
        Array::F32(v) if v.len() == all => Array::F32(first(v, layers)),
        Array::Bool(v) if v.len() == all => Array::Bool(first(v, layers)),
        a => a.clone(),
    }
}

/// The test model file `name` (in `EDGELM_TEST_MODELS`, default target/test-models), made
/// from `source` by `build` on first use and again when `source` is newer.
pub(super) fn made_once(
    name: &str,
    source: &Path,
    build: impl FnOnce(&Path) -> Vec<u8>,
) -> PathBuf {
    let dir = std::env::var_os("EDGELM_TEST_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/test-models"));
    kept(&dir.join(name), &[source], || build(source))
}

/// Tensor `name` of `file`, as it is there.
pub(super) fn raw_tensor(file: &GgufFile, name: &str) -> Tensor {
    let t = file
        .tensors()
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no {name} in the source model"));
    (
        t.name.clone(),
        t.dims.clone(),
        t.ty,
        file.tensor_data(t).to_vec(),
    )
}

/// A tensor to write: name, ggml dims, type, bytes.
pub(super) type Tensor = (String, Vec<u64>, GgmlType, Vec<u8>);

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
    let mut kvs_template: Option<String> = None;
    // Sets a key of the family, over the reference model's value where it has one.
    let mut key = |k: &str, v: Value| {
        let k = format!("{arch}.{k}");
        match kvs.iter_mut().find(|(name, _)| *name == k) {
            Some(slot) => slot.1 = v,
            None => kvs.push((k, v)),
        }
    };

    let raw = |name: &str| raw_tensor(&file, name);
    let mut out: Vec<Tensor> = Vec::new();
    for t in file.tensors() {
        let parts: Vec<&str> = t.name.split('.').collect();
        let layer = layer_of(&t.name);
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
        if let (Some(l), "qwen3moe" | "gpt-oss") = (layer, arch) {
            let gpt_oss = arch == "gpt-oss";
            if let Some(experts) = experts_of(&tensor, kind, l, n_embd, gpt_oss) {
                out.extend(experts);
                continue;
            }
        }
        if let (Some(l), "lfm2") = (layer, arch) {
            if lfm2_conv(l) {
                if let Some(conv) = lfm2_short_conv(&raw, kind, l) {
                    out.extend(conv);
                    continue;
                }
                if matches!(kind, "attn_k" | "attn_v" | "attn_output") {
                    continue;
                }
            }
        }
        if let (Some(l), "qwen35") = (layer, arch) {
            if let Some(tensors) = qwen35_layer(&raw, kind, l) {
                out.extend(tensors);
                continue;
            }
        }
        if let ("lfm2", "output_norm") = (arch, parts[0]) {
            // LFM2's converter names the final norm after the embedding.
            let mut norm = tensor;
            norm.0 = "token_embd_norm.weight".into();
            out.push(norm);
            continue;
        }
        if let (Some(l), "gpt-oss" | "qwen35", "ffn_norm") = (layer, arch, kind) {
            // gpt-oss names the FFN's norm after the attention it follows.
            let mut norm = tensor;
            norm.0 = format!("blk.{l}.post_attention_norm.weight");
            out.push(norm);
            continue;
        }
        let rows = tensor.1.get(1).copied().unwrap_or(1) as usize;
        out.push(tensor);
        let Some(l) = layer else { continue };
        let name = |k: &str| format!("blk.{l}.{k}.weight");
        match (arch, kind) {
            ("qwen2" | "gpt-oss", "attn_q" | "attn_k" | "attn_v") => {
                out.push(vector(&format!("blk.{l}.{kind}.bias"), rows, 0.0, 0.05))
            }
            ("gpt-oss", "attn_output") => {
                out.push(vector(
                    &format!("blk.{l}.attn_output.bias"),
                    rows,
                    0.0,
                    0.02,
                ));
                let n_head = u32_key("attention.head_count") as usize;
                out.push(vector(&name("attn_sinks"), n_head, 0.5, 1.0));
            }
            ("qwen3" | "qwen3moe" | "gemma3" | "lfm2", "attn_q") => {
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
    if matches!(arch, "qwen3moe" | "gpt-oss") {
        let ff = u32_key("feed_forward_length") as usize;
        key("expert_count", Value::U32(TEST_EXPERTS as u32));
        key("expert_used_count", Value::U32(TEST_EXPERTS_USED as u32));
        key(
            "expert_feed_forward_length",
            Value::U32((ff / TEST_SLICES) as u32),
        );
    }
    match arch {
        "lfm2" => key("shortconv.l_cache", Value::U32(LFM2_TAPS as u32)),
        "qwen35" => {
            let layers = u32_key("block_count") as usize;
            for (k, v) in qwen35_keys(layers, head_dim) {
                key(k, v);
            }
        }
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
        "gpt-oss" => {
            // gpt-oss's own chat template, so that chat speaks harmony as with a real gpt-oss
            // file (the reference vocabulary spells the markers out as text).
            let template = repo_root().join("tests/data/gpt-oss-chat-template.jinja");
            let template = std::fs::read_to_string(template).unwrap();
            kvs_template = Some(template);
            key("attention.sliding_window", Value::U32(GEMMA3_TEST_WINDOW));
            key("rope.scaling.type", Value::String("yarn".into()));
            key("rope.scaling.factor", Value::F32(2.0));
            key("rope.scaling.original_context_length", Value::U32(4096));
            let mut output = raw("token_embd.weight");
            output.0 = "output.weight".into();
            out.push(output);
        }
        "gemma3" => {
            key("attention.sliding_window", Value::U32(GEMMA3_TEST_WINDOW));
            key("attention.key_length", Value::U32(head_dim as u32));
            key("attention.value_length", Value::U32(head_dim as u32));
        }
        _ => {}
    }
    if arch == "lfm2" {
        // One KV head count per layer, 0 on the convolution layers (as LFM2's converter).
        let kv = u32_key("attention.head_count_kv") as i32;
        let layers = u32_key("block_count") as usize;
        let per_layer = (0..layers)
            .map(|l| if lfm2_conv(l) { 0 } else { kv })
            .collect();
        let slot = kvs
            .iter_mut()
            .find(|(k, _)| k == "lfm2.attention.head_count_kv");
        slot.expect("the reference model has head_count_kv").1 =
            Value::Array(Array::I32(per_layer));
    }
    if let Some(t) = kvs_template {
        let slot = kvs.iter_mut().find(|(k, _)| k == "tokenizer.chat_template");
        slot.expect("the reference model has a chat template").1 = Value::String(t);
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

/// The `qwen35` test model's keys: the DeltaNet's shape, its layers (as the converter writes
/// both: the array decides), partial M-RoPE with its sections, and the head dimension.
fn qwen35_keys(layers: usize, head_dim: usize) -> Vec<(&'static str, Value)> {
    let d = QWEN35_V_HEADS * head_dim;
    vec![
        ("ssm.conv_kernel", Value::U32(QWEN35_TAPS as u32)),
        ("ssm.state_size", Value::U32(head_dim as u32)),
        ("ssm.group_count", Value::U32(QWEN35_K_HEADS as u32)),
        ("ssm.time_step_rank", Value::U32(QWEN35_V_HEADS as u32)),
        ("ssm.inner_size", Value::U32(d as u32)),
        ("full_attention_interval", Value::U32(4)),
        (
            "attention.recurrent_layers",
            Value::Array(Array::Bool((0..layers).map(qwen35_delta).collect())),
        ),
        ("rope.dimension_count", Value::U32(QWEN35_ROT as u32)),
        (
            "rope.dimension_sections",
            Value::Array(Array::I32(QWEN35_SECTIONS.to_vec())),
        ),
        ("attention.key_length", Value::U32(head_dim as u32)),
        ("attention.value_length", Value::U32(head_dim as u32)),
    ]
}

/// What stands for layer `l`'s attention tensor `kind` in the `qwen35` test model; `None`
/// where the tensor stays as it is. An attention layer's Q gains an output gate per head
/// (the head's query rows halved: σ near ½) and its output matrix doubles to make up for it.
/// A DeltaNet layer's tensors are written where `attn_q` was (its K, V and output go): q, k
/// and v are the layer's first 192 Q rows, its K rows, and its V rows with the previous
/// layer's; z its other 384 Q rows; β and α small f32 matrices; decays near ½ a token; the
/// out-projection the output matrix's first 384 columns at `QWEN35_OUT_SCALE`.
fn qwen35_layer(raw: &dyn Fn(&str) -> Tensor, kind: &str, l: usize) -> Option<Vec<Tensor>> {
    let name = |k: &str| format!("blk.{l}.{k}.weight");
    match (qwen35_delta(l), kind) {
        (false, "attn_q") => {
            let q = raw(&name("attn_q"));
            let gate = (q.0.clone(), q.1.clone(), q.2, scaled_q4_1(&q.3, 0.5));
            let heads = q.1[1] as usize / 64;
            let parts: Vec<Tensor> = (0..heads)
                .flat_map(|h| [rows(&q, h * 64, 64), rows(&gate, h * 64, 64)])
                .collect();
            Some(vec![
                stack(&q.0, &parts),
                vector(&name("attn_q_norm"), 64, 1.0, 0.1),
                vector(&name("attn_k_norm"), 64, 1.0, 0.1),
            ])
        }
        (false, "attn_output") => {
            let mut o = raw(&name("attn_output"));
            o.3 = scaled_q4_1(&o.3, 2.0);
            Some(vec![o])
        }
        (true, "attn_q") => Some(qwen35_delta_net(raw, l)),
        (true, "attn_k" | "attn_v" | "attn_output") => Some(Vec::new()),
        _ => None,
    }
}

/// Layer `l`'s gated DeltaNet tensors (see [`qwen35_layer`]).
fn qwen35_delta_net(raw: &dyn Fn(&str) -> Tensor, l: usize) -> Vec<Tensor> {
    let name = |k: &str| format!("blk.{l}.{k}.weight");
    let q = raw(&name("attn_q"));
    let n_embd = q.1[0] as usize;
    let key_dim = QWEN35_K_HEADS * 64;
    let value_dim = QWEN35_V_HEADS * 64;
    let v_prev = raw(&format!("blk.{}.attn_v.weight", l - 1));
    let qkv = stack(
        &name("attn_qkv"),
        &[
            rows(&q, 0, key_dim),
            raw(&name("attn_k")),
            raw(&name("attn_v")),
            v_prev,
        ],
    );
    let mut z = rows(&q, key_dim, value_dim);
    z.0 = name("attn_gate");
    let channels = 2 * key_dim + value_dim;
    let mut kernel = vector(&name("ssm_conv1d"), QWEN35_TAPS * channels, 0.15, 0.05);
    // Per channel, taps oldest first: the newest weighs most.
    let taps: Vec<f32> = f32s(&kernel.3)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1 + i % QWEN35_TAPS) as f32)
        .collect();
    kernel.3 = taps.iter().flat_map(|v| v.to_le_bytes()).collect();
    kernel.1 = vec![QWEN35_TAPS as u64, channels as u64];
    let matrix = |k: &str| {
        let mut m = vector(&name(k), n_embd * QWEN35_V_HEADS, 0.0, 0.05);
        m.1 = vec![n_embd as u64, QWEN35_V_HEADS as u64];
        m
    };
    let mut out = raw(&name("attn_output"));
    out.0 = name("ssm_out");
    out.3 = scaled_q4_1(&columns_q4_1(&out, value_dim), QWEN35_OUT_SCALE);
    out.1 = vec![value_dim as u64, n_embd as u64];
    vec![
        qkv,
        z,
        kernel,
        vector(&format!("blk.{l}.ssm_dt.bias"), QWEN35_V_HEADS, 1.0, 0.5),
        vector(&format!("blk.{l}.ssm_a"), QWEN35_V_HEADS, -0.5, 0.2),
        matrix("ssm_beta"),
        matrix("ssm_alpha"),
        vector(&name("ssm_norm"), 64, 1.0, 0.1),
        out,
    ]
}

/// Rows `first..first + n` of a 2-D tensor.
fn rows(t: &Tensor, first: usize, n: usize) -> Tensor {
    let row = t.3.len() / t.1[1] as usize;
    let bytes = t.3[first * row..(first + n) * row].to_vec();
    (t.0.clone(), vec![t.1[0], n as u64], t.2, bytes)
}

/// The first `cols` columns of every row of a Q4_1 matrix (whole blocks of 32).
fn columns_q4_1(t: &Tensor, cols: usize) -> Vec<u8> {
    assert_eq!(
        t.2,
        GgmlType::Q4_1,
        "the reference model's matrices are Q4_1"
    );
    let row = t.3.len() / t.1[1] as usize;
    t.3.chunks_exact(row)
        .flat_map(|r| r[..cols / 32 * 20].iter().copied())
        .collect()
}

/// The values of an f32 tensor's bytes.
fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|v| f32::from_le_bytes(v.try_into().unwrap()))
        .collect()
}

/// The short-convolution tensors that stand for layer `l`'s attention (written where its
/// `attn_q` was; its K, V and output go): the in-projection's B, C and x bands are the layer's
/// Q rows, its output matrix and the previous layer's Q rows, each halved, the out-projection its
/// output matrix, and the kernel small positive taps (the newest the largest), so the layer
/// mixes the last three positions without drowning the residual. `None` for other tensors.
fn lfm2_short_conv(raw: &dyn Fn(&str) -> Tensor, kind: &str, l: usize) -> Option<Vec<Tensor>> {
    if kind != "attn_q" {
        return None;
    }
    let name = |k: &str| format!("blk.{l}.{k}.weight");
    let half = |mut t: Tensor| {
        assert_eq!(
            t.2,
            GgmlType::Q4_1,
            "the reference model's matrices are Q4_1"
        );
        t.3 = scaled_q4_1(&t.3, 0.5);
        t
    };
    let b = half(raw(&name("attn_q")));
    let c = half(raw(&name("attn_output")));
    let x = half(raw(&format!("blk.{}.attn_q.weight", l - 1)));
    let in_proj = stack(&name("shortconv.in_proj"), &[b, c, x]);
    let mut out_proj = raw(&name("attn_output"));
    out_proj.0 = name("shortconv.out_proj");
    out_proj.3 = scaled_q4_1(&out_proj.3, LFM2_OUT_SCALE);
    let n_embd = out_proj.1[1] as usize;
    let mut kernel = vector(&name("shortconv.conv"), LFM2_TAPS * n_embd, 0.2, 0.05);
    // Per channel, taps oldest first: the newest weighs most.
    let taps: Vec<f32> = kernel
        .3
        .chunks_exact(4)
        .enumerate()
        .map(|(i, v)| f32::from_le_bytes(v.try_into().unwrap()) * (1 + i % LFM2_TAPS) as f32)
        .collect();
    kernel.3 = taps.iter().flat_map(|v| v.to_le_bytes()).collect();
    kernel.1 = vec![LFM2_TAPS as u64, n_embd as u64];
    Some(vec![in_proj, kernel, out_proj])
}

/// The expert tensors that stand for dense FFN tensor `t` of layer `l` (see
/// [`TEST_SLICES`]): slice s of the FFN's width is the gate and up rows of band s (the same
/// bytes) and a band of the down matrix's columns, scaled by `TEST_SLICES` in expert s and by
/// three quarters of that in expert s + `TEST_SLICES`. The router is written beside the gate.
///
/// `gpt_oss`: the experts in MXFP4 (the Q4_1 rows decoded, scaled, and re-encoded), with the
/// biases gpt-oss has (see [`router_bias`]; small ones on the gate and down outputs, and -1 on
/// the up outputs). gpt-oss's SwiGLU is `x·σ(1.702·x)·(u + 1)`: with the gate rows divided by
/// 1.702, the up rows multiplied by it and the up bias taking the 1 back, it is the reference
/// model's `silu(g)·u` (but where its clamps bind), so the experts still compute about the
/// reference model's FFN.
fn experts_of(
    t: &Tensor,
    kind: &str,
    l: usize,
    n_embd: usize,
    gpt_oss: bool,
) -> Option<Vec<Tensor>> {
    let (name, dims, ty, bytes) = t;
    let exps = |k: &str| format!("blk.{l}.{k}_exps.weight");
    let n = TEST_EXPERTS as u64;
    let expert_bias = |k: &str, len: usize, center: f32| {
        let b = vector(
            &format!("blk.{l}.{k}_exps.bias"),
            len * TEST_EXPERTS,
            center,
            0.02,
        );
        (b.0, vec![len as u64, n], b.2, b.3)
    };
    match kind {
        "ffn_gate" | "ffn_up" => {
            let (cols, slice_rows) = (dims[0], dims[1] / TEST_SLICES as u64);
            let (ty, bytes) = if gpt_oss {
                let factor = if kind == "ffn_gate" {
                    1.0 / 1.702
                } else {
                    1.702
                };
                (GgmlType::MXFP4, to_mxfp4(*ty, bytes, factor))
            } else {
                (*ty, bytes.clone())
            };
            let both = [bytes.as_slice(), bytes.as_slice()].concat();
            let mut out = vec![(exps(kind), vec![cols, slice_rows, n], ty, both)];
            if gpt_oss {
                let center = if kind == "ffn_up" { -1.0 } else { 0.0 };
                out.push(expert_bias(kind, slice_rows as usize, center));
            }
            if kind == "ffn_gate" {
                let half = vector(
                    &format!("blk.{l}.ffn_gate_inp.weight"),
                    n_embd * TEST_SLICES,
                    0.0,
                    0.02,
                );
                let negated: Vec<u8> = half
                    .3
                    .chunks_exact(4)
                    .flat_map(|v| (-f32::from_le_bytes(v.try_into().unwrap())).to_le_bytes())
                    .collect();
                let router = [half.3, negated].concat();
                out.push((half.0, vec![n_embd as u64, n], half.2, router));
                if gpt_oss {
                    out.push(router_bias(l));
                }
            }
            Some(out)
        }
        "ffn_down" => {
            assert_eq!(*ty, GgmlType::Q4_1, "{name}: the recipe scales Q4_1 blocks");
            let (cols, rows) = (dims[0] as usize, dims[1] as usize);
            let row_bytes = bytes.len() / rows;
            let slice = row_bytes / TEST_SLICES;
            let mut out = Vec::with_capacity(2 * bytes.len());
            for strength in [1.0, 0.75] {
                for s in 0..TEST_SLICES {
                    for r in 0..rows {
                        let at = r * row_bytes + s * slice;
                        let factor = strength * TEST_SLICES as f32;
                        let band = &bytes[at..at + slice];
                        if gpt_oss {
                            out.extend(to_mxfp4(*ty, band, factor));
                        } else {
                            out.extend(scaled_q4_1(band, factor));
                        }
                    }
                }
            }
            let ff = (cols / TEST_SLICES) as u64;
            if gpt_oss {
                let down = (
                    exps("ffn_down"),
                    vec![ff, rows as u64, n],
                    GgmlType::MXFP4,
                    out,
                );
                return Some(vec![down, expert_bias("ffn_down", rows, 0.0)]);
            }
            Some(vec![(exps("ffn_down"), vec![ff, rows as u64, n], *ty, out)])
        }
        _ => None,
    }
}

/// gpt-oss's router bias: +1 on experts 0..`TEST_SLICES` and -1 on their pair members (with
/// a little noise, the same for both of a pair). A token still picks one expert of each pair,
/// the strong one unless its router logit is below -1. Without the shift, the pick between the
/// two is decided by a logit near 0, and rounding differences flip picks often enough to make
/// the model chaotic (llama.cpp's own q8_0-cache KLD 0.1 to 0.5 on it), which would make the
/// comparison meaningless.
fn router_bias(l: usize) -> Tensor {
    let noise = vector(
        &format!("blk.{l}.ffn_gate_inp.bias"),
        TEST_SLICES,
        0.0,
        0.01,
    );
    let shifted = |by: f32| -> Vec<u8> {
        noise
            .3
            .chunks_exact(4)
            .flat_map(|v| (f32::from_le_bytes(v.try_into().unwrap()) + by).to_le_bytes())
            .collect()
    };
    let bytes = [shifted(1.0), shifted(-1.0)].concat();
    (noise.0.clone(), vec![TEST_EXPERTS as u64], noise.2, bytes)
}

/// Rows of `ty` decoded, times `factor`, and encoded as MXFP4 with ggml's reference quantizer
/// (`quantize_row_mxfp4_ref`): per 32 values, the exponent of the largest magnitude less 2,
/// and each value's nearest entry of the doubled E2M1 table.
fn to_mxfp4(ty: GgmlType, bytes: &[u8], factor: f32) -> Vec<u8> {
    use edgelm::quant::{e8m0_to_f32_half, KVALUES_MXFP4};
    let n = bytes.len() / ty.block_bytes() * ty.block_elems();
    let mut values = vec![0f32; n];
    edgelm::quant::dequantize_row(ty, bytes, &mut values).unwrap();
    let mut out = Vec::with_capacity(n / 32 * 17);
    for block in values.chunks_exact(32) {
        let block: Vec<f32> = block.iter().map(|v| v * factor).collect();
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(e);
        let nearest = |x: f32| {
            let err = |k: i8| (k as f32 * d - x).abs();
            // The first of equally near entries, as ggml's `best_index_mxfp4`.
            (1..16).fold(0, |best, i| {
                if err(KVALUES_MXFP4[i]) < err(KVALUES_MXFP4[best]) {
                    i
                } else {
                    best
                }
            }) as u8
        };
        out.push(e);
        out.extend((0..16).map(|j| nearest(block[j]) | (nearest(block[j + 16]) << 4)));
    }
    out
}

/// Q4_1 blocks (f16 scale d, f16 minimum m, 16 bytes of nibbles) with every value times
/// `factor`: d and m scaled.
pub(super) fn scaled_q4_1(blocks: &[u8], factor: f32) -> Vec<u8> {
    let mut out = blocks.to_vec();
    for b in out.chunks_exact_mut(20) {
        for at in [0, 2] {
            let v = half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32() * factor;
            b[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
        }
    }
    out
}

/// Tensors of the same type and row length, their rows stacked in order.
pub(super) fn stack(name: &str, parts: &[Tensor]) -> Tensor {
    let rows: u64 = parts.iter().map(|p| p.1[1]).sum();
    let bytes = parts.iter().flat_map(|p| p.3.iter().copied()).collect();
    (name.into(), vec![parts[0].1[0], rows], parts[0].2, bytes)
}

/// An f32 vector of `n` values around `center`, deterministic per name.
pub(super) fn vector(name: &str, n: usize, center: f32, spread: f32) -> Tensor {
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
