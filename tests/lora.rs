//! LoRA adapters end to end on the reference model: `serve --lora` lists them in `/v1/models`
//! and a request's `model` selects one; requests for four adapters and the base model batched
//! together get the answers they get alone; an administrator loads and unloads adapters while
//! the model serves, with the API key only; hostile adapter files are refused in one line.
//! (Their logits against llama.cpp's `--lora`: tests/kld.rs.)

mod common;

use common::*;
use edgelm::gguf::Value;
use std::path::{Path, PathBuf};

/// `edgelm serve` of the reference model as `base`, with `flags` (its adapters).
fn serve(flags: &[String]) -> Server {
    let mut all: Vec<&str> = vec!["--max-seqs", "16"];
    all.extend(flags.iter().map(String::as_str));
    Server::start_with(format!("base={}", model_path().display()), &all)
}

/// The greedy completion of `prompt` by `model`.
fn complete(server: &Server, model: &str, prompt: &str) -> String {
    let body = serde_json::json!({
        "model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0,
        "ignore_eos": true,
    });
    let (status, text) = server.request("POST", "/v1/completions", &body.to_string());
    assert_eq!(status, 200, "{model}: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["model"], model, "{text}");
    v["choices"][0]["text"].as_str().unwrap().to_string()
}

/// The test adapters for the reference model, as `serve --lora NAME=PATH:SCALE` flags.
fn lora_flags() -> Vec<String> {
    TEST_ADAPTERS
        .iter()
        .flat_map(|s| {
            let path = test_adapter(&model_path(), s);
            let arg = format!("{}={}:{}", s.name, path.display(), s.scale);
            ["--lora".to_string(), arg]
        })
        .collect()
}

/// Prompts of a few KV blocks each, so that the prefix cache holds their blocks.
const PROMPTS: [&str; 4] = [
    "The GNU General Public License is a series of widely used free software licenses that \
     guarantee end users the freedom to run, study, share, and modify the software. The \
     licenses were written by Richard Stallman, founder of the Free Software Foundation, and",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old \
     clockmaker who repaired every clock in the valley. One winter morning a stranger knocked \
     on his door carrying a clock that",
    "To install the package on a fresh machine, first update the system's package index and \
     make sure that a recent compiler is present. Then download the release archive, check its \
     signature against the published key, and",
    "The three primary colours of light are red, green and blue. Mixed in equal amounts they \
     give white, and every colour a screen shows is some mixture of the three. Painters, \
     however, learn a different set of primaries, because",
];

#[test]
fn adapters_batched_with_the_base_answer_as_they_do_alone() {
    // 16 streams: stream k asks model k mod 5 (the base model, then each adapter) to continue
    // prompt k / 5 mod 4, so each prompt is run by the base and by adapters.
    let models: Vec<&str> = std::iter::once("base")
        .chain(TEST_ADAPTERS.iter().map(|s| s.name))
        .collect();
    let asks: Vec<(&str, &str)> = (0..16)
        .map(|k| (models[k % 5], PROMPTS[(k / 5) % 4]))
        .collect();
    let server = serve(&lora_flags());
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = asks
            .iter()
            .map(|&(m, p)| s.spawn(|| complete(&server, m, p)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    drop(server);
    // Then one at a time, on a fresh server: the base model computes each prompt first and its
    // blocks stay in the prefix cache, which must not give them to an adapter's request.
    let server = serve(&lora_flags());
    for (k, &(m, p)) in asks.iter().enumerate() {
        let alone = complete(&server, m, p);
        assert_eq!(alone, together[k], "stream {k} ({m}, {p:?})");
    }
    // The adapters change what the model says.
    let base = complete(&server, "base", PROMPTS[0]);
    let differ = TEST_ADAPTERS
        .iter()
        .filter(|s| complete(&server, s.name, PROMPTS[0]) != base)
        .count();
    assert!(differ >= 3, "only {differ} adapters change the greedy text");
}

#[test]
fn models_lists_each_adapter_with_its_base() {
    let server = serve(&lora_flags()[..2]);
    let (status, body) = server.request("GET", "/v1/models", "");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2, "{body}");
    let base = data[0]["id"].as_str().unwrap();
    assert_eq!(base, "base", "{body}");
    let adapter = &data[1];
    assert_eq!(adapter["id"], TEST_ADAPTERS[0].name, "{body}");
    assert_eq!(adapter["parent"], base, "{body}");
    assert_eq!(adapter["lora"]["rank"], TEST_ADAPTERS[0].rank, "{body}");
    let path = format!("/v1/models/{}", TEST_ADAPTERS[0].name);
    let (status, one) = server.request("GET", &path, "");
    assert_eq!(status, 200, "{one}");
    assert!(one.contains(&format!("\"parent\":\"{base}\"")), "{one}");
    // /metrics counts the adapter and the memory its updates take.
    assert_eq!(server.metric("edgelm_lora_adapters"), 1.0);
    // Rank 8 in F16 on every attention and FFN matrix of 30 layers: about 4 MiB.
    let bytes = server.metric("edgelm_lora_adapter_bytes");
    assert!((3e6..2e7).contains(&bytes), "{bytes}");
    // kv-plan counts the same memory before anything is served.
    let out = run_ok(
        edgelm()
            .args(["kv-plan", "--json", "--lora", &lora_flags()[1], "-m"])
            .arg(model_path()),
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["adapters"]["bytes"].as_f64(), Some(bytes), "{plan}");
    assert_eq!(plan["adapters"]["each"][0]["name"], TEST_ADAPTERS[0].name);
}

/// A `/v1/load_lora_adapter` body for `spec`'s test adapter, called `name`.
fn load_body(name: &str, spec: &AdapterSpec) -> String {
    let path = test_adapter(&model_path(), spec);
    serde_json::json!({"lora_name": name, "lora_path": path, "scale": spec.scale}).to_string()
}

const LOAD: &str = "/v1/load_lora_adapter";
const UNLOAD: &str = "/v1/unload_lora_adapter";

#[test]
fn adapters_load_and_unload_while_serving() {
    let spec = &TEST_ADAPTERS[3];
    // The answer of the adapter loaded at start, to hold the one loaded at run time to.
    let at_start = serve(&lora_flags()[6..]);
    let want = complete(&at_start, spec.name, PROMPTS[1]);
    let base = complete(&at_start, "base", PROMPTS[1]);
    assert_ne!(want, base, "the adapter changes nothing");
    // Without an API key the administration endpoints are closed.
    let (status, body) = at_start.request("POST", LOAD, &load_body("x", spec));
    assert_eq!(status, 403, "{body}");
    drop(at_start);

    let server = serve(&["--api-key".to_string(), "sesame".to_string()]);
    let (status, body) = server.request_keyed("POST", LOAD, &load_body("x", spec), None);
    assert_eq!(status, 401, "{body}");
    let (status, body) = server.request_keyed("POST", UNLOAD, "{}", Some("wrong"));
    assert_eq!(status, 401, "{body}");
    let (status, body) = server.request("POST", LOAD, &load_body(spec.name, spec));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""parent":"base""#), "{body}");
    assert_eq!(complete(&server, spec.name, PROMPTS[1]), want);
    assert_eq!(server.metric("edgelm_lora_adapters"), 1.0);
    let (_, models) = server.request("GET", "/v1/models", "");
    assert!(
        models.contains(&format!(r#""id":"{}""#, spec.name)),
        "{models}"
    );
    // A taken name, a bad file, a missing one, an unknown field: 400s that name the cause.
    let hostile = edited("admin-arch", |k, _| {
        let arch = k.iter_mut().find(|(k, _)| k == "general.architecture");
        arch.unwrap().1 = Value::String("gemma3".into());
    });
    let cases = [
        (load_body(spec.name, spec), "is taken"),
        (load_body("base", spec), "is taken"),
        (
            serde_json::json!({"lora_name": "h", "lora_path": hostile}).to_string(),
            "an adapter for architecture gemma3",
        ),
        (
            r#"{"lora_name": "m", "lora_path": "/nonexistent/m.gguf"}"#.to_string(),
            "/nonexistent/m.gguf",
        ),
        (
            r#"{"lora_name": "m", "lora_path": "m.gguf", "rank": 4}"#.to_string(),
            "unrecognized request argument: rank",
        ),
    ];
    for (body, want) in &cases {
        let (status, answer) = server.request("POST", LOAD, body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(want), "{body}: {answer} lacks {want:?}");
    }
    assert_eq!(server.metric("edgelm_lora_adapters"), 1.0);
    // Unloaded, its name is refused (not answered by the base model) and its memory is gone.
    let unload = format!("{{\"lora_name\": \"{}\"}}", spec.name);
    let (status, body) = server.request("POST", UNLOAD, &unload);
    assert_eq!(status, 200, "{body}");
    let ask = serde_json::json!({"model": spec.name, "prompt": "Hi", "max_tokens": 2});
    let (status, body) = server.request("POST", "/v1/completions", &ask.to_string());
    assert_eq!(status, 404, "{body}");
    assert_eq!(server.metric("edgelm_lora_adapter_bytes"), 0.0);
    let (status, body) = server.request("POST", UNLOAD, &unload);
    assert_eq!(status, 404, "{body}");
    // Loaded again under another name, it answers as before.
    let (status, body) = server.request("POST", LOAD, &load_body("again", spec));
    assert_eq!(status, 200, "{body}");
    assert_eq!(complete(&server, "again", PROMPTS[1]), want);
    assert_eq!(complete(&server, "base", PROMPTS[1]), base);
}

/// `edgelm run --lora FILE`: its exit status and its stderr's last line.
fn run_with_adapter(adapter: &Path) -> (bool, String) {
    let out = edgelm()
        .args(["run", "-n", "2", "-p", "Hello", "--temp", "0", "-t", "2"])
        .arg("-m")
        .arg(model_path())
        .arg("--lora")
        .arg(adapter)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.lines().last().unwrap_or("").to_string();
    (out.status.success(), last)
}

/// The good rank-8 adapter rewritten by `edit` (over its keys and tensors) as `name`.
fn edited(
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, Value)>, &mut Vec<TensorEntry>),
) -> PathBuf {
    let good = test_adapter(&model_path(), &TEST_ADAPTERS[0]);
    edited_copy(&good, &format!("hostile-lora-{name}.gguf"), edit)
}

#[test]
fn hostile_adapters_are_refused_in_one_line() {
    let set = |keys: &mut Vec<(String, Value)>, key: &str, v: Value| {
        keys.iter_mut().find(|(k, _)| k == key).unwrap().1 = v;
    };
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            edited("arch", |k, _| {
                set(k, "general.architecture", Value::String("gemma3".into()))
            }),
            "an adapter for architecture gemma3",
        ),
        (
            edited("type", |k, _| {
                set(k, "general.type", Value::String("model".into()))
            }),
            "not an adapter file",
        ),
        (
            // lora_b of layer 0's Q with one output row too many.
            edited("shape", |_, t| {
                let b = t
                    .iter_mut()
                    .find(|t| t.0 == "blk.0.attn_q.weight.lora_b")
                    .unwrap();
                b.1[1] += 1;
                b.3.extend(vec![0u8; b.1[0] as usize * 2]);
            }),
            "do not fit the model's",
        ),
        (
            // lora_a of rank 8, lora_b of rank 7.
            edited("rank", |_, t| {
                let b = t
                    .iter_mut()
                    .find(|t| t.0 == "blk.0.attn_k.weight.lora_b")
                    .unwrap();
                b.3.truncate(b.3.len() / 8 * 7);
                b.1[0] = 7;
            }),
            "rank 8 and lora_b's 7 differ",
        ),
        (
            edited("half", |_, t| {
                t.retain(|t| t.0 != "blk.3.ffn_up.weight.lora_b")
            }),
            "'blk.3.ffn_up.weight' has .lora_a but no .lora_b",
        ),
        (
            edited("norm", |_, t| {
                let v = vec![0u8; 576 * 4];
                t.push((
                    "blk.0.attn_norm.weight".into(),
                    vec![576],
                    edgelm::quant::GgmlType::F32,
                    v,
                ));
            }),
            "is not a LoRA pair's half",
        ),
        (
            edited("embd", |_, t| {
                for x in t
                    .iter_mut()
                    .filter(|t| t.0.starts_with("blk.0.attn_q.weight"))
                {
                    x.0 = x.0.replace("blk.0.attn_q.weight", "token_embd.weight");
                }
            }),
            "adapters of the token embeddings are not supported",
        ),
        (model_path(), "not an adapter file"),
    ];
    for (path, want) in &cases {
        let (ok, line) = run_with_adapter(path);
        assert!(!ok, "{}: accepted", path.display());
        assert!(
            line.contains(want),
            "{}: {line:?} lacks {want:?}",
            path.display()
        );
    }
    // A file cut short is refused by the GGUF reader before anything is read.
    let good = test_adapter(&model_path(), &TEST_ADAPTERS[0]);
    let bytes = std::fs::read(&good).unwrap();
    let cut = repo_root().join("target/test-artifacts/hostile-lora-cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() - 1000]).unwrap();
    let (ok, line) = run_with_adapter(&cut);
    assert!(!ok && line.contains("adapter"), "{line:?}");
    // A missing file is named as an adapter's, before the model loads.
    let out = edgelm()
        .args(["serve", "--port", "1", "--lora", "/nonexistent/sql.gguf"])
        .arg("-m")
        .arg(model_path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("adapter /nonexistent/sql.gguf"), "{err}");
}
