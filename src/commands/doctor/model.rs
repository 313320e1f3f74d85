//! Model checks: the file, its GGUF header, its SHA-256 against a manifest; KV sizing against
//! the profile and memory; a short greedy generation as a self-test.

use super::{human, Check, Context};
use crate::cli::ComputeArgs;
use crate::commands::{engine_config, init_threads, kv_bytes_for};
use edgelm::engine::{Engine, EngineConfig, EngineHandle, Event, GenParams, SamplingParams};
use edgelm::gguf::GgufFile;
use edgelm::kv::plan::KvPlan;
use edgelm::model::{Model, ModelConfig};
use edgelm::tokenizer::Tokenizer;
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Average tokens a sequence holds, for the "sequences that fit" figure.
const AVG_TOKENS: usize = 512;
/// Memory beyond weights and KV the server needs (activations, buffers, HTTP threads).
const OVERHEAD_BYTES: u64 = 128 << 20;
const SELF_TEST_PROMPT: &str = "The capital of France is";
const SELF_TEST_TOKENS: usize = 16;

/// What the model check learned, for the checks after it.
pub struct Parsed {
    pub config: ModelConfig,
    pub file_bytes: u64,
}

/// Parses `sha256sum` output: `<64 hex>  <name>` (or ` *<name>` for binary mode).
/// Returns (lower-case hex, file name as written); malformed lines are skipped.
pub fn parse_sha256sums(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim_end_matches('\r');
            if line.starts_with('#') || line.len() < 66 {
                return None;
            }
            let (hex, rest) = line.split_at(64);
            if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return None;
            }
            let name = rest
                .strip_prefix("  ")
                .or_else(|| rest.strip_prefix(" *"))?;
            (!name.is_empty()).then(|| (hex.to_ascii_lowercase(), name.to_owned()))
        })
        .collect()
}

/// The manifest entry for a file named `name` (entries may carry a directory prefix).
pub fn manifest_entry<'a>(entries: &'a [(String, String)], name: &str) -> Option<&'a str> {
    entries
        .iter()
        .find(|(_, n)| Path::new(n).file_name().is_some_and(|f| f == name))
        .map(|(h, _)| h.as_str())
}

