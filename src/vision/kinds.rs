//! Every projector type edgelm runs: one table, from which the loader's refusal and `inspect`
//! are built and against which the README's list is checked (`tests/architectures.rs`).

use anyhow::{bail, Result};

/// What a projector file's `clip.projector_type` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProjectorKind {
    /// Gemma 3's: a SigLIP ViT, its patches average-pooled `n_merge` × `n_merge`, an RMS norm
    /// ("soft embedding norm") and a projection to the text model's width.
    Gemma3,
    /// Idefics3's (SmolVLM, SmolVLM2): a SigLIP ViT run on each tile of the image and on a
    /// whole-image overview, each view's patches pixel-shuffled `n_merge` × `n_merge` into
    /// wider rows and projected by one matrix.
    Idefics3,
    /// Qwen2.5-VL's: a ViT over the image at its own size (RMS norms, SwiGLU FFNs, 2-D rotary
    /// positions, no learned ones; all blocks but every `n_wa_pattern`-th attend only within
    /// windows of the image), each 2 × 2 square of patches merged into one row by an MLP.
    Qwen25vl,
    /// Qwen3-VL's: a ViT over the image at its own size (a grid of patches within a range of
    /// rows, 2-D rotary positions, learned positions resized to the grid), each 2 × 2 square
    /// of patches merged into one row by an MLP; some blocks' rows, merged by MLPs of their
    /// own ("DeepStack"), go beside each row for the text model's first layers.
    Qwen3vl,
}

/// One row of [`PROJECTORS`].
#[derive(Clone, Copy, Debug)]
pub struct ProjectorType {
    /// `clip.projector_type` as llama.cpp's converter writes it.
    pub name: &'static str,
    pub kind: ProjectorKind,
    /// The vision-language models whose projector files this is.
    pub models: &'static str,
    /// The text architecture the projector's rows are made for.
    pub text_arch: &'static str,
    /// An image's positions attend to each other, not only to those before them.
    pub bidirectional: bool,
}

/// The projector types edgelm implements, in the order the docs list them.
pub const PROJECTORS: [ProjectorType; 4] = [
    ProjectorType {
        name: "gemma3",
        kind: ProjectorKind::Gemma3,
        models: "Gemma 3 4B/12B/27B",
        text_arch: "gemma3",
        bidirectional: true,
    },
    ProjectorType {
        name: "idefics3",
        kind: ProjectorKind::Idefics3,
        models: "SmolVLM and SmolVLM2 256M/500M/2.2B",
        text_arch: "llama",
        bidirectional: false,
    },
    ProjectorType {
        name: "qwen2.5vl_merger",
        kind: ProjectorKind::Qwen25vl,
        models: "Qwen2.5-VL 3B/7B/32B/72B",
        text_arch: "qwen2vl",
        bidirectional: false,
    },
    ProjectorType {
        name: "qwen3vl_merger",
        kind: ProjectorKind::Qwen3vl,
        models: "Qwen3-VL 2B/4B/8B/32B",
        text_arch: "qwen3vl",
        bidirectional: false,
    },
];

/// The names of [`PROJECTORS`], as a refusal lists them.
pub fn projector_names() -> String {
    let names: Vec<&str> = PROJECTORS.iter().map(|p| p.name).collect();
    names.join(", ")
}

/// The kind `name` stands for, or the refusal that lists the implemented ones.
pub fn projector_kind(name: &str) -> Result<ProjectorKind> {
    match PROJECTORS.iter().find(|p| p.name == name) {
        Some(p) => Ok(p.kind),
        None => bail!(
            "projector type '{name}' is not implemented (edgelm runs: {})",
            projector_names()
        ),
    }
}

impl ProjectorKind {
    fn row(self) -> &'static ProjectorType {
        PROJECTORS
            .iter()
            .find(|p| p.kind == self)
            .expect("every kind is in the table")
    }

    pub fn name(self) -> &'static str {
        self.row().name
    }

    pub fn text_arch(self) -> &'static str {
        self.row().text_arch
    }

    /// Qwen-VL's types: the image at its own size, its patches in merged 2 × 2 squares with
    /// 2-D rotary positions, each square merged into one row by an MLP, the rows at M-RoPE
    /// positions in the text model.
    pub fn merges_squares(self) -> bool {
        matches!(self, ProjectorKind::Qwen25vl | ProjectorKind::Qwen3vl)
    }

    /// The type's row of [`PROJECTORS`].
    pub fn info(self) -> &'static ProjectorType {
        self.row()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_projector_is_found_by_its_name_and_others_are_refused_with_the_list() {
        for p in PROJECTORS {
            assert_eq!(projector_kind(p.name).unwrap(), p.kind);
            assert_eq!(p.kind.name(), p.name);
        }
        let e = projector_kind("llava").unwrap_err().to_string();
        assert!(
            e.contains("'llava'") && e.contains(&projector_names()),
            "{e}"
        );
    }

    /// README's introduction names every projector type edgelm runs, and so does
    /// docs/api.md's images section.
    #[test]
    fn the_readme_and_the_api_guide_name_every_projector_type() {
        let readme = include_str!("../../README.md");
        let intro = &readme[..readme.find("\n## ").expect("a first section")];
        let api = include_str!("../../docs/api.md");
        let images = &api[api.find("## Images").expect("an images section")..];
        let images = &images[..images[3..].find("\n## ").map_or(images.len(), |e| e + 3)];
        for p in PROJECTORS {
            assert!(
                intro.contains(&format!("of type {}", p.name)),
                "README's introduction does not name {}",
                p.name
            );
            assert!(
                images.contains(p.name),
                "docs/api.md's images section does not name {}",
                p.name
            );
        }
    }
}
