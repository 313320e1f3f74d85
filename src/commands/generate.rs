//! `edgelm run`: one prompt, one sequence, text streamed to stdout as it is generated.

use super::init_threads;
use crate::cli::RunArgs;
use anyhow::{bail, Result};
use edgelm::engine::{Sampler, SamplingParams, Session};
use edgelm::model::{Logits, Model};
use edgelm::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer};
use std::io::Write;
use std::time::Instant;

pub fn run(args: RunArgs) -> Result<()> {
    let start = Instant::now();
    let threads = init_threads(&args.compute)?;
    let model = Model::load(&args.model.model)?;
    let tok = Tokenizer::from_gguf(&model.file)?;
    let prompt = if args.chat {
        render_chat(&tok, args.system.as_deref(), &args.prompt)?
    } else {
        args.prompt.clone()
    };
    let ids = tok.encode(&prompt, true)?;
    if ids.is_empty() {
        bail!("the prompt is empty: nothing to continue from");
    }
    let ctx = model.config.context_length;
    if ids.len() >= ctx {
        bail!(
            "the prompt has {} tokens, the model's context is {ctx}",
            ids.len()
        );
    }
    let budget = (ids.len() + args.n_predict).min(ctx);
    let mut session = Session::new(
        &model,
        budget,
        args.compute.kv_type,
        args.compute.block_size,
    )?;
    let mut sampler = Sampler::new(SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repeat_penalty,
        seed: args.seed,
        ..Default::default()
    });
    log::info!(
        "model loaded in {:.2} s, {threads} threads",
        start.elapsed().as_secs_f64()
    );

    let t_prompt = Instant::now();
    let mut logits = session.extend(&ids, Logits::Last, 512)?;
    let prompt_s = t_prompt.elapsed().as_secs_f64();

    let t_gen = Instant::now();
    let mut out = std::io::stdout().lock();
    let mut decoder = StreamDecoder::new();
    let mut generated: Vec<u32> = Vec::new();
    let mut first_token_s = None;
    while generated.len() < args.n_predict && session.len() < budget {
        let next = sampler.sample(&logits, &generated);
        if first_token_s.is_none() {
            first_token_s = Some(start.elapsed().as_secs_f64());
        }
        if !args.ignore_eos && tok.is_eog(next) {
            break;
        }
        generated.push(next);
        out.write_all(decoder.push(tok.token_bytes(next, false)).as_bytes())?;
        out.flush()?;
        if generated.len() == args.n_predict {
            break;
        }
        logits = session.extend(&[next], Logits::Last, 1)?;
    }
    out.write_all(decoder.finish().as_bytes())?;
    writeln!(out)?;
    let gen_s = t_gen.elapsed().as_secs_f64();
    eprintln!(
        "prompt: {} tokens in {:.3} s ({:.1} tok/s); generated: {} tokens in {:.3} s ({:.1} tok/s); first token after {:.3} s",
        ids.len(),
        prompt_s,
        ids.len() as f64 / prompt_s.max(1e-9),
        generated.len(),
        gen_s,
        generated.len() as f64 / gen_s.max(1e-9),
        first_token_s.unwrap_or(0.0),
    );
    Ok(())
}

fn render_chat(tok: &Tokenizer, system: Option<&str>, user: &str) -> Result<String> {
    let Some(src) = tok.chat_template() else {
        bail!("--chat: the model has no chat template (tokenizer.chat_template)");
    };
    let tmpl = ChatTemplate::new(src, tok.special_text(tok.bos), tok.special_text(tok.eos))?;
    let mut msgs = Vec::new();
    if let Some(s) = system {
        msgs.push(ChatMessage {
            role: "system".into(),
            content: s.into(),
        });
    }
    msgs.push(ChatMessage {
        role: "user".into(),
        content: user.into(),
    });
    tmpl.render(&msgs, true)
}
