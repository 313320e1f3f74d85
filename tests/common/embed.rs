//! Embeddings from edgelm's engine and from the peer's `llama-embedding`, and the comparison
//! the embedding tests hold them to: cosine similarity per text, and the same nearest
//! neighbour for every text. The peer's tokens and vectors are kept in target/peer-embeddings
//! ([`peer_embedding`]): each text takes three peer runs, and the peer gives the same output
//! for the same model, text and options.

use super::{kept, peer_output, peer_tool, reference_dir, repo_root};
use edgelm::engine::{Engine, EngineConfig, Event, GenParams};
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use serde_json::json;
use sha2::{Digest, Sha256};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The cosine every text may keep to the peer's vector, however close the peer's own variants
/// stay (the bar where that yardstick is tighter).
pub const MIN_COSINE: f64 = 0.999;
/// The peer's text separator: one no text holds (they hold newlines, its default).
pub const SEP: &str = "<#edgelm-sep#>";

/// What `llama-embedding` gives for one text: its tokens and its (L2-normalised) vector.
pub struct PeerEmbedding {
    pub tokens: Vec<u32>,
    pub vector: Vec<f64>,
}

/// How the peer runs: its defaults (f16 cache, flash attention), which edgelm is held to, or
/// one of its own variants, whose distance from those defaults is the yardstick (the
/// correctness standard, docs/numerics.md): its q8_0 cache, or its other attention path (a
/// model whose attention is not causal keeps no cache, so only that one moves its vectors).
#[derive(Clone, Copy, Debug)]
pub enum PeerRun {
    Defaults,
    Q8_0Cache,
    PlainAttention,
}

impl PeerRun {
    fn args(self) -> &'static [&'static str] {
        match self {
            PeerRun::Defaults => &[],
            PeerRun::Q8_0Cache => &["-ctk", "q8_0", "-ctv", "q8_0"],
            PeerRun::PlainAttention => &["-fa", "off"],
        }
    }
}

/// The SHA-256 of `bytes`, in hex.
fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The peer's runs for every text of `texts` under each of `runs`, made (and kept) by
/// `PEER_JOBS` runs at a time, one thread each: a run of a short text is mostly the peer's
/// start, on one thread, so runs side by side finish sooner than one after another with every
/// core. (Runs of several threads each side by side would be far slower: the peer's threads
/// spin at every barrier while another run holds their core.)
fn make_peer_embeddings(
    model: &Path,
    digest: &str,
    texts: &[String],
    ctx: usize,
    runs: &[PeerRun],
) {
    const PEER_JOBS: usize = 2;
    let jobs: Vec<(&String, PeerRun)> = runs
        .iter()
        .flat_map(|&run| texts.iter().map(move |t| (t, run)))
        .collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..PEER_JOBS {
            scope.spawn(|| {
                while let Some(&(text, run)) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                    peer_embedding(model, digest, text, ctx, run);
                }
            });
        }
    });
}

/// `llama-embedding` on `text` alone, given on the command line (a prompt file would lose a
/// final newline), with a context of `ctx` and one thread, run as `run` says; its tokens from
/// `--verbose-prompt`. Kept in target/peer-embeddings under the model's SHA-256 (`digest`:
/// an edited model is written again on every run, with the same bytes) and that of the peer's
/// arguments, the text among them; run again when the peer is newer than the kept file.
pub fn peer_embedding(
    model: &Path,
    digest: &str,
    text: &str,
    ctx: usize,
    run: PeerRun,
) -> PeerEmbedding {
    let tool = peer_tool("llama-embedding");
    let ctx = ctx.to_string();
    let args: Vec<&str> = ["-p", text, "--embd-separator", SEP]
        .into_iter()
        .chain(["--embd-output-format", "json", "--verbose-prompt"])
        .chain(["-c", &ctx, "-t", "1", "--no-warmup"])
        .chain(run.args().iter().copied())
        .collect();
    let key = sha256_hex(args.join("\0").as_bytes());
    let file = format!(
        "target/peer-embeddings/{}-{}.json",
        &digest[..16],
        &key[..16]
    );
    let file = repo_root().join(file);
    let file = kept(&file, &[&tool], || {
        let (stdout, stderr) = peer_output(
            Command::new(&tool)
                // Its libraries beside it, wherever the build tree was when it was linked.
                .env("LD_LIBRARY_PATH", tool.parent().expect("in a directory"))
                .arg("-m")
                .arg(model)
                .args(&args),
            |stdout, _| embedding_json(stdout).is_some(),
        );
        let (start, json) = embedding_json(&stdout).expect("whole JSON");
        let data = json["data"].as_array().unwrap();
        assert_eq!(data.len(), 1, "llama-embedding split {text:?}");
        let tokens = verbose_tokens(&stderr, &stdout[..start]);
        let run = json!({"args": args, "tokens": tokens, "embedding": data[0]["embedding"]});
        serde_json::to_vec(&run).unwrap()
    });
    let run: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(run["args"], json!(args), "{file:?} holds another run");
    let numbers = |key: &str| -> Vec<f64> {
        let v = run[key].as_array().unwrap();
        v.iter().map(|x| x.as_f64().unwrap()).collect()
    };
    PeerEmbedding {
        tokens: numbers("tokens").into_iter().map(|t| t as u32).collect(),
        vector: numbers("embedding"),
    }
}

