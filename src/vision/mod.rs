//! Images in: a projector file (llama.cpp's mmproj GGUF, `clip.*` keys) loaded strictly beside
//! the text model, and an image turned into rows of the text model's width. The path of one
//! image: `decode` (bytes to RGB, with limits) → `preprocess` (the peer's resize, padding,
//! tiling and normalisation: one or more views) → `encoder` (the ViT, per view) → `head` (the
//! projector proper); `layout` says where each view's rows go in the prompt.
//!
//! Reading order: `kinds` (the one table of projector types), `config`, `weights`, then the
//! path above.

mod attention;
mod config;
mod decode;
#[cfg(feature = "cuda")]
mod device;
mod encoder;
mod head;
mod kinds;
mod layout;
mod preprocess;
mod resize;
mod sources;
mod weights;
mod workspace;

pub use config::VisionConfig;
pub use decode::{decode, Rgb};
pub use kinds::{projector_kind, projector_names, ProjectorKind, ProjectorType, PROJECTORS};
pub use sources::ImageSources;

use crate::backend::batch::Embedded;
use crate::gguf::GgufFile;
use crate::model::ModelConfig;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};
use weights::VisionWeights;

/// A loaded projector file: its settings and its weights (matrices read from the mapping).
pub struct Projector {
    pub config: VisionConfig,
    file: Arc<GgufFile>,
    weights: VisionWeights,
    /// Recent images' rows: a follow-up turn that sends the same frame again is not encoded
    /// again.
    recent: Mutex<Recent>,
    /// The encoder's rows, kept for the next image (none while an image is being encoded).
    workspace: Mutex<Option<workspace::Workspace>>,
    /// The encoder on a CUDA device, where one was given ([`Projector::encode_on`]).
    #[cfg(feature = "cuda")]
    device: Mutex<Option<device::DeviceEncoder>>,
}

/// The rows of the images encoded last (each image's views), newest last, within a budget
/// of bytes.
struct Recent {
    entries: Vec<(u64, Views)>,
    budget: usize,
}

/// An image's views' rows, in prompt order.
pub type Views = Vec<Arc<Embedded>>;

impl Recent {
    fn get(&mut self, key: u64) -> Option<Views> {
        let at = self.entries.iter().position(|e| e.0 == key)?;
        let hit = self.entries.remove(at);
        self.entries.push(hit.clone());
        Some(hit.1)
    }

    /// Keeps `views`, dropping the oldest entries until the rest fit the budget.
    fn put(&mut self, key: u64, views: Views) {
        self.entries.push((key, views));
        let bytes = |e: &(u64, Views)| e.1.iter().map(|v| v.rows.len() * 4).sum::<usize>();
        while self.entries.iter().map(bytes).sum::<usize>() > self.budget {
            self.entries.remove(0);
        }
    }
}

/// Bytes of recent images' rows a projector keeps by default (a real Gemma 3 image's 256
/// rows of 2,560 are 2.5 MiB; a SmolVLM-256M photo's 13 views of 64 rows of 576, 1.8 MiB).
pub const RECENT_IMAGES_BYTES: usize = 64 << 20;

impl Projector {
    /// Loads and checks `path`; a file with a key, tensor or type edgelm does not implement
    /// is refused.
    pub fn open(path: &Path) -> Result<Projector> {
        let file = GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
        Self::from_file(Arc::new(file)).with_context(|| format!("projector {}", path.display()))
    }

    pub fn from_file(file: Arc<GgufFile>) -> Result<Projector> {
        let config = VisionConfig::from_gguf(&file)?;
        let weights = VisionWeights::load(&file, &config)?;
        Ok(Projector {
            config,
            file,
            weights,
            recent: Mutex::new(Recent {
                entries: Vec::new(),
                budget: RECENT_IMAGES_BYTES,
            }),
            workspace: Mutex::new(None),
            #[cfg(feature = "cuda")]
            device: Mutex::new(None),
        })
    }

    /// Loads `path` (as [`Projector::open`]) for the text model of `text`, which its rows
    /// must be made for and whose vocabulary `vocab` must hold its image markers.
    pub fn open_beside(path: &Path, text: &ModelConfig, vocab: &Tokenizer) -> Result<Projector> {
        let projector = Self::open(path)?;
        (projector.check_text_model(&text.arch, text.n_embd, text.deepstack_layers))
            .and_then(|()| projector.check_vocabulary(vocab))
            .with_context(|| format!("projector {}", path.display()))?;
        Ok(projector)
    }

    /// Refuses a text model the projector's rows are not made for (`deepstack`: the layers
    /// that take DeepStack rows, Qwen3-VL's `n_deepstack_layers`).
    pub fn check_text_model(&self, arch: &str, n_embd: usize, deepstack: usize) -> Result<()> {
        let kind = self.config.kind;
        if arch != kind.text_arch() {
            bail!(
                "a {} projector feeds a {} text model, not {arch}",
                kind.name(),
                kind.text_arch()
            );
        }
        if n_embd != self.config.projection_dim {
            bail!(
                "the projector's rows are {} wide, the text model's {n_embd}",
                self.config.projection_dim
            );
        }
        if deepstack != self.config.deepstack.len() {
            bail!(
                "the projector gives {} DeepStack rows, the text model takes {deepstack}",
                self.config.deepstack.len()
            );
        }
        Ok(())
    }

