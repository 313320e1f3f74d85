//! Embeddings from edgelm's engine and from the peer's `llama-embedding`, and the comparison
//! the embedding tests hold them to: cosine similarity per text, and the same nearest
//! neighbour for every text.

use super::{peer_tool, reference_dir};
use edgelm::engine::{Engine, EngineConfig, Event, GenParams};
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

pub const MIN_COSINE: f64 = 0.999;
/// The peer's text separator: one no text holds (they hold newlines, its default).
pub const SEP: &str = "<#edgelm-sep#>";

/// What `llama-embedding` gives for one text: its tokens and its (L2-normalised) vector.
pub struct PeerEmbedding {
    pub tokens: Vec<u32>,
    pub vector: Vec<f64>,
}

/// `llama-embedding` on `text` alone, given on the command line (a prompt file would lose a
/// final newline), with a context of `ctx`; its tokens from `--verbose-prompt`.
pub fn peer_embedding(model: &Path, text: &str, ctx: usize) -> PeerEmbedding {
    let tool = peer_tool("llama-embedding");
    let out = Command::new(&tool)
        // Its libraries beside it, wherever the build tree was when it was linked.
        .env("LD_LIBRARY_PATH", tool.parent().expect("in a directory"))
        .arg("-m")
        .arg(model)
        .args(["-p", text, "--embd-separator", SEP])
        .args(["--embd-output-format", "json", "--verbose-prompt"])
        .args(["-c", &ctx.to_string(), "-t", "2", "--no-warmup"])
        .output()
        .expect("llama-embedding runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "llama-embedding failed: {stderr}");
    let start = stdout
        .find("{\n  \"object\"")
        .expect("JSON in llama-embedding's output");
    let mut values = serde_json::Deserializer::from_str(&stdout[start..]).into_iter();
    let json: serde_json::Value = values.next().unwrap().unwrap();
    let data = json["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "llama-embedding split {text:?}");
    let e = data[0]["embedding"].as_array().unwrap();
    PeerEmbedding {
        tokens: verbose_tokens(&stderr, &stdout[..start]),
        vector: e.iter().map(|x| x.as_f64().unwrap()).collect(),
    }
}

/// The ids `--verbose-prompt` lists: "number of tokens in prompt = N" in its log, and N lines
/// of "  ID -> 'piece'" in its output.
fn verbose_tokens(log: &str, listing: &str) -> Vec<u32> {
    const COUNT: &str = "number of tokens in prompt = ";
    let at = log
        .find(COUNT)
        .expect("llama-embedding counts the prompt's tokens");
    let rest = &log[at + COUNT.len()..];
    let n: usize = rest.split_whitespace().next().unwrap().parse().unwrap();
    let ids: Vec<u32> = listing
        .lines()
        .filter_map(|l| l.split_once(" -> '")?.0.trim().parse().ok())
        .take(n)
        .collect();
    assert_eq!(ids.len(), n, "could not read the peer's {n} tokens");
    ids
}

/// Holds edgelm to `llama-embedding` on `model` (run with a context of `ctx`) for `texts`:
/// the same tokens for every text, then [`assert_close`] (or, without `neighbours`, only
/// [`assert_cosines`]). Prints the figures under `name`.
pub fn assert_matches_peer(
    name: &str,
    model: &Path,
    texts: &[String],
    ctx: usize,
    neighbours: bool,
) {
    assert!(texts.len() >= 50, "{name}: only {} texts", texts.len());
    let peer: Vec<_> = texts
        .iter()
        .map(|t| peer_embedding(model, t, ctx))
        .collect();
    let (ids, ours) = edgelm_embeddings(model, texts);
    for (i, (p, o)) in peer.iter().zip(&ids).enumerate() {
        assert_eq!(
            &p.tokens, o,
            "{name}: text {i} ({:?}): tokens differ",
            texts[i]
        );
    }
    let longest = ids.iter().map(Vec::len).max().unwrap_or(0);
    eprintln!(
        "{name}: tokens identical to the peer's for all {} texts (the longest {longest})",
        texts.len()
    );
    let peer: Vec<Vec<f64>> = peer.into_iter().map(|p| p.vector).collect();
    match neighbours {
        true => assert_close(name, texts, &ours, &peer),
        false => assert_cosines(name, texts, &ours, &peer),
    }
}

/// That `model` is not chaotic (the comparison with the peer would then prove nothing): two
/// paraphrases embed closer to each other than to an unrelated sentence. Prints both cosines
/// under `name`.
pub fn assert_paraphrases_closer(name: &str, model: &Path) {
    let texts: Vec<String> = [
        "The cat sat on the mat.",
        "A cat was sitting on the mat.",
        "Quarterly revenue rose by four percent in Europe.",
    ]
    .map(String::from)
    .to_vec();
    let (_, v) = edgelm_embeddings(model, &texts);
    let (close, far) = (cosine(&v[0], &v[1]), cosine(&v[0], &v[2]));
    eprintln!("{name}: paraphrase {close:.4}, unrelated {far:.4}");
    assert!(close > far, "{name}: paraphrase {close}, unrelated {far}");
}

/// edgelm's tokens of `texts` and their embeddings, all submitted to one engine at once.
pub fn edgelm_embeddings(model: &Path, texts: &[String]) -> (Vec<Vec<u32>>, Vec<Vec<f64>>) {
    let m = Arc::new(Model::load(model).unwrap());
    let tok = Tokenizer::from_gguf(&m.file).unwrap();
    let (handle, thread) = Engine::start(m, tok.eog_tokens().to_vec(), EngineConfig::default())
        .expect("the engine starts");
    let params = GenParams {
        max_tokens: 0,
        embed: true,
        ..GenParams::default()
    };
    let ids: Vec<Vec<u32>> = texts.iter().map(|t| tok.encode(t, true).unwrap()).collect();
    let rxs: Vec<_> = ids
        .iter()
        .map(|p| handle.submit(p.clone(), params.clone()).unwrap().1)
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
    (ids, vectors)
}

pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

/// Each text's nearest other text by cosine, and how far ahead of the runner-up it is.
pub fn nearest(v: &[Vec<f64>]) -> Vec<(usize, f64)> {
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

/// Holds `ours` to `peer` (one vector per text of `texts`): cosine ≥ [`MIN_COSINE`] for every
/// text, and the same nearest neighbour for every text but where the peer's own top two are
/// a tie within the bar's noise. Prints the figures under `name` (and every text's cosine
/// when `EDGELM_DEBUG_COS` is set).
pub fn assert_close(name: &str, texts: &[String], ours: &[Vec<f64>], peer: &[Vec<f64>]) {
    assert_cosines(name, texts, ours, peer);
    let (n_ours, n_peer) = (nearest(ours), nearest(peer));
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

/// The first half of [`assert_close`]: cosine ≥ [`MIN_COSINE`] for every text.
pub fn assert_cosines(name: &str, texts: &[String], ours: &[Vec<f64>], peer: &[Vec<f64>]) {
    assert_eq!(peer.len(), texts.len());
    let cos: Vec<f64> = ours.iter().zip(peer).map(|(a, b)| cosine(a, b)).collect();
    let worst = cos.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = cos.iter().sum::<f64>() / cos.len() as f64;
    eprintln!(
        "{name}: {} texts, cosine to llama-embedding: min {worst:.6}, mean {mean:.6}",
        texts.len()
    );
    if std::env::var_os("EDGELM_DEBUG_COS").is_some() {
        for (i, c) in cos.iter().enumerate() {
            eprintln!(
                "{i}: {c:.6} {:?}",
                texts[i].chars().take(40).collect::<String>()
            );
        }
    }
    for (i, c) in cos.iter().enumerate() {
        assert!(*c >= MIN_COSINE, "text {i} ({:?}): cosine {c}", texts[i]);
    }
}

/// Texts whose tokens exercise a tokenizer's normalisation: case, accents (precomposed and
/// combining), punctuation and symbols, CJK and other scripts, control characters,
/// whitespace runs, special tokens written out, words with no piece.
pub const TRICKY: &[&str] = &[
    "Héllo WÖRLD, naïve café — déjà vu!",
    "e\u{301}cole e\u{300} la ma\u{303}o",
    "日本語のテキストと中文混合 text",
    "Ελληνικά ΚΕΦΑΛΑΙΑ και русский ТЕКСТ",
    "tab\there\u{7}bell\u{1}soh\r\nnewline   spaces",
    "[CLS] written [SEP] out [MASK] and [UNK] too",
    "fn main() { println!(\"{}\", 1 + 2 * 3); } // x^2 $5 ~tilde",
    "emoji 😀🎉 and ∑∫√ symbols € £ ¥",
    "don't won't it's U.S.A. e-mail 3.14159 1,000,000",
    "ǅemal ǈubica Ǳ ß ẞ İstanbul",
];

/// The texts of at most `max_tokens` tokens: the tricky ones, the tokenizer cases, GPL
/// paragraphs, and long texts of joined paragraphs as long as that allows (the longest fill
/// most of it).
pub fn texts(tok: &Tokenizer, max_tokens: usize) -> Vec<String> {
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
    let len = |t: &str| tok.encode(t, true).unwrap().len();
    let mut long: Vec<String> = Vec::new();
    let mut current = String::new();
    for p in &paragraphs {
        let joined = format!("{current}\n\n{p}");
        if len(&joined) > max_tokens - 12 && !current.is_empty() {
            long.push(std::mem::take(&mut current));
            current = p.clone();
        } else {
            current = joined.trim().to_string();
        }
    }
    let mut all: Vec<String> = Vec::new();
    let candidates = TRICKY
        .iter()
        .map(|t| t.to_string())
        .chain(cases)
        .chain(more.map(|v| v.as_str().unwrap().to_string()))
        .chain(paragraphs)
        .chain(long);
    for t in candidates {
        let fits = len(&t) <= max_tokens;
        if fits && !t.trim().is_empty() && !all.contains(&t) && !t.contains(SEP) {
            all.push(t);
        }
    }
    all
}
