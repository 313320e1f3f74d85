//! Image bytes to RGB pixels through the `image` crate (PNG, JPEG, WebP, GIF's first frame),
//! with its decoding limits set so that a small file declaring a huge image is refused before
//! anything is allocated for it, and JPEG's EXIF orientation applied.

use anyhow::{bail, Context, Result};
use image::{DynamicImage, ImageDecoder, ImageFormat, ImageReader, Limits};
use std::io::Cursor;

/// An image as 8-bit RGB, row-major, 3 bytes a pixel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rgb {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// The largest side and pixel count accepted: a 48-megapixel camera's frame, well past what
/// any projector resizes to.
pub const MAX_SIDE: u32 = 16_384;
pub const MAX_PIXELS: u64 = 48_000_000;

/// Decodes `bytes`, whose format is read from its magic bytes (a MIME type that lies does
/// not matter).
pub fn decode(bytes: &[u8]) -> Result<Rgb> {
    let reader = ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .context("the image cannot be read")?;
    match reader.format() {
        Some(ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP | ImageFormat::Gif) => {}
        Some(f) => bail!("{f:?} images are not accepted (PNG, JPEG, WebP or GIF)"),
        None => bail!("the data is not an image in a known format (PNG, JPEG, WebP or GIF)"),
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_SIDE);
    limits.max_image_height = Some(MAX_SIDE);
    // RGBA16 is the widest buffer a decoder may make: 8 bytes a pixel, and room for a copy.
    limits.max_alloc = Some(MAX_PIXELS * 8 * 2);
    let mut reader = reader;
    reader.limits(limits);
    let mut decoder = reader
        .into_decoder()
        .context("the image cannot be decoded")?;
    let (w, h) = decoder.dimensions();
    if u64::from(w) * u64::from(h) > MAX_PIXELS {
        bail!("the image is {w} × {h} pixels, more than {MAX_PIXELS}");
    }
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut image = DynamicImage::from_decoder(decoder).context("the image cannot be decoded")?;
    image.apply_orientation(orientation);
    // As stb_image (the peer's decoder) gives 3 channels: gray repeated, alpha dropped,
    // 16-bit channels taken to 8.
    let rgb = image.to_rgb8();
    Ok(Rgb {
        width: rgb.width() as usize,
        height: rgb.height() as usize,
        data: rgb.into_raw(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32, color: image::ColorType) -> Vec<u8> {
        let mut out = Vec::new();
        let bytes = vec![7u8; (w * h) as usize * color.bytes_per_pixel() as usize];
        image::write_buffer_with_format(
            &mut Cursor::new(&mut out),
            &bytes,
            w,
            h,
            color,
            ImageFormat::Png,
        )
        .unwrap();
        out
    }

    #[test]
    fn gray_sixteen_bit_and_alpha_images_become_rgb() {
        for color in [
            image::ColorType::L8,
            image::ColorType::Rgba8,
            image::ColorType::Rgb16,
        ] {
            let rgb = decode(&png(5, 3, color)).unwrap();
            assert_eq!(
                (rgb.width, rgb.height, rgb.data.len()),
                (5, 3, 45),
                "{color:?}"
            );
        }
    }

    #[test]
    fn truncated_and_foreign_data_is_refused() {
        let whole = png(8, 8, image::ColorType::Rgb8);
        assert!(decode(&whole[..whole.len() / 2]).is_err());
        let e = decode(b"GIF89 not really").unwrap_err().to_string();
        assert!(!e.is_empty());
        let e = decode(b"plain text").unwrap_err().to_string();
        assert!(e.contains("not an image"), "{e}");
    }

    #[test]
    fn a_small_file_declaring_a_huge_image_is_refused_before_decoding() {
        // A PNG header claiming 50,000 × 50,000 pixels, and nothing behind it.
        let mut bomb = png(1, 1, image::ColorType::Rgb8);
        bomb[16..20].copy_from_slice(&50_000u32.to_be_bytes());
        bomb[20..24].copy_from_slice(&50_000u32.to_be_bytes());
        let e = format!("{:#}", decode(&bomb).unwrap_err());
        assert!(
            e.contains("limit")
                || e.contains("more than")
                || e.contains("CRC")
                || e.contains("decoded"),
            "{e}"
        );
    }
}
