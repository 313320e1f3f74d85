//! The model families edgelm runs, and what distinguishes each one from the plain Llama block.
//! Everything here is data: the one forward pass reads it (see `forward.rs`); what each family
//! must compute is its llama.cpp graph builder (`src/models/<arch>.cpp`), the reference.

use crate::backend::ops::{Activation, Gating, RopeLayout};

/// A family of GGUF architectures sharing one description.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `llama` (Llama 2/3.x, Mistral 7B, the DeepSeek-R1 Llama distills); `mistral`, which
    /// some converters write for Mistral 7B, is read as `llama`.
    Llama,
    /// `qwen2` (Qwen2/2.5, the DeepSeek-R1 Qwen distills): Q/K/V biases, NeoX RoPE.
    Qwen2,
    /// `qwen2vl` (Qwen2-VL's and Qwen2.5-VL's text model): qwen2's blocks with M-RoPE
    /// positions in runs (`rope.dimension_sections`: an image's positions turn by its row
    /// and column).
    Qwen2Vl,
    /// `qwen3`: per-head RMSNorm of Q and K before RoPE.
    Qwen3,
    /// `qwen3vl` (Qwen3-VL's text model): qwen3's blocks with interleaved M-RoPE positions
    /// (`rope.dimension_sections`: an image's positions turn by its row and column) and
    /// DeepStack (`n_deepstack_layers`: the first layers each add an image position's next
    /// DeepStack row, given beside its projector row, to its output).
    Qwen3Vl,
    /// `qwen3moe` (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): qwen3's attention, a mixture of
    /// experts for every FFN (softmax gating, the top k renormalised).
    Qwen3Moe,
    /// `gemma3`: √n_embd embedding scale, four norms per block, GeGLU, Q/K norms, sliding
    /// windows on five layers of six with their own RoPE base.
    Gemma3,
    /// `phi3` (Phi-3/3.5/4-mini): fused QKV and gate/up, LongRoPE factors.
    Phi3,
    /// `gpt-oss` (gpt-oss-20b/120b): attention sinks, biases everywhere, a sliding window on
    /// every other layer, YaRN, and a mixture of experts (the top k of the router's logits,
    /// softmax over those) with the clamped SwiGLU; its FFN norm is `post_attention_norm`.
    GptOss,
    /// `smollm3`: no RoPE on every fourth layer.
    Smollm3,
    /// `granite` (Granite 3.x dense): embedding, residual, attention and logit scales.
    Granite,
    /// `lfm2` (LFM2/LFM2.5, Liquid AI): a hybrid. Most layers are gated short convolutions
    /// (`shortconv.*`: in-projection to B, C, x; a causal depthwise convolution of B·x over the
    /// last `shortconv.l_cache` positions; C times it; out-projection), the others GQA
    /// attention with Q/K norms; `attention.head_count_kv` is per layer, 0 on convolution
    /// layers; the output norm is `token_embd_norm`.
    Lfm2,
    /// `qwen35` (Qwen3.5): a hybrid. Most layers are gated DeltaNets (`attn_qkv` to q, k and
    /// v, convolved with `ssm_conv1d` and SiLU; the gated delta rule with decay from `ssm_a`
    /// and `ssm_dt`, β from `ssm_beta`; an RMSNorm gated by SiLU(`attn_gate`); `ssm_out`), the
    /// others attention whose `attn_q` packs an output gate beside each head's query, with Q/K
    /// norms and M-RoPE over part of each head; the FFN's norm is `post_attention_norm`.
    Qwen35,
    /// `bert` (all-MiniLM, bge-small/base): an encoder that only embeds. Token, absolute
    /// position and token-type embeddings (type 0) summed and layer-normed
    /// (`token_embd_norm`); blocks of bidirectional attention and an ungated GELU FFN, each
    /// added to the residual and then layer-normed (`attn_output_norm`,
    /// `layer_output_norm`: post-norm, weight and bias); biases everywhere; no output head.
    Bert,
    /// `gemma-embedding` (EmbeddingGemma): Gemma 3's blocks as an embedding model only, with
    /// bidirectional attention, symmetric windows on the sliding layers (a key is masked when
    /// it is more than half the window from the query, either side), no output head, and
    /// optional dense projections of the pooled vector (`dense_2`, `dense_3`).
    GemmaEmbedding,
    /// `nomic-bert` (nomic-embed-text v1/v1.5): bert's encoder layout without position
    /// embeddings, NeoX RoPE on Q and K instead, a fused QKV, and a SwiGLU FFN (gate, up,
    /// down, no FFN biases).
    NomicBert,
}

