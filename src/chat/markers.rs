//! The marker strings of every call syntax, and how one vocabulary holds them. A marker is a
//! control token in the vocabulary of the model that speaks its syntax (gpt-oss's `<|call|>`,
//! Mistral's `[TOOL_CALLS]`) and plain text in any other, and a grammar must name it the way the
//! vocabulary holds it, so grammars are built for one vocabulary's [`MarkerTokens`].

use crate::tokenizer::Tokenizer;

pub const HERMES_OPEN: &str = "<tool_call>";
pub const HERMES_CLOSE: &str = "</tool_call>";
pub const PYTHON_TAG: &str = "<|python_tag|>";
pub const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
pub const MISTRAL_ARGS: &str = "[ARGS]";
pub const MISTRAL_CALL_ID: &str = "[CALL_ID]";
/// The markers of Mistral's call syntax (control tokens in Mistral vocabularies).
pub const MISTRAL_MARKERS: [&str; 3] = [MISTRAL_CALLS, MISTRAL_ARGS, MISTRAL_CALL_ID];

pub const HARMONY_START: &str = "<|start|>";
pub const HARMONY_CHANNEL: &str = "<|channel|>";
pub const HARMONY_MESSAGE: &str = "<|message|>";
pub const HARMONY_END: &str = "<|end|>";
pub const HARMONY_RETURN: &str = "<|return|>";
pub const HARMONY_CALL: &str = "<|call|>";
pub const HARMONY_CONSTRAIN: &str = "<|constrain|>";
pub const HARMONY_MARKERS: [&str; 7] = [
    HARMONY_START,
    HARMONY_CHANNEL,
    HARMONY_MESSAGE,
    HARMONY_END,
    HARMONY_RETURN,
    HARMONY_CALL,
    HARMONY_CONSTRAIN,
];

/// The length of the longest end of `s` that begins `tag` (on a char boundary): text a stream
/// holds back, since the next token may complete the marker.
pub fn partial_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&k| s.is_char_boundary(s.len() - k) && tag.starts_with(&s[s.len() - k..]))
        .unwrap_or(0)
}

/// How one vocabulary holds a syntax's markers: as one control token each, or as text.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MarkerTokens {
    /// The markers that are one control token, with its id.
    special: Vec<(&'static str, u32)>,
    /// Of those, the ones that end generation (the engine allows them exactly where a grammar
    /// may end, so a grammar must not name them).
    eog: Vec<&'static str>,
}

impl MarkerTokens {
    /// How the vocabulary holds harmony's markers.
    pub fn of(tok: &Tokenizer) -> MarkerTokens {
        MarkerTokens::of_list(tok, &HARMONY_MARKERS)
    }

    /// How the vocabulary holds `markers` (another format's, e.g. Mistral's `[TOOL_CALLS]`).
    pub fn of_list(tok: &Tokenizer, markers: &[&'static str]) -> MarkerTokens {
        let mut m = MarkerTokens::default();
        for &marker in markers {
            let Ok(ids) = tok.encode(marker, false) else {
                continue;
            };
            if let [id] = ids[..] {
                if tok.is_control(id) {
                    m.special.push((marker, id));
                    if tok.is_eog(id) {
                        m.eog.push(marker);
                    }
                }
            }
        }
        m
    }

    /// The tokens that end a harmony answer (`<|return|>`, `<|call|>`) where the vocabulary has
    /// them: the engine stops on them. Spelled out as text, stop strings catch them instead.
    pub fn stop_tokens(&self) -> Vec<u32> {
        self.special
            .iter()
            .filter(|(m, _)| *m == HARMONY_RETURN || *m == HARMONY_CALL)
            .map(|&(_, id)| id)
            .collect()
    }

    /// The markers' token ids (none where they are text).
    pub fn ids(&self) -> Vec<u32> {
        self.special.iter().map(|&(_, id)| id).collect()
    }

    /// `marker` is one control token that ends generation (the engine stops on it).
    pub fn ends_generation(&self, marker: &str) -> bool {
        self.eog.contains(&marker)
    }

    /// `marker` is one control token in this vocabulary.
    pub fn is_special(&self, marker: &str) -> bool {
        self.special.iter().any(|(m, _)| *m == marker)
    }

    /// `marker` as a Lark item: a special token (by name where Lark can spell it, `<|…|>`,
    /// else by id), or its text.
    pub fn lit(&self, marker: &str) -> String {
        match self.special.iter().find(|(m, _)| *m == marker) {
            Some(_) if marker.starts_with("<|") => marker.to_string(),
            Some((_, id)) => format!("<[{id}]>"),
            None => format!("\"{marker}\""),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::tokenizer::VocabSpec;

    /// GGUF's token type of control tokens.
    const CONTROL: i32 = 3;

    fn reference_spec() -> VocabSpec {
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        VocabSpec::from_gguf(&file).unwrap()
    }

    /// The reference vocabulary with the harmony markers added as control tokens, as gpt-oss
    /// has them (`<|return|>` its end of generation, `<|call|>` not).
    pub(in crate::chat) fn gpt_oss_like() -> Tokenizer {
        with_markers(&HARMONY_MARKERS)
    }

    /// The reference vocabulary with `markers` added as control tokens (and `<|return|>` its
    /// end of generation where it is one of them).
    pub(in crate::chat) fn with_markers(markers: &[&str]) -> Tokenizer {
        let mut spec = reference_spec();
        for m in markers {
            spec.tokens.push(m.to_string());
            spec.token_types.push(CONTROL);
            spec.scores.push(0.0);
        }
        if let Some(end) = spec.tokens.iter().position(|t| t == HARMONY_RETURN) {
            spec.eos = Some(end as u32);
        }
        Tokenizer::from_spec(&spec).unwrap()
    }

    #[test]
    fn markers_follow_the_vocabulary() {
        let tok = gpt_oss_like();
        let m = MarkerTokens::of(&tok);
        assert_eq!(m.special.len(), 7);
        assert_eq!(m.eog, vec![HARMONY_RETURN, HARMONY_CALL]);
        assert_eq!(m.stop_tokens().len(), 2);
        let file = crate::gguf::GgufFile::open(crate::gguf::test_model_path()).unwrap();
        let m = MarkerTokens::of(&Tokenizer::from_gguf(&file).unwrap());
        assert_eq!(m, MarkerTokens::default());
        assert!(m.stop_tokens().is_empty());
    }
}
