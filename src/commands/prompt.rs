//! What `run` and `bench` share in making a prompt: a chat template (the model's or a file),
//! the projector file and the images it encodes, and where each image stands in the text.

use anyhow::{bail, Context, Result};
use edgelm::chat::IMAGE_MARKER;
use edgelm::engine::PromptImage;
use edgelm::model::Model;
use edgelm::tokenizer::{ChatTemplate, Tokenizer};
use edgelm::vision::{decode, Projector};
use std::path::{Path, PathBuf};

/// The chat template in `file`, or the model's own; an error names what is missing.
pub fn chat_template(tok: &Tokenizer, file: Option<&Path>) -> Result<ChatTemplate> {
    let src = match file {
        Some(path) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the chat template {}", path.display()))?,
        None => match tok.chat_template() {
            Some(src) => src.to_string(),
            None => bail!(
                "--chat: the model has no chat template (tokenizer.chat_template); give one with \
                 --chat-template-file"
            ),
        },
    };
    tok.compile_chat_template(&src)
}

/// The projector file `path`, where one is given, checked against `model` and its vocabulary.
pub fn open_projector(
    path: Option<&Path>,
    model: &Model,
    tok: &Tokenizer,
) -> Result<Option<Projector>> {
    let Some(path) = path else {
        return Ok(None);
    };
    let projector = Projector::open_beside(path, &model.config, tok)?;
    Ok(Some(projector))
}

/// `prompt` with one image marker per image: as it is where it has them all, else with the
/// markers before it (as llama.cpp's mtmd-cli places images).
pub fn with_image_markers(prompt: &str, images: usize) -> Result<String> {
    match prompt.matches(IMAGE_MARKER).count() {
        n if n == images => Ok(prompt.to_string()),
        0 => Ok(IMAGE_MARKER.repeat(images) + prompt),
        n => bail!("the prompt has {n} image markers ({IMAGE_MARKER}) for {images} images"),
    }
}

/// `prompt`'s tokens, and its images (files) decoded and encoded by `projector`.
pub fn prompt_with_images(
    tok: &Tokenizer,
    projector: Option<&Projector>,
    prompt: &str,
    images: &[PathBuf],
) -> Result<(Vec<u32>, Vec<PromptImage>)> {
    if images.is_empty() {
        return Ok((tok.encode(prompt, true)?, Vec::new()));
    }
    let Some(projector) = projector else {
        bail!("--image needs the model's projector file (--mmproj)");
    };
    let rgbs = (images.iter())
        .map(|path| {
            let bytes =
                std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
            decode(&bytes).with_context(|| format!("image {}", path.display()))
        })
        .collect::<Result<Vec<_>>>()?;
    let sizes: Vec<(usize, usize)> = rgbs.iter().map(|i| (i.width, i.height)).collect();
    let (ids, starts) = projector.prompt_tokens(tok, prompt, IMAGE_MARKER, 0, &sizes)?;
    let t0 = std::time::Instant::now();
    let mut out = Vec::new();
    for (rgb, views) in rgbs.iter().zip(starts) {
        let rows = projector.embed(rgb);
        out.extend(
            views
                .into_iter()
                .zip(rows)
                .map(|(at, rows)| PromptImage { at, rows }),
        );
    }
    log::info!(
        "{} images encoded in {:.3} s ({} positions)",
        images.len(),
        t0.elapsed().as_secs_f64(),
        out.iter().map(|i| i.rows.len()).sum::<usize>()
    );
    Ok((ids, out))
}
