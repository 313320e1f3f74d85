//! An image's pixels to what the ViT reads, as llama.cpp's `mtmd-image.cpp` prepares them
//! for each projector type: resized (Pillow's filters), padded or cut in tiles, normalised per
//! channel.

use super::config::VisionConfig;
use super::decode::Rgb;
use super::kinds::ProjectorKind;
use super::resize::{resize, Filter};

/// An image of normalised values, row-major, 3 channels a pixel.
pub struct Pixels {
    pub width: usize,
    pub height: usize,
    data: Vec<f32>,
}

impl Pixels {
    /// `width` × `height` pixels of three values each, row by row.
    #[cfg(test)]
    pub fn new(width: usize, height: usize, data: Vec<f32>) -> Pixels {
        assert_eq!(data.len(), width * height * 3);
        Pixels {
            width,
            height,
            data,
        }
    }

    pub fn at(&self, x: usize, y: usize, channel: usize) -> f32 {
        self.data[(y * self.width + x) * 3 + channel]
    }
}

/// `img` as the projector of `cfg` reads it: its views, in the order the prompt holds them.
pub fn preprocess(cfg: &VisionConfig, img: &Rgb) -> Vec<Pixels> {
    match cfg.kind {
        // One fixed-size view, bilinear (mtmd's `fixed_size` preprocessor).
        ProjectorKind::Gemma3 => vec![normalise(
            cfg,
            &fit_and_pad(img, (cfg.image_size, cfg.image_size), Filter::Bilinear),
        )],
        // The image at its own size within the type's rows, bicubic (mtmd's `dyn_size`
        // preprocessor: the aspect the whole squares leave is padded, not stretched).
        ProjectorKind::Qwen25vl | ProjectorKind::Qwen3vl => {
            let size = cfg.view_size(img.width, img.height);
            vec![normalise(cfg, &fit_and_pad(img, size, Filter::Bicubic))]
        }
        ProjectorKind::Idefics3 => idefics3_views(cfg, img)
            .iter()
            .map(|view| normalise(cfg, view))
            .collect(),
    }
}

/// Idefics3's tiles: columns and rows of the grid an image of `width` × `height` is cut in,
/// and the size it is first resized to (its longer side to `longest_edge`, the other by the
/// aspect ratio, truncated then made even, as mtmd's `idefics3` preprocessor computes it).
pub fn idefics3_grid(cfg: &VisionConfig, width: usize, height: usize) -> Grid {
    let (edge, tile) = (cfg.longest_edge.unwrap_or(cfg.image_size), cfg.image_size);
    let aspect = width as f64 / height as f64;
    // A side below 2 pixels (a 5,000 × 1 strip) is kept at 2: mtmd would resize to nothing.
    let even = |v: f64| {
        let v = v as usize;
        (v + v % 2).max(2)
    };
    let (w, h) = match width >= height {
        true => (edge, even(edge as f64 / aspect)),
        false => (even(edge as f64 * aspect), edge),
    };
    Grid {
        resized: (w, h),
        columns: w.div_ceil(tile),
        rows: h.div_ceil(tile),
    }
}

/// What [`idefics3_grid`] computes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Grid {
    pub resized: (usize, usize),
    pub columns: usize,
    pub rows: usize,
}

/// The tiles of the resized image (stretched to whole tiles), row by row, then the whole of
/// it as one tile (the overview); every resize Lanczos, as mtmd's.
fn idefics3_views(cfg: &VisionConfig, img: &Rgb) -> Vec<Rgb> {
    let tile = cfg.image_size;
    let grid = idefics3_grid(cfg, img.width, img.height);
    let resized = resize(img, grid.resized.0, grid.resized.1, Filter::Lanczos);
    let refined = resize(
        &resized,
        grid.columns * tile,
        grid.rows * tile,
        Filter::Lanczos,
    );
    let mut views = Vec::with_capacity(grid.columns * grid.rows + 1);
    for y in 0..grid.rows {
        for x in 0..grid.columns {
            views.push(crop(&refined, x * tile, y * tile, tile));
        }
    }
    views.push(resize(&refined, tile, tile, Filter::Lanczos));
    views
}

