//! How an embedding model turns a prompt's hidden rows into one vector: `{arch}.pooling_type`,
//! llama.cpp's `llama_pooling_type` enum as written in the GGUF.

use super::Keys;
use anyhow::{bail, Result};

/// `{arch}.pooling_type`. A model without the key has [`Pooling::None`]: a generative model,
/// which hands back no embeddings (llama.cpp's server refuses `/v1/embeddings` for it too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    None,
    /// The mean of every prompt position's final-normed hidden state.
    Mean,
    /// The first position's (a BERT-style `[CLS]` token).
    Cls,
    /// The last position's (decoder embedding models such as Qwen3-Embedding).
    Last,
    /// A reranker's classification head over the pooled state, which edgelm does not run.
    Rank,
}

/// llama.cpp's pooling types (`LLAMA_POOLING_TYPE_*`): the number a GGUF writes for each kind,
/// and its name.
const POOLINGS: [(usize, Pooling, &str); 5] = [
    (0, Pooling::None, "none"),
    (1, Pooling::Mean, "mean"),
    (2, Pooling::Cls, "cls"),
    (3, Pooling::Last, "last"),
    (4, Pooling::Rank, "rank"),
];

impl Pooling {
    /// The kind llama.cpp numbers `id`; other numbers are refused.
    pub fn from_id(id: usize) -> Option<Pooling> {
        POOLINGS.iter().find(|p| p.0 == id).map(|p| p.1)
    }

    pub(super) fn read(k: &Keys<'_>) -> Result<Pooling> {
        let Some(id) = k.u32("pooling_type")? else {
            return Ok(Pooling::None);
        };
        match Pooling::from_id(id) {
            Some(p) => Ok(p),
            None => {
                let kinds: Vec<String> = POOLINGS
                    .iter()
                    .map(|(id, _, name)| format!("{id} {name}"))
                    .collect();
                let kinds = kinds.join(", ");
                bail!(
                    "{} is {id}, which is no pooling type ({kinds})",
                    k.name("pooling_type")
                )
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        POOLINGS
            .iter()
            .find(|p| p.1 == self)
            .expect("every kind is in POOLINGS")
            .2
    }

    /// Whether `/v1/embeddings` can serve the model: it pools into one vector per input.
    pub fn embeds(self) -> bool {
        matches!(self, Pooling::Mean | Pooling::Cls | Pooling::Last)
    }

    /// Of the prompt positions `start..start + len` of a prompt of `prompt_len` tokens, those
    /// whose hidden states this pooling reads (as offsets into the span).
    pub fn rows(self, start: usize, len: usize, prompt_len: usize) -> std::ops::Range<usize> {
        let end = start + len;
        match self {
            Pooling::Mean => 0..len,
            Pooling::Cls if start == 0 && len > 0 => 0..1,
            Pooling::Last if end == prompt_len && len > 0 => len - 1..len,
            _ => 0..0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_llama_cpp_s() {
        assert_eq!(Pooling::from_id(0), Some(Pooling::None));
        assert_eq!(Pooling::from_id(1), Some(Pooling::Mean));
        assert_eq!(Pooling::from_id(2), Some(Pooling::Cls));
        assert_eq!(Pooling::from_id(3), Some(Pooling::Last));
        assert_eq!(Pooling::from_id(4), Some(Pooling::Rank));
        assert_eq!(Pooling::from_id(5), None);
        for (id, kind, name) in POOLINGS {
            assert_eq!((Pooling::from_id(id), kind.as_str()), (Some(kind), name));
        }
        assert!(Pooling::Mean.embeds() && !Pooling::None.embeds() && !Pooling::Rank.embeds());
    }

    #[test]
    fn rows_read_per_chunk() {
        // A 10-token prompt in chunks 0..4 and 4..10.
        assert_eq!(Pooling::Mean.rows(0, 4, 10), 0..4);
        assert_eq!(Pooling::Mean.rows(4, 6, 10), 0..6);
        assert_eq!(Pooling::Cls.rows(0, 4, 10), 0..1);
        assert!(Pooling::Cls.rows(4, 6, 10).is_empty());
        assert!(Pooling::Last.rows(0, 4, 10).is_empty());
        assert_eq!(Pooling::Last.rows(4, 6, 10), 5..6);
        assert!(Pooling::None.rows(0, 10, 10).is_empty());
    }
}
