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
use std::fs::File;
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
    let (tokens, n_ctx, base) = if args.kl_divergence {
        let (h, r) = open_base(&args, vocab)?;
        (h.tokens, h.n_ctx, Some(r))
    } else {
        (tokenize_text(&args, &tok)?, args.ctx, None)
    };
    if n_ctx < 8 {
        bail!("--ctx-size must be at least 8");
    }
    let n_chunks = chunk_count(tokens.len(), n_ctx, args.chunks)?;
    let mut writer = create_base(&args, n_ctx, vocab, &tokens[..n_chunks * n_ctx])?;

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
    let adapter = super::load_adapters(&model, args.lora.as_slice())?.pop();
    session.set_adapter(adapter)?;
    let mut chunks = Chunks {
        tokens: &tokens,
        n_ctx,
        n_chunks,
        vocab,
        bos: if tok.add_bos { tok.bos } else { None },
        session,
    };
    let t0 = Instant::now();
    if let Some(base) = base {
        let stats = chunks.compare(base)?;
        print_speed(n_chunks, n_ctx, t0);
        println!();
        print!("{}", stats.report());
        return Ok(());
    }
    let nll = chunks.score(writer.as_mut())?;
    print_speed(n_chunks, n_ctx, t0);
    if let Some(mut w) = writer {
        w.flush()?;
    }
    nll.print_estimate();
    Ok(())
}

/// `--kl-divergence-base FILE` to compare against: its header (checked against the model's
/// vocabulary), and the reader positioned at its first rows.
fn open_base(args: &PerplexityArgs, vocab: usize) -> Result<(kld::Header, BufReader<File>)> {
    let path = args
        .kl_divergence_base
        .as_ref()
        .context("--kl-divergence needs --kl-divergence-base FILE to compare against")?;
    let f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
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
    Ok((h, r))
}

/// The tokens of `-f FILE`.
fn tokenize_text(args: &PerplexityArgs, tok: &Tokenizer) -> Result<Vec<u32>> {
    let file = args
        .file
        .as_ref()
        .context("give the text to score with -f FILE (or --kl-divergence)")?;
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    // As llama-perplexity: BOS as the vocabulary wants, special tokens not parsed.
    tok.encode_with(&text, true, false)
}

/// Whole chunks of `n_ctx` in `n_tokens`, at most `limit` (`--chunks`); at least one.
fn chunk_count(n_tokens: usize, n_ctx: usize, limit: Option<usize>) -> Result<usize> {
    let mut n_chunks = n_tokens / n_ctx;
    if let Some(limit) = limit {
        n_chunks = n_chunks.min(limit);
    }
    if n_chunks == 0 {
        bail!("{n_tokens} tokens is less than one chunk of {n_ctx}");
    }
    Ok(n_chunks)
}

/// The base file `--kl-divergence-base FILE` asks for when not comparing, its header written.
fn create_base(
    args: &PerplexityArgs,
    n_ctx: usize,
    vocab: usize,
    tokens: &[u32],
) -> Result<Option<BufWriter<File>>> {
    let (Some(path), false) = (&args.kl_divergence_base, args.kl_divergence) else {
        return Ok(None);
    };
    let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = BufWriter::new(f);
    kld::write_header(&mut w, n_ctx, vocab, tokens)?;
    Ok(Some(w))
}

/// How long the chunks took, on stderr.
fn print_speed(n_chunks: usize, n_ctx: usize, t0: Instant) {
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "{} chunks in {secs:.1} s ({:.1} tok/s evaluated)",
        n_chunks,
        (n_chunks * n_ctx) as f64 / secs
    );
}

/// The text's chunks, each evaluated from an empty context.
struct Chunks<'a> {
    tokens: &'a [u32],
    n_ctx: usize,
    n_chunks: usize,
    vocab: usize,
    /// The token every chunk starts with, for a model that wants BOS.
    bos: Option<u32>,
    session: Session,
}

impl Chunks<'_> {
    /// The tokens of chunk `c`, as the text has them (the targets of its predictions).
    fn text(&self, c: usize) -> &[u32] {
        &self.tokens[c * self.n_ctx..(c + 1) * self.n_ctx]
    }

    /// The logits of every position of chunk `c`.
    fn evaluate(&mut self, c: usize) -> Result<Vec<f32>> {
        let mut chunk = self.text(c).to_vec();
        // As llama-perplexity: a model that wants BOS gets it at the start of every chunk.
        if let Some(bos) = self.bos {
            chunk[0] = bos;
        }
        self.session.reset();
        self.session.extend(&chunk, Logits::All)
    }

    /// The positions scored: the second half of a chunk (each sees at least n_ctx/2 tokens),
    /// each predicting the token after it.
    fn scored(&self) -> std::ops::Range<usize> {
        self.n_ctx / 2..self.n_ctx - 1
    }

    /// Compares every chunk's log-probabilities with the base file's rows, printing each
    /// chunk's line as llama-perplexity does.
    fn compare(&mut self, mut base: BufReader<File>) -> Result<kld::Kld> {
        let (vocab, row_len) = (self.vocab, kld::row_len(self.vocab));
        let mut rows = vec![0u16; self.scored().len() * row_len];
        let mut stats = kld::Kld::default();
        for c in 0..self.n_chunks {
            let logits = self.evaluate(c)?;
            let next = self.text(c);
            kld::read_rows(&mut base, &mut rows)?;
            for (j, row) in self.scored().zip(rows.chunks_exact(row_len)) {
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
        }
        Ok(stats)
    }

    /// The negative log-likelihood of every scored token; with `writer`, each position's
    /// log-probabilities go to the base file too.
    fn score(&mut self, mut writer: Option<&mut BufWriter<File>>) -> Result<Nll> {
        let (vocab, row_len) = (self.vocab, kld::row_len(self.vocab));
        let mut rows = vec![0u16; self.scored().len() * row_len];
        let mut nll = Nll::default();
        for c in 0..self.n_chunks {
            let logits = self.evaluate(c)?;
            let next = self.text(c);
            for (k, j) in self.scored().enumerate() {
                let l = &logits[j * vocab..(j + 1) * vocab];
                let v = match writer {
                    Some(_) => kld::encode_row(
                        l,
                        next[j + 1] as usize,
                        &mut rows[k * row_len..(k + 1) * row_len],
                    ),
                    None => -logprobs_of(l, next[j + 1], 0).0 as f64,
                };
                nll.add(v);
            }
            if let Some(w) = writer.as_mut() {
                kld::write_rows(w, &rows)?;
            }
            eprintln!(
                "[{}/{}] running PPL = {:.4}",
                c + 1,
                self.n_chunks,
                nll.ppl()
            );
        }
        Ok(nll)
    }
}

/// Sums of the scored tokens' negative log-likelihoods.
#[derive(Default)]
struct Nll {
    sum: f64,
    sum_sq: f64,
    count: usize,
}

impl Nll {
    fn add(&mut self, v: f64) {
        self.sum += v;
        self.sum_sq += v * v;
        self.count += 1;
    }

    fn ppl(&self) -> f64 {
        (self.sum / self.count as f64).exp()
    }

    /// The final estimate with its uncertainty, as llama-perplexity prints it.
    fn print_estimate(&self) {
        let (mean, var) = (
            self.sum / self.count as f64,
            self.sum_sq / self.count as f64 - (self.sum / self.count as f64).powi(2),
        );
        let ppl = mean.exp();
        println!(
            "Final estimate: PPL = {ppl:.4} +/- {:.5}",
            (var.max(0.0) / (self.count as f64 - 1.0)).sqrt() * ppl
        );
        println!("PPL = {ppl:.4}");
    }
}