/// The `size` × `size` square of `img` from (`x0`, `y0`).
fn crop(img: &Rgb, x0: usize, y0: usize, size: usize) -> Rgb {
    let mut data = Vec::with_capacity(size * size * 3);
    for y in y0..y0 + size {
        data.extend_from_slice(&img.data[(y * img.width + x0) * 3..][..size * 3]);
    }
    Rgb {
        width: size,
        height: size,
        data,
    }
}

/// `img` scaled to fit a `width` × `height` canvas with its aspect kept (sides rounded up),
/// centred on black: mtmd's resize with `PAD_CEIL`.
fn fit_and_pad(img: &Rgb, (width, height): (usize, usize), filter: Filter) -> Rgb {
    if (img.width, img.height) == (width, height) {
        return img.clone();
    }
    let scale = (width as f32 / img.width as f32).min(height as f32 / img.height as f32);
    let fit = |side: usize, most: usize| (((side as f32) * scale).ceil() as usize).clamp(1, most);
    let (w, h) = (fit(img.width, width), fit(img.height, height));
    let small = resize(img, w, h, filter);
    let mut canvas = Rgb {
        width,
        height,
        data: vec![0; width * height * 3],
    };
    let (x0, y0) = ((width - w) / 2, (height - h) / 2);
    for y in 0..h {
        let from = &small.data[y * w * 3..][..w * 3];
        canvas.data[((y0 + y) * width + x0) * 3..][..w * 3].copy_from_slice(from);
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
        width: img.width,
        height: img.height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idefics3_cuts_tiles_by_the_longer_side() {
        let cfg = |edge: usize| VisionConfig {
            longest_edge: Some(edge),
            ..crate::vision::config::tests::gemma3_like()
        };
        // 451 × 300 to 448 × 298 (448 / 1.5033 = 298.0), in 2 × 2 tiles of 224.
        let g = idefics3_grid(&cfg(448), 451, 300);
        assert_eq!((g.resized, g.columns, g.rows), ((448, 298), 2, 2));
        // Tall: 300 × 451 to 298 × 448; 2048 over 512-pixel tiles of a 4:3 photo: 4 × 3.
        assert_eq!(idefics3_grid(&cfg(448), 300, 451).resized, (298, 448));
        let c = VisionConfig {
            image_size: 512,
            ..cfg(2048)
        };
        let g = idefics3_grid(&c, 4000, 3000);
        assert_eq!((g.resized, g.columns, g.rows), ((2048, 1536), 4, 3));
        // A strip keeps two pixels of its short side.
        assert_eq!(idefics3_grid(&cfg(448), 5000, 1).resized, (448, 2));
    }

    #[test]
    fn idefics3_views_are_the_tiles_row_by_row_then_the_overview() {
        let cfg = VisionConfig {
            image_size: 2,
            longest_edge: Some(4),
            ..crate::vision::config::tests::gemma3_like()
        };
        // A 4 × 4 image of distinct pixels needs no resize: its four corners are the tiles.
        let img = Rgb {
            width: 4,
            height: 4,
            data: (0..48).map(|v| v as u8).collect(),
        };
        let views = idefics3_views(&cfg, &img);
        assert_eq!(views.len(), 5);
        assert_eq!(views[1].data[..3], img.data[6..9]);
        assert_eq!(views[2].data[..3], img.data[24..27]);
        assert_eq!((views[4].width, views[4].height), (2, 2));
    }

    #[test]
    fn a_wide_image_is_fitted_centred_and_padded_with_black() {
        let img = Rgb {
            width: 8,
            height: 4,
            data: vec![255; 8 * 4 * 3],
        };
        let out = fit_and_pad(&img, (4, 4), Filter::Bilinear);
        assert_eq!((out.width, out.height), (4, 4));
        let row = |y: usize| out.data[y * 12..(y + 1) * 12].to_vec();
        assert_eq!(row(0), vec![0; 12]);
        assert_eq!(row(1), vec![255; 12]);
        assert_eq!(row(2), vec![255; 12]);
        assert_eq!(row(3), vec![0; 12]);
    }
}
