//! A chat request's images: each `image_url` part's bytes read ([`ImageSources`]) and decoded into
//! pixels, and the
//! rendered prompt's markers replaced by what the projector's model reads around an image
//! (its begin and end text) and the image's positions. Errors name the content part.

use super::error::ApiError;
use crate::chat::{ImagePart, IMAGE_MARKER};
use crate::server::generate::PendingImage;
use crate::tokenizer::Tokenizer;
use crate::vision::{decode, ImageSources, Projector};

/// The token an image's positions hold in the prompt: any id would do, as their rows replace
/// its embedding; it counts as a prompt token like the image's other positions.
const PLACEHOLDER: u32 = 0;

/// Where a request's images come from and what they are read into.
pub struct ImageInput<'a> {
    pub projector: Option<&'a Projector>,
    pub sources: &'a ImageSources,
    /// The model's context length: an image whose positions pass it is refused by name.
    pub context: usize,
}

/// `prompt` (a rendered chat prompt with one [`IMAGE_MARKER`] per image of `parts`, in order)
/// as tokens, and the images to place at their positions.
pub fn prompt_with_images(
    tokenizer: &Tokenizer,
    input: &ImageInput<'_>,
    prompt: &str,
    parts: &[ImagePart],
) -> Result<(Vec<u32>, Vec<PendingImage>), ApiError> {
    let ImageInput {
        projector,
        sources,
        context,
    } = *input;
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
    let rgbs = (parts.iter().map(|p| image_of(sources, p))).collect::<Result<Vec<_>, _>>()?;
    let sizes: Vec<(usize, usize)> = rgbs.iter().map(|i| (i.width, i.height)).collect();
    let (tokens, starts) = projector
        .prompt_tokens(tokenizer, prompt, IMAGE_MARKER, PLACEHOLDER, &sizes)
        .map_err(|e| ApiError::bad_request(e.to_string()).param("messages"))?;
    for ((part, views), &(width, height)) in parts.iter().zip(&starts).zip(&sizes) {
        let rows = projector.config.view_rows(width, height);
        let (at, end) = (views[0], views[views.len() - 1] + rows);
        if end > context {
            return Err(ApiError::bad_request(format!(
                "{}: the image's positions {at}..{end} do not fit the context length of \
                 {context} tokens",
                part.param
            ))
            .param(&part.param));
        }
    }
    let images = (starts.into_iter().zip(rgbs))
        .map(|(views, rgb)| PendingImage { views, rgb })
        .collect();
    Ok((tokens, images))
}

/// The pixels of an image part: its bytes read from where its URL says (if the server
/// allows it), then decoded (the bytes decide the format, whatever MIME type the URL names).
fn image_of(sources: &ImageSources, part: &ImagePart) -> Result<crate::vision::Rgb, ApiError> {
    let bad =
        |why: String| ApiError::bad_request(format!("{}: {why}", part.param)).param(&part.param);
    let bytes = sources.read(&part.url.url).map_err(bad)?;
    decode(&bytes).map_err(|e| bad(format!("{e:#}")))
}
