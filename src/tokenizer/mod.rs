//! Tokenizer built from the GGUF's own vocabulary: byte-level BPE vocabularies go through the
//! `tokenizers` crate (with the pre-tokenizer `pretok` picks), SentencePiece vocabularies
//! through our own `spm` (llama.cpp's merge-by-score algorithm), BERT's WordPiece through
//! `wpm` (llama.cpp's WPM, its normalisation tables included); special tokens are split out
//! first (`special`) either way. Plus our own token → bytes table for streaming
//! detokenization and the chat template renderer.

mod bytelevel;
pub mod chat;
mod detok;
mod pretok;
mod special;
mod spm;
mod vocab;
mod wpm;

pub use chat::{ChatMessage, ChatTemplate, TemplateInputs};
pub use detok::StreamDecoder;
pub use pretok::PreTokenizerKind;
pub use vocab::{VocabKind, VocabSpec};

use anyhow::{anyhow, Context, Result};
use special::{Fragment, SpecialTokens};
use tokenizers::models::bpe::{Vocab, BPE};
use vocab::{
    TOKEN_TYPE_BYTE, TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_UNUSED,
    TOKEN_TYPE_USER_DEFINED,
};

/// What turns a text fragment (between special tokens) into ids.
enum Segmenter {
    /// Byte-level BPE with the vocabulary's pre-tokenizer (the `tokenizers` crate).
    Bpe(Box<tokenizers::Tokenizer>),
    /// SentencePiece-style merges by score (llama.cpp's algorithm, see `spm`).
    Spm {
        spm: spm::Spm,
        add_space_prefix: bool,
    },
    /// WordPiece, greedy longest pieces per word (llama.cpp's WPM, see `wpm`).
    Wpm(wpm::Wpm),
}

pub struct Tokenizer {
    segmenter: Segmenter,
    specials: SpecialTokens,
    /// What each token stands for as text bytes (control tokens: their literal text).
    token_bytes: Vec<Vec<u8>>,
    token_types: Vec<i32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub add_bos: bool,
    /// Ends an input tokenized with its special tokens: a WordPiece input's `[SEP]`, or EOS
    /// where the vocabulary asks (`VocabSpec::add_eos`).
    end: Option<u32>,
    /// Tokens that end generation (EOS, EOT and the like).
    eog: Vec<u32>,
    chat_template: Option<String>,
}

impl Tokenizer {
    pub fn from_gguf(file: &crate::gguf::GgufFile) -> Result<Tokenizer> {
        Self::from_spec(&VocabSpec::from_gguf(file)?)
    }