/// An architecture edgelm runs: the name `general.architecture` carries, the family it loads
/// as, and the models it covers.
#[derive(Clone, Copy, Debug)]
pub struct Arch {
    pub name: &'static str,
    pub family: Family,
    pub models: &'static str,
}

/// Every architecture edgelm runs: what the loader accepts, what the refusal of any other name
/// lists and what `edgelm inspect` says of a file.
pub const ARCHITECTURES: &[Arch] = &[
    arch(
        "llama",
        Family::Llama,
        "Llama 2/3.x, Mistral 7B, the DeepSeek-R1 Llama distills",
    ),
    arch("mistral", Family::Llama, "Mistral 7B, read as llama"),
    arch(
        "qwen2",
        Family::Qwen2,
        "Qwen2/2.5, the DeepSeek-R1 Qwen distills",
    ),
    arch(
        "qwen2vl",
        Family::Qwen2Vl,
        "Qwen2-VL, Qwen2.5-VL 3B/7B/32B: the text model beside its projector",
    ),
    arch("qwen3", Family::Qwen3, "Qwen3"),
    arch(
        "qwen3vl",
        Family::Qwen3Vl,
        "Qwen3-VL 2B/4B/8B/32B: the text model beside its projector",
    ),
    arch(
        "qwen3moe",
        Family::Qwen3Moe,
        "Qwen3-30B-A3B, Qwen3-Coder-30B-A3B: a mixture of experts",
    ),
    arch("gemma3", Family::Gemma3, "Gemma 3"),
    arch("phi3", Family::Phi3, "Phi-3/3.5/4-mini"),
    arch("smollm3", Family::Smollm3, "SmolLM3"),
    arch("granite", Family::Granite, "Granite 3.x dense"),
    arch(
        "gpt-oss",
        Family::GptOss,
        "gpt-oss-20b/120b: a mixture of experts",
    ),
    arch(
        "lfm2",
        Family::Lfm2,
        "LFM2/LFM2.5: a hybrid of short convolutions and attention",
    ),
    arch(
        "qwen35",
        Family::Qwen35,
        "Qwen3.5: a hybrid of gated DeltaNets and attention",
    ),
    arch("bert", Family::Bert, "all-MiniLM, bge-small/base"),
    arch("nomic-bert", Family::NomicBert, "nomic-embed-text v1/v1.5"),
    arch("gemma-embedding", Family::GemmaEmbedding, "EmbeddingGemma"),
];

const fn arch(name: &'static str, family: Family, models: &'static str) -> Arch {
    Arch {
        name,
        family,
        models,
    }
}

impl Arch {
    /// The architecture `general.architecture` names, if edgelm runs it.
    pub fn named(name: &str) -> Option<&'static Arch> {
        ARCHITECTURES.iter().find(|a| a.name == name)
    }

    /// Every name edgelm runs, comma-separated.
    pub fn names() -> String {
        let names: Vec<&str> = ARCHITECTURES.iter().map(|a| a.name).collect();
        names.join(", ")
    }

    /// What a model of the architecture is for: generating text, or only embeddings (an
    /// encoder, or gemma-embedding's stack with bidirectional attention).
    pub fn role(&self) -> &'static str {
        match (self.family.encoder(), self.family.embeds_only()) {
            (true, _) => "an encoder, embeddings only",
            (false, true) => "embeddings only",
            (false, false) => "generates text",
        }
    }

    /// What `edgelm inspect` says of a file of the architecture: its name, the models it
    /// covers, its role.
    pub fn describe(&self) -> String {
        format!("{}: {}; {}", self.name, self.models, self.role())
    }
}

impl Family {
    /// The family of the architecture `general.architecture` names, if edgelm runs it.
    pub fn from_arch(arch: &str) -> Option<Family> {
        Arch::named(arch).map(|a| a.family)
    }

    pub fn rope_layout(self) -> RopeLayout {
        match self {
            Family::Llama | Family::Smollm3 | Family::Granite | Family::Bert => RopeLayout::Normal,
            Family::Qwen2
            | Family::Qwen2Vl
            | Family::Qwen3
            | Family::Qwen3Vl
            | Family::Qwen3Moe
            | Family::Gemma3
            | Family::GemmaEmbedding
            | Family::NomicBert
            | Family::Phi3
            | Family::GptOss
            | Family::Lfm2
            | Family::Qwen35 => RopeLayout::Neox,
        }
    }