    /// Refuses a text model whose vocabulary lacks the special tokens the type's prompts
    /// hold around an image (a model other than the one the projector was made for).
    pub fn check_vocabulary(&self, tokenizer: &Tokenizer) -> Result<()> {
        let kind = self.config.kind;
        for marker in layout::marker_tokens(kind) {
            if tokenizer.encode(marker, false)?.len() != 1 {
                bail!(
                    "the text model's vocabulary has no token {marker}, which the prompts of a \
                     projector of type {} hold around an image: serve it with the model it was \
                     made for",
                    kind.name()
                );
            }
        }
        Ok(())
    }

    /// One line on what it is: its type, the ViT's shape, and what an image becomes.
    pub fn describe(&self) -> String {
        let c = &self.config;
        let views = match c.longest_edge {
            None => "an image".to_string(),
            Some(edge) => format!(
                "a view (tiles of an image resized to {edge} pixels on its longer side, and an \
                 overview: at most {} views)",
                c.max_views()
            ),
        };
        let (size, rows) = match c.dynamic_rows {
            None => (
                format!("{}-pixel images", c.image_size),
                c.max_view_rows().to_string(),
            ),
            Some((least, most)) => (
                "images at their own size".into(),
                format!("{least} to {most}"),
            ),
        };
        let deepstack = match c.deepstack.len() {
            0 => String::new(),
            n => format!(
                " (and beside each, {n} DeepStack rows from blocks {:?})",
                c.deepstack
            ),
        };
        format!(
            "{} projector ({}): a ViT of {} blocks {} wide, {size} in patches of {} merged {} × \
             {}, {rows} rows of {}{deepstack} {views}",
            c.kind.name(),
            c.kind.info().models,
            c.n_layers,
            c.n_embd,
            c.patch_size,
            c.n_merge,
            c.n_merge,
            c.projection_dim
        )
    }

    /// Bytes the projector's weights take in memory, and the most an image's encoding adds
    /// (a view's patches, the ViT's rows and attention's packed keys and values, kept for the
    /// next image; the scores per pool thread; the views' rows).
    pub fn memory_bytes(&self, threads: usize) -> (usize, usize) {
        let c = &self.config;
        let n = c.max_view_patches();
        let rows = workspace::Workspace::most_values(n, c, &self.weights);
        let scores = threads * attention::QUERY_BLOCK * n;
        let views = self.max_rows_per_image() * c.row_width();
        (self.weights.bytes(), (rows + scores + views) * 4)
    }

    /// The most rows one image becomes in the text model (a tiled image's largest grid).
    pub fn max_rows_per_image(&self) -> usize {
        self.config.max_views() * self.config.max_view_rows()
    }

    /// `img`'s views, each as [`VisionConfig::view_rows`] rows of
    /// [`VisionConfig::row_width`] values, one after another in prompt order.
    pub fn encode(&self, img: &Rgb) -> Vec<f32> {
        self.encode_in_slices(img, &mut |piece| while piece() {})
    }

    /// [`Projector::encode`] in slices: `slice` is called with a function that runs the next
    /// piece of the ViT (a few milliseconds) and says whether more remain, runs as many as
    /// its time allows and returns; it is called again until none remain.
    pub fn encode_in_slices(&self, img: &Rgb, slice: &mut Slicer<'_>) -> Vec<f32> {
        self.encode_views(&self.prepare(img), slice).concat()
    }

    /// `img`'s views as the ViT reads them: resized, tiled and normalised (what libmtmd does
    /// in `mtmd_tokenize`, before its encoder runs).
    pub fn prepare(&self, img: &Rgb) -> Prepared {
        Prepared(preprocess::preprocess(&self.config, img))
    }

    /// [`Projector::encode`] of views already prepared: the encoder alone (what libmtmd's
    /// `mtmd_encode_chunk` does).
    pub fn encode_prepared(&self, views: &Prepared) -> Vec<f32> {
        self.encode_views(views, &mut |piece| while piece() {})
            .concat()
    }

    /// Encodes on the CUDA device where the model runs on one (`backend`), before the engine
    /// sizes its KV pool from the memory left: the weights and the rows of the largest view go
    /// there first. Where the device cannot take the projector, one log line says why and the
    /// CPU encodes.
    pub fn follow_backend(&self, backend: crate::backend::select::Backend) {
        #[cfg(feature = "cuda")]
        if backend == crate::backend::select::Backend::Cuda {
            let on_device = crate::backend::cuda::CudaDevice::open(0)
                .map_err(anyhow::Error::msg)
                .and_then(|dev| self.encode_on(&dev));
            match on_device {
                Ok(()) => log::info!("images are encoded on the CUDA device"),
                Err(e) => log::warn!("{e:#}: images are encoded on the CPU"),
            }
        }
        #[cfg(not(feature = "cuda"))]
        let _ = backend;
    }