/// Directories a SHA256SUMS may sit in: beside the model (and its link target), the profile,
/// the install tree around the binary, and /etc/edgelm.
fn manifest_dirs(ctx: &Context) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let parent = |p: &Path| {
        p.parent()
            .map(|d| {
                if d.as_os_str().is_empty() {
                    Path::new(".")
                } else {
                    d
                }
            })
            .map(Path::to_path_buf)
    };
    dirs.extend(parent(&ctx.model_path));
    if let Ok(real) = std::fs::canonicalize(&ctx.model_path) {
        dirs.extend(parent(&real));
    }
    if let Some(p) = &ctx.profile_path {
        dirs.extend(parent(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(bin) = exe.parent() {
            dirs.push(bin.to_path_buf());
            dirs.extend(bin.parent().map(Path::to_path_buf));
        }
    }
    dirs.push(PathBuf::from("/etc/edgelm"));
    dirs.push(PathBuf::from("/opt/edgelm"));
    let mut seen = Vec::new();
    dirs.retain(|d| {
        let key = std::fs::canonicalize(d).unwrap_or_else(|_| d.clone());
        let new = !seen.contains(&key);
        seen.push(key);
        new
    });
    dirs
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}

/// The check of the first (or only) model the profile serves.
pub fn model(ctx: &Context) -> (Check, Option<Parsed>) {
    model_at(ctx, "model".into(), &ctx.model_path)
}

/// The check of a further model the profile serves (`[[models]]`), named after its id.
pub fn further_model(ctx: &Context, m: &edgelm::config::ModelSection) -> Check {
    model_at(ctx, format!("model {}", m.served_id()), &m.path).0
}

fn model_at(ctx: &Context, name: String, path: &Path) -> (Check, Option<Parsed>) {
    let mut c = Check::new(name);
    c.detail("path", path.display().to_string());
    if !path.exists() {
        return (
            c.fail(
                edgelm::config::missing_model(path),
                "pass --model FILE or set model.path in the profile",
            ),
            None,
        );
    }
    let (file, config) = match open(path) {
        Ok(x) => x,
        Err((reason, hint)) => return (c.fail(reason, hint), None),
    };
    let summary = describe(&mut c, &file, &config);
    let file_bytes = file.file_size();
    drop(file);
    let parsed = Some(Parsed { config, file_bytes });
    (verify(c, ctx, path, &summary), parsed)
}

/// The model's GGUF and the configuration edgelm reads from it, or why not (reason, hint).
fn open(path: &Path) -> Result<(GgufFile, ModelConfig), (String, &'static str)> {
    let file = GgufFile::open(path).map_err(|e| {
        (
            format!("{} is not a readable GGUF: {e}", path.display()),
            "the file is damaged or not a GGUF model: copy it again",
        )
    })?;
    let config = ModelConfig::from_gguf(&file).map_err(|e| {
        (
            format!("GGUF parses but edgelm cannot serve it: {e:#}"),
            "use a supported architecture (llama, mistral, qwen2)",
        )
    })?;
    Ok((file, config))
}

/// Records the model's shape as details; returns its one-line summary.
fn describe(c: &mut Check, file: &GgufFile, config: &ModelConfig) -> String {
    let params: u64 = file
        .tensors()
        .iter()
        .map(|t| t.dims.iter().product::<u64>())
        .sum();
    let file_bytes = file.file_size();
    let name = file.get_str("general.name").unwrap_or("").to_owned();
    c.detail("name", name.clone());
    c.detail("architecture", config.arch.clone());
    c.detail("params", params);
    c.detail("file_bytes", file_bytes);
    c.detail("n_layers", config.n_layers);
    c.detail("n_embd", config.n_embd);
    c.detail("n_head", config.n_head);
    c.detail("n_head_kv", config.n_head_kv);
    c.detail("context_length", config.context_length);
    c.detail("vocab_size", config.vocab_size);
    format!(
        "{}{} {:.0}M params, {} layers, ctx {}, {}",
        if name.is_empty() {
            String::new()
        } else {
            format!("{name}: ")
        },
        config.arch,
        params as f64 / 1e6,
        config.n_layers,
        config.context_length,
        human(file_bytes)
    )
}

/// Checks the file against the first SHA256SUMS that names it (under its own or its link
/// target's name); a warning when no manifest does.
fn verify(mut c: Check, ctx: &Context, path: &Path, summary: &str) -> Check {
    let names: Vec<String> = [Some(path.to_path_buf()), std::fs::canonicalize(path).ok()]
        .into_iter()
        .flatten()
        .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    let mut manifests_without_entry = Vec::new();
    for dir in manifest_dirs(ctx) {
        let manifest = dir.join("SHA256SUMS");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        let entries = parse_sha256sums(&text);
        let Some(expected) = names.iter().find_map(|n| manifest_entry(&entries, n)) else {
            manifests_without_entry.push(manifest.display().to_string());
            continue;
        };
        c.detail("manifest", manifest.display().to_string());
        c.detail("sha256_expected", expected);
        return compare_hash(c, path, expected, &manifest, summary);
    }
    let why = if manifests_without_entry.is_empty() {
        "no SHA256SUMS manifest found".to_owned()
    } else {
        format!("{} has no entry for it", manifests_without_entry.join(", "))
    };
    c.warn(
        format!("{summary}; not verified: {why}"),
        "ship a SHA256SUMS (sha256sum format) next to the model to verify it",
    )
}

/// Hashes the file and compares it with `expected`, the entry of `manifest`.
fn compare_hash(
    mut c: Check,
    path: &Path,
    expected: &str,
    manifest: &Path,
    summary: &str,
) -> Check {
    let actual = match sha256_file(path) {
        Ok(h) => h,
        Err(e) => {
            return c.fail(
                format!("{summary}; cannot read it to hash: {e}"),
                "check the file's permissions and the disk",
            )
        }
    };
    c.detail("sha256", actual.clone());
    if actual == expected {
        c.pass(format!("{summary}; SHA-256 matches {}", manifest.display()))
    } else {
        c.fail(
            format!(
                "{summary}; SHA-256 {} does not match {} in {}",
                &actual[..16],
                &expected[..16],
                manifest.display()
            ),
            "the model file is corrupt or not the one shipped: copy it again from the bundle",
        )
    }
}

pub fn kv_plan(ctx: &Context, parsed: Option<&Parsed>) -> Check {
    let mut c = Check::new("kv_plan");
    let Some(p) = parsed else {
        return c.fail("the model did not load", "fix the model check first");
    };
    let e = &ctx.profile.engine;
    let cfg = &p.config;
    if e.kv_type.row_bytes(cfg.head_dim).is_none() {
        return c.fail(
            format!(
                "kv_type {} does not fit head_dim {} (needs a multiple of 32)",
                e.kv_type, cfg.head_dim
            ),
            "set engine.kv_type = \"f16\" in the profile",
        );
    }
    let geom = cfg.page_geometry(e.kv_type, e.block_size);
    let budget = (e.kv_memory_mib as u64) << 20;
    let layout = cfg.kv_layout();
    let plan = KvPlan::new(
        &geom,
        &layout,
        cfg.n_head,
        budget as usize,
        cfg.context_length,
        AVG_TOKENS,
    );
    let tokens = layout.max_tokens(plan.pool_blocks, e.max_batched_tokens, plan.block_size);
    let need = p.file_bytes + budget + OVERHEAD_BYTES;
    c.detail("kv_type", e.kv_type.to_string());
    c.detail("kv_bytes_per_token", plan.kv_bytes_per_token);
    c.detail("kv_budget_bytes", budget);
    c.detail("tokens_fit", tokens);
    c.detail("seqs_fit_avg_tokens", plan.max_seqs_paged);
    c.detail("avg_tokens", AVG_TOKENS);
    c.detail("seqs_fit_full_context", plan.max_seqs_contiguous);
    c.detail("weights_bytes", p.file_bytes);
    c.detail("need_bytes", need);
    let reason = format!(
        "{} B/token ({}), {} MiB holds {tokens} tokens = {} seqs of {AVG_TOKENS} ({} at full {}-token context); weights {} + KV + overhead = {}",
        plan.kv_bytes_per_token,
        e.kv_type,
        e.kv_memory_mib,
        plan.max_seqs_paged,
        plan.max_seqs_contiguous,
        cfg.context_length,
        human(p.file_bytes),
        human(need)
    );
    if let Some(m) = ctx.mem {
        c.detail("mem_available_bytes", m.available);
        if need > m.total {
            return c.fail(
                format!("{reason} > {} total memory", human(m.total)),
                "lower engine.kv_memory_mib, use kv_type q8_0/q4_0, or a smaller model",
            );
        }
        if need > m.available {
            return c.warn(
                format!("{reason} > {} available", human(m.available)),
                "not enough free memory now (a running edgelm already holds its share): \
                 stop other services or lower engine.kv_memory_mib",
            );
        }
    }
    if plan.max_seqs_paged < e.max_seqs {
        return c.warn(
            format!("{reason}; fewer than engine.max_seqs = {}", e.max_seqs),
            "raise engine.kv_memory_mib or lower engine.max_seqs: requests will queue for KV",
        );
    }
    c.pass(format!("{reason}; fits"))
}

pub fn self_test(ctx: &Context, model_ok: bool) -> Check {
    let c = Check::new("self_test");
    if !model_ok {
        return c.fail("the model did not load", "fix the model check first");
    }
    match generate(ctx, c.clone()) {
        Ok(c) => c,
        Err(e) => c.fail(
            format!("generation failed: {}", format!("{e:#}").replace('\n', " ")),
            "run `edgelm run -m MODEL -p hello` for details; the model or this build is broken",
        ),
    }
}

fn generate(ctx: &Context, mut c: Check) -> anyhow::Result<Check> {
    let e = &ctx.profile.engine;
    let start = Instant::now();
    // One sequence, through the same thread-pool set-up as `serve`.
    let compute = ComputeArgs {
        max_seqs: 1,
        ..ComputeArgs::from_profile(e)
    };
    let threads = init_threads(&compute)?;
    let model = Arc::new(Model::load(&ctx.model_path)?);
    let tok = Tokenizer::from_gguf(&model.file)?;
    let ids = tok.encode(SELF_TEST_PROMPT, true)?;
    let load_s = start.elapsed().as_secs_f64();
    // A pool just big enough for the one sequence (plus a spare block).
    let config = EngineConfig {
        kv_memory_bytes: kv_bytes_for(
            &model,
            &compute,
            ids.len() + SELF_TEST_TOKENS + e.block_size,
        ),
        ..engine_config(&compute)
    };
    let (engine, thread) = Engine::start(model.clone(), tok.eog_tokens().to_vec(), config)?;
    let t_submit = Instant::now();
    let result = greedy_tokens(&engine, ids.clone());
    let done = Instant::now();
    engine.shutdown();
    let _ = thread.join();
    let (first, out) = result?;
    let n = out.len();
    let Some(first) = first else {
        anyhow::bail!("no token was generated");
    };
    let ttft = first.duration_since(t_submit).as_secs_f64();
    let total = done.duration_since(t_submit).as_secs_f64();
    let after_first = done.duration_since(first).as_secs_f64();
    let tps = if n > 1 && after_first > 0.0 {
        (n - 1) as f64 / after_first
    } else {
        n as f64 / total.max(1e-9)
    };
    let bytes: Vec<u8> = out
        .iter()
        .flat_map(|&t| tok.token_bytes(t, false).iter().copied())
        .collect();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    c.detail("prompt", SELF_TEST_PROMPT);
    c.detail("prompt_tokens", ids.len());
    c.detail("generated_tokens", n);
    c.detail("load_s", load_s);
    c.detail("ttft_s", ttft);
    c.detail("tokens_per_s", tps);
    c.detail("threads", threads);
    c.detail("text", text);
    Ok(c.pass(format!(
        "{n} tokens greedy, TTFT {:.0} ms, {tps:.1} tok/s decode ({threads} threads, load {load_s:.2} s)",
        ttft * 1000.0
    )))
}

/// [`SELF_TEST_TOKENS`] tokens generated greedily after `ids` (end-of-generation ignored), and
/// when the first of them came.
fn greedy_tokens(
    engine: &EngineHandle,
    ids: Vec<u32>,
) -> anyhow::Result<(Option<Instant>, Vec<u32>)> {
    let params = GenParams {
        max_tokens: Some(SELF_TEST_TOKENS),
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        ignore_eos: true,
        ..Default::default()
    };
    let (_, events) = engine.submit(ids, params)?;
    let (mut first, mut out) = (None, Vec::new());
    for event in events {
        match event {
            Event::Token { token, .. } => {
                first.get_or_insert_with(Instant::now);
                out.push(token);
            }
            Event::Finished { .. } => break,
            Event::Error(e) => anyhow::bail!("{e}"),
            // Generation requests get no embeddings.
            Event::PromptLogprobs(_) | Event::Embedding { .. } => {}
        }
    }
    Ok((first, out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256sums_lines() {
        let a = "a".repeat(64);
        let b = "B".repeat(64);
        let text = format!(
            "{a}  model.gguf\n{b} *dir/other.gguf\n# comment\nnot a line\n{}  short\n",
            "c".repeat(10)
        );
        let e = parse_sha256sums(&text);
        assert_eq!(
            e,
            vec![
                (a.clone(), "model.gguf".to_string()),
                ("b".repeat(64), "dir/other.gguf".to_string()),
            ]
        );
        assert_eq!(manifest_entry(&e, "model.gguf"), Some(a.as_str()));
        assert_eq!(
            manifest_entry(&e, "other.gguf"),
            Some("b".repeat(64).as_str())
        );
        assert_eq!(manifest_entry(&e, "missing.gguf"), None);
        // One space is not sha256sum's format.
        assert!(parse_sha256sums(&format!("{a} model.gguf\n")).is_empty());
    }

    #[test]
    fn sha256_of_a_file() {
        let p = std::env::temp_dir().join(format!("edgelm-sha-{}", std::process::id()));
        std::fs::write(&p, b"abc").unwrap();
        let h = sha256_file(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        assert_eq!(
            h,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
