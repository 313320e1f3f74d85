//! `edgelm perplexity`: llama-perplexity's method. The text is split into chunks of n_ctx
//! tokens; each chunk is evaluated from an empty context, and only its second half is scored
//! (so every scored token sees at least n_ctx/2 tokens of context).

use super::init_threads;
use crate::cli::PerplexityArgs;
use anyhow::{bail, Context, Result};
use edgelm::engine::sampler::log_softmax;
use edgelm::engine::Session;
use edgelm::model::{Logits, Model};
use edgelm::tokenizer::Tokenizer;
use std::time::Instant;

pub fn run(args: PerplexityArgs) -> Result<()> {
    init_threads(&args.compute)?;
    let model = Model::load(&args.model.model)?;
    let tok = Tokenizer::from_gguf(&model.file)?;
    let text = std::fs::read_to_string(&args.file)
        .with_context(|| format!("cannot read {}", args.file.display()))?;
    let n_ctx = args.ctx;
    if n_ctx < 8 {
        bail!("--ctx-size must be at least 8");
    }
    let tokens = tok.encode(&text, true)?;
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(limit) = args.chunks {
        n_chunks = n_chunks.min(limit);
    }
    if n_chunks == 0 {
        bail!("{} tokens is less than one chunk of {n_ctx}", tokens.len());
    }
    eprintln!(
        "perplexity: {} tokens, {n_chunks} chunks of {n_ctx}",
        tokens.len()
    );
    let mut session = Session::new(&model, n_ctx, args.compute.kv_type, args.compute.block_size)?;
    let first = n_ctx / 2;
    let (mut nll, mut count) = (0.0f64, 0usize);
    let vocab = model.config.vocab_size;
    let t0 = Instant::now();
    for c in 0..n_chunks {
        let mut chunk = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        // As llama-perplexity: a model that wants BOS gets it at the start of every chunk.
        if tok.add_bos {
            if let Some(bos) = tok.bos {
                chunk[0] = bos;
            }
        }
        session.reset();
        let logits = session.extend(&chunk, Logits::All, n_ctx)?;
        for j in first..n_ctx - 1 {
            let lp = log_softmax(&logits[j * vocab..(j + 1) * vocab]);
            nll -= lp[chunk[j + 1] as usize] as f64;
            count += 1;
        }
        eprintln!(
            "[{}/{n_chunks}] running PPL = {:.4}",
            c + 1,
            (nll / count as f64).exp()
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} tokens scored in {secs:.1} s ({:.1} tok/s evaluated)",
        count,
        (n_chunks * n_ctx) as f64 / secs
    );
    println!("PPL = {:.4}", (nll / count as f64).exp());
    Ok(())
}
