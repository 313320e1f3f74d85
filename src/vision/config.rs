//! A projector file's settings (`clip.*` keys, as llama.cpp's converter writes them), read
//! strictly: a key edgelm does not implement is refused, never ignored.

use super::kinds::{projector_kind, ProjectorKind};
use crate::gguf::{Array, GgufFile, Value};
use anyhow::{bail, Context, Result};

/// The vision encoder's and projector's shape and preprocessing.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    pub kind: ProjectorKind,
    /// The ViT's width, FFN width, blocks and heads.
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_layers: usize,
    pub n_head: usize,
    pub head_dim: usize,
    /// ε of the ViT's layer norms and of the projector's RMS norm.
    pub eps: f32,
    /// Each image becomes `image_size` × `image_size` pixels, cut in patches of `patch_size`.
    pub image_size: usize,
    pub patch_size: usize,
    /// Per channel (R, G, B): a pixel is `(v / 255 - mean) / std`.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// Patches merged per side (Gemma 3: pooled `n_merge` × `n_merge`; Idefics3:
    /// pixel-shuffled).
    pub n_merge: usize,
    /// Idefics3: the image is first resized so that its longer side is this many pixels,
    /// then cut in tiles of `image_size` (`clip.vision.preproc_image_size`).
    pub longest_edge: Option<usize>,
    /// The width of the rows the projector hands the text model.
    pub projection_dim: usize,
    /// Qwen3-VL: the blocks whose rows are merged by a DeepStack MLP of their own, each
    /// giving a row of `projection_dim` beside each image row (`clip.vision.is_deepstack_layers`).
    pub deepstack: Vec<usize>,
    /// Qwen-VL: an image keeps its aspect, resized to whole merged squares of patches, so
    /// that it becomes between the first and the second number of rows (mtmd's limits).
    pub dynamic_rows: Option<(usize, usize)>,
    /// Qwen2.5-VL: the blocks that attend only within windows of the image.
    pub windows: Option<Windows>,
}

/// Qwen2.5-VL's window attention (`clip.vision.n_wa_pattern`, `clip.vision.window_size`):
/// every `full_every`-th block attends over the whole image, the others only within square
/// windows of `side` × `side` merged squares (the image's last ones cut short).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    pub full_every: usize,
    pub side: usize,
}

impl Windows {
    /// Whether block `layer` attends within windows.
    pub fn applies_to(&self, layer: usize) -> bool {
        !(layer + 1).is_multiple_of(self.full_every)
    }
}

/// The window llama.cpp's Qwen2.5-VL graph takes when the file names none, in pixels.
const DEFAULT_WINDOW_PIXELS: usize = 112;

/// The rows a Qwen3-VL image becomes at least and at most (llama.cpp's defaults for the
/// Qwen-VL types, from Qwen2.5-VL's `preprocessor_config.json`).
const QWEN_VL_ROWS: (usize, usize) = (8, 4096);

/// The `clip.*` keys this reader understands; any other is refused.
const KNOWN: [&str; 23] = [
    "clip.projector_type",
    "clip.has_vision_encoder",
    "clip.has_audio_encoder",
    "clip.use_gelu",
    "clip.use_silu",
    "clip.vision.embedding_length",
    "clip.vision.feed_forward_length",
    "clip.vision.block_count",
    "clip.vision.projection_dim",
    "clip.vision.attention.head_count",
    "clip.vision.attention.head_count_kv",
    "clip.vision.attention.head_dim",
    "clip.vision.attention.layer_norm_epsilon",
    "clip.vision.image_size",
    "clip.vision.patch_size",
    "clip.vision.image_mean",
    "clip.vision.image_std",
    "clip.vision.projector.scale_factor",
    "clip.vision.preproc_image_size",
    "clip.vision.spatial_merge_size",
    "clip.vision.is_deepstack_layers",
    "clip.vision.n_wa_pattern",
    "clip.vision.window_size",
];

