//! The tokenizer description a GGUF file carries (`tokenizer.ggml.*`), as plain data.

use super::wpm::Normalizer;
use crate::gguf::{GgufFile, Value};

const BOS: &str = "tokenizer.ggml.bos_token_id";
/// (sic: llama.cpp's key is spelled so.)
const SEP: &str = "tokenizer.ggml.seperator_token_id";
const UNK: &str = "tokenizer.ggml.unknown_token_id";

/// ggml token types (`tokenizer.ggml.token_type`).
pub const TOKEN_TYPE_NORMAL: i32 = 1;
pub const TOKEN_TYPE_UNKNOWN: i32 = 2;
pub const TOKEN_TYPE_CONTROL: i32 = 3;
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;
pub const TOKEN_TYPE_UNUSED: i32 = 5;
pub const TOKEN_TYPE_BYTE: i32 = 6;

/// Which tokenizer algorithm the vocabulary is for (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabKind {
    /// Byte-level BPE with merges ("gpt2").
    BytePairGpt2,
    /// SentencePiece-style vocabulary with scores and byte-fallback tokens ("llama").
    SentencePiece,
    /// BERT's WordPiece ("bert"): llama.cpp's WPM tokenizer (see `wpm`).
    WordPiece,
}

#[derive(Clone, Debug)]
pub struct VocabSpec {
    pub kind: VocabKind,
    /// `tokenizer.ggml.pre`: names the pre-tokenizer regexes for BPE vocabularies.
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub token_types: Vec<i32>,
    pub scores: Vec<f32>,
    pub merges: Vec<String>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    /// The separator a WordPiece input ends with (`[SEP]`) and its unknown token (`[UNK]`).
    pub sep: Option<u32>,
    pub unk: Option<u32>,
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: EOS ends every input tokenized with its special tokens
    /// (embedding models pooled on their last token, such as Qwen3-Embedding, set it).
    pub add_eos: bool,
    pub add_space_prefix: bool,
    /// WordPiece normalisation (`tokenizer.ggml.normalizer.lowercase`, `.strip_accents`).
    pub normalizer: Normalizer,
    pub chat_template: Option<String>,
}

impl VocabSpec {
    /// Reads the tokenizer metadata; errors name the missing or malformed key.
    pub fn from_gguf(file: &GgufFile) -> anyhow::Result<VocabSpec> {
        use anyhow::{bail, Context};
        let kind = vocab_kind(file)?;
        let tokens: Vec<String> = file
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_string_array())
            .context("GGUF has no tokenizer.ggml.tokens string array")?
            .to_vec();
        if tokens.is_empty() {
            bail!("tokenizer.ggml.tokens is empty");
        }
        let n = tokens.len();
        let types = ("tokenizer.ggml.token_type", "an integer array");
        let token_types = per_token(file, types, n, Value::as_i32_array)?
            .unwrap_or_else(|| vec![TOKEN_TYPE_NORMAL; n]);
        let scores = ("tokenizer.ggml.scores", "a float array");
        let scores =
            per_token(file, scores, n, Value::as_f32_array)?.unwrap_or_else(|| vec![0.0; n]);
        let merges: Vec<String> = match file.get("tokenizer.ggml.merges") {
            Some(v) => v
                .as_string_array()
                .context("tokenizer.ggml.merges is not a string array")?
                .to_vec(),
            None => Vec::new(),
        };
        if kind == VocabKind::BytePairGpt2 && merges.is_empty() {
            bail!("a gpt2 tokenizer needs tokenizer.ggml.merges");
        }
        let id = |key: &str| special_id(file, key, n, kind);
        let flag = |key: &str, default: bool| flag(file, key, default);
        let wpm = kind == VocabKind::WordPiece;
        let lowercase = flag("tokenizer.ggml.normalizer.lowercase", true);
        Ok(VocabSpec {
            kind,
            pre: file.get_str("tokenizer.ggml.pre").map(str::to_owned),
            bos: id(BOS)?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            sep: id(SEP)?,
            unk: id(UNK)?,
            // SentencePiece vocabularies add BOS unless told otherwise; BPE ones do not;
            // WordPiece always adds [CLS] and [SEP] (llama.cpp's WPM ignores the keys).
            add_bos: wpm
                || flag(
                    "tokenizer.ggml.add_bos_token",
                    kind == VocabKind::SentencePiece,
                ),
            add_eos: !wpm && flag("tokenizer.ggml.add_eos_token", false),
            add_space_prefix: flag(
                "tokenizer.ggml.add_space_prefix",
                kind == VocabKind::SentencePiece,
            ),
            normalizer: Normalizer {
                lowercase,
                strip_accents: flag("tokenizer.ggml.normalizer.strip_accents", lowercase),
            },
            chat_template: file.get_str("tokenizer.chat_template").map(str::to_owned),
            tokens,
            token_types,
            scores,
            merges,
        })
    }
}

/// The tokenizer algorithm `tokenizer.ggml.model` names.
fn vocab_kind(file: &GgufFile) -> anyhow::Result<VocabKind> {
    use anyhow::{bail, Context};
    let model = file
        .get_str("tokenizer.ggml.model")
        .context("GGUF has no tokenizer.ggml.model")?;
    Ok(match model {
        "gpt2" => VocabKind::BytePairGpt2,
        "llama" => VocabKind::SentencePiece,
        "bert" => VocabKind::WordPiece,
        other => bail!("unsupported tokenizer model '{other}' (supported: gpt2, llama, bert)"),
    })
}

/// `key`'s array of one value per token (`n` of them), read by `read` (`what` it must be, for
/// the error); `None` without the key.
fn per_token<T: Clone>(
    file: &GgufFile,
    (key, what): (&str, &str),
    n: usize,
    read: fn(&Value) -> Option<&[T]>,
) -> anyhow::Result<Option<Vec<T>>> {
    let Some(v) = file.get(key) else {
        return Ok(None);
    };
    let values = read(v).ok_or_else(|| anyhow::anyhow!("{key} is not {what}"))?;
    if values.len() != n {
        anyhow::bail!("{key} has {} entries, tokens has {n}", values.len());
    }
    Ok(Some(values.to_vec()))
}

/// The boolean `key`, or `default` without it (or when it is not a boolean).
fn flag(file: &GgufFile, key: &str, default: bool) -> bool {
    match file.get(key) {
        Some(v) => v.as_bool().unwrap_or(default),
        None => default,
    }
}

/// The special token `key` names, checked to be in the vocabulary of `n` tokens; without the
/// key, llama.cpp's default for a WordPiece vocabulary ([CLS] 101, [SEP] 102, [UNK] 100), none
/// for the others.
fn special_id(
    file: &GgufFile,
    key: &str,
    n: usize,
    kind: VocabKind,
) -> anyhow::Result<Option<u32>> {
    use anyhow::bail;
    let default = match key {
        BOS => 101,
        SEP => 102,
        UNK => 100,
        _ => u32::MAX,
    };
    match file.get_u32(key) {
        Some(id) if (id as usize) < n => Ok(Some(id)),
        Some(id) => bail!("{key} = {id} is outside the vocabulary of {n} tokens"),
        None if kind != VocabKind::WordPiece || default == u32::MAX => Ok(None),
        None if (default as usize) < n => Ok(Some(default)),
        None => bail!(
            "GGUF has no {key}, and its default {default} is outside the vocabulary of {n} tokens"
        ),
    }
}
