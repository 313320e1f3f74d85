//! A chat request's images: each `image_url` part's data URL decoded into pixels, and the
//! rendered prompt's markers replaced by what the projector's model reads around an image
//! (its begin and end text) and the image's positions. Errors name the content part.

use super::error::ApiError;
use crate::chat::{ImagePart, IMAGE_MARKER};
use crate::server::generate::PendingImage;
use crate::tokenizer::Tokenizer;
use crate::vision::{decode, Projector};
use base64::Engine as _;

/// The token an image's positions hold in the prompt: any id would do, as their rows replace
/// its embedding; it counts as a prompt token like the image's other positions.
const PLACEHOLDER: u32 = 0;

/// `prompt` (a rendered chat prompt with one [`IMAGE_MARKER`] per image of `parts`, in order)
/// as tokens, and the images to place at their positions.
pub fn prompt_with_images(
    tokenizer: &Tokenizer,
    projector: Option<&Projector>,
    prompt: &str,
    parts: &[ImagePart],
) -> Result<(Vec<u32>, Vec<PendingImage>), ApiError> {
    let Some(projector) = projector else {
        return Err(ApiError::bad_request(
            "this model reads no images: it is served without a projector file (serve --mmproj)",
        )
        .param(&parts[0].param));
    };
    let pieces: Vec<&str> = prompt.split(IMAGE_MARKER).collect();
    if pieces.len() != parts.len() + 1 {
        return Err(ApiError::bad_request(format!(
            "the prompt holds {} image markers for {} images: a message's text may not contain \
             '{IMAGE_MARKER}', and the chat template must show every image part",
            pieces.len() - 1,
            parts.len()
        ))
        .param("messages"));
    }
    let rgbs = parts.iter().map(image_of).collect::<Result<Vec<_>, _>>()?;
    let (tokens, starts) = projector
        .prompt_tokens(tokenizer, prompt, IMAGE_MARKER, PLACEHOLDER)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("messages"))?;
    let images = (starts.into_iter().zip(rgbs))
        .map(|(at, rgb)| PendingImage { at, rgb })
        .collect();
    Ok((tokens, images))
}

/// The pixels of an image part: a base64 `data:` URL decoded (its bytes decide the format,
/// whatever MIME type it names). Remote URLs are not fetched: an appliance does not reach out
/// on a client's behalf.
fn image_of(part: &ImagePart) -> Result<crate::vision::Rgb, ApiError> {
    let bad =
        |why: String| ApiError::bad_request(format!("{}: {why}", part.param)).param(&part.param);
    let url = part.url.url.trim();
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(bad(
            "remote image URLs are not fetched; send the image as a data: URL".into(),
        ));
    }
    let Some((head, data)) = url.strip_prefix("data:").and_then(|u| u.split_once(',')) else {
        return Err(bad(
            "image_url.url must be a data: URL (data:image/png;base64,...)".into(),
        ));
    };
    if !head.ends_with(";base64") {
        return Err(bad("the data: URL is not base64 (;base64)".into()));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .map_err(|e| bad(format!("the data: URL's base64 does not decode ({e})")))?;
    decode(&bytes).map_err(|e| bad(format!("{e:#}")))
}
