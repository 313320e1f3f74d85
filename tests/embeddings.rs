//! `/v1/embeddings`' numbers against llama.cpp's `llama-embedding` on the same GGUF: the
//! reference model with `llama.pooling_type` set (mean, last), 50+ texts (short and long,
//! several languages and scripts, code; the long ones take two prefill chunks), each
//! embedded by edgelm's engine (all submitted at once, so they share steps) and by the peer.
//! Bar: cosine similarity ≥ 0.999 per text, and the same nearest neighbour for every text.

mod common;

use common::{edited_model, model_path, peer_tool, reference_dir};
use edgelm::engine::{Engine, EngineConfig, Event, GenParams};
use edgelm::gguf::Value;
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const MIN_COSINE: f64 = 0.999;
/// The peer's text separator: one no text holds (they hold newlines, its default).
const SEP: &str = "<#edgelm-sep#>";

/// The reference model with `llama.pooling_type` = `id` (llama.cpp's numbering).
fn pooled_model(id: u32, name: &str) -> PathBuf {
    edited_model(name, |kvs, _| {
        kvs.retain(|(k, _)| k != "llama.pooling_type");
        kvs.push(("llama.pooling_type".into(), Value::U32(id)));
    })
}

/// The texts: the tokenizer cases (many scripts, emoji, code, whitespace), then paragraphs of
/// the GPL, alone and joined into long texts (about 900 tokens: two 512-token prefill chunks).
fn texts() -> Vec<String> {
    let dir = reference_dir();
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let cases: Vec<String> = serde_json::from_str(&read("tokenize-cases.json")).unwrap();
    let more: serde_json::Value = serde_json::from_str(&read("cases.json")).unwrap();
    let more = more["tokenize"].as_array().unwrap().iter();
    let paragraphs: Vec<String> = read("gpl-3.txt")
        .split("\n\n")
        .map(|p| p.trim().to_string())
        .filter(|p| p.len() > 300)
        .take(16)
        .collect();
    let long: Vec<String> = paragraphs.chunks(8).map(|c| c.join("\n\n")).collect();
    let mut all: Vec<String> = Vec::new();
    let candidates = cases
        .into_iter()
        .chain(more.map(|v| v.as_str().unwrap().to_string()))
        .chain(paragraphs)
        .chain(long);
    for t in candidates {
        // No text may be empty (a 400 on the API).
        if !t.trim().is_empty() && !all.contains(&t) && !t.contains(SEP) {
            all.push(t);
        }
    }
    all
}

/// The peer's embeddings of `texts` (L2-normalised, its default), one run per text: given
/// several, `llama-embedding` packs them into one batch, and its own vectors then move with
/// the batch (a text's last-token vector by a cosine of 0.992 from the one it gets alone),
/// while edgelm's do not.
fn peer_embeddings(model: &Path, texts: &[String]) -> Vec<Vec<f64>> {
    texts.iter().map(|t| peer_run(model, t)).collect()
}

