//! `edgelm run`: one prompt through the engine (the same path the server uses), text
//! streamed to stdout as it is generated.

use super::{engine_config, init_threads, kv_bytes_for};
use crate::cli::RunArgs;
use anyhow::{bail, Result};
use edgelm::engine::{Engine, Event, GenParams, PromptImage, SamplingParams};
use edgelm::model::Model;
use edgelm::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
use edgelm::vision::Projector;
use std::io::Write;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Instant;

pub fn run(args: RunArgs) -> Result<()> {
    super::require_model(&args.model.model)?;
    let start = Instant::now();
    let threads = init_threads(&args.compute)?;
    args.compute.backend.resolve("running");
    let model = Arc::new(Model::load(&args.model.model)?);
    let tok = Tokenizer::from_gguf(&model.file)?;
    let ctx = model.config.context_length;
    let projector = super::open_projector(args.mmproj.as_deref(), &model, &tok)?;
    if let Some(p) = &projector {
        p.follow_backend(args.compute.backend.resolve_quietly());
    }
    let (ids, images) = prompt_ids(&args, &tok, projector.as_ref(), ctx)?;
    let adapter = super::load_adapters(&model, args.lora.as_slice())?.pop();
    let n_predict = args.n_predict.min(ctx - ids.len());
    let mut config = engine_config(&args.compute);
    // One sequence: a pool just big enough for it unless a size was given.
    if args.compute.kv_memory_mib.is_none() {
        config.kv_memory_bytes = kv_bytes_for(&model, &args.compute, ids.len() + n_predict);
    }
    let (engine, thread) = Engine::start(model.clone(), tok.eog_tokens().to_vec(), config)?;
    log::info!(
        "model loaded in {:.2} s, {threads} threads",
        start.elapsed().as_secs_f64()
    );
    let t_submit = Instant::now();
    let params = GenParams {
        adapter,
        ..gen_params(&args, n_predict)
    };
    let (_, events) = engine.submit_with_images(ids.clone(), images, params)?;
    let (generated, first_token_at) = stream_text(events, &tok)?;
    let first = first_token_at.unwrap_or_else(Instant::now);
    let prompt_s = first.duration_since(t_submit).as_secs_f64();
    let gen_s = first.elapsed().as_secs_f64();
    eprintln!(
        "prompt: {} tokens in {:.3} s ({:.1} tok/s); generated: {} tokens, {:.1} tok/s after the first; first token after {:.3} s from start",
        ids.len(),
        prompt_s,
        ids.len() as f64 / prompt_s.max(1e-9),
        generated,
        generated.saturating_sub(1) as f64 / gen_s.max(1e-9),
        first.duration_since(start).as_secs_f64(),
    );
    engine.shutdown();
    let _ = thread.join();
    Ok(())
}

/// The prompt's token ids (rendered by the chat template with `--chat`) and its images,
/// encoded; refused when empty or when it fills the model's context `ctx`.
fn prompt_ids(
    args: &RunArgs,
    tok: &Tokenizer,
    projector: Option<&Projector>,
    ctx: usize,
) -> Result<(Vec<u32>, Vec<PromptImage>)> {
    let user = super::with_image_markers(&args.prompt, args.image.len())?;
    let prompt = if args.chat {
        let tmpl = super::chat_template(tok, args.chat_template_file.as_deref())?;
        render_chat(&tmpl, args.system.as_deref(), &user)?
    } else {
        user
    };
    let (ids, images) = super::prompt_with_images(tok, projector, &prompt, &args.image)?;
    if ids.is_empty() {
        bail!("the prompt is empty: nothing to continue from");
    }
    if ids.len() >= ctx {
        bail!(
            "the prompt has {} tokens, the model's context is {ctx}",
            ids.len()
        );
    }
    Ok((ids, images))
}

/// The request the flags describe, for at most `n_predict` tokens.
fn gen_params(args: &RunArgs, n_predict: usize) -> GenParams {
    GenParams {
        max_tokens: Some(n_predict),
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            min_p: args.min_p,
            repetition_penalty: args.repeat_penalty,
            seed: args.seed,
            ..Default::default()
        },
        ignore_eos: args.ignore_eos,
        prompt_lookup: args.compute.prompt_lookup > 0,
        ..Default::default()
    }
}

/// Writes each generated token's text to stdout as it arrives (whole UTF-8 characters only)
/// until the request finishes; returns the tokens generated and when the first came.
fn stream_text(events: Receiver<Event>, tok: &Tokenizer) -> Result<(usize, Option<Instant>)> {
    let mut out = std::io::stdout().lock();
    let mut decoder = StreamDecoder::new();
    let (mut generated, mut first_token_at) = (0usize, None);
    for event in events {
        match event {
            Event::Token { token, .. } => {
                if first_token_at.is_none() {
                    first_token_at = Some(Instant::now());
                }
                generated += 1;
                out.write_all(decoder.push(tok.token_bytes(token, false)).as_bytes())?;
                out.flush()?;
            }
            Event::Finished { .. } => break,
            Event::Error(e) => bail!("generation failed: {e}"),
            // Generation requests get no embeddings.
            Event::PromptLogprobs(_) | Event::Embedding { .. } => {}
        }
    }
    out.write_all(decoder.finish().as_bytes())?;
    writeln!(out)?;
    Ok((generated, first_token_at))
}

/// `user` (and `system`) as the chat template `tmpl` renders them, ready for the reply.
pub(super) fn render_chat(tmpl: &ChatTemplate, system: Option<&str>, user: &str) -> Result<String> {
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(ChatMessage {
            role: "system".into(),
            content: s.into(),
            ..Default::default()
        });
    }
    msgs.push(ChatMessage {
        role: "user".into(),
        content: user.into(),
        ..Default::default()
    });
    tmpl.render(&msgs, true)
}
