//! An image's pixels to what the ViT reads, as llama.cpp's `mtmd-image.cpp` prepares them
//! for each projector type: resized (Pillow's filters), padded, normalised per channel.

use super::config::VisionConfig;
use super::decode::Rgb;
use super::kinds::ProjectorKind;
use super::resize::{resize, Filter};

/// A square image of normalised values, row-major, 3 channels a pixel.
pub struct Pixels {
    pub size: usize,
    data: Vec<f32>,
}

impl Pixels {
    pub fn at(&self, x: usize, y: usize, channel: usize) -> f32 {
        self.data[(y * self.size + x) * 3 + channel]
    }
}

/// `img` as the projector of `cfg` reads it.
pub fn preprocess(cfg: &VisionConfig, img: &Rgb) -> Pixels {
    match cfg.kind {
        // One fixed-size view, bilinear (mtmd's `fixed_size` preprocessor).
        ProjectorKind::Gemma3 => {
            normalise(cfg, &fit_and_pad(img, cfg.image_size, Filter::Bilinear))
        }
    }
}

/// `img` scaled to fit a `size` × `size` square with its aspect kept (sides rounded up),
/// centred on black: mtmd's resize with `PAD_CEIL`.
fn fit_and_pad(img: &Rgb, size: usize, filter: Filter) -> Rgb {
    if (img.width, img.height) == (size, size) {
        return img.clone();
    }
    let scale = (size as f32 / img.width as f32).min(size as f32 / img.height as f32);
    let fit = |side: usize| (((side as f32) * scale).ceil() as usize).clamp(1, size);
    let (w, h) = (fit(img.width), fit(img.height));
    let small = resize(img, w, h, filter);
    let mut canvas = Rgb {
        width: size,
        height: size,
        data: vec![0; size * size * 3],
    };
    let (x0, y0) = ((size - w) / 2, (size - h) / 2);
    for y in 0..h {
        let from = &small.data[y * w * 3..][..w * 3];
        canvas.data[((y0 + y) * size + x0) * 3..][..w * 3].copy_from_slice(from);
    }
    canvas
}

/// Each value `(v / 255 - mean) / std` in f32, as `clip_image_f32::normalize`.
fn normalise(cfg: &VisionConfig, img: &Rgb) -> Pixels {
    let data = img
        .data
        .iter()
        .enumerate()
        .map(|(i, &v)| (f32::from(v) / 255.0 - cfg.mean[i % 3]) / cfg.std[i % 3])
        .collect();
    Pixels {
        size: img.width,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wide_image_is_fitted_centred_and_padded_with_black() {
        let img = Rgb {
            width: 8,
            height: 4,
            data: vec![255; 8 * 4 * 3],
        };
        let out = fit_and_pad(&img, 4, Filter::Bilinear);
        assert_eq!((out.width, out.height), (4, 4));
        let row = |y: usize| out.data[y * 12..(y + 1) * 12].to_vec();
        assert_eq!(row(0), vec![0; 12]);
        assert_eq!(row(1), vec![255; 12]);
        assert_eq!(row(2), vec![255; 12]);
        assert_eq!(row(3), vec![0; 12]);
    }
}
