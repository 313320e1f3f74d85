//! The operations a transformer needs (a decoder's, or an encoder's), as the one forward pass
//! (`model::forward`) calls them. A backend implements [`Ops`] over its own memory: the CPU
//! over vectors and the paged pool in RAM, CUDA over device buffers and its pool in device
//! memory. A step's batch (tokens, positions, block tables) is given to the backend before the
//! pass starts, so an op names only what differs between calls: which buffers, which weights,
//! which layer.

use crate::gguf::GgufFile;
use crate::kv::KvLayout;
use crate::quant::GgmlType;
use anyhow::Result;
use std::sync::Arc;

/// The activation buffers of one step. Every token of the step has a row in each but `Head` and
/// `Logits` (widths in [`Widths`]), which hold only the rows whose logits are wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The residual stream (n_embd).
    X,
    /// A normed copy of the residual, the input of a matmul (n_embd).
    H,
    /// Queries (n_head · head_dim).
    Q,
    /// This step's keys and values (n_head_kv · head_dim).
    K,
    V,
    /// The attention output (n_head · head_dim).
    Attn,
    /// The output of an attention or FFN projection (n_embd).
    Proj,
    /// FFN gate and up projections (n_ff).
    Gate,
    Up,
    /// The residual rows whose logits are wanted (n_embd).
    Head,
    /// Their logits (vocab).
    Logits,
    /// A gated DeltaNet's convolved q, k and v channels; or a gated attention's packed query
    /// and output gate, then the gate alone (Qwen3.5; 0 wide in other models).
    Mix,
    /// A gated DeltaNet's z, then its gated-normed output (its value width).
    Z,
    /// A gated DeltaNet's β and α logits, one per value head.
    Beta,
    Alpha,
}

/// Row widths of the buffers (values per token).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Widths {
    pub embd: usize,
    pub q: usize,
    pub kv: usize,
    pub ff: usize,
    pub vocab: usize,
    /// [`Buf::Mix`], [`Buf::Z`], and [`Buf::Beta`] / [`Buf::Alpha`] (0 without Qwen3.5's
    /// layers).
    pub mix: usize,
    pub inner: usize,
    pub dt_heads: usize,
}

impl Widths {
    pub fn of(&self, buf: Buf) -> usize {
        match buf {
            Buf::X | Buf::H | Buf::Proj | Buf::Head => self.embd,
            Buf::Q | Buf::Attn => self.q,
            Buf::K | Buf::V => self.kv,
            Buf::Gate | Buf::Up => self.ff,
            Buf::Logits => self.vocab,
            Buf::Mix => self.mix,
            Buf::Z => self.inner,
            Buf::Beta | Buf::Alpha => self.dt_heads,
        }
    }
}

/// A weight matrix in the model file: `rows` output rows of `cols` values each, starting at row
/// `first_row` of the file's tensor (so a band of a fused tensor, such as the Q rows of a fused
/// QKV, is a matrix of its own). The bytes stay in the memory map.
#[derive(Clone, Debug, PartialEq)]
pub struct Mat {
    pub name: String,
    pub ty: GgmlType,
    pub cols: usize,
    pub rows: usize,
    /// Index into `GgufFile::tensors()`.
    pub tensor: usize,
    pub first_row: usize,
}

impl Mat {
    pub fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.cols as u64)
            .expect("checked at load") as usize
    }

    /// Byte offset of the first row within the tensor's data.
    pub fn byte_offset(&self) -> usize {
        self.first_row * self.row_bytes()
    }

    pub fn data<'a>(&self, file: &'a GgufFile) -> &'a [u8] {
        let all = file.tensor_data(&file.tensors()[self.tensor]);
        &all[self.byte_offset()..self.byte_offset() + self.rows * self.row_bytes()]
    }
}

/// A small f32 vector (a norm weight, a bias, RoPE factors) in the model's vector arena, where
/// they are kept dequantized: `len` values from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VecRef {
    pub offset: usize,
    pub len: usize,
}

impl VecRef {
    pub fn of(self, arena: &[f32]) -> &[f32] {
        &arena[self.offset..self.offset + self.len]
    }
}

/// A layer norm's weight and bias (an encoder's norms: mean-subtracted, scaled to unit
/// variance, then times the weight plus the bias).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerNorm {
    pub weight: VecRef,
    pub bias: VecRef,
}

