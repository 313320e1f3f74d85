//! Pillow's separable resampling (bilinear, bicubic, Lanczos) in its fixed-point arithmetic,
//! as llama.cpp's `mtmd-image.cpp` ports it: the same weights, rounding and clamping, so that
//! the same image gives the same pixels as the peer's.

use super::decode::Rgb;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Filter {
    Bilinear,
    Bicubic,
    Lanczos,
}

impl Filter {
    fn support(self) -> f64 {
        match self {
            Filter::Bilinear => 1.0,
            Filter::Bicubic => 2.0,
            Filter::Lanczos => 3.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let sinc = |v: f64| match v {
            0.0 => 1.0,
            _ => (v * std::f64::consts::PI).sin() / (v * std::f64::consts::PI),
        };
        match self {
            Filter::Lanczos if (-3.0..3.0).contains(&x) => sinc(x) * sinc(x / 3.0),
            Filter::Lanczos => 0.0,
            Filter::Bilinear => (1.0 - x.abs()).max(0.0),
            Filter::Bicubic => {
                // Pillow's a = -0.5 (ggml and PyTorch use -0.75).
                let (a, x) = (-0.5, x.abs());
                if x < 1.0 {
                    ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * a
                } else {
                    0.0
                }
            }
        }
    }
}

/// Fractional bits of the fixed-point weights: 32 less 8 for a pixel, less 2 of headroom.
const PRECISION_BITS: u32 = 22;

/// Per output pixel: the first input pixel, and the fixed-point weights of those it reads.
struct Taps {
    first: Vec<usize>,
    weights: Vec<Vec<i32>>,
}

fn taps(filter: Filter, in_size: usize, out_size: usize) -> Taps {
    let scale = in_size as f64 / out_size as f64;
    // Downsampling widens the filter (against aliasing); upsampling keeps it.
    let filter_scale = scale.max(1.0);
    let support = filter.support() * filter_scale;
    let mut first = Vec::with_capacity(out_size);
    let mut weights = Vec::with_capacity(out_size);
    for xx in 0..out_size {
        let center = (xx as f64 + 0.5) * scale;
        let xmin = ((center - support + 0.5) as i64).max(0) as usize;
        let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
        let w: Vec<f64> = (xmin..xmax)
            .map(|x| filter.weight((x as f64 - center + 0.5) / filter_scale))
            .collect();
        let total: f64 = w.iter().sum();
        let fixed = w
            .iter()
            .map(|&v| {
                let v = if total != 0.0 { v / total } else { v };
                // Pillow adds ±0.5 and truncates toward zero.
                let scaled = v * f64::from(1u32 << PRECISION_BITS);
                (scaled + if v < 0.0 { -0.5 } else { 0.5 }) as i32
            })
            .collect();
        first.push(xmin);
        weights.push(fixed);
    }
    Taps { first, weights }
}

fn clip8(v: i32) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// `img` resized to `width` × `height` (no padding): rows first, then columns, as Pillow.
pub fn resize(img: &Rgb, width: usize, height: usize, filter: Filter) -> Rgb {
    let mut out = img.clone();
    if width != img.width {
        out = horizontal(&out, width, &taps(filter, img.width, width));
    }
    if height != img.height {
        out = vertical(&out, height, &taps(filter, img.height, height));
    }
    out
}

fn horizontal(img: &Rgb, width: usize, t: &Taps) -> Rgb {
    let mut data = vec![0u8; width * img.height * 3];
    for y in 0..img.height {
        let row = &img.data[y * img.width * 3..][..img.width * 3];
        for xx in 0..width {
            let mut acc = [1i32 << (PRECISION_BITS - 1); 3];
            for (i, &w) in t.weights[xx].iter().enumerate() {
                let p = &row[(t.first[xx] + i) * 3..][..3];
                for c in 0..3 {
                    acc[c] += i32::from(p[c]) * w;
                }
            }
            let o = &mut data[(y * width + xx) * 3..][..3];
            for c in 0..3 {
                o[c] = clip8(acc[c]);
            }
        }
    }
    Rgb {
        width,
        height: img.height,
        data,
    }
}

fn vertical(img: &Rgb, height: usize, t: &Taps) -> Rgb {
    let row_len = img.width * 3;
    let mut data = vec![0u8; row_len * height];
    let mut acc = vec![0i32; row_len];
    for yy in 0..height {
        acc.fill(1 << (PRECISION_BITS - 1));
        for (i, &w) in t.weights[yy].iter().enumerate() {
            let row = &img.data[(t.first[yy] + i) * row_len..][..row_len];
            acc.iter_mut()
                .zip(row)
                .for_each(|(a, &p)| *a += i32::from(p) * w);
        }
        let o = &mut data[yy * row_len..][..row_len];
        o.iter_mut().zip(&acc).for_each(|(o, &a)| *o = clip8(a));
    }
    Rgb {
        width: img.width,
        height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flat_image_stays_flat_and_weights_sum_to_one() {
        let img = Rgb {
            width: 7,
            height: 5,
            data: vec![200; 7 * 5 * 3],
        };
        for f in [Filter::Bilinear, Filter::Bicubic, Filter::Lanczos] {
            for (w, h) in [(3, 2), (16, 11)] {
                let out = resize(&img, w, h, f);
                assert_eq!((out.width, out.height), (w, h));
                assert!(out.data.iter().all(|&v| v == 200), "{f:?} {w}x{h}");
            }
            let t = taps(f, 7, 3);
            for w in &t.weights {
                let sum: i64 = w.iter().map(|&v| i64::from(v)).sum();
                assert!(
                    (sum - (1 << PRECISION_BITS)).abs() <= w.len() as i64,
                    "{f:?}"
                );
            }
        }
    }

    #[test]
    fn halving_with_bilinear_weights_pixels_as_pillow() {
        // Pillow's bilinear at scale 2 spans two input pixels each side of an output pixel's
        // centre, weighted 1/4, 3/4, 3/4, 1/4; at the edges the three inside, renormalised:
        // 0·3/7 + 80·3/7 + 160·1/7 = 57.1 and 80·1/7 + 160·3/7 + 240·3/7 = 182.9.
        let img = Rgb {
            width: 4,
            height: 1,
            data: [0, 80, 160, 240].iter().flat_map(|&v| [v, v, v]).collect(),
        };
        let out = resize(&img, 2, 1, Filter::Bilinear);
        assert_eq!(out.data, vec![57, 57, 57, 183, 183, 183]);
    }
}