/// `llama-embedding` on `text`, given on the command line (a prompt file would lose a final
/// newline).
fn peer_run(model: &Path, text: &str) -> Vec<f64> {
    let out = Command::new(peer_tool("llama-embedding"))
        .arg("-m")
        .arg(model)
        .args(["-p", text, "--embd-separator", SEP])
        .args(["--embd-output-format", "json"])
        .args(["-c", "2048", "-t", "2", "--no-warmup"])
        .output()
        .expect("llama-embedding runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "llama-embedding failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let start = stdout
        .find("{\n  \"object\"")
        .expect("JSON in llama-embedding's output");
    let mut values = serde_json::Deserializer::from_str(&stdout[start..]).into_iter();
    let json: serde_json::Value = values.next().unwrap().unwrap();
    let data = json["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "llama-embedding split {text:?}");
    let e = data[0]["embedding"].as_array().unwrap();
    e.iter().map(|x| x.as_f64().unwrap()).collect()
}

/// edgelm's embeddings of `texts`, all submitted to one engine at once.
fn edgelm_embeddings(model: &Path, texts: &[String]) -> Vec<Vec<f64>> {
    let m = Arc::new(Model::load(model).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let (handle, thread) = Engine::start(m, tok.eog_tokens().to_vec(), EngineConfig::default())
        .expect("the engine starts");
    let params = GenParams {
        max_tokens: 0,
        embed: true,
        ..GenParams::default()
    };
    let rxs: Vec<_> = texts
        .iter()
        .map(|t| {
            let ids = tok.encode(t, true).unwrap();
            handle.submit(ids, params.clone()).unwrap().1
        })
        .collect();
    let vectors = rxs
        .into_iter()
        .map(|rx| loop {
            match rx.recv().expect("the engine answers") {
                Event::Embedding { vector, .. } => {
                    break vector.iter().map(|&x| f64::from(x)).collect()
                }
                Event::Error(e) => panic!("embedding failed: {e}"),
                _ => {}
            }
        })
        .collect();
    handle.shutdown();
    thread.join().unwrap();
    vectors
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Each text's nearest other text by cosine, and how far ahead of the runner-up it is.
fn nearest(v: &[Vec<f64>]) -> Vec<(usize, f64)> {
    (0..v.len())
        .map(|i| {
            let mut sims: Vec<(usize, f64)> = (0..v.len())
                .filter(|&j| j != i)
                .map(|j| (j, cosine(&v[i], &v[j])))
                .collect();
            sims.sort_by(|a, b| b.1.total_cmp(&a.1));
            (sims[0].0, sims[0].1 - sims[1].1)
        })
        .collect()
}

/// The comparisons run one at a time: each keeps every core busy (the peer's threads, then
/// the engine's), and two at once on a small machine take several times as long.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Compares edgelm with the peer on the model pooled by `id`.
fn matches_the_peer(id: u32, name: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let model = pooled_model(id, name);
    let texts = texts();
    assert!(texts.len() >= 50, "only {} texts", texts.len());
    let peer = peer_embeddings(&model, &texts);
    let ours = edgelm_embeddings(&model, &texts);
    assert_eq!(peer.len(), texts.len());
    let cos: Vec<f64> = ours.iter().zip(&peer).map(|(a, b)| cosine(a, b)).collect();
    let worst = cos.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = cos.iter().sum::<f64>() / cos.len() as f64;
    eprintln!(
        "{name}: {} texts, cosine to llama-embedding: min {worst:.6}, mean {mean:.6}",
        texts.len()
    );
    for (i, c) in cos.iter().enumerate() {
        assert!(*c >= MIN_COSINE, "text {i} ({:?}): cosine {c}", texts[i]);
    }
    // The same nearest neighbour for every text, but where the peer's own top two are a tie
    // within the bar's noise.
    let (n_ours, n_peer) = (nearest(&ours), nearest(&peer));
    let mut same = 0;
    for (i, (o, p)) in n_ours.iter().zip(&n_peer).enumerate() {
        if o.0 == p.0 {
            same += 1;
        } else {
            assert!(
                p.1 < 1e-3,
                "text {i}: nearest {} here, {} in the peer",
                o.0,
                p.0
            );
        }
    }
    eprintln!(
        "{name}: same nearest neighbour for {same} of {} texts",
        texts.len()
    );
}

#[test]
fn mean_pooling_matches_llama_embedding() {
    matches_the_peer(1, "smollm2-pooling-mean.gguf");
}

#[test]
fn last_token_pooling_matches_llama_embedding() {
    matches_the_peer(3, "smollm2-pooling-last.gguf");
}

#[test]
fn unknown_pooling_types_are_refused_and_none_serves_no_embeddings() {
    let bad = pooled_model(9, "smollm2-pooling-9.gguf");
    let err = Model::load(&bad).err().expect("pooling_type 9 is refused");
    assert!(
        format!("{err:#}").contains("llama.pooling_type is 9"),
        "{err:#}"
    );
    let plain = Model::load(&model_path()).unwrap();
    assert_eq!(plain.config.pooling, edgelm::model::Pooling::None);
}
