//! `edgelm perplexity`: llama-perplexity's method. The text is split into chunks of n_ctx
//! tokens; each chunk is evaluated from an empty context, and only its second half is scored
//! (so every scored token sees at least n_ctx/2 tokens of context).
//!
//! With `--kl-divergence-base FILE` it also writes each scored position's log-probabilities in
//! llama.cpp's base-file format; with `--kl-divergence` it reads such a file (made by either
//! engine), evaluates the same tokens and prints the statistics llama-perplexity prints.

mod kld;

use super::init_threads;
use crate::cli::PerplexityArgs;
use anyhow::{bail, Context, Result};
use edgelm::engine::sampler::logprobs_of;
use edgelm::engine::{Session, SessionConfig};
use edgelm::model::{Logits, Model};
use edgelm::tokenizer::Tokenizer;
use std::io::{BufReader, BufWriter, Write};
use std::sync::Arc;
use std::time::Instant;

pub fn run(args: PerplexityArgs) -> Result<()> {
    crate::commands::require_model(&args.model.model)?;
    init_threads(&args.compute)?;
    let backend = args.compute.backend.resolve("scoring");
    let mut model = Model::load(&args.model.model)?;
    let tok = Tokenizer::from_gguf(&model.file)?;
    let vocab = model.config.vocab_size;

    // The tokens and chunk size: from the text, or from the base file when comparing.
    let (tokens, n_ctx, mut base) = if args.kl_divergence {
        let path = args
            .kl_divergence_base
            .as_ref()
            .context("--kl-divergence needs --kl-divergence-base FILE to compare against")?;
        let f =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let mut r = BufReader::new(f);
        let h = kld::read_header(&mut r)
            .with_context(|| format!("{} is not a base-logits file", path.display()))?;
        if h.n_vocab != vocab {
            bail!(
                "{} has a vocabulary of {} tokens, the model {vocab}",
                path.display(),
                h.n_vocab
            );
        }
        (h.tokens, h.n_ctx, Some(r))
    } else {
        let file = args
            .file
            .as_ref()
            .context("give the text to score with -f FILE (or --kl-divergence)")?;
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        // As llama-perplexity: BOS as the vocabulary wants, special tokens not parsed.
        (tok.encode_with(&text, true, false)?, args.ctx, None)
    };
    if n_ctx < 8 {
        bail!("--ctx-size must be at least 8");
    }
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(limit) = args.chunks {
        n_chunks = n_chunks.min(limit);
    }
    if n_chunks == 0 {
        bail!("{} tokens is less than one chunk of {n_ctx}", tokens.len());
    }
    let mut writer = match (&args.kl_divergence_base, args.kl_divergence) {
        (Some(path), false) => {
            let f = std::fs::File::create(path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            let mut w = BufWriter::new(f);
            kld::write_header(&mut w, n_ctx, vocab, &tokens[..n_chunks * n_ctx])?;
            Some(w)
        }
        _ => None,
    };

    model.set_context(n_ctx);
    let model = Arc::new(model);
    let mut session = Session::new(
        model.clone(),
        SessionConfig {
            kv_type: args.compute.kv_type,
            block_size: args.compute.block_size,
            max_tokens: n_ctx,
            chunk: args.compute.max_batched_tokens,
            backend,
            gpu_reserve_bytes: args.compute.gpu_reserve_mib << 20,
        },
    )?;
    eprintln!(
        "perplexity: {} tokens, {n_chunks} chunks of {n_ctx}{}",
        tokens.len(),
        if session.is_cuda() { " (CUDA)" } else { "" }
    );
    let first = n_ctx / 2;
    let scored = n_ctx - 1 - first;
    let row_len = kld::row_len(vocab);
    let mut rows = vec![0u16; scored * row_len];
    let mut stats = kld::Kld::default();
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
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
        let logits = session.extend(&chunk, Logits::All)?;
        let next = &tokens[c * n_ctx..(c + 1) * n_ctx];
        if let Some(r) = base.as_mut() {
            kld::read_rows(r, &mut rows)?;
            for (j, row) in (first..n_ctx - 1).zip(rows.chunks_exact(row_len)) {
                stats.add(
                    &logits[j * vocab..(j + 1) * vocab],
                    row,
                    next[j + 1] as usize,
                );
            }
            if c == 0 {
                println!("chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p");
            }
            println!("{}", stats.chunk_line(c + 1));
            continue;
        }
        for (k, j) in (first..n_ctx - 1).enumerate() {
            let l = &logits[j * vocab..(j + 1) * vocab];
            let v = match writer.as_mut() {
                Some(_) => kld::encode_row(
                    l,
                    next[j + 1] as usize,
                    &mut rows[k * row_len..(k + 1) * row_len],
                ),
                None => -logprobs_of(l, next[j + 1], 0).0 as f64,
            };
            nll += v;
            nll2 += v * v;
            count += 1;
        }
        if let Some(w) = writer.as_mut() {
            kld::write_rows(w, &rows)?;
        }
        eprintln!(
            "[{}/{n_chunks}] running PPL = {:.4}",
            c + 1,
            (nll / count as f64).exp()
        );
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} chunks in {secs:.1} s ({:.1} tok/s evaluated)",
        n_chunks,
        (n_chunks * n_ctx) as f64 / secs
    );
    if base.is_some() {
        println!();
        print!("{}", stats.report());
        return Ok(());
    }
    if let Some(mut w) = writer {
        w.flush()?;
    }
    let (mean, var) = (
        nll / count as f64,
        nll2 / count as f64 - (nll / count as f64).powi(2),
    );
    let ppl = mean.exp();
    println!(
        "Final estimate: PPL = {ppl:.4} +/- {:.5}",
        (var.max(0.0) / (count as f64 - 1.0)).sqrt() * ppl
    );
    println!("PPL = {ppl:.4}");
    Ok(())
}
