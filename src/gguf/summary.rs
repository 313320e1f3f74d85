//! What `edgelm inspect` prints: a model's identity, hyper-parameters,
//! tokenizer and tensor inventory, gathered from a [`GgufFile`].
//!
//! Fields are public (and plain data) so other code can render them as JSON;
//! anything absent from the file is `None` and printed as "-".

use std::fmt;

use super::file::GgufFile;
use super::value::{quote, Value};
use crate::quant::GgmlType;

#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub version: u32,
    pub file_size: u64,
    pub architecture: Option<String>,
    pub name: Option<String>,
    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub file_type: Option<u32>,
    pub hparams: HyperParams,
    pub tokenizer: TokenizerSummary,
    /// Tensor count per ggml type, most common first.
    pub tensor_types: Vec<(GgmlType, usize)>,
    pub n_tensors: usize,
    pub n_parameters: u64,
}

/// `{arch}.*` hyper-parameters (`None` when missing or not a scalar of the right kind).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct HyperParams {
    pub context_length: Option<u32>,
    pub embedding_length: Option<u32>,
    pub block_count: Option<u32>,
    pub feed_forward_length: Option<u32>,
    pub head_count: Option<u32>,
    pub head_count_kv: Option<u32>,
    pub rope_freq_base: Option<f32>,
    pub rms_norm_eps: Option<f32>,
    /// `{arch}.vocab_size`, else the number of tokenizer tokens.
    pub vocab_size: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenizerSummary {
    pub model: Option<String>,
    pub pre: Option<String>,
    pub n_tokens: Option<usize>,
    pub n_merges: Option<usize>,
    pub bos: Option<SpecialToken>,
    pub eos: Option<SpecialToken>,
    pub pad: Option<SpecialToken>,
    pub has_chat_template: bool,
}

/// A special token id and, when the id is inside the vocabulary, its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialToken {
    pub id: u32,
    pub text: Option<String>,
}

pub fn summarize(file: &GgufFile) -> Summary {
    let arch = file.architecture().unwrap_or("");
    let u = |key: &str| file.get_u32(&format!("{arch}.{key}"));
    let f = |key: &str| file.get_f32(&format!("{arch}.{key}"));
    let tokens = file
        .get("tokenizer.ggml.tokens")
        .and_then(Value::as_string_array);
    let special = |key: &str| {
        file.get_u32(key).map(|id| SpecialToken {
            id,
            text: tokens.and_then(|t| t.get(id as usize)).cloned(),
        })
    };

    let mut tensor_types: Vec<(GgmlType, usize)> = Vec::new();
    for t in file.tensors() {
        match tensor_types.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some((_, n)) => *n += 1,
            None => tensor_types.push((t.ty, 1)),
        }
    }
    tensor_types.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.id().cmp(&b.0.id())));

    Summary {
        version: file.version(),
        file_size: file.file_size(),
        architecture: file.architecture().map(str::to_owned),
        name: file.get_str("general.name").map(str::to_owned),
        file_type: file.get_u32("general.file_type"),
        hparams: HyperParams {
            context_length: u("context_length"),
            embedding_length: u("embedding_length"),
            block_count: u("block_count"),
            feed_forward_length: u("feed_forward_length"),
            head_count: u("attention.head_count"),
            head_count_kv: u("attention.head_count_kv"),
            rope_freq_base: f("rope.freq_base"),
            rms_norm_eps: f("attention.layer_norm_rms_epsilon"),
            vocab_size: file
                .get(&format!("{arch}.vocab_size"))
                .and_then(Value::as_u64)
                .or(tokens.map(|t| t.len() as u64)),
        },
        tokenizer: TokenizerSummary {
            model: file.get_str("tokenizer.ggml.model").map(str::to_owned),
            pre: file.get_str("tokenizer.ggml.pre").map(str::to_owned),
            n_tokens: tokens.map(<[String]>::len),
            n_merges: file
                .get("tokenizer.ggml.merges")
                .and_then(Value::as_string_array)
                .map(<[String]>::len),
            bos: special("tokenizer.ggml.bos_token_id"),
            eos: special("tokenizer.ggml.eos_token_id"),
            pad: special("tokenizer.ggml.padding_token_id"),
            has_chat_template: file.get_str("tokenizer.chat_template").is_some(),
        },
        n_tensors: file.tensors().len(),
        n_parameters: file
            .tensors()
            .iter()
            .fold(0u64, |acc, t| acc.saturating_add(t.n_elements())),
        tensor_types,
    }
}

