//! The engine against the peer engine's outputs in tests/data (llama.cpp, f16 KV):
//! tokenization (both real models), chat rendering, greedy continuations and teacher-forced
//! argmax agreement. (Logit distances, the correctness measure, are in tests/kld.rs.)

mod common;

use common::*;
use edgelm::engine::sampler::{argmax, logprobs_of};
use edgelm::engine::{Session, SessionConfig};
use edgelm::kv::KvType;
use edgelm::model::{Logits, Model};
use edgelm::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use std::sync::Arc;

fn load() -> (Arc<Model>, Tokenizer) {
    let model = Model::load(&model_path()).unwrap();
    let tok = Tokenizer::from_gguf(&model.file).unwrap();
    (Arc::new(model), tok)
}

fn session(model: &Arc<Model>, tokens: usize, kv: KvType) -> Session {
    Session::new(model.clone(), SessionConfig::cpu(kv, 16, tokens, 512)).unwrap()
}

/// Every string of tests/data/tokenize-cases.json (multilingual text, code, whitespace, emoji,
/// special tokens) tokenized as llama-tokenize does, BOS included as the model wants.
fn check_tokenizations(model: &std::path::Path, reference: &str) {
    let file = edgelm::gguf::GgufFile::open(model).unwrap();
    let tok = Tokenizer::from_gguf(&file).unwrap();
    let text = std::fs::read_to_string(reference_dir().join(reference)).unwrap();
    let data: serde_json::Value = serde_json::from_str(&text).unwrap();
    let cases = data["cases"].as_array().unwrap();
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let got = tok.encode(text, true).unwrap();
        if got != ids_of(&case["ids"]) {
            failures.push(format!("{text:?}: got {got:?}, want {}", case["ids"]));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

#[test]
fn smollm2_tokenizes_as_the_peer() {
    check_tokenizations(&model_path(), "smollm2-tokenize.json");
}

#[test]
fn gemma3_tokenizes_as_the_peer() {
    check_tokenizations(&gemma3_path(), "gemma3-tokenize.json");
}

#[test]
fn tokenizer_matches_all_reference_tokenizations() {
    let (model, tok) = load();
    drop(model);
    let reference = reference();
    let cases = reference["tokenize"].as_array().unwrap();
    assert_eq!(cases.len(), 20);
    let mut failures = Vec::new();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want = ids_of(&case["ids"]);
        let got = tok.encode(text, true).unwrap();
        if got != want {
            failures.push(format!("{text:?}: got {got:?}, want {want:?}"));
        }
        // Decoding gives the text back (byte-level BPE is lossless).
        assert_eq!(tok.decode(&got, true), text);
    }
    assert!(
        failures.is_empty(),
        "{} of 20 differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn chat_template_renders_reference_prompts() {
    let (_, tok) = load();
    let tmpl = ChatTemplate::new(
        tok.chat_template().expect("model has a chat template"),
        tok.special_text(tok.bos),
        tok.special_text(tok.eos),
    )
    .unwrap();
    let reference = reference();
    let cases = reference["chat"].as_array().unwrap();
    assert_eq!(cases.len(), 3);
    for case in cases {
        let msgs: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        assert_eq!(
            tmpl.render(&msgs, true).unwrap(),
            case["prompt"].as_str().unwrap()
        );
    }
}

/// Greedy generation, token for token (each generated token with the engine's arithmetic for
/// generated tokens), stopping after an end-of-generation token (which the peer's `ids`
/// include).
fn greedy(model: &Arc<Model>, tok: &Tokenizer, prompt: &[u32], n: usize, kv: KvType) -> Vec<u32> {
    let mut s = session(model, prompt.len() + n, kv);
    let mut logits = s.extend(prompt, Logits::Last).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let next = argmax(&logits);
        out.push(next);
        if tok.is_eog(next) {
            break;
        }
        logits = s.extend_generated(&[next], Logits::Last).unwrap();
    }
    out
}

/// Greedy text need not be the peer's bit for bit (kernels may round differently), but a
/// continuation may leave the peer's only where the peer itself hesitated: its top-2
/// log-probability margin there is under 0.5.
#[test]
fn greedy_continuations_leave_the_peer_only_at_near_ties() {
    let (model, tok) = load();
    let reference = reference();
    let cases = reference["greedy"].as_array().unwrap();
    assert_eq!(cases.len(), 12);
    let mut exact = 0;
    let mut report = Vec::new();
    for case in cases {
        let prompt = ids_of(&case["prompt_ids"]);
        assert_eq!(
            tok.encode(case["prompt"].as_str().unwrap(), true).unwrap(),
            prompt
        );
        let want = ids_of(&case["ids"]);
        let got = greedy(&model, &tok, &prompt, 48, KvType::F16);
        let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) else {
            exact += 1;
            continue;
        };
        let top = &case["top5"][at];
        let margin = top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap();
        report.push(format!(
            "{:?}: first difference at token {at} (peer margin {margin:.3})",
            case["prompt"].as_str().unwrap()
        ));
        assert!(
            margin < 0.5,
            "left the peer at a confident position: {report:?}"
        );
    }
    eprintln!("greedy: {exact}/12 identical; {}", report.join("; "));
}