    pub fn activation(self) -> Activation {
        match self {
            // ggml's GELU on the CPU is the tanh form, looked up in its f16 table.
            Family::Gemma3 | Family::GemmaEmbedding | Family::Bert => Activation::GeluTanh,
            Family::GptOss => Activation::SwigluOai,
            _ => Activation::Silu,
        }
    }

    /// Per-head RMSNorm of Q and K (`attn_q_norm`, `attn_k_norm`) before RoPE.
    pub fn qk_norm(self) -> bool {
        matches!(
            self,
            Family::Qwen3
                | Family::Qwen3Vl
                | Family::Qwen3Moe
                | Family::Gemma3
                | Family::GemmaEmbedding
                | Family::Lfm2
                | Family::Qwen35
        )
    }

    /// Layers that keep a short-convolution state instead of attending (those whose
    /// `attention.head_count_kv` entry is 0).
    pub fn short_convolutions(self) -> bool {
        self == Family::Lfm2
    }

    /// Attention whose query projection packs a sigmoid output gate beside each head's query
    /// (per head, `head_dim` query rows then `head_dim` gate rows).
    pub fn output_gate(self) -> bool {
        self == Family::Qwen35
    }

    /// The name of the final norm (LFM2's converter calls it `token_embd_norm`).
    pub fn output_norm_name(self) -> &'static str {
        match self {
            Family::Lfm2 => "token_embd_norm.weight",
            _ => "output_norm.weight",
        }
    }

    /// How the family's mixture-of-experts FFNs weigh their experts (gating, and whether the
    /// chosen weights are renormalised); `None` for a dense family.
    pub fn experts(self) -> Option<(Gating, bool)> {
        match self {
            Family::Qwen3Moe => Some((Gating::SoftmaxThenTopK, true)),
            Family::GptOss => Some((Gating::TopKThenSoftmax, false)),
            _ => None,
        }
    }

    /// A learned logit per query head in every softmax's denominator (`attn_sinks`).
    pub fn attention_sinks(self) -> bool {
        self == Family::GptOss
    }

    /// Biases on the router and on every expert's matrices.
    pub fn expert_biases(self) -> bool {
        self == Family::GptOss
    }

    /// The name of the norm before the FFN (gpt-oss calls it the post-attention norm).
    pub fn ffn_norm_name(self) -> &'static str {
        match self {
            Family::GptOss | Family::Qwen35 => "post_attention_norm",
            _ => "ffn_norm",
        }
    }

    /// RMSNorm of the attention and FFN outputs before each residual add
    /// (`post_attention_norm`, `post_ffw_norm`).
    pub fn post_norms(self) -> bool {
        matches!(self, Family::Gemma3 | Family::GemmaEmbedding)
    }

    /// The encoder layout (bert, nomic-bert): layer norms with biases after each residual add
    /// instead of RMS norms before each block, token-type embeddings, and no output head.
    pub fn encoder(self) -> bool {
        matches!(self, Family::Bert | Family::NomicBert)
    }

    /// Absolute position embeddings (`position_embd`) added to the input, instead of RoPE.
    pub fn absolute_positions(self) -> bool {
        self == Family::Bert
    }

    /// A gated FFN (gate, up, down); bert's is ungated (act(up) then down).
    pub fn gated_ffn(self) -> bool {
        self != Family::Bert
    }

    /// Whether a token attends only to the positions before it (decoders); an encoder's
    /// tokens, and gemma-embedding's, attend to every token of their input.
    pub fn causal(self) -> bool {
        !self.encoder() && self != Family::GemmaEmbedding
    }

    /// A model that only embeds: no output head (an encoder, gemma-embedding).
    pub fn embeds_only(self) -> bool {
        self.encoder() || self == Family::GemmaEmbedding
    }

    /// The pooled vector may go through dense projections (`dense_2`, then `dense_3`) before
    /// it is normalised, as llama.cpp's `build_dense_out`.
    pub fn dense_out(self) -> bool {
        self == Family::GemmaEmbedding
    }

    /// Gate and up projections in one tensor (`ffn_up` of 2·n_ff rows, gate first).
    pub fn fused_gate_up(self) -> bool {
        self == Family::Phi3
    }

    /// The optional tensors llama.cpp's loader accepts for the family (beyond Q/K/V biases and
    /// a fused QKV, which every family accepts): a file may carry these or not.
    pub fn optional(self) -> Optional {
        let llama_like = Optional {
            attn_out_bias: true,
            ffn_biases: true,
            output_bias: false,
            rope_factors: true,
        };
        match self {
            Family::Llama | Family::Granite => llama_like,
            Family::Bert => Optional {
                attn_out_bias: true,
                ffn_biases: true,
                ..Optional::NONE
            },
            // llama.cpp loads FFN biases for it but never adds them: a file with them is
            // refused rather than run without.
            Family::NomicBert => Optional {
                attn_out_bias: true,
                ..Optional::NONE
            },
            Family::Qwen2 => Optional {
                output_bias: true,
                ..Optional::NONE
            },
            Family::Phi3 => Optional {
                rope_factors: true,
                ..Optional::NONE
            },
            // llama.cpp's qwen2vl loads no attention-output bias and loads the output bias
            // without adding it: a file with either is refused rather than run without.
            Family::Qwen2Vl
            | Family::Qwen3
            | Family::Qwen3Vl
            | Family::Qwen3Moe
            | Family::Gemma3
            | Family::GemmaEmbedding
            | Family::Smollm3
            | Family::Lfm2
            | Family::Qwen35 => Optional::NONE,
            // Its output bias is required (bound with the sinks), the rest it does not have.
            Family::GptOss => Optional {
                attn_out_bias: true,
                ..Optional::NONE
            },
        }
    }
}