/// llama.cpp's name for a `general.file_type` value.
pub fn file_type_name(ftype: u32) -> Option<&'static str> {
    Some(match ftype {
        0 => "ALL_F32",
        1 => "MOSTLY_F16",
        2 => "MOSTLY_Q4_0",
        3 => "MOSTLY_Q4_1",
        7 => "MOSTLY_Q8_0",
        8 => "MOSTLY_Q5_0",
        9 => "MOSTLY_Q5_1",
        10 => "MOSTLY_Q2_K",
        11 => "MOSTLY_Q3_K_S",
        12 => "MOSTLY_Q3_K_M",
        13 => "MOSTLY_Q3_K_L",
        14 => "MOSTLY_Q4_K_S",
        15 => "MOSTLY_Q4_K_M",
        16 => "MOSTLY_Q5_K_S",
        17 => "MOSTLY_Q5_K_M",
        18 => "MOSTLY_Q6_K",
        32 => "MOSTLY_BF16",
        _ => return None,
    })
}

struct Opt<'a, T>(&'a Option<T>);

impl<T: fmt::Display> fmt::Display for Opt<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}

impl fmt::Display for SpecialToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.text {
            Some(t) => write!(f, "{} {}", self.id, quote(t, 40)),
            None => write!(f, "{} (outside vocabulary)", self.id),
        }
    }
}