/// How RoPE pairs up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Adjacent pairs (x[2i], x[2i+1]): llama's GGUF convention (the converter permutes Q/K).
    Normal,
    /// Halves (x[i], x[i + n_rot/2]): GPT-NeoX style, used by qwen2, gemma3, phi3 and others.
    Neox,
}

/// The gating activation of a gated FFN: `gate = act(gate) · up`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): llama, qwen, phi3, granite, smollm3.
    Silu,
    /// GELU, tanh approximation (GeGLU): gemma.
    GeluTanh,
    /// gpt-oss's clamped SwiGLU: `min(g, 7) · σ(1.702 · min(g, 7)) · (clamp(u, ±7) + 1)`.
    SwigluOai,
}

/// How a mixture-of-experts layer turns its router's logits into the weights of the experts
/// it picks (llama.cpp's `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over every expert's logit, then the top k of those probabilities (qwen3moe).
    SoftmaxThenTopK,
    /// The top k logits, then a softmax over those alone (gpt-oss).
    TopKThenSoftmax,
}

/// What a mixture-of-experts layer does with its router's logits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Routing {
    /// Experts each token uses (k).
    pub used: usize,
    pub gating: Gating,
    /// Divide the chosen weights by their sum (qwen3moe).
    pub normalize: bool,
    /// Multiplies the chosen weights (`expert_weights_scale`; 1 when absent).
    pub scale: f32,
}

/// A mixture-of-experts FFN's weights: the router (one row per expert) and each expert's
/// gated FFN, as bands of the file's 3-D expert tensors (one band of rows per expert).
#[derive(Clone, Debug, PartialEq)]
pub struct Experts {
    /// [n_expert × n_embd].
    pub router: Mat,
    /// Added to the router's logits (gpt-oss).
    pub router_bias: Option<VecRef>,
    /// Per expert, the biases of its gate, up and down outputs (gpt-oss).
    pub biases: Option<Vec<ExpertBiases>>,
    /// Per expert: [n_ff_exp × n_embd].
    pub gate: Vec<Mat>,
    pub up: Vec<Mat>,
    /// Per expert: [n_embd × n_ff_exp].
    pub down: Vec<Mat>,
}

/// One expert's output biases.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertBiases {
    pub gate: VecRef,
    pub up: VecRef,
    pub down: VecRef,
}

impl Experts {
    pub fn count(&self) -> usize {
        self.gate.len()
    }

    /// Every matrix: the router, then each expert's gate, up and down.
    pub fn matrices(&self) -> impl Iterator<Item = &Mat> {
        std::iter::once(&self.router)
            .chain((0..self.count()).flat_map(|e| [&self.gate[e], &self.up[e], &self.down[e]]))
    }
}

/// A layer's sliding attention window: which positions near a query it sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Window {
    /// The last `n` positions up to the query, itself included (a decoder's sliding window,
    /// llama.cpp's `LLAMA_SWA_TYPE_STANDARD`): blocks behind it can be released.
    Trailing(usize),
    /// The positions within `n / 2` of the query on either side (gemma-embedding,
    /// llama.cpp's `LLAMA_SWA_TYPE_SYMMETRIC`): a key is masked when |p_query − p_key| > n / 2.
    Symmetric(usize),
}

impl Window {
    /// The trailing window's length, which bounds the blocks a KV group keeps; `None` for a
    /// symmetric one, which reads ahead as well (an input computed whole keeps every block).
    pub fn trailing(self) -> Option<usize> {
        match self {
            Window::Trailing(n) => Some(n),
            Window::Symmetric(_) => None,
        }
    }

    /// Narrows a query's visible positions `first..=last` to the window around its position
    /// `pos` (a trailing window's start is already the KV group's: `KvLayout::first_visible`).
    pub fn clamp(self, pos: usize, first: usize, last: usize) -> (usize, usize) {
        match self {
            Window::Trailing(_) => (first, last),
            Window::Symmetric(n) => (first.max(pos.saturating_sub(n / 2)), last.min(pos + n / 2)),
        }
    }

