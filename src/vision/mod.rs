//! Images in: a projector file (llama.cpp's mmproj GGUF, `clip.*` keys) loaded strictly beside
//! the text model, and an image turned into rows of the text model's width. The path of one
//! image: `decode` (bytes to RGB, with limits) → `preprocess` (the peer's resize, padding and
//! normalisation) → `encoder` (the ViT) → `head` (the projector proper).
//!
//! Reading order: `kinds` (the one table of projector types), `config`, `weights`, then the
//! path above.

mod config;
mod decode;
mod encoder;
mod head;
mod kinds;
mod preprocess;
mod resize;
mod weights;

pub use config::VisionConfig;
pub use decode::{decode, Rgb};
pub use kinds::{projector_kind, projector_names, ProjectorKind, ProjectorType, PROJECTORS};

use crate::gguf::GgufFile;
use anyhow::{bail, Context, Result};
use std::path::Path;
use weights::VisionWeights;

/// A loaded projector file: its settings and its weights (matrices read from the mapping).
pub struct Projector {
    pub config: VisionConfig,
    file: GgufFile,
    weights: VisionWeights,
}

impl Projector {
    /// Loads and checks `path`; a file with a key, tensor or type edgelm does not implement
    /// is refused.
    pub fn open(path: &Path) -> Result<Projector> {
        let file = GgufFile::open(path).with_context(|| format!("{}", path.display()))?;
        Self::from_file(file).with_context(|| format!("projector {}", path.display()))
    }

    pub fn from_file(file: GgufFile) -> Result<Projector> {
        let config = VisionConfig::from_gguf(&file)?;
        let weights = VisionWeights::load(&file, &config)?;
        Ok(Projector {
            config,
            file,
            weights,
        })
    }

    /// Refuses a text model the projector's rows are not made for.
    pub fn check_text_model(&self, arch: &str, n_embd: usize) -> Result<()> {
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
        Ok(())
    }

    /// Rows one image becomes in the text model.
    pub fn tokens_per_image(&self) -> usize {
        self.config.tokens_per_image()
    }

    /// Bytes of the matrices read from the file per image.
    pub fn weight_bytes(&self) -> u64 {
        self.weights
            .matrices()
            .iter()
            .map(|m| (m.rows * m.row_bytes()) as u64)
            .sum()
    }

    /// `img` as `tokens_per_image()` rows of `projection_dim` values.
    pub fn encode(&self, img: &Rgb) -> Vec<f32> {
        let pixels = preprocess::preprocess(&self.config, img);
        let vit = encoder::run_vit(&self.file, &self.weights, &self.config, &pixels);
        head::project(&self.config, &self.weights, &vit)
    }
}