impl VisionConfig {
    pub fn from_gguf(file: &GgufFile) -> Result<VisionConfig> {
        if file.get_str("general.type").is_some_and(|t| t != "clip") {
            bail!("not a projector file: general.type is not 'clip'");
        }
        let kind = projector_kind(
            file.get_str("clip.projector_type")
                .or_else(|| file.get_str("clip.vision.projector_type"))
                .context("not a projector file: it has no clip.projector_type")?,
        )?;
        check_keys(file, kind)?;
        let n_embd = size(file, "clip.vision.embedding_length")?;
        let n_head = size(file, "clip.vision.attention.head_count")?;
        if n_embd % n_head != 0 {
            bail!("clip.vision.embedding_length {n_embd} is not a whole number of {n_head} heads");
        }
        let head_dim = n_embd / n_head;
        for (key, want) in [
            ("clip.vision.attention.head_count_kv", n_head),
            ("clip.vision.attention.head_dim", head_dim),
        ] {
            if let Some(got) = opt_size(file, key)? {
                if got != want {
                    bail!("{key} is {got}: edgelm's ViT attends with {want}");
                }
            }
        }
        let image_size = size(file, "clip.vision.image_size")?;
        let patch_size = size(file, "clip.vision.patch_size")?;
        let n_merge = merge_of(file, kind)?;
        let n_layers = size(file, "clip.vision.block_count")?;
        let deepstack = deepstack_layers(file, kind, n_layers)?;
        let longest_edge = match kind {
            ProjectorKind::Gemma3 | ProjectorKind::Qwen25vl | ProjectorKind::Qwen3vl => None,
            // Older converters wrote no longest edge (llama.cpp then slices another way).
            ProjectorKind::Idefics3 => {
                Some(opt_size(file, "clip.vision.preproc_image_size")?.context(
                    "clip.vision.preproc_image_size is missing (an older converter's file): \
                     convert the model again with a current convert_hf_to_gguf.py",
                )?)
            }
        };
        let side = image_size / patch_size;
        if image_size % patch_size != 0 || side % n_merge != 0 {
            bail!(
                "clip.vision.image_size {image_size} is not whole patches of {patch_size} \
                 pooled {n_merge} × {n_merge}"
            );
        }
        let cfg = VisionConfig {
            kind,
            n_embd,
            n_ff: size(file, "clip.vision.feed_forward_length")?,
            n_layers,
            n_head,
            head_dim,
            eps: file
                .get_f32("clip.vision.attention.layer_norm_epsilon")
                .filter(|e| e.is_finite() && *e > 0.0)
                .context("clip.vision.attention.layer_norm_epsilon is missing or not positive")?,
            image_size,
            patch_size,
            mean: triple(file, "clip.vision.image_mean")?,
            std: triple(file, "clip.vision.image_std")?,
            n_merge,
            longest_edge,
            projection_dim: size(file, "clip.vision.projection_dim")?,
            deepstack,
            dynamic_rows: kind.merges_squares().then_some(QWEN_VL_ROWS),
            windows: windows(file, kind, patch_size * n_merge)?,
        };
        cfg.check_plausible()?;
        Ok(cfg)
    }

    /// Sizes no real projector has are refused before anything is allocated by them.
    fn check_plausible(&self) -> Result<()> {
        if self.n_embd > 16_384 || self.n_ff > 1 << 17 || self.n_layers > 256 {
            bail!(
                "the ViT's sizes ({} wide, FFN {}, {} blocks) are implausible",
                self.n_embd,
                self.n_ff,
                self.n_layers
            );
        }
        if self.image_size > 4096 || self.patch_size > 64 || self.projection_dim > 65_536 {
            bail!(
                "the image size {} or patch size {} is implausible",
                self.image_size,
                self.patch_size
            );
        }
        if self
            .longest_edge
            .is_some_and(|l| l > 8192 || l < self.image_size)
        {
            bail!(
                "clip.vision.preproc_image_size {} is implausible for tiles of {}",
                self.longest_edge.unwrap_or(0),
                self.image_size
            );
        }
        if self.std.contains(&0.0) {
            bail!("clip.vision.image_std has a 0");
        }
        Ok(())
    }

