//! Pre-tokenizer choice for byte-level BPE vocabularies, keyed by `tokenizer.ggml.pre`.
//!
//! The regexes are the ones llama.cpp applies for each pre-tokenizer name (which in turn are
//! the Hugging Face tokenizers' own), so our splits match the peer's.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::SplitDelimiterBehavior;

const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DIGITS: &str = r"\p{N}";

/// How a family of vocabularies splits text before BPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's regex only.
    Gpt2,
    /// Every digit on its own, then GPT-2's regex (starcoder, smollm, refact, ...).
    DigitsThenGpt2,
    /// Llama 3's regex (numbers in groups of up to three).
    Llama3,
    /// Qwen2's regex (single digits).
    Qwen2,
}

impl PreTokenizerKind {
    /// Maps `tokenizer.ggml.pre`; `None` for names we have no rule for.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "gpt2" | "mpt" | "olmo" | "jais" | "gpt-2" | "phi-2" | "trillion" => Self::Gpt2,
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" => Self::DigitsThenGpt2,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "smaug-bpe" | "dbrx" | "pixtral"
            | "tekken" => Self::Llama3,
            "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" | "megrez" => Self::Qwen2,
            _ => return None,
        })
    }

    pub fn build(self) -> anyhow::Result<PreTokenizerWrapper> {
        let split = |re: &str| -> anyhow::Result<PreTokenizerWrapper> {
            let s = Split::new(
                SplitPattern::Regex(re.to_owned()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| anyhow::anyhow!("bad pre-tokenizer regex: {e}"))?;
            Ok(PreTokenizerWrapper::Split(s))
        };
        // ByteLevel's own regex is GPT-2's; with a custom split first we switch it off.
        let byte_level =
            |use_regex| PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, use_regex));
        let parts = match self {
            Self::Gpt2 => vec![byte_level(true)],
            Self::DigitsThenGpt2 => vec![split(DIGITS)?, byte_level(true)],
            Self::Llama3 => vec![split(LLAMA3)?, byte_level(false)],
            Self::Qwen2 => vec![split(QWEN2)?, byte_level(false)],
        };
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(parts)))
    }
}