/// q8_0 pages against f16 pages. Whole 48-token greedy continuations are only reported: this
/// model turns any perturbation of K/V into a different trajectory within a few dozen tokens
/// (llama.cpp's own q8_0 cache reproduces its f16 greedy output on 3 of the 12 prompts; ours
/// on 4). What is asserted, per position while scoring the f16 continuation: q8_0 pages
/// give the same argmax wherever f16 pages were confident (top-2 margin ≥ 0.5 nats), and at
/// ≥ 95% of positions overall.
#[test]
fn q8_0_pages_agree_with_f16_pages() {
    let (model, tok) = load();
    let reference = reference();
    let (mut same, mut agree, mut total) = (0, 0, 0);
    let vocab = model.config.vocab_size;
    for case in reference["greedy"].as_array().unwrap() {
        let prompt = ids_of(&case["prompt_ids"]);
        let f16 = greedy(&model, &tok, &prompt, 48, KvType::F16);
        let q8 = greedy(&model, &tok, &prompt, 48, KvType::Q8_0);
        same += usize::from(f16 == q8);
        let mut all = prompt.clone();
        all.extend(&f16);
        let score = |kv| {
            session(&model, all.len(), kv)
                .extend(&all, Logits::All)
                .unwrap()
        };
        let (lf, lq) = (score(KvType::F16), score(KvType::Q8_0));
        for k in 0..f16.len() {
            let at = (prompt.len() - 1 + k) * vocab..(prompt.len() + k) * vocab;
            let (rf, rq) = (&lf[at.clone()], &lq[at]);
            total += 1;
            if argmax(rq) == argmax(rf) {
                agree += 1;
            } else {
                let (_, top2) = logprobs_of(rf, 0, 2);
                let margin = top2[0].1 - top2[1].1;
                assert!(
                    margin < 0.5,
                    "q8_0 flipped a confident position (f16 margin {margin:.3})"
                );
            }
        }
    }
    eprintln!("q8_0 pages: {same}/12 greedy continuations identical to f16 pages; {agree}/{total} positions agree");
    assert!(
        agree * 100 >= total * 95,
        "q8_0 pages agree at only {agree}/{total} positions"
    );
}

#[test]
fn teacher_forced_argmax_agrees_with_the_peer() {
    let (model, _) = load();
    let reference = reference();
    let (mut agree, mut total) = (0usize, 0usize);
    let mut lp_diffs = Vec::new();
    for case in reference["greedy"].as_array().unwrap() {
        let prompt = ids_of(&case["prompt_ids"]);
        let gen = ids_of(&case["ids"]);
        let top5 = case["top5"].as_array().unwrap();
        let mut all = prompt.clone();
        all.extend(&gen);
        let logits = session(&model, all.len(), KvType::F16)
            .extend(&all, Logits::All)
            .unwrap();
        let vocab = model.config.vocab_size;
        for (k, &peer_tok) in gen.iter().enumerate() {
            let row = &logits[(prompt.len() - 1 + k) * vocab..(prompt.len() + k) * vocab];
            let ours = argmax(row);
            total += 1;
            if ours == peer_tok {
                agree += 1;
                // Our log-probability of the peer's token is close to the peer's own.
                let (lp, _) = logprobs_of(row, peer_tok, 0);
                let peer_lp = top5[k][0][1].as_f64().unwrap() as f32;
                assert!((lp - peer_lp).abs() < 0.5, "logprob {lp} vs peer {peer_lp}");
                lp_diffs.push((lp - peer_lp).abs());
            } else {
                // The bar the greedy test and q8_0 pages are held to: prompt tokens take their
                // own summation order (docs/numerics.md), which moves logits about as much as a
                // q8_0 cache does.
                let margin = top5[k][0][1].as_f64().unwrap() - top5[k][1][1].as_f64().unwrap();
                assert!(
                    margin < 0.5,
                    "argmax differs at a confident position (peer margin {margin:.3}): prompt {:?}, step {k}",
                    case["prompt"].as_str().unwrap()
                );
            }
        }
    }
    let rate = agree as f64 / total as f64;
    let mean_diff = lp_diffs.iter().sum::<f32>() / lp_diffs.len() as f32;
    eprintln!(
        "teacher forcing: {agree}/{total} = {:.2}% positions agree; mean |logprob − peer's| {mean_diff:.4}",
        rate * 100.0
    );
    // The bars are the q8_0 cache's, as for the KLD: edgelm's own q8_0 pages, with prompt
    // tokens in the peer's summation order, agree at 97.4% (490/503, standard error 0.7%),
    // with a mean logprob distance of 0.036 and flips up to a peer margin of 0.31; the chain
    // order of packed matrices agrees at 96.2%, 0.033 (docs/numerics.md).
    assert!(rate >= 0.96, "argmax agreement {rate:.4} < 0.96");
    assert!(mean_diff < 0.05, "mean logprob distance {mean_diff} ≥ 0.05");
}
