//! What an image is in a prompt, per projector type, as llama.cpp's `mtmd_tokenize` lays it
//! out: text (tokenized with special tokens) around the rows of each view the projector makes
//! of it.

use super::config::VisionConfig;
use super::kinds::ProjectorKind;
use super::preprocess::idefics3_grid;

/// A piece of an image's stretch of prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    /// Text the prompt holds there (special tokens written as their text).
    Text(String),
    /// The rows of the next view ([`super::preprocess::preprocess`]'s order).
    View,
}

/// Texts of `kind`'s layout that must each be one token of the text model's vocabulary (its
/// special tokens): without them the markers would be read as plain text.
pub fn marker_tokens(kind: ProjectorKind) -> &'static [&'static str] {
    match kind {
        ProjectorKind::Gemma3 => &["<start_of_image>", "<end_of_image>"],
        ProjectorKind::Idefics3 => &["<fake_token_around_image>", "<global-img>", "<row_1_col_1>"],
        ProjectorKind::Qwen25vl | ProjectorKind::Qwen3vl => &["<|vision_start|>", "<|vision_end|>"],
    }
}

/// The parts an image of `width` × `height` pixels becomes, in prompt order.
pub fn image_parts(cfg: &VisionConfig, width: usize, height: usize) -> Vec<Part> {
    let text = |t: &str| Part::Text(t.to_string());
    match cfg.kind {
        ProjectorKind::Gemma3 => vec![text("<start_of_image>"), Part::View, text("<end_of_image>")],
        ProjectorKind::Qwen25vl | ProjectorKind::Qwen3vl => {
            vec![text("<|vision_start|>"), Part::View, text("<|vision_end|>")]
        }
        // Transformers' Idefics3 processor: each tile after its row and column, a newline
        // between rows of tiles, then the overview ("global image").
        ProjectorKind::Idefics3 => {
            let grid = idefics3_grid(cfg, width, height);
            let mut parts = Vec::new();
            for row in 1..=grid.rows {
                for column in 1..=grid.columns {
                    parts.push(Part::Text(format!(
                        "<fake_token_around_image><row_{row}_col_{column}>"
                    )));
                    parts.push(Part::View);
                }
                if row < grid.rows {
                    parts.push(text("\n"));
                }
            }
            parts.push(text("\n\n<fake_token_around_image><global-img>"));
            parts.push(Part::View);
            parts.push(text("<fake_token_around_image>"));
            parts
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idefics3_lays_out_tiles_by_row_and_column_then_the_overview() {
        let cfg = VisionConfig {
            kind: ProjectorKind::Idefics3,
            longest_edge: Some(448),
            ..crate::vision::config::tests::gemma3_like()
        };
        // 451 × 300: 2 × 2 tiles.
        let parts = image_parts(&cfg, 451, 300);
        let texts: Vec<&str> = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::View => None,
            })
            .collect();
        assert_eq!(
            texts,
            [
                "<fake_token_around_image><row_1_col_1>",
                "<fake_token_around_image><row_1_col_2>",
                "\n",
                "<fake_token_around_image><row_2_col_1>",
                "<fake_token_around_image><row_2_col_2>",
                "\n\n<fake_token_around_image><global-img>",
                "<fake_token_around_image>",
            ]
        );
        assert_eq!(parts.iter().filter(|p| **p == Part::View).count(), 5);
    }
}
