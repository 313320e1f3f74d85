//! `edgelm bench --mmproj F --image I`: what an image costs. The projector's encode time
//! (median of `--repeats` rounds, as llama.cpp's libmtmd is timed by `mtmd-embed`: the views'
//! preparation, which libmtmd does while it tokenizes, timed on its own), then the
//! time to first token of a request that carries the image, of the same request again (its
//! prompt from the prefix cache, its rows from the recent images'), and of the request with
//! the image mirrored (another image: encoded, and a miss after the text before it). On the
//! CUDA backend the encoder runs, and is timed, on the device.

use super::{engine_config, init_threads, kv_bytes_for, open_projector};
use crate::cli::BenchArgs;
use anyhow::{bail, Context, Result};
use edgelm::chat::IMAGE_MARKER;
use edgelm::engine::{Engine, EngineHandle, Event, GenParams};
use edgelm::model::Model;
use edgelm::tokenizer::Tokenizer;
use edgelm::vision::{decode, Projector, Rgb};
use std::sync::Arc;
use std::time::Instant;

/// The text after the image in each timed request.
const PROMPT: &str = "Describe this image in one sentence.";

pub fn run(args: &BenchArgs) -> Result<()> {
    let (Some(_), Some(image)) = (&args.mmproj, &args.image) else {
        bail!("the image bench needs both --mmproj and --image");
    };
    if args.repeats == 0 {
        bail!("--repeats must be ≥ 1");
    }
    let threads = init_threads(&args.compute)?;
    let model = Arc::new(Model::load(&args.model.model)?);
    let tok = Tokenizer::from_gguf(&model.file)?;
    let projector = open_projector(args.mmproj.as_deref(), &model, &tok)?.expect("given");
    let bytes = std::fs::read(image).with_context(|| format!("cannot read {}", image.display()))?;
    let rgb = decode(&bytes).with_context(|| format!("image {}", image.display()))?;
    let backend = args.compute.backend.resolve("benchmarking");
    projector.follow_backend(backend);
    let on_device = projector.encodes_on_device();
    // Timed as libmtmd's are (`mtmd-embed`): preparing the views (its `mtmd_tokenize`), then
    // the encoder alone (its `mtmd_encode_chunk`).
    let (mut prepare_ms, mut encode_ms) = (Vec::new(), Vec::new());
    for _ in 0..args.repeats {
        let t = Instant::now();
        let views = projector.prepare(&rgb);
        prepare_ms.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        std::hint::black_box(projector.encode_prepared(&views));
        encode_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }
    for times in [&mut prepare_ms, &mut encode_ms] {
        times.sort_by(f64::total_cmp);
    }
    println!(
        "image encode ({} projector, {} × {} pixels, {}): median {:.1} ms of {} rounds ({}); \
         its views prepared (resized, tiled, normalised) beforehand: median {:.1} ms",
        projector.config.kind.name(),
        rgb.width,
        rgb.height,
        match on_device {
            true => "on the CUDA device".to_string(),
            false => format!("{threads} threads"),
        },
        encode_ms[encode_ms.len() / 2],
        encode_ms.len(),
        encode_ms
            .iter()
            .map(|t| format!("{t:.1}"))
            .collect::<Vec<_>>()
            .join(", "),
        prepare_ms[prepare_ms.len() / 2],
    );
    let prompt = format!("{IMAGE_MARKER}{PROMPT}");
    let size = [(rgb.width, rgb.height)];
    let (ids, _) = projector.prompt_tokens(&tok, &prompt, IMAGE_MARKER, 0, &size)?;
    let mut config = engine_config(&args.compute);
    if args.compute.kv_memory_mib.is_none() {
        config.kv_memory_bytes = 4 * kv_bytes_for(&model, &args.compute, ids.len() + 8);
    }
    let (engine, thread) = Engine::start(model.clone(), tok.eog_tokens().to_vec(), config)?;
    let timed = |img: &Rgb| first_token_s(&engine, &projector, &tok, &prompt, img);
    let cold = timed(&rgb);
    let again = timed(&rgb);
    let other = timed(&mirrored(&rgb));
    engine.shutdown();
    let _ = thread.join();
    let (cold, again, other) = (cold?, again?, other?);
    println!(
        "time to first token, {} prompt positions: cold {:.1} ms; the same image and text again \
         {:.1} ms ({:.0}% of cold); another image {:.1} ms",
        ids.len(),
        cold * 1e3,
        again * 1e3,
        100.0 * again / cold,
        other * 1e3
    );
    Ok(())
}

/// Seconds from the image's bytes decoded to the first token of a greedy request for
/// `prompt` with `img` (its rows made, or found among the recent images', on the way).
fn first_token_s(
    engine: &EngineHandle,
    projector: &Projector,
    tok: &Tokenizer,
    prompt: &str,
    img: &Rgb,
) -> Result<f64> {
    let t = Instant::now();
    let size = [(img.width, img.height)];
    let (ids, starts) = projector.prompt_tokens(tok, prompt, IMAGE_MARKER, 0, &size)?;
    let images = (starts[0].iter().zip(projector.embed(img)))
        .map(|(&at, rows)| edgelm::engine::PromptImage { at, rows })
        .collect();
    let params = GenParams {
        max_tokens: Some(1),
        ..Default::default()
    };
    let (_, events) = engine.submit_with_images(ids, images, params)?;
    for event in events {
        match event {
            Event::Token { .. } => return Ok(t.elapsed().as_secs_f64()),
            Event::Error(e) => bail!("the request failed: {e}"),
            _ => {}
        }
    }
    bail!("the request ended without a token")
}

/// `img` mirrored left to right: another image of the same size and content.
fn mirrored(img: &Rgb) -> Rgb {
    let row = img.width * 3;
    let data = img
        .data
        .chunks_exact(row)
        .flat_map(|r| {
            r.chunks_exact(3)
                .rev()
                .flatten()
                .copied()
                .collect::<Vec<u8>>()
        })
        .collect();
    Rgb {
        data,
        ..img.clone()
    }
}