/// Optional tensors a family may carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Optional {
    /// `attn_output.bias`.
    pub attn_out_bias: bool,
    /// `ffn_gate.bias`, `ffn_up.bias`, `ffn_down.bias`.
    pub ffn_biases: bool,
    /// `output.bias`.
    pub output_bias: bool,
    /// `rope_freqs` (Llama 3.1) or, with LongRoPE scaling, `rope_factors_long`/`_short`.
    pub rope_factors: bool,
}

impl Optional {
    const NONE: Optional = Optional {
        attn_out_bias: false,
        ffn_biases: false,
        output_bias: false,
        rope_factors: false,
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{Array, GgufFile, GgufWriter, Value};
    use crate::model::ModelConfig;

    /// Every name the loader accepts is in the table, and the refusal of any other name lists
    /// each of them.
    #[test]
    fn the_refusal_lists_every_architecture_the_loader_accepts() {
        let bytes = GgufWriter::new()
            .kv("general.architecture", Value::String("no-such-arch".into()))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(); 8])),
            )
            .to_bytes();
        let file = GgufFile::from_bytes(bytes).unwrap();
        let refusal = ModelConfig::from_gguf(&file).unwrap_err().to_string();
        let listed = refusal
            .split_once("(supported: ")
            .and_then(|(_, l)| l.strip_suffix(')'))
            .unwrap_or_else(|| panic!("no list in: {refusal}"));
        let listed: Vec<&str> = listed.split(", ").collect();
        for a in ARCHITECTURES {
            assert_eq!(Family::from_arch(a.name), Some(a.family), "{}", a.name);
            assert!(
                listed.contains(&a.name),
                "{} is missing from: {refusal}",
                a.name
            );
        }
        assert_eq!(listed.len(), ARCHITECTURES.len(), "{refusal}");
    }

    /// README's opening sentence names every architecture: those that generate in its
    /// parentheses, as many as it says, and then those that only embed.
    #[test]
    fn the_readme_names_every_architecture() {
        let readme = include_str!("../../README.md");
        let start = readme
            .find("It runs ")
            .expect("README says what edgelm runs");
        let end = start
            + readme[start..]
                .find(" for embeddings")
                .expect("and what embeds");
        let (generating, embedding) = readme[start..end]
            .split_once("), ")
            .expect("the generating architectures in parentheses");
        let words = |text: &str| -> Vec<String> {
            text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .filter(|w| !w.is_empty())
                .map(str::to_owned)
                .collect()
        };
        let (generating_words, embedding_words) = (words(generating), words(embedding));
        let mut count = 0;
        for a in ARCHITECTURES {
            let list = match a.family.embeds_only() {
                true => &embedding_words,
                false => {
                    count += 1;
                    &generating_words
                }
            };
            assert!(
                list.iter().any(|w| w == a.name),
                "README leaves out {}",
                a.name
            );
        }
        let numbers = [
            "zero",
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
        ];
        let says = format!("It runs {} architectures", numbers[count]);
        assert!(generating.starts_with(&says), "README should say: {says}");
    }
}