    /// Patches per side of the (square) image.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// Rows each view of an image of `width` × `height` pixels (the whole image, a tile or
    /// an overview: the views of an image are all one size) becomes in the text model.
    pub fn view_rows(&self, width: usize, height: usize) -> usize {
        let (w, h) = self.view_size(width, height);
        let merged = self.patch_size * self.n_merge;
        (w / merged) * (h / merged)
    }

    /// The pixels each view of an image of `width` × `height` is: the fixed size of the
    /// type, or (Qwen3-VL) the image's own, resized within its range of rows.
    pub fn view_size(&self, width: usize, height: usize) -> (usize, usize) {
        match self.dynamic_rows {
            None => (self.image_size, self.image_size),
            Some(rows) => dynamic_size(width, height, self.patch_size * self.n_merge, rows),
        }
    }

    /// Where an image's rows take M-RoPE positions (Qwen3-VL's): the grid of rows its view
    /// becomes (columns, rows).
    pub fn mrope_grid(&self, width: usize, height: usize) -> Option<(usize, usize)> {
        let merged = self.patch_size * self.n_merge;
        self.dynamic_rows.map(|_| {
            let (w, h) = self.view_size(width, height);
            (w / merged, h / merged)
        })
    }

    /// The most views an image becomes: Idefics3's largest grid of tiles (a square image)
    /// and its overview.
    pub fn max_views(&self) -> usize {
        match self.longest_edge {
            None => 1,
            Some(edge) => edge.div_ceil(self.image_size).pow(2) + 1,
        }
    }

    /// The most rows a view becomes.
    pub fn max_view_rows(&self) -> usize {
        match self.dynamic_rows {
            None => self.view_rows(self.image_size, self.image_size),
            Some((_, most)) => most,
        }
    }

    /// The most patches a view holds (each of its rows merges `n_merge`² of them).
    pub fn max_view_patches(&self) -> usize {
        self.max_view_rows() * self.n_merge * self.n_merge
    }

    /// The width of an image row as the text model reads it: the projection, then each
    /// DeepStack block's row beside it.
    pub fn row_width(&self) -> usize {
        self.projection_dim * (1 + self.deepstack.len())
    }
}

/// An image of `width` × `height` resized to whole squares of `align` pixels, its aspect
/// kept, so that it is between `rows.0` and `rows.1` squares: mtmd's
/// `calc_size_preserved_ratio` (transformers' `smart_resize`), in its f32 arithmetic.
pub fn dynamic_size(
    width: usize,
    height: usize,
    align: usize,
    rows: (usize, usize),
) -> (usize, usize) {
    let f = align as f32;
    let (wf, hf) = (width as f32, height as f32);
    let by = |x: f32, op: fn(f32) -> f32| (op(x / f) as usize) * align;
    let (min_pixels, max_pixels) = (rows.0 * align * align, rows.1 * align * align);
    let mut w = by(wf, f32::round).max(align);
    let mut h = by(hf, f32::round).max(align);
    if w * h > max_pixels {
        let beta = (hf * wf / max_pixels as f32).sqrt();
        h = by(hf / beta, f32::floor).max(align);
        w = by(wf / beta, f32::floor).max(align);
    } else if w * h < min_pixels {
        let beta = (min_pixels as f32 / (hf * wf)).sqrt();
        h = by(hf * beta, f32::ceil);
        w = by(wf * beta, f32::ceil);
    }
    (w, h)
}