    /// Whether images are encoded on a CUDA device ([`Projector::follow_backend`]).
    pub fn encodes_on_device(&self) -> bool {
        #[cfg(feature = "cuda")]
        return self.device().is_some();
        #[cfg(not(feature = "cuda"))]
        false
    }

    /// Each view encoded (in slices), in prompt order.
    fn encode_views(&self, views: &Prepared, slice: &mut Slicer<'_>) -> Vec<Vec<f32>> {
        #[cfg(feature = "cuda")]
        if let Some(out) = self.encode_on_device(views, slice) {
            return out;
        }
        let (cfg, w) = (&self.config, &self.weights);
        let mut out = Vec::new();
        let kept = || self.workspace.lock().unwrap_or_else(|e| e.into_inner());
        let mut work = kept().take().unwrap_or_default();
        for pixels in &views.0 {
            let mut run = encoder::VitRun::new(&self.file, w, cfg, pixels, work);
            let mut more = true;
            while more {
                slice(&mut || {
                    more = run.piece();
                    more
                });
            }
            work = run.finish();
            out.push(head::project(cfg, w, &self.file, &mut work));
        }
        *kept() = Some(work);
        out
    }

    /// `prompt` (text with one `marker` where each image goes; `sizes` are the images'
    /// widths and heights, in order) as the text model reads it, as llama.cpp's
    /// `mtmd_tokenize` makes it: each piece of text tokenized on its own (BOS before the first
    /// where the vocabulary wants one), each image laid out as its type's [`layout`] says,
    /// its views' positions holding `placeholder`. Returns the tokens and, per image, each
    /// view's first position.
    pub fn prompt_tokens(
        &self,
        tokenizer: &Tokenizer,
        prompt: &str,
        marker: &str,
        placeholder: u32,
        sizes: &[(usize, usize)],
    ) -> Result<(Vec<u32>, Vec<Vec<usize>>)> {
        let mut pieces = prompt.split(marker);
        let mut tokens = tokenizer.encode(pieces.next().unwrap_or(""), true)?;
        let mut starts = Vec::new();
        for (i, text_after) in pieces.enumerate() {
            let &(width, height) = sizes.get(i).context("more image markers than images")?;
            let mut views = Vec::new();
            let rows = self.config.view_rows(width, height);
            for part in layout::image_parts(&self.config, width, height) {
                match part {
                    layout::Part::Text(text) => tokens.extend(tokenizer.encode(&text, false)?),
                    layout::Part::View => {
                        views.push(tokens.len());
                        tokens.extend(std::iter::repeat_n(placeholder, rows));
                    }
                }
            }
            starts.push(views);
            tokens.extend(tokenizer.encode(text_after, false)?);
        }
        if starts.len() != sizes.len() {
            bail!("{} image markers for {} images", starts.len(), sizes.len());
        }
        Ok((tokens, starts))
    }

    /// `img` encoded as the rows a prompt gives the text model in place of its views'
    /// positions, each view keyed by [`image_key`] and its place: from the recent images'
    /// rows where it is one of them.
    pub fn embed(&self, img: &Rgb) -> Views {
        self.embed_in_slices(img, &mut |piece| while piece() {})
    }

    /// [`Projector::embed`], encoding (where it must) in slices as
    /// [`Projector::encode_in_slices`] does.
    pub fn embed_in_slices(&self, img: &Rgb, slice: &mut Slicer<'_>) -> Views {
        let key = image_key(img);
        if let Some(hit) = self.recent().get(key) {
            return hit;
        }
        let width = self.config.row_width();
        let grid = self.config.mrope_grid(img.width, img.height);
        let views = self.encode_views(&self.prepare(img), slice);
        let views: Views = (views.into_iter().enumerate())
            .map(|(i, rows)| {
                Arc::new(Embedded {
                    rows,
                    width,
                    // Views of one image differ by their place, never collide with another
                    // image's but by chance.
                    key: key.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                    bidirectional: self.config.kind.info().bidirectional,
                    grid,
                })
            })
            .collect();
        self.recent().put(key, views.clone());
        views
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An image's views, prepared for its projector's ViT ([`Projector::prepare`]).
pub struct Prepared(Vec<preprocess::Pixels>);

/// Runs pieces of an encoder (the function it is given: false once none remain) for as long
/// as its caller allows.
pub type Slicer<'a> = dyn FnMut(&mut dyn FnMut() -> bool) + 'a;

/// What identifies an image's rows to the prefix cache: a hash of its size and pixels (the
/// same frame sent again, however it was encoded as a file, is the same image).
pub fn image_key(img: &Rgb) -> u64 {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update((img.width as u64).to_le_bytes());
    h.update((img.height as u64).to_le_bytes());
    h.update(&img.data);
    u64::from_le_bytes(h.finalize()[..8].try_into().expect("32 bytes"))
}