    pub fn from_spec(spec: &VocabSpec) -> Result<Tokenizer> {
        if spec.add_eos && spec.eos.is_none() {
            anyhow::bail!("tokenizer.ggml.add_eos_token is set but there is no EOS token");
        }
        let segmenter = match spec.kind {
            VocabKind::BytePairGpt2 => Segmenter::Bpe(Box::new(build_bpe(spec)?)),
            VocabKind::SentencePiece => Segmenter::Spm {
                spm: spm::Spm::new(&spec.tokens, &spec.scores),
                add_space_prefix: spec.add_space_prefix,
            },
            VocabKind::WordPiece => {
                let unk = spec
                    .unk
                    .context("a WordPiece vocabulary needs an unknown token")?;
                Segmenter::Wpm(wpm::Wpm::new(&spec.tokens, unk, spec.normalizer))
            }
        };
        // Control, user-defined and unknown tokens are matched as whole strings first, the
        // way llama.cpp parses special tokens in prompts.
        let specials = SpecialTokens::new(
            spec.tokens
                .iter()
                .zip(&spec.token_types)
                .enumerate()
                .filter(|(_, (_, &ty))| {
                    matches!(
                        ty,
                        TOKEN_TYPE_CONTROL | TOKEN_TYPE_USER_DEFINED | TOKEN_TYPE_UNKNOWN
                    )
                })
                .map(|(id, (t, &ty))| (t.clone(), id as u32, ty != TOKEN_TYPE_USER_DEFINED)),
        )?;

        let token_bytes = spec
            .tokens
            .iter()
            .zip(&spec.token_types)
            .map(|(t, &ty)| token_text_bytes(spec.kind, t, ty))
            .collect();
        let eog = end_of_generation(spec);
        Ok(Tokenizer {
            segmenter,
            specials,
            token_bytes,
            token_types: spec.token_types.clone(),
            bos: spec.bos,
            eos: spec.eos,
            add_bos: spec.add_bos,
            // WordPiece ends an input with [SEP], other vocabularies with EOS when they ask.
            end: match spec.kind {
                VocabKind::WordPiece => spec.sep,
                _ => spec.eos.filter(|_| spec.add_eos),
            },
            eog,
            chat_template: spec.chat_template.clone(),
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Token ids for `text`, special tokens parsed; BOS prepended when the vocabulary wants it
    /// and `add_bos` is set (and then, for WordPiece, `[SEP]` appended).
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        self.encode_with(text, add_bos, true)
    }

    /// [`Self::encode`], with control tokens written in `text` recognised only when
    /// `parse_special` (user-defined tokens always are, as in llama.cpp: its perplexity tool
    /// tokenizes without parsing special tokens).
    pub fn encode_with(&self, text: &str, add_bos: bool, parse_special: bool) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        if add_bos && self.add_bos {
            ids.extend(self.bos);
        }
        // SentencePiece prefixes a space to text that starts the input or follows a special
        // token (when the vocabulary asks for it), as llama.cpp does.
        let mut after_special = true;
        for frag in self.specials.partition(text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    ids.push(id);
                    after_special = true;
                }
                Fragment::Text(t) => {
                    match &self.segmenter {
                        Segmenter::Bpe(bpe) => {
                            let enc = bpe
                                .encode_fast(t, false)
                                .map_err(|e| anyhow!("tokenizer failed: {e}"))?;
                            ids.extend_from_slice(enc.get_ids());
                        }
                        Segmenter::Spm {
                            spm,
                            add_space_prefix,
                        } => {
                            let prefix = if *add_space_prefix && after_special {
                                "\u{2581}"
                            } else {
                                ""
                            };
                            let escaped = format!("{prefix}{}", t.replace(' ', "\u{2581}"));
                            spm.tokenize(&escaped, &mut ids);
                        }
                        Segmenter::Wpm(wpm) => wpm.tokenize(t, &mut ids),
                    }
                    after_special = false;
                }
            }
        }
        // llama.cpp adds the end token with the special tokens, whether or not BOS is one.
        if add_bos {
            ids.extend(self.end);
        }
        Ok(ids)
    }

    /// The bytes a token stands for; control tokens give their literal text only when
    /// `render_special` (generated text normally hides them).
    pub fn token_bytes(&self, id: u32, render_special: bool) -> &[u8] {
        let Some(bytes) = self.token_bytes.get(id as usize) else {
            return &[];
        };
        if !render_special && self.is_control(id) {
            return &[];
        }
        bytes
    }

    pub fn is_control(&self, id: u32) -> bool {
        matches!(self.token_types.get(id as usize), Some(&TOKEN_TYPE_CONTROL))
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    pub fn eog_tokens(&self) -> &[u32] {
        &self.eog
    }

    /// Whole-sequence decode (lossy at the very end only).
    pub fn decode(&self, ids: &[u32], render_special: bool) -> String {
        let mut d = StreamDecoder::new();
        let mut s = String::new();
        for &id in ids {
            s += &d.push(self.token_bytes(id, render_special));
        }
        s + &d.finish()
    }

    /// The token's own string as stored in the vocabulary (for logprob listings).
    pub fn token_piece(&self, id: u32) -> String {
        String::from_utf8_lossy(self.token_bytes(id, true)).into_owned()
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The chat template `source` compiled for this vocabulary (its `bos_token` and
    /// `eos_token`).
    pub fn compile_chat_template(&self, source: &str) -> Result<ChatTemplate> {
        ChatTemplate::new(
            source,
            self.special_text(self.bos),
            self.special_text(self.eos),
        )
    }

    /// The text of a token id, for templates that need `bos_token`/`eos_token`.
    pub fn special_text(&self, id: Option<u32>) -> String {
        id.map(|id| self.token_piece(id)).unwrap_or_default()
    }
}

fn token_text_bytes(kind: VocabKind, token: &str, ty: i32) -> Vec<u8> {
    if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED || ty == TOKEN_TYPE_UNUSED {
        return token.as_bytes().to_vec();
    }
    match kind {
        VocabKind::BytePairGpt2 => bytelevel::decode_token(token),
        VocabKind::WordPiece => token.replace('\u{2581}', " ").into_bytes(),
        VocabKind::SentencePiece => {
            if ty == TOKEN_TYPE_BYTE {
                if let Some(b) = parse_byte_token(token) {
                    return vec![b];
                }
            }
            token.replace('\u{2581}', " ").into_bytes()
        }
    }
}

/// `<0x0A>` → 0x0A.
fn parse_byte_token(t: &str) -> Option<u8> {
    let hex = t.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

fn vocab_map(spec: &VocabSpec) -> Vocab {
    let mut map = Vocab::with_capacity(spec.tokens.len());
    for (i, t) in spec.tokens.iter().enumerate() {
        // Keep the first id when a vocabulary repeats a string.
        map.entry(t.clone()).or_insert(i as u32);
    }
    map
}

fn build_bpe(spec: &VocabSpec) -> Result<tokenizers::Tokenizer> {
    let vocab = vocab_map(spec);
    let mut merges = Vec::with_capacity(spec.merges.len());
    for (i, m) in spec.merges.iter().enumerate() {
        let (a, b) = m
            .split_once(' ')
            .with_context(|| format!("tokenizer.ggml.merges[{i}] = {m:?} is not 'left right'"))?;
        merges.push((a.to_owned(), b.to_owned()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .build()
        .map_err(|e| anyhow!("cannot build BPE model: {e}"))?;
    let pre_name = spec.pre.as_deref().unwrap_or("default");
    let pre = PreTokenizerKind::from_name(pre_name).unwrap_or_else(|| {
        log::warn!("unknown tokenizer.ggml.pre '{pre_name}', using GPT-2's pre-tokenizer");
        PreTokenizerKind::Gpt2
    });
    let mut tok = tokenizers::Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(pre.build()?));
    Ok(tok)
}

/// The tokens that end an answer: the metadata's EOS and EOT, and the control tokens chat
/// vocabularies end turns with that the metadata does not always name. In gpt-oss's harmony
/// vocabulary `<|return|>` and `<|call|>` end an answer, and `<|end|>` only ends one message
/// of it (the reasoning before the final answer): it is not an end when those two are there,
/// as llama.cpp decides.
fn end_of_generation(spec: &VocabSpec) -> Vec<u32> {
    let mut eog: Vec<u32> = [spec.eos, spec.eot].into_iter().flatten().collect();
    let control = |name: &str| {
        let id = spec.tokens.iter().position(|t| t == name)?;
        (spec.token_types[id] == TOKEN_TYPE_CONTROL).then_some(id as u32)
    };
    for name in [
        "<|im_end|>",
        "<|eot_id|>",
        "<|end_of_text|>",
        "<|endoftext|>",
        "<end_of_turn>",
        "<|return|>",
        "<|call|>",
    ] {
        if let Some(id) = control(name) {
            if !eog.contains(&id) {
                eog.push(id);
            }
        }
    }
    let end = spec.tokens.iter().position(|t| t == "<|end|>");
    if let (Some(_), Some(_), Some(end)) = (control("<|return|>"), control("<|call|>"), end) {
        eog.retain(|&id| id as usize != end);
    }
    eog
}

#[cfg(test)]
mod tests {
    use super::*;

    const NO_NORMALIZER: wpm::Normalizer = wpm::Normalizer {
        lowercase: false,
        strip_accents: false,
    };

    /// A tiny byte-level vocabulary: enough to check merges, digits and special tokens.
    fn tiny_bpe() -> VocabSpec {
        let mut tokens: Vec<String> = (0..=255u8)
            .map(|b| bytelevel::byte_to_char()[b as usize].to_string())
            .collect();
        tokens.extend(["he", "ll", "hell", "hello", "Ġw", "<|end|>"].map(String::from));
        let mut types = vec![1; tokens.len()];
        *types.last_mut().unwrap() = TOKEN_TYPE_CONTROL;
        VocabSpec {
            kind: VocabKind::BytePairGpt2,
            pre: Some("smollm".into()),
            scores: vec![0.0; tokens.len()],
            token_types: types,
            merges: ["h e", "l l", "he ll", "hell o", "Ġ w"]
                .map(String::from)
                .to_vec(),
            bos: None,
            eos: Some(tokens.len() as u32 - 1),
            eot: None,
            sep: None,
            unk: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
            normalizer: NO_NORMALIZER,
            chat_template: None,
            tokens,
        }
    }

    /// A vocabulary that asks for EOS gets it after every input tokenized with its special
    /// tokens (and only then), as llama.cpp's tokenizer does.
    #[test]
    fn add_eos_ends_inputs_with_special_tokens() {
        let eos = tiny_bpe().eos;
        let tok = Tokenizer::from_spec(&VocabSpec {
            add_eos: true,
            ..tiny_bpe()
        })
        .unwrap();
        let with = tok.encode("hello", true).unwrap();
        assert_eq!(with.last().copied(), eos);
        assert_eq!(tok.encode("hello", false).unwrap(), with[..with.len() - 1]);
        let plain = Tokenizer::from_spec(&tiny_bpe()).unwrap();
        assert_eq!(plain.encode("hello", true).unwrap(), with[..with.len() - 1]);
    }

    /// A tiny SentencePiece-style vocabulary: merges come from scores, unknown characters
    /// fall back to byte tokens, and a leading space marker is added.
    #[test]
    fn sentencepiece_scores_byte_fallback_and_space_prefix() {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![
            vocab::TOKEN_TYPE_UNKNOWN,
            TOKEN_TYPE_CONTROL,
            TOKEN_TYPE_CONTROL,
        ];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(TOKEN_TYPE_BYTE);
        }
        let pieces = [
            "▁", "h", "e", "l", "o", "▁h", "▁he", "ll", "▁hell", "▁hello",
        ];
        for p in pieces {
            tokens.push(p.into());
            types.push(vocab::TOKEN_TYPE_NORMAL);
        }
        // Longer pieces score higher, so they merge first.
        let scores: Vec<f32> = tokens.iter().map(|t| t.chars().count() as f32).collect();
        let spec = VocabSpec {
            kind: VocabKind::SentencePiece,
            pre: None,
            token_types: types,
            scores,
            merges: Vec::new(),
            bos: Some(1),
            eos: Some(2),
            eot: None,
            sep: None,
            unk: Some(0),
            add_bos: true,
            add_eos: false,
            add_space_prefix: true,
            normalizer: NO_NORMALIZER,
            chat_template: None,
            tokens: tokens.clone(),
        };
        let tok = Tokenizer::from_spec(&spec).unwrap();
        let id = |s: &str| tokens.iter().position(|t| t == s).unwrap() as u32;
        assert_eq!(tok.encode("hello", true).unwrap(), vec![1, id("▁hello")]);
        // 'i' is not in the vocabulary: byte fallback.
        let ids = tok.encode("hi", false).unwrap();
        assert_eq!(ids, vec![id("▁h"), id("<0x69>")]);
        assert_eq!(tok.decode(&ids, false), " hi");
        assert!(tok.is_eog(2));
    }

    /// `tokenizer.ggml.add_eos_token`: EOS appended to an input encoded with its special
    /// tokens (EmbeddingGemma's inputs end with it), not to one encoded without.
    #[test]
    fn add_eos_token_appends_eos() {
        use crate::gguf::{Array, GgufFile, GgufWriter, Value};
        let tokens: Vec<String> = [
            "<unk>",
            "<bos>",
            "<eos>",
            "\u{2581}hi",
            "\u{2581}",
            "h",
            "i",
            "\u{2581}h",
        ]
        .map(String::from)
        .to_vec();
        // Longer pieces score higher, so they merge first.
        let scores: Vec<f32> = tokens.iter().map(|t| t.chars().count() as f32).collect();
        let file = |add_eos: bool| {
            let bytes = GgufWriter::new()
                .kv("tokenizer.ggml.model", Value::String("llama".into()))
                .kv(
                    "tokenizer.ggml.tokens",
                    Value::Array(Array::String(tokens.clone())),
                )
                .kv(
                    "tokenizer.ggml.scores",
                    Value::Array(Array::F32(scores.clone())),
                )
                .kv(
                    "tokenizer.ggml.token_type",
                    Value::Array(Array::I32(vec![2, 3, 3, 1, 1, 1, 1, 1])),
                )
                .kv("tokenizer.ggml.bos_token_id", Value::U32(1))
                .kv("tokenizer.ggml.eos_token_id", Value::U32(2))
                .kv("tokenizer.ggml.add_eos_token", Value::Bool(add_eos))
                .to_bytes();
            Tokenizer::from_gguf(&GgufFile::from_bytes(bytes).unwrap()).unwrap()
        };
        assert_eq!(file(true).encode("hi", true).unwrap(), vec![1, 3, 2]);
        assert_eq!(file(true).encode("hi", false).unwrap(), vec![3]);
        assert_eq!(file(false).encode("hi", true).unwrap(), vec![1, 3]);
    }

    /// A WordPiece vocabulary: [CLS] and [SEP] around the input, special tokens parsed in it,
    /// word starts with "▁".
    #[test]
    fn wordpiece_adds_cls_and_sep_and_parses_specials() {
        let tokens: Vec<String> = [
            "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "▁hi", "▁the", "re", "▁!",
        ]
        .map(String::from)
        .to_vec();
        let mut types = vec![TOKEN_TYPE_CONTROL; 5];
        types[1] = TOKEN_TYPE_UNKNOWN;
        types.extend([vocab::TOKEN_TYPE_NORMAL; 4]);
        let spec = VocabSpec {
            kind: VocabKind::WordPiece,
            pre: None,
            scores: vec![0.0; tokens.len()],
            token_types: types,
            merges: Vec::new(),
            bos: Some(2),
            eos: None,
            eot: None,
            sep: Some(3),
            unk: Some(1),
            add_bos: true,
            add_eos: false,
            add_space_prefix: false,
            normalizer: wpm::Normalizer {
                lowercase: true,
                strip_accents: true,
            },
            chat_template: None,
            tokens,
        };
        let tok = Tokenizer::from_spec(&spec).unwrap();
        assert_eq!(tok.encode("Hi THERE!", true).unwrap(), [2, 5, 6, 7, 8, 3]);
        assert_eq!(tok.encode("hi [MASK] zz", false).unwrap(), [5, 4, 1]);
        assert_eq!(tok.decode(&[5, 6, 7], false), " hi there");
    }

    #[test]
    fn bpe_merges_digits_and_specials() {
        let spec = tiny_bpe();
        let tok = Tokenizer::from_spec(&spec).unwrap();
        let id = |s: &str| spec.tokens.iter().position(|t| t == s).unwrap() as u32;
        let ids = tok.encode("hello w12<|end|>", false).unwrap();
        assert_eq!(
            ids,
            vec![id("hello"), id("Ġw"), id("1"), id("2"), id("<|end|>")]
        );
        assert!(tok.is_eog(id("<|end|>")));
        assert_eq!(tok.decode(&ids, false), "hello w12");
        assert_eq!(tok.decode(&ids, true), "hello w12<|end|>");
    }

    /// A harmony vocabulary (gpt-oss): `<|return|>` and `<|call|>` end the answer, `<|end|>`
    /// (which only ends the reasoning message) does not, even where the metadata names it.
    #[test]
    fn harmony_answers_end_at_return_or_call_not_at_end() {
        let mut spec = tiny_bpe();
        for t in ["<|return|>", "<|call|>"] {
            spec.tokens.push(t.into());
            spec.token_types.push(TOKEN_TYPE_CONTROL);
            spec.scores.push(0.0);
        }
        let id = |s: &str| spec.tokens.iter().position(|t| t == s).unwrap() as u32;
        spec.eot = Some(id("<|end|>"));
        let tok = Tokenizer::from_spec(&spec).unwrap();
        assert!(tok.is_eog(id("<|return|>")) && tok.is_eog(id("<|call|>")));
        assert!(!tok.is_eog(id("<|end|>")));
    }
}