/// Patches merged per side by the projector of `kind`, from the key its type reads (and a
/// key it does not read refused).
fn merge_of(file: &GgufFile, kind: ProjectorKind) -> Result<usize> {
    let merge = match (kind, opt_size(file, "clip.vision.projector.scale_factor")?) {
        (ProjectorKind::Gemma3, merge) => merge.unwrap_or(4),
        (ProjectorKind::Idefics3, Some(merge)) if merge > 1 => merge,
        (ProjectorKind::Idefics3, _) => {
            bail!("clip.vision.projector.scale_factor is missing or 1: Idefics3 shuffles by it")
        }
        (ProjectorKind::Qwen25vl | ProjectorKind::Qwen3vl, _) => {
            match opt_size(file, "clip.vision.spatial_merge_size")?.unwrap_or(2) {
                2 => 2,
                m => bail!("clip.vision.spatial_merge_size is {m}: Qwen-VL merges 2 × 2"),
            }
        }
    };
    let unread = match kind.merges_squares() {
        true => "clip.vision.projector.scale_factor",
        false => "clip.vision.spatial_merge_size",
    };
    refuse_if_set(file, kind, &[unread])?;
    Ok(merge)
}

/// Refuses the first of `keys` the file sets: the projector of `kind` does not read them.
fn refuse_if_set(file: &GgufFile, kind: ProjectorKind, keys: &[&str]) -> Result<()> {
    match keys.iter().find(|key| file.get(key).is_some()) {
        Some(key) => bail!(
            "{key} is set, which a {} projector does not read",
            kind.name()
        ),
        None => Ok(()),
    }
}

/// Qwen2.5-VL's window attention: `clip.vision.n_wa_pattern` is required (0: every block
/// attends over the whole image) and read by no other type; windows are `window_size` pixels
/// (112 where it is missing or 0, as llama.cpp), whole merged squares of `square` pixels.
fn windows(file: &GgufFile, kind: ProjectorKind, square: usize) -> Result<Option<Windows>> {
    let (pattern, size) = ("clip.vision.n_wa_pattern", "clip.vision.window_size");
    if kind != ProjectorKind::Qwen25vl {
        refuse_if_set(file, kind, &[pattern, size])?;
        return Ok(None);
    }
    let full_every = opt_size(file, pattern)?.with_context(|| format!("{pattern} is missing"))?;
    if full_every == 0 {
        return Ok(None);
    }
    let pixels = match opt_size(file, size)? {
        None | Some(0) => DEFAULT_WINDOW_PIXELS,
        Some(p) => p,
    };
    if pixels < square || pixels > 4096 {
        bail!("{size} is {pixels}: not between one merged square ({square} pixels) and 4,096");
    }
    Ok(Some(Windows {
        full_every,
        side: pixels / square,
    }))
}

/// The blocks `clip.vision.is_deepstack_layers` marks (Qwen3-VL's; no other type has any).
fn deepstack_layers(file: &GgufFile, kind: ProjectorKind, n_layers: usize) -> Result<Vec<usize>> {
    let key = "clip.vision.is_deepstack_layers";
    let flags = match file.get(key) {
        None => return Ok(Vec::new()),
        Some(Value::Array(Array::Bool(flags))) => flags,
        Some(_) => bail!("{key} is not an array of booleans"),
    };
    if kind != ProjectorKind::Qwen3vl && flags.contains(&true) {
        bail!(
            "{key} marks blocks, which a {} projector does not have",
            kind.name()
        );
    }
    if flags.len() != n_layers {
        bail!("{key} has {} entries for {n_layers} blocks", flags.len());
    }
    Ok((0..n_layers).filter(|&i| flags[i]).collect())
}