    /// Positions a query sees at most within a context of `ctx`.
    pub fn span(self, ctx: usize) -> usize {
        match self {
            Window::Trailing(n) => n.min(ctx),
            Window::Symmetric(n) => (n / 2 * 2 + 1).min(ctx),
        }
    }
}

/// One layer's attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Attention {
    pub layer: usize,
    /// The positions a query sees near it (`None`: all before it, or with bidirectional
    /// attention all of its span).
    pub window: Option<Window>,
    /// Multiplies Q·K before the softmax.
    pub scale: f32,
    /// Per query head, a logit that joins every softmax's denominator and nothing else
    /// (gpt-oss's attention sinks).
    pub sinks: Option<VecRef>,
    /// A query sees the positions before it (decoders); when false, every position of its
    /// own span in the step, later ones included (an encoder, whose input is one span).
    pub causal: bool,
}

/// One short-convolution layer (LFM2): which of the model's such layers (its state's place in a
/// sequence's slot), its depthwise kernel (`taps` values per channel, oldest position first).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShortConv {
    pub index: usize,
    pub kernel: VecRef,
    pub taps: usize,
}

/// The shape of a gated DeltaNet layer (Qwen3.5): keys and values of `head_dim` (d_k = d_v),
/// `k_heads` key heads shared by `v_heads` value heads (value head h reads key head
/// h mod `k_heads`, llama.cpp's tiled order), and a causal convolution of `taps` positions over
/// the q, k and v channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeltaNetShape {
    pub head_dim: usize,
    pub k_heads: usize,
    pub v_heads: usize,
    pub taps: usize,
}

impl DeltaNetShape {
    pub fn key_dim(&self) -> usize {
        self.k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.v_heads * self.head_dim
    }

    /// Channels of the convolution: q, k, then v.
    pub fn channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 values of one layer's convolution state: the last `taps - 1` rows of its input.
    pub fn conv_floats(&self) -> usize {
        (self.taps - 1) * self.channels()
    }

    /// f32 values of one layer's state: the convolution rows, then per value head the
    /// delta rule's d_k × d_v matrix.
    pub fn floats(&self) -> usize {
        self.conv_floats() + self.v_heads * self.head_dim * self.head_dim
    }
}

/// One gated DeltaNet layer as its ops take it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeltaNet {
    /// Which of the model's DeltaNet layers (its state's place in a sequence's slot).
    pub index: usize,
    pub shape: DeltaNetShape,
    /// The convolution's kernel: `taps` values per channel, oldest position first.
    pub kernel: VecRef,
    /// Per value head, the bias of the decay's softplus (`ssm_dt.bias`) and the decay's scale
    /// (`ssm_a`, which the converter stores as −exp(A_log)).
    pub dt_bias: VecRef,
    pub a: VecRef,
    /// The gated RMSNorm's weight (`ssm_norm`, head_dim values, shared by the heads) and ε.
    pub norm: VecRef,
    pub eps: f32,
}