/// Groups digits in threes: 134515008 → "134,515,008".
fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = &self.hparams;
        let t = &self.tokenizer;
        let mib = self.file_size as f64 / (1024.0 * 1024.0);
        writeln!(f, "{:<22}{}", "gguf version", self.version)?;
        writeln!(
            f,
            "{:<22}{} bytes ({mib:.2} MiB)",
            "file size",
            thousands(self.file_size)
        )?;
        writeln!(f, "{:<22}{}", "architecture", Opt(&self.architecture))?;
        writeln!(
            f,
            "{:<22}{}",
            "name",
            Opt(&self.name.as_ref().map(|n| quote(n, 80)))
        )?;
        let ftype = self
            .file_type
            .map(|t| format!("{t} ({})", file_type_name(t).unwrap_or("unknown")));
        writeln!(f, "{:<22}{}", "file type", Opt(&ftype))?;
        writeln!(f, "{:<22}{}", "context length", Opt(&h.context_length))?;
        writeln!(f, "{:<22}{}", "embedding length", Opt(&h.embedding_length))?;
        writeln!(f, "{:<22}{}", "blocks", Opt(&h.block_count))?;
        writeln!(
            f,
            "{:<22}{}",
            "feed-forward length",
            Opt(&h.feed_forward_length)
        )?;
        writeln!(f, "{:<22}{}", "attention heads", Opt(&h.head_count))?;
        writeln!(f, "{:<22}{}", "kv heads", Opt(&h.head_count_kv))?;
        writeln!(f, "{:<22}{}", "rope freq base", Opt(&h.rope_freq_base))?;
        writeln!(
            f,
            "{:<22}{}",
            "rms norm epsilon",
            Opt(&h.rms_norm_eps.map(|e| format!("{e:e}")))
        )?;
        writeln!(f, "{:<22}{}", "vocab size", Opt(&h.vocab_size))?;
        writeln!(
            f,
            "{:<22}{} (pre: {})",
            "tokenizer",
            Opt(&t.model),
            Opt(&t.pre)
        )?;
        writeln!(f, "{:<22}{}", "tokens", Opt(&t.n_tokens))?;
        writeln!(f, "{:<22}{}", "merges", Opt(&t.n_merges))?;
        writeln!(f, "{:<22}{}", "bos", Opt(&t.bos))?;
        writeln!(f, "{:<22}{}", "eos", Opt(&t.eos))?;
        writeln!(f, "{:<22}{}", "pad", Opt(&t.pad))?;
        writeln!(
            f,
            "{:<22}{}",
            "chat template",
            if t.has_chat_template { "yes" } else { "no" }
        )?;
        let by_type: Vec<String> = self
            .tensor_types
            .iter()
            .map(|(ty, n)| format!("{ty}: {n}"))
            .collect();
        writeln!(
            f,
            "{:<22}{} ({})",
            "tensors",
            self.n_tensors,
            by_type.join(", ")
        )?;
        write!(
            f,
            "{:<22}{} ({:.1}M)",
            "parameters",
            thousands(self.n_parameters),
            self.n_parameters as f64 / 1e6
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::test_model_path;
    use crate::gguf::value::Array;
    use crate::gguf::writer::GgufWriter;

    #[test]
    fn thousands_groups() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(134_515_008), "134,515,008");
    }

    #[test]
    fn sparse_synthetic_file() {
        let bytes = GgufWriter::new()
            .kv("general.architecture", Value::String("toy".into()))
            .kv("toy.block_count", Value::U32(2))
            .kv(
                "toy.attention.head_count",
                Value::Array(Array::U32(vec![4, 4])),
            )
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["<s>".into(), "a\n".into()])),
            )
            .kv("tokenizer.ggml.bos_token_id", Value::U32(0))
            .kv("tokenizer.ggml.eos_token_id", Value::I32(1))
            .kv("tokenizer.ggml.padding_token_id", Value::U64(7))
            .tensor("x", &[2], GgmlType::F32, vec![0; 8])
            .to_bytes();
        let s = summarize(&GgufFile::from_bytes(bytes).unwrap());
        assert_eq!(s.hparams.block_count, Some(2));
        assert_eq!(
            s.hparams.head_count, None,
            "per-layer arrays are not a scalar"
        );
        assert_eq!(s.hparams.vocab_size, Some(2));
        assert_eq!(
            s.tokenizer.eos,
            Some(SpecialToken {
                id: 1,
                text: Some("a\n".into())
            })
        );
        assert_eq!(s.n_parameters, 2);
        let text = s.to_string();
        assert!(text.contains("eos                   1 \"a\\n\""), "{text}");
        assert!(
            text.contains("pad                   7 (outside vocabulary)"),
            "{text}"
        );
        assert!(text.contains("context length        -"), "{text}");
        assert!(text.contains("tensors               1 (F32: 1)"), "{text}");
    }

    #[test]
    fn real_model_summary() {
        let f = GgufFile::open(test_model_path()).unwrap();
        let s = summarize(&f);
        assert_eq!(s.architecture.as_deref(), Some("llama"));
        assert_eq!(s.hparams.block_count, Some(30));
        assert_eq!(s.hparams.head_count_kv, Some(3));
        assert_eq!(s.hparams.vocab_size, Some(49152));
        assert_eq!(s.tokenizer.n_merges, Some(48900));
        assert_eq!(
            s.tokenizer.bos,
            Some(SpecialToken {
                id: 1,
                text: Some("<|im_start|>".into())
            })
        );
        assert_eq!(
            s.tensor_types,
            [
                (GgmlType::Q4_1, 210),
                (GgmlType::F32, 61),
                (GgmlType::Q8_0, 1)
            ]
        );
        assert_eq!(s.n_parameters, 134_515_008);
        let text = s.to_string();
        assert!(
            text.contains("file type             3 (MOSTLY_Q4_1)"),
            "{text}"
        );
        if std::env::var_os("EDGELM_PRINT_SUMMARY").is_some() {
            println!("{text}");
        }
    }
}