/// Refuses a `clip.*` key edgelm does not read, and encoders other than a GELU vision ViT.
fn check_keys(file: &GgufFile, kind: ProjectorKind) -> Result<()> {
    for (key, _) in file.metadata() {
        if key.starts_with("clip.") && !KNOWN.contains(&key.as_str()) {
            bail!(
                "{key} is set, which edgelm's {} projector does not implement",
                kind.name()
            );
        }
    }
    if flag(file, "clip.has_vision_encoder")? != Some(true) {
        bail!("clip.has_vision_encoder is not true: edgelm runs vision projectors only");
    }
    if flag(file, "clip.has_audio_encoder")? == Some(true) {
        bail!("clip.has_audio_encoder is true: edgelm runs no audio encoder");
    }
    // Qwen2.5-VL's FFN is SwiGLU (`use_silu`); SigLIP's and Qwen3-VL's GELU (tanh), and
    // llama.cpp's default without either key is quick GELU. The one key must be true and
    // the other not.
    let ((key, ffn), other) = match kind {
        ProjectorKind::Qwen25vl => (("clip.use_silu", "SwiGLU"), "clip.use_gelu"),
        _ => (("clip.use_gelu", "GELU"), "clip.use_silu"),
    };
    if flag(file, key)? != Some(true) || flag(file, other)? == Some(true) {
        bail!(
            "{key} is not true: edgelm's {} ViT runs {ffn} only",
            kind.name()
        );
    }
    Ok(())
}

fn flag(file: &GgufFile, key: &str) -> Result<Option<bool>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => v
            .as_bool()
            .map(Some)
            .with_context(|| format!("{key} is not a boolean")),
    }
}

fn opt_size(file: &GgufFile, key: &str) -> Result<Option<usize>> {
    match file.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u32() {
            Some(0) => bail!("{key} is 0"),
            Some(x) => Ok(Some(x as usize)),
            None => bail!("{key} is not an unsigned integer"),
        },
    }
}

fn size(file: &GgufFile, key: &str) -> Result<usize> {
    opt_size(file, key)?.with_context(|| format!("the projector file has no {key}"))
}

fn triple(file: &GgufFile, key: &str) -> Result<[f32; 3]> {
    let Some(Value::Array(Array::F32(values))) = file.get(key) else {
        bail!("the projector file has no {key} (an array of f32)");
    };
    match values[..] {
        [r, g, b] if values.iter().all(|v| v.is_finite()) => Ok([r, g, b]),
        _ => bail!("{key} is not three finite numbers (one per channel)"),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small Gemma 3-like config for unit tests of what follows from it.
    pub fn gemma3_like() -> VisionConfig {
        VisionConfig {
            kind: ProjectorKind::Gemma3,
            n_embd: 64,
            n_ff: 128,
            n_layers: 1,
            n_head: 2,
            head_dim: 32,
            eps: 1e-6,
            image_size: 224,
            patch_size: 14,
            mean: [0.5; 3],
            std: [0.5; 3],
            n_merge: 4,
            longest_edge: None,
            projection_dim: 64,
            deepstack: Vec::new(),
            dynamic_rows: None,
            windows: None,
        }
    }

    #[test]
    fn idefics3_views_at_most_a_square_images_grid_and_its_overview() {
        let c = VisionConfig {
            kind: ProjectorKind::Idefics3,
            image_size: 512,
            patch_size: 16,
            longest_edge: Some(2048),
            ..gemma3_like()
        };
        assert_eq!(c.max_views(), 17);
        assert_eq!(c.view_rows(4000, 3000), 64);
        assert_eq!(gemma3_like().max_views(), 1);
    }

    #[test]
    fn qwen_images_keep_their_aspect_in_whole_squares_within_the_rows() {
        // 451 × 300 in squares of 32: 448 × 288 (14 × 9 rows).
        assert_eq!(dynamic_size(451, 300, 32, (8, 4096)), (448, 288));
        // Too large: scaled down to at most 4,096 squares; too small: up to at least 8.
        assert_eq!(dynamic_size(4000, 3000, 32, (8, 4096)), (2336, 1760));
        assert_eq!(dynamic_size(40, 30, 32, (8, 4096)), (128, 96));
    }
}