/// The op set. Row counts come from the step: every buffer but `Head` and `Logits` has one row
/// per token; those two have one row per gathered row.
pub trait Ops {
    /// X = the embedding rows of the step's tokens, times `scale`.
    fn embed(&mut self, table: &Mat, scale: f32) -> Result<()>;
    /// `dst` = RMSNorm of `src` times `w`, over rows of `w.len` values (so a norm over each
    /// head is the same op with a head-sized `w`). `dst` may be `src`.
    fn rmsnorm(&mut self, src: Buf, w: VecRef, eps: f32, dst: Buf) -> Result<()>;
    /// `buf` = its layer norm (each row less its mean, over the root of its variance plus
    /// `eps`) times `n.weight` plus `n.bias`, in place (ggml's `norm`, `mul`, `add`).
    fn layernorm(&mut self, buf: Buf, n: LayerNorm, eps: f32) -> Result<()>;
    /// X += the rows of `table` at the step's positions (absolute position embeddings).
    fn add_positions(&mut self, table: &Mat) -> Result<()>;
    /// X += part `part` (1 for the first DeepStack row) of each input row the step gives
    /// (Qwen3-VL's image positions; text positions add nothing).
    fn add_deepstack(&mut self, part: usize) -> Result<()>;
    /// Each `out` = `x` times its matrix (transposed): matrices that share an input are given
    /// together, so the input is prepared once.
    fn matmul(&mut self, x: Buf, outs: &[(&Mat, Buf)]) -> Result<()>;
    /// Adds `b` to every row of `buf`.
    fn add_bias(&mut self, buf: Buf, b: VecRef) -> Result<()>;
    /// Rotates every head of `buf` (Q or K) by the step's RoPE table `table`.
    fn rope(&mut self, buf: Buf, table: usize) -> Result<()>;
    /// The Walsh-Hadamard rotation of quantized pages (`kv::KvType::rotated`), in place.
    fn hadamard(&mut self, buf: Buf) -> Result<()>;
    /// Writes this step's K and V into the layer's pages, then Attn = attention of Q over
    /// every position each token sees.
    fn attention(&mut self, a: Attention) -> Result<()>;
    /// Gate = act(Gate) · Up.
    fn glu(&mut self, act: Activation) -> Result<()>;
    /// `buf` = act(`buf`), ungated (an encoder's FFN).
    fn activate(&mut self, buf: Buf, act: Activation) -> Result<()>;
    /// Proj = the mixture of `experts` applied to H: the router's logits, the experts each
    /// token picks (`routing`), and their gated FFNs (activation `act`) weighted and summed.
    fn moe(&mut self, experts: &Experts, routing: Routing, act: Activation) -> Result<()>;
    /// Attn = C ⊙ conv(B ⊙ x), with B in Q, C in Attn and x in Proj (each n_embd wide): per
    /// channel, the causal convolution of B ⊙ x over the sequence's last `taps - 1` rows (its
    /// state slot; none before position 0) and this step's, after which the slot holds the
    /// last `taps - 1` rows.
    fn short_conv(&mut self, conv: ShortConv) -> Result<()>;
    /// Qwen3.5's packed query and output gate: Mix holds per head `head_dim` query values then
    /// `head_dim` gate values; Q = the query halves, and Mix keeps the gate halves, packed
    /// (n_head · head_dim per token), for [`Ops::output_gate`].
    fn split_query_gate(&mut self) -> Result<()>;
    /// Attn ·= σ(Mix), the gate [`Ops::split_query_gate`] left there.
    fn output_gate(&mut self) -> Result<()>;
    /// Mix = SiLU of the causal convolution of Mix's q, k and v channels, per channel over the
    /// sequence's last `taps - 1` rows (its state slot; none before position 0) and this
    /// step's, after which the slot holds the last `taps - 1` rows.
    fn delta_conv(&mut self, d: &DeltaNet) -> Result<()>;
    /// The gated delta rule over the convolved Mix, β and α, carried in the sequence's state
    /// slot: per token and value head, q and k L2-normalised, the state decayed by
    /// exp(softplus(α + dt_bias) · a), corrected towards v by σ(β) along k, and read by q
    /// (scaled by 1/√d_k); then Z = RMSNorm(that output) · norm ⊙ SiLU(Z).
    fn delta_rule(&mut self, d: &DeltaNet) -> Result<()>;
    /// `dst` += `src` · `scale`.
    fn add_scaled(&mut self, dst: Buf, src: Buf, scale: f32) -> Result<()>;
    /// `buf` ·= `s`.
    fn scale(&mut self, buf: Buf, s: f32) -> Result<()>;
    /// `buf` = cap · tanh(`buf` / cap).
    fn softcap(&mut self, buf: Buf, cap: f32) -> Result<()>;
    /// Head = rows `rows` of X (the tokens whose logits are wanted), in that order.
    fn gather(&mut self, rows: &[usize]) -> Result<()>;
}

/// How one RoPE table turns a position into rotation angles (ggml's `rope_yarn` without the
/// YaRN ramp): the angle of pair i at position p is `freq_scale · p · base^(-2i/n_rot) /
/// factors[i]`, and cos and sin are multiplied by `mscale`.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeTable {
    pub base: f32,
    pub freq_scale: f32,
    pub mscale: f32,
    /// Per-pair frequency divisors (Llama 3.1's `rope_freqs`, Phi-3's LongRoPE factors).
    pub factors: Option<Vec<f32>>,
}