/// Where `llama-embedding`'s JSON starts in its output, and the JSON, when it is all there.
fn embedding_json(stdout: &str) -> Option<(usize, serde_json::Value)> {
    let start = stdout.find("{\n  \"object\"")?;
    let mut values = serde_json::Deserializer::from_str(&stdout[start..]).into_iter();
    Some((start, values.next()?.ok()?))
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

/// The peer's variants `model` is measured against. A model whose attention is not causal
/// keeps no cache in the peer: its q8_0 run is its defaults' exactly, and is not run.
fn peer_runs(model: &Path) -> &'static [PeerRun] {
    let file = edgelm::gguf::GgufFile::open(model).unwrap();
    let arch = file.architecture().expect("general.architecture");
    let causal = edgelm::model::Family::from_arch(arch)
        .expect("a supported family")
        .causal();
    match causal {
        true => &[PeerRun::Q8_0Cache, PeerRun::PlainAttention],
        false => &[PeerRun::PlainAttention],
    }
}

/// Holds edgelm to `llama-embedding` on `model` (run with a context of `ctx`) for `texts`:
/// the same tokens for every text, then [`assert_close`] against the peer's defaults, with its
/// own variants as the yardstick (or, without `neighbours`, only [`assert_cosines`]). Prints
/// the figures under `name`.
pub fn assert_matches_peer(
    name: &str,
    model: &Path,
    texts: &[String],
    ctx: usize,
    neighbours: bool,
) {
    assert!(texts.len() >= 50, "{name}: only {} texts", texts.len());
    let digest = sha256_hex(&std::fs::read(model).unwrap());
    let runs = peer_runs(model);
    make_peer_embeddings(
        model,
        &digest,
        texts,
        ctx,
        &[&[PeerRun::Defaults], runs].concat(),
    );
    let peer: Vec<_> = texts
        .iter()
        .map(|t| peer_embedding(model, &digest, t, ctx, PeerRun::Defaults))
        .collect();
    let variants: Vec<(PeerRun, Vec<Vec<f64>>)> = runs
        .iter()
        .map(|&run| {
            let v = texts
                .iter()
                .map(|t| peer_embedding(model, &digest, t, ctx, run).vector);
            (run, v.collect())
        })
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
    let against = Against {
        peer: &peer,
        variants: &variants,
    };
    match neighbours {
        true => assert_close(name, texts, &ours, &against),
        false => assert_cosines(name, texts, &ours, &against),
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
        max_tokens: Some(0),
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

/// The peer's vectors (its defaults) that edgelm is held to, and the same texts through each
/// of the peer's own variants: how far those move them is the yardstick.
pub struct Against<'a> {
    pub peer: &'a [Vec<f64>],
    pub variants: &'a [(PeerRun, Vec<Vec<f64>>)],
}

/// Cosine to `peer` per text, with its worst and mean.
fn cosines(of: &[Vec<f64>], peer: &[Vec<f64>]) -> (Vec<f64>, f64, f64) {
    let cos: Vec<f64> = of.iter().zip(peer).map(|(a, b)| cosine(a, b)).collect();
    let worst = cos.iter().cloned().fold(f64::INFINITY, f64::min);
    let mean = cos.iter().sum::<f64>() / cos.len() as f64;
    (cos, worst, mean)
}

/// The texts whose nearest neighbour in `of` is not the peer's (`peer`, from [`nearest`]):
/// (text, its nearest in `of`, the peer's, the peer's margin over its runner-up).
fn flips(of: &[Vec<f64>], peer: &[(usize, f64)]) -> Vec<(usize, usize, usize, f64)> {
    nearest(of)
        .iter()
        .zip(peer)
        .enumerate()
        .filter(|(_, (o, p))| o.0 != p.0)
        .map(|(i, (o, p))| (i, o.0, p.0, p.1))
        .collect()
}

/// Holds `ours` (one vector per text of `texts`) to the peer: [`assert_cosines`], and the
/// peer's nearest neighbour for as many texts as its farthest variant keeps it (as "same top"
/// counts the most likely token): no more texts find another, where the peer's own top two
/// are not a tie within 0.001, than under that variant, plus one standard error of that count
/// (√n, at least 1: a variant that moves none on 80 texts has not shown that none ever
/// moves). Prints the figures under `name`.
pub fn assert_close(name: &str, texts: &[String], ours: &[Vec<f64>], against: &Against) {
    assert_cosines(name, texts, ours, against);
    let n_peer = nearest(against.peer);
    // The flips that count: where the peer's top two are not a tie.
    let counted = |of: &[Vec<f64>]| -> Vec<(usize, usize, usize, f64)> {
        let all = flips(of, &n_peer);
        all.into_iter().filter(|f| f.3 >= 1e-3).collect()
    };
    let mut allowed = 0;
    for (run, v) in against.variants {
        let f = counted(v);
        eprintln!(
            "{name}: the peer's {run:?}: another nearest neighbour for {} of {} texts",
            f.len(),
            texts.len()
        );
        allowed = allowed.max(f.len());
    }
    let allowed = allowed + (allowed.max(1) as f64).sqrt() as usize;
    let ours = counted(ours);
    eprintln!(
        "{name}: another nearest neighbour for {} of {} texts here (text, here, peer, the peer's margin): {ours:?}",
        ours.len(),
        texts.len()
    );
    assert!(
        ours.len() <= allowed,
        "{name}: another nearest neighbour than the peer's for {} texts, more than {allowed}: {ours:?}",
        ours.len()
    );
}

/// The first half of [`assert_close`]: no text's cosine to the peer below [`MIN_COSINE`] or
/// the worst one of the peer's variants gives, whichever is lower, and the mean distance
/// (1 − cosine) no more than 1 − [`MIN_COSINE`] or the farthest variant's, whichever is more.
pub fn assert_cosines(name: &str, texts: &[String], ours: &[Vec<f64>], against: &Against) {
    assert_eq!(against.peer.len(), texts.len());
    let (cos, worst, mean) = cosines(ours, against.peer);
    eprintln!(
        "{name}: {} texts, cosine to llama-embedding: min {worst:.6}, mean {mean:.6}",
        texts.len()
    );
    let (mut floor, mut mean_bar) = (MIN_COSINE, 1.0 - MIN_COSINE);
    for (run, v) in against.variants {
        let (_, v_worst, v_mean) = cosines(v, against.peer);
        eprintln!("{name}: the peer's {run:?}: min {v_worst:.6}, mean {v_mean:.6}");
        floor = floor.min(v_worst);
        mean_bar = mean_bar.max(1.0 - v_mean);
    }
    if std::env::var_os("EDGELM_DEBUG_COS").is_some() {
        for (i, c) in cos.iter().enumerate() {
            let v: Vec<String> = against
                .variants
                .iter()
                .map(|(_, v)| format!("{:.6}", cosine(&v[i], &against.peer[i])))
                .collect();
            eprintln!(
                "{i}: {c:.6} (variants {}) {:?}",
                v.join(" "),
                texts[i].chars().take(40).collect::<String>()
            );
        }
    }
    for (i, c) in cos.iter().enumerate() {
        assert!(
            *c >= floor,
            "text {i} ({:?}): cosine {c} < {floor}",
            texts[i]
        );
    }
    assert!(
        1.0 - mean <= mean_bar,
        "{name}: mean distance {} > {mean_bar}",
        1.0 - mean
    );
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