/// The shapes a backend sizes its buffers and kernels by.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    pub widths: Widths,
    /// Causal attention (decoders); false for an encoder's bidirectional attention, where a
    /// step must hold each input whole (see [`Attention::causal`]).
    pub causal: bool,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (the rest pass through).
    pub n_rot: usize,
    pub rope_layout: RopeLayout,
    /// The RoPE tables the layers use (Gemma 3: one for global layers, one for local ones).
    pub ropes: Vec<RopeTable>,
    /// The mixture-of-experts FFNs' sizes (`None`: dense FFNs).
    pub experts: Option<ExpertShape>,
    /// f32 values of one sequence's recurrent state (a hybrid's; 0 when every layer attends).
    pub state_floats: usize,
    /// Taps of the short convolutions (LFM2; 0 without them).
    pub conv_taps: usize,
    /// The gated DeltaNets' shape (Qwen3.5; `None` without them).
    pub delta_net: Option<DeltaNetShape>,
    /// Interleaved M-RoPE (Qwen3.5, Qwen3-VL): per rotated pair, the part of a three-part
    /// position (0 temporal, 1 row, 2 column) that turns it, for the tokens a step gives such
    /// positions (`BatchMeta::rope_positions`: Qwen3-VL's images and the text after them).
    pub mrope: Option<Vec<u8>>,
    /// Qwen3-VL: the first layers that each add an image position's next DeepStack row to
    /// their output; an input row is `widths.embd` times one more than this wide.
    pub deepstack: usize,
}

/// The sizes of a model's mixture-of-experts FFNs (every such layer has the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertShape {
    /// Experts per layer.
    pub count: usize,
    /// Experts each token uses.
    pub used: usize,
    /// Each expert's FFN width.
    pub ff: usize,
}

/// A model as a backend runs it: what to size buffers and kernels by, where the weights are,
/// and the forward pass itself. `model::Model` is the one implementation; a backend that
/// drives its own steps (CUDA, which captures them into graphs) takes any `Network`, so it
/// holds no copy of the layer sequence and no knowledge of the model's types.
pub trait Network {
    fn shape(&self) -> &Shape;
    /// Which layers share a KV block table.
    fn kv_layout(&self) -> &KvLayout;
    /// The file the matrices are read from.
    fn file(&self) -> &Arc<GgufFile>;
    /// The f32 vectors (norms, biases) that [`VecRef`]s index.
    fn arena(&self) -> &[f32];
    /// The token embedding table (only gathered, never multiplied by, unless it is also in
    /// [`Network::matrices`] as a tied output).
    fn embedding(&self) -> &Mat;
    /// Every matrix a step multiplies by.
    fn matrices(&self) -> Vec<&Mat>;
    /// Every mixture-of-experts FFN, in layer order (their matrices are among
    /// [`Network::matrices`] too).
    fn expert_layers(&self) -> Vec<&Experts>;
    /// A bound on the positions a batch may hold (a batch beyond it is refused).
    fn max_position(&self) -> usize;
    /// The embedding and every block for the step's tokens (the residual stream left in X).
    /// `rotated`: the KV pages hold K and V Hadamard-rotated.
    fn run_blocks<O: Ops>(&self, ops: &mut O, rotated: bool) -> Result<()>;
    /// Head = rows `rows` of the residual stream after the final norm (the hidden states an
    /// embedding model pools).
    fn run_final_norm<O: Ops>(&self, ops: &mut O, rows: &[usize]) -> Result<()>;
    /// Logits for rows `rows` of the residual stream.
    fn run_head<O: Ops>(&self, ops: &mut O, rows: &[usize]) -> Result<()>;
}

#[cfg(test)]
mod tests {
    use super::Window;

    #[test]
    fn a_symmetric_window_sees_half_its_length_either_side() {
        let w = Window::Symmetric(8);
        assert_eq!(w.clamp(10, 0, 30), (6, 14));
        // Clamped to what the query could see without it.
        assert_eq!(w.clamp(2, 0, 5), (0, 5));
        assert_eq!(w.span(100), 9);
        assert_eq!(w.trailing(), None);
        // A trailing window's start comes from the KV layout: it is left as given.
        let t = Window::Trailing(8);
        assert_eq!(
            (t.clamp(10, 3, 10), t.trailing(), t.span(4)),
            ((3, 10), Some(8), 4)
        );
    }
}
