//! One typed launch per kernel the forward pass uses: argument order, grid and block as the
//! header comment of each `kernels/*.cu` file states them. Every pointer is a raw device
//! address (see `mem.rs` for why), every launch goes on the executor's one stream, nothing here
//! allocates or synchronises, so a sequence of these calls can be captured into a CUDA graph.
// Each launch takes its kernel's argument list: splitting it into structs would only hide the
// correspondence with the .cu signature.
#![allow(clippy::too_many_arguments)]

use super::device::CudaDevice;
use super::launch::{
    argmax_config, gemm_config, gemv_config, matmul_kernel, moe_gemv_config, moe_gemv_kernel,
    sample_config, MATMUL_TYPES, MOE_MAX_PAIRS, ROUTER_WARPS,
};
use crate::backend::ops::{Activation, Gating, Routing};
use crate::kv::KvType;
use crate::quant::GgmlType;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaFunction, CudaStream, LaunchConfig, PushKernelArg};

pub(super) type Ptr = CUdeviceptr;

/// Threads per block of the element-wise kernels (any multiple of 32 works for them).
pub(super) const THREADS: usize = 256;
/// kernels/attention.cu ATT_WARPS.
const ATT_THREADS: usize = 32 * 4;
/// kernels/norm.cu NORM_THREADS.
const NORM_THREADS: usize = 256;

pub(super) fn cfg1(threads: usize, block: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (threads.div_ceil(block).max(1) as u32, 1, 1),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A row's `cols` values over blocks of THREADS (grid x), one grid row per row (grid y).
fn per_row(cols: usize, rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (cols.div_ceil(THREADS) as u32, rows as u32, 1),
        block_dim: (THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block of NORM_THREADS per row (kernels/norm.cu).
pub(super) fn norm_rows(rows: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (NORM_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One kernel argument, passed by value as the kernel's signature declares it.
#[derive(Clone, Copy)]
pub(super) enum Arg {
    /// A device address (any `T *`).
    Addr(Ptr),
    Int(i32),
    /// `long long`.
    Long(i64),
    Float(f32),
}
pub(super) use Arg::{Addr, Float, Int, Long};

/// Launches `f` (`name`, for the error) on `s` in the shape `cfg` with `args`.
///
/// # Safety
/// `args` are `f`'s parameters in number, order and C type, `cfg` is the launch shape the
/// kernel's header states, and every address is a buffer as large as the kernel reads or
/// writes there.
pub(super) unsafe fn launch(
    s: &CudaStream,
    f: &CudaFunction,
    name: &str,
    cfg: LaunchConfig,
    args: &[Arg],
) -> Result<(), String> {
    let mut builder = s.launch_builder(f);
    for arg in args {
        match arg {
            Addr(p) => builder.arg(p),
            Int(v) => builder.arg(v),
            Long(v) => builder.arg(v),
            Float(v) => builder.arg(v),
        };
    }
    // SAFETY: the caller's.
    unsafe { builder.launch(cfg) }
        .map(drop)
        .map_err(|e| format!("launching {name} failed: {e:?}"))
}

/// The kernels the forward pass launches, looked up once.
pub struct Kernels {
    quantize: CudaFunction,
    rmsnorm: CudaFunction,
    rope: CudaFunction,
    hadamard: CudaFunction,
    silu_mul: CudaFunction,
    gelu_mul: CudaFunction,
    swiglu_oai_mul: CudaFunction,
    add_scaled: CudaFunction,
    add_bias: CudaFunction,
    scale: CudaFunction,
    softcap: CudaFunction,
    embed: CudaFunction,
    put_rows: CudaFunction,
    kv_append: CudaFunction,
    kv_copy: CudaFunction,
    attention: CudaFunction,
    argmax: CudaFunction,
    sample: CudaFunction,
    /// (weight type, gemv?) -> kernel.
    matmul: Vec<(GgmlType, bool, CudaFunction)>,
    moe_router_f32: CudaFunction,
    moe_route: CudaFunction,
    moe_add_bias: CudaFunction,
    moe_combine: CudaFunction,
    /// Expert weight type -> its `moe_gemv_*`.
    moe_gemv: Vec<(GgmlType, CudaFunction)>,
    short_conv: CudaFunction,
    conv_silu: CudaFunction,
    l2_norm_heads: CudaFunction,
    /// Head size -> its `delta_rule_d*`.
    delta_rule: Vec<(usize, CudaFunction)>,
    split_query: CudaFunction,
    output_gate: CudaFunction,
}

/// kernels/recurrent.cu CONV_THREADS.
const CONV_THREADS: usize = 256;
/// kernels/recurrent.cu CONV_MAX_TAPS: the most positions a convolution kernel spans.
pub const CONV_MAX_TAPS: usize = 16;
/// kernels/recurrent.cu DN_ROWS: state rows per warp of `delta_rule_d*`.
const DN_ROWS: usize = 8;
/// The DeltaNet head sizes with a `delta_rule_d*` kernel.
pub const DELTA_HEAD_DIMS: [usize; 2] = [64, 128];

/// Where a recurrent op's state is: the pool's slots (`slot_floats` f32 each), the op's part
/// at `offset` floats within a slot, and the step's sequences and saves (workspace `Meta`).
#[derive(Clone, Copy, Debug)]
pub struct StateArgs {
    pub states: Ptr,
    pub slot_floats: usize,
    pub offset: usize,
    pub seqs: Ptr,
    pub saves: Ptr,
    /// Sequences of the step (grid rows).
    pub count: usize,
}

impl StateArgs {
    /// The state's arguments, in the order every recurrent kernel takes them: `float *states,
    /// long long slot_floats, long long state_off, const int *seqs, const int *saves`.
    fn args(&self) -> [Arg; 5] {
        [
            Addr(self.states),
            Long(self.slot_floats as i64),
            Long(self.offset as i64),
            Addr(self.seqs),
            Addr(self.saves),
        ]
    }
}

/// A gated DeltaNet layer's inputs and weights for `delta_rule_d*`.
#[derive(Clone, Copy, Debug)]
pub struct DeltaRuleArgs {
    pub mix: Ptr,
    pub beta: Ptr,
    pub alpha: Ptr,
    pub z: Ptr,
    pub dt_bias: Ptr,
    pub a: Ptr,
    pub norm: Ptr,
    pub eps: f32,
    pub head_dim: usize,
    pub k_heads: usize,
    pub v_heads: usize,
}

impl Kernels {
    /// Looks up every kernel a model with pages of `kv_type` and heads of `head_dim` needs.
    pub fn new(dev: &CudaDevice, kv_type: KvType, head_dim: usize) -> Result<Kernels, String> {
        let f = |name: &str| {
            dev.function(name)
                .cloned()
                .ok_or_else(|| format!("kernel {name} is not loaded"))
        };
        let attention = format!("attention_{}_d{head_dim}", kv_type.name());
        let moe_gemv = MATMUL_TYPES
            .into_iter()
            .chain([GgmlType::MXFP4])
            .map(|ty| Ok((ty, f(moe_gemv_kernel(ty).expect("an expert type"))?)))
            .collect::<Result<_, String>>()?;
        let mut matmul = Vec::new();
        for ty in MATMUL_TYPES {
            for (gemv, n) in [(true, 1), (false, 64)] {
                let name = matmul_kernel(ty, n).expect("a CUDA matmul type");
                matmul.push((ty, gemv, f(name)?));
            }
        }
        let delta_rule = DELTA_HEAD_DIMS
            .into_iter()
            .map(|d| Ok((d, f(&format!("delta_rule_d{d}"))?)))
            .collect::<Result<_, String>>()?;
        Ok(Kernels {
            short_conv: f("short_conv")?,
            conv_silu: f("conv_silu")?,
            l2_norm_heads: f("l2_norm_heads")?,
            delta_rule,
            split_query: f("split_query")?,
            output_gate: f("output_gate")?,
            quantize: f("quantize_q8_1")?,
            rmsnorm: f("rmsnorm")?,
            rope: f("rope")?,
            hadamard: f("hadamard_64")?,
            silu_mul: f("silu_mul")?,
            gelu_mul: f("gelu_mul")?,
            swiglu_oai_mul: f("swiglu_oai_mul")?,
            add_scaled: f("add_scaled")?,
            add_bias: f("add_bias")?,
            scale: f("scale")?,
            softcap: f("softcap")?,
            embed: f("embed")?,
            put_rows: f("put_rows")?,
            kv_append: f("kv_append")?,
            kv_copy: f("kv_copy_block")?,
            attention: f(&attention)?,
            argmax: f("argmax_rows")?,
            sample: f("sample_rows")?,
            matmul,
            moe_router_f32: f("moe_router_f32")?,
            moe_route: f("moe_route")?,
            moe_add_bias: f("moe_add_bias")?,
            moe_combine: f("moe_combine")?,
            moe_gemv,
        })
    }

    /// act (q8_1, rows x cols/32 blocks) <- x (rows x cols f32).
    pub fn quantize(
        &self,
        s: &CudaStream,
        x: Ptr,
        act: Ptr,
        rows: usize,
        cols: usize,
    ) -> Result<(), String> {
        // SAFETY: quantize_q8_1(const float *x, u8 *y, int rows, int cols); one warp per block
        // of 32 values; the caller sized both buffers.
        unsafe {
            launch(
                s,
                &self.quantize,
                "quantize_q8_1",
                cfg1(rows * cols, THREADS),
                &[Addr(x), Addr(act), Int(rows as i32), Int(cols as i32)],
            )
        }
    }

    /// y (n_tok x rows) <- W (rows x cols, type `ty`) times the q8_1 activations: the GEMV up
    /// to GEMV_MAX_TOK tokens, the GEMM above.
    pub fn matmul(
        &self,
        s: &CudaStream,
        ty: GgmlType,
        w: Ptr,
        act: Ptr,
        y: Ptr,
        rows: usize,
        cols: usize,
        n_tok: usize,
    ) -> Result<(), String> {
        let name = matmul_kernel(ty, n_tok).ok_or_else(|| format!("no CUDA matmul for {ty}"))?;
        let gemv = name.starts_with("gemv");
        let f = &self
            .matmul
            .iter()
            .find(|(t, g, _)| *t == ty && *g == gemv)
            .ok_or_else(|| format!("{name} not loaded"))?
            .2;
        let cfg = if gemv {
            gemv_config(rows)
        } else {
            gemm_config(rows, n_tok)
        };
        // SAFETY: gemv_*/gemm_*(const u8 *w, const u8 *act, float *y, int rows, int cols,
        // int n_tok), launch shapes from launch.rs.
        unsafe {
            launch(
                s,
                f,
                name,
                cfg,
                &[
                    Addr(w),
                    Addr(act),
                    Addr(y),
                    Int(rows as i32),
                    Int(cols as i32),
                    Int(n_tok as i32),
                ],
            )
        }
    }

    /// out (rows x n) <- RMSNorm(x) * w. `out` may be `x`.
    pub fn rmsnorm(
        &self,
        s: &CudaStream,
        x: Ptr,
        w: Ptr,
        out: Ptr,
        rows: usize,
        n: usize,
        eps: f32,
    ) -> Result<(), String> {
        rmsnorm(s, &self.rmsnorm, x, w, out, rows, n, eps)
    }

    /// RoPE in place on x (n_tok x n_heads x head_dim) from the (cos, sin) table cs.
    pub fn rope(
        &self,
        s: &CudaStream,
        x: Ptr,
        cs: Ptr,
        n_tok: usize,
        n_heads: usize,
        head_dim: usize,
        n_rot: usize,
        neox: bool,
    ) -> Result<(), String> {
        rope(
            s,
            &self.rope,
            x,
            cs,
            (n_tok, n_heads, head_dim),
            n_rot,
            neox,
        )
    }

    /// The 64-wide Walsh-Hadamard rotation of every chunk of x (`values` a multiple of 64).
    pub fn hadamard(&self, s: &CudaStream, x: Ptr, values: usize) -> Result<(), String> {
        let chunks = (values / 64) as i64;
        // SAFETY: hadamard_64(float *x, long long n_chunks); one warp per chunk, 8 warps per
        // block (HAD_WARPS_MAX is 32).
        unsafe {
            launch(
                s,
                &self.hadamard,
                "hadamard_64",
                cfg1(chunks as usize * 32, THREADS),
                &[Addr(x), Long(chunks)],
            )
        }
    }

    /// gate <- act(gate) * up over n values.
    pub fn glu(
        &self,
        s: &CudaStream,
        act: Activation,
        gate: Ptr,
        up: Ptr,
        n: usize,
    ) -> Result<(), String> {
        let (f, name) = match act {
            Activation::Silu => (&self.silu_mul, "silu_mul"),
            Activation::GeluTanh => (&self.gelu_mul, "gelu_mul"),
            Activation::SwigluOai => (&self.swiglu_oai_mul, "swiglu_oai_mul"),
        };
        glu(s, (f, name), gate, up, n)
    }

    /// x += y * scale over n values.
    pub fn add_scaled(
        &self,
        s: &CudaStream,
        x: Ptr,
        y: Ptr,
        scale: f32,
        n: usize,
    ) -> Result<(), String> {
        add_scaled(s, &self.add_scaled, x, y, scale, n)
    }

    /// Every `cols`-wide row of x (n values in all) += b.
    pub fn add_bias(
        &self,
        s: &CudaStream,
        x: Ptr,
        b: Ptr,
        n: usize,
        cols: usize,
    ) -> Result<(), String> {
        add_bias(s, &self.add_bias, x, b, n, cols)
    }

    /// x <- x * v (`softcap`: cap * tanh(x / cap), with v the cap) over n values.
    pub fn scale(
        &self,
        s: &CudaStream,
        softcap: bool,
        x: Ptr,
        v: f32,
        n: usize,
    ) -> Result<(), String> {
        let (f, name) = if softcap {
            (&self.softcap, "softcap")
        } else {
            (&self.scale, "scale")
        };
        // SAFETY: scale / softcap(float *x, float v, long long n).
        unsafe {
            launch(
                s,
                f,
                name,
                cfg1(n, THREADS),
                &[Addr(x), Float(v), Long(n as i64)],
            )
        }
    }

    /// out (n_tok x cols) <- rows tokens[t] of the embedding table w (type ty), times `scale`.
    pub fn embed(
        &self,
        s: &CudaStream,
        w: Ptr,
        ty: GgmlType,
        row_bytes: usize,
        cols: usize,
        tokens: Ptr,
        scale: f32,
        out: Ptr,
        n_tok: usize,
    ) -> Result<(), String> {
        // SAFETY: embed(const u8 *w, int ty, long long row_bytes, int cols, const int *tokens,
        // float scale, float *out); grid (ceil(cols / block), n_tok).
        unsafe {
            launch(
                s,
                &self.embed,
                "embed",
                per_row(cols, n_tok),
                &[
                    Addr(w),
                    Int(ty.id() as i32),
                    Long(row_bytes as i64),
                    Int(cols as i32),
                    Addr(tokens),
                    Float(scale),
                    Addr(out),
                ],
            )
        }
    }

    /// Input rows into `out` (rows of `cols`): row i of `rows` (rows `stride` apart, its values
    /// from `offset`) becomes, or with `add` is added to, row `tokens[i]`, for i < n.
    pub fn put_rows(
        &self,
        s: &CudaStream,
        out: Ptr,
        (rows, stride, offset): (Ptr, usize, usize),
        tokens: Ptr,
        n: usize,
        cols: usize,
        add: bool,
    ) -> Result<(), String> {
        if n == 0 {
            return Ok(());
        }
        // SAFETY: put_rows(float *out, const float *rows, const int *tokens, int cols,
        // long long stride, long long offset, int add); grid (ceil(cols / block), n).
        unsafe {
            launch(
                s,
                &self.put_rows,
                "put_rows",
                per_row(cols, n),
                &[
                    Addr(out),
                    Addr(rows),
                    Addr(tokens),
                    Int(cols as i32),
                    Long(stride as i64),
                    Long(offset as i64),
                    Int(add as i32),
                ],
            )
        }
    }

    /// Writes n_tok tokens' K and V rows (n_tok x kv_heads x head_dim each) into their slots.
    pub fn kv_append(
        &self,
        s: &CudaStream,
        k: Ptr,
        v: Ptr,
        slots: Ptr,
        n_tok: usize,
        pages: Ptr,
        layer: usize,
        blocks: usize,
        kv_heads: usize,
        head_dim: usize,
        block_size: usize,
        kv_type: KvType,
    ) -> Result<(), String> {
        let warps = n_tok * 2 * kv_heads * (head_dim / 32);
        let kt = kv_type_id(kv_type);
        // SAFETY: kv_append(const float *k, const float *v, const int *slots, int n_tok,
        // u8 *pages, int layer, int blocks, int kv_heads, int head_dim, int block_size,
        // int kv_type); one warp per (token, part, head, 32 values).
        unsafe {
            launch(
                s,
                &self.kv_append,
                "kv_append",
                cfg1(warps * 32, THREADS),
                &[
                    Addr(k),
                    Addr(v),
                    Addr(slots),
                    Int(n_tok as i32),
                    Addr(pages),
                    Int(layer as i32),
                    Int(blocks as i32),
                    Int(kv_heads as i32),
                    Int(head_dim as i32),
                    Int(block_size as i32),
                    Int(kt),
                ],
            )
        }
    }

    /// Copies every layer's rows of block src to block dst.
    pub fn kv_copy_block(
        &self,
        s: &CudaStream,
        pages: Ptr,
        layers: usize,
        blocks: usize,
        span: usize,
        src: usize,
        dst: usize,
    ) -> Result<(), String> {
        // SAFETY: kv_copy_block(u8 *pages, int layers, int blocks, long long span, int src,
        // int dst); one thread per 16-bit word per layer.
        unsafe {
            launch(
                s,
                &self.kv_copy,
                "kv_copy_block",
                cfg1(layers * span / 2, THREADS),
                &[
                    Addr(pages),
                    Int(layers as i32),
                    Int(blocks as i32),
                    Long(span as i64),
                    Int(src as i32),
                    Int(dst as i32),
                ],
            )
        }
    }

    /// out (n_tok x n_head x head_dim) <- causal attention of q over the paged K/V, each token
    /// seeing the `window` positions up to its own (0: all of them) and on through its
    /// `through` entry; `sinks`: n_head f32 logits joined to each head's softmax denominator,
    /// or 0 for none.
    pub fn attention(
        &self,
        s: &CudaStream,
        q: Ptr,
        out: Ptr,
        pages: Ptr,
        tables: Ptr,
        table_offsets: Ptr,
        (positions, through): (Ptr, Ptr),
        n_tok: usize,
        layer: usize,
        blocks: usize,
        n_head: usize,
        kv_heads: usize,
        block_size: usize,
        scale: f32,
        window: usize,
        sinks: Ptr,
    ) -> Result<(), String> {
        // SAFETY: attention_*(const float *q, float *out, const u8 *pages,
        // const int *block_tables, const int *table_offsets, const int *positions,
        // const int *through, int layer, int blocks, int n_head, int kv_heads, int block_size,
        // float scale, int window, const float *sinks); one block of 32 * ATT_WARPS threads per (token, KV head).
        unsafe {
            launch(
                s,
                &self.attention,
                "attention",
                LaunchConfig {
                    grid_dim: ((n_tok * kv_heads) as u32, 1, 1),
                    block_dim: (ATT_THREADS as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    Addr(q),
                    Addr(out),
                    Addr(pages),
                    Addr(tables),
                    Addr(table_offsets),
                    Addr(positions),
                    Addr(through),
                    Int(layer as i32),
                    Int(blocks as i32),
                    Int(n_head as i32),
                    Int(kv_heads as i32),
                    Int(block_size as i32),
                    Float(scale),
                    Int(window as i32),
                    Addr(sinks),
                ],
            )
        }
    }

    /// y (n_tok x n_expert) <- the f32 router w (n_expert x cols) times x (n_tok x cols).
    pub fn moe_router_f32(
        &self,
        s: &CudaStream,
        w: Ptr,
        x: Ptr,
        y: Ptr,
        n_expert: usize,
        cols: usize,
        n_tok: usize,
    ) -> Result<(), String> {
        // SAFETY: moe_router_f32(const float *w, const float *x, float *y, int n_expert,
        // int cols, int n_tok); one warp per (token, expert), ROUTER_WARPS per block.
        unsafe {
            launch(
                s,
                &self.moe_router_f32,
                "moe_router_f32",
                cfg1(n_tok * n_expert * 32, 32 * ROUTER_WARPS),
                &[
                    Addr(w),
                    Addr(x),
                    Addr(y),
                    Int(n_expert as i32),
                    Int(cols as i32),
                    Int(n_tok as i32),
                ],
            )
        }
    }

    /// ids, wts (n_tok x routing.used) <- each token's picks from its router logits
    /// (n_tok x n_expert) and their weights.
    pub fn moe_route(
        &self,
        s: &CudaStream,
        logits: Ptr,
        n_expert: usize,
        routing: Routing,
        ids: Ptr,
        wts: Ptr,
        n_tok: usize,
    ) -> Result<(), String> {
        // moe.cu GATING_SOFTMAX_THEN_TOP_K / GATING_TOP_K_THEN_SOFTMAX.
        let gating = match routing.gating {
            Gating::SoftmaxThenTopK => 0i32,
            Gating::TopKThenSoftmax => 1,
        };
        // SAFETY: moe_route(const float *logits, int n_expert, int used, int gating,
        // int normalize, float scale, int *ids, float *wts, int n_tok); one thread per token.
        unsafe {
            launch(
                s,
                &self.moe_route,
                "moe_route",
                cfg1(n_tok, 64),
                &[
                    Addr(logits),
                    Int(n_expert as i32),
                    Int(routing.used as i32),
                    Int(gating),
                    Int(routing.normalize as i32),
                    Float(routing.scale),
                    Addr(ids),
                    Addr(wts),
                    Int(n_tok as i32),
                ],
            )
        }
    }

    /// y (pairs x rows) <- for each pair p, expert ids[p]'s matrix (type `ty`, rows x cols,
    /// at w + ids[p] * expert_bytes) times q8_1 activation row p / act_div.
    pub fn moe_gemv(
        &self,
        s: &CudaStream,
        ty: GgmlType,
        w: Ptr,
        expert_bytes: usize,
        ids: Ptr,
        act: Ptr,
        act_div: usize,
        y: Ptr,
        rows: usize,
        cols: usize,
        pairs: usize,
    ) -> Result<(), String> {
        let f = &self
            .moe_gemv
            .iter()
            .find(|(t, _)| *t == ty)
            .ok_or_else(|| format!("no CUDA expert kernel for {ty}"))?
            .1;
        if pairs > MOE_MAX_PAIRS {
            return Err(format!(
                "{pairs} expert pairs in one step (at most {MOE_MAX_PAIRS})"
            ));
        }
        // SAFETY: moe_gemv_*(const u8 *w, long long expert_bytes, const int *ids,
        // const u8 *act, int act_div, float *y, int rows, int cols); grid (row blocks, pairs),
        // pairs checked above; the ids come from moe_route, below the expert count.
        unsafe {
            launch(
                s,
                f,
                "moe_gemv",
                moe_gemv_config(rows, pairs),
                &[
                    Addr(w),
                    Long(expert_bytes as i64),
                    Addr(ids),
                    Addr(act),
                    Int(act_div as i32),
                    Addr(y),
                    Int(rows as i32),
                    Int(cols as i32),
                ],
            )
        }
    }

    /// Each pair's row of x (pairs x cols) += row ids[pair] of b (n_expert x cols).
    pub fn moe_add_bias(
        &self,
        s: &CudaStream,
        x: Ptr,
        b: Ptr,
        ids: Ptr,
        pairs: usize,
        cols: usize,
    ) -> Result<(), String> {
        // SAFETY: moe_add_bias(float *x, const float *b, const int *ids, long long n,
        // int cols); one thread per value.
        unsafe {
            launch(
                s,
                &self.moe_add_bias,
                "moe_add_bias",
                cfg1(pairs * cols, THREADS),
                &[
                    Addr(x),
                    Addr(b),
                    Addr(ids),
                    Long((pairs * cols) as i64),
                    Int(cols as i32),
                ],
            )
        }
    }

    /// out (n_tok x cols) <- each token's pair rows of y weighted by wts and summed in order.
    pub fn moe_combine(
        &self,
        s: &CudaStream,
        y: Ptr,
        wts: Ptr,
        out: Ptr,
        used: usize,
        cols: usize,
        n_tok: usize,
    ) -> Result<(), String> {
        // SAFETY: moe_combine(const float *y, const float *wts, float *out, int used,
        // int cols, long long n); one thread per value of out.
        unsafe {
            launch(
                s,
                &self.moe_combine,
                "moe_combine",
                cfg1(n_tok * cols, THREADS),
                &[
                    Addr(y),
                    Addr(wts),
                    Addr(out),
                    Int(used as i32),
                    Int(cols as i32),
                    Long((n_tok * cols) as i64),
                ],
            )
        }
    }

    /// c <- c * conv(b * x) per channel (n channels), each sequence's causal convolution over
    /// its state slot's rows, then its span's (LFM2's short convolution).
    pub fn short_conv(
        &self,
        s: &CudaStream,
        (b, x, c): (Ptr, Ptr, Ptr),
        st: StateArgs,
        kernel: Ptr,
        taps: usize,
        n: usize,
    ) -> Result<(), String> {
        // SAFETY: short_conv(const float *b, const float *x, float *c, float *states,
        // long long slot_floats, long long state_off, const int *seqs, const int *saves,
        // const float *kernel, int taps, int n); grid (ceil(n / CONV_THREADS), sequences).
        // The step's slots were checked against the pool's.
        unsafe {
            launch(
                s,
                &self.short_conv,
                "short_conv",
                conv_config(n, st.count),
                &[
                    &[Addr(b), Addr(x), Addr(c)][..],
                    &st.args(),
                    &[Addr(kernel), Int(taps as i32), Int(n as i32)],
                ]
                .concat(),
            )
        }
    }

    /// mix <- SiLU of each sequence's causal convolution of its n channels over its state
    /// slot's rows, then its span's (a gated DeltaNet's q, k and v).
    pub fn conv_silu(
        &self,
        s: &CudaStream,
        mix: Ptr,
        st: StateArgs,
        kernel: Ptr,
        taps: usize,
        n: usize,
    ) -> Result<(), String> {
        // SAFETY: conv_silu(float *mix, float *states, long long slot_floats,
        // long long state_off, const int *seqs, const int *saves, const float *kernel,
        // int taps, int n); grid (ceil(n / CONV_THREADS), sequences).
        unsafe {
            launch(
                s,
                &self.conv_silu,
                "conv_silu",
                conv_config(n, st.count),
                &[
                    &[Addr(mix)][..],
                    &st.args(),
                    &[Addr(kernel), Int(taps as i32), Int(n as i32)],
                ]
                .concat(),
            )
        }
    }

    /// The first `heads` heads (of `hd`) of every `stride`-wide row of x L2-normalised.
    pub fn l2_norm_heads(
        &self,
        s: &CudaStream,
        x: Ptr,
        (stride, heads, hd): (usize, usize, usize),
        eps: f32,
        rows: usize,
    ) -> Result<(), String> {
        // SAFETY: l2_norm_heads(float *x, int stride, int heads, int hd, float eps,
        // long long rows); one warp per (row, head).
        unsafe {
            launch(
                s,
                &self.l2_norm_heads,
                "l2_norm_heads",
                cfg1(rows * heads * 32, THREADS),
                &[
                    Addr(x),
                    Int(stride as i32),
                    Int(heads as i32),
                    Int(hd as i32),
                    Float(eps),
                    Long(rows as i64),
                ],
            )
        }
    }

    /// The gated delta rule of every sequence's span and value head, carried in the state
    /// slots, each token's output gated-normed over z.
    pub fn delta_rule(
        &self,
        s: &CudaStream,
        p: &DeltaRuleArgs,
        st: StateArgs,
    ) -> Result<(), String> {
        let f = &self
            .delta_rule
            .iter()
            .find(|(d, _)| *d == p.head_dim)
            .ok_or_else(|| format!("no delta_rule kernel for heads of {}", p.head_dim))?
            .1;
        // SAFETY: delta_rule_d*(const float *mix, const float *beta, const float *alpha,
        // float *z, const float *dt_bias, const float *a, const float *norm, float eps,
        // int k_heads, int v_heads, float *states, long long slot_floats, long long state_off,
        // const int *seqs, const int *saves); grid (v_heads, sequences), head_dim / DN_ROWS
        // warps.
        unsafe {
            launch(
                s,
                f,
                "delta_rule",
                LaunchConfig {
                    grid_dim: (p.v_heads as u32, st.count as u32, 1),
                    block_dim: ((p.head_dim / DN_ROWS * 32) as u32, 1, 1),
                    shared_mem_bytes: 0,
                },
                &[
                    &[
                        Addr(p.mix),
                        Addr(p.beta),
                        Addr(p.alpha),
                        Addr(p.z),
                        Addr(p.dt_bias),
                        Addr(p.a),
                        Addr(p.norm),
                        Float(p.eps),
                        Int(p.k_heads as i32),
                        Int(p.v_heads as i32),
                    ][..],
                    &st.args(),
                ]
                .concat(),
            )
        }
    }

    /// q (n values) <- the query halves of mix's packed query and gate heads of `hd`
    /// (`gate` false); or attn (n values) *= σ of the gate halves (`gate` true).
    pub fn query_gate(
        &self,
        s: &CudaStream,
        gate: bool,
        mix: Ptr,
        out: Ptr,
        hd: usize,
        n: usize,
    ) -> Result<(), String> {
        let (f, name) = if gate {
            (&self.output_gate, "output_gate")
        } else {
            (&self.split_query, "split_query")
        };
        let (first, second) = if gate { (out, mix) } else { (mix, out) };
        // SAFETY: split_query(const float *mix, float *q, int hd, long long n) and
        // output_gate(float *attn, const float *mix, int hd, long long n): one thread per
        // value of q / attn.
        unsafe {
            launch(
                s,
                f,
                name,
                cfg1(n, THREADS),
                &[Addr(first), Addr(second), Int(hd as i32), Long(n as i64)],
            )
        }
    }

    /// out[r] <- argmax of logits row r (rows x n).
    pub fn argmax(
        &self,
        s: &CudaStream,
        logits: Ptr,
        n: usize,
        out: Ptr,
        rows: usize,
    ) -> Result<(), String> {
        // SAFETY: argmax_rows(const float *logits, int n, u32 *out); one block per row.
        unsafe {
            launch(
                s,
                &self.argmax,
                "argmax_rows",
                argmax_config(rows),
                &[Addr(logits), Int(n as i32), Addr(out)],
            )
        }
    }

    /// out[r] <- a token drawn from row r with the parameters params[r] (SampleRow layout).
    pub fn sample(
        &self,
        s: &CudaStream,
        logits: Ptr,
        n: usize,
        params: Ptr,
        out: Ptr,
        rows: usize,
    ) -> Result<(), String> {
        // SAFETY: sample_rows(const float *logits, int n, const SampleRow *params, u32 *out);
        // one block per row.
        unsafe {
            launch(
                s,
                &self.sample,
                "sample_rows",
                sample_config(rows),
                &[Addr(logits), Int(n as i32), Addr(params), Addr(out)],
            )
        }
    }
}

/// A convolution kernel's grid: channels in blocks of CONV_THREADS, one row per sequence.
fn conv_config(n: usize, seqs: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(CONV_THREADS) as u32, seqs as u32, 1),
        block_dim: (CONV_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// kernels/common.cuh KV_F16 / KV_Q8_0 / KV_Q4_0.
fn kv_type_id(t: KvType) -> i32 {
    match t {
        KvType::F16 => 0,
        KvType::Q8_0 => 1,
        KvType::Q4_0 => 2,
    }
}

// Launches the vision encoder's ops (`encoder_ops.rs`) share with the forward pass.

/// out (rows x n) <- RMSNorm(x) * w with `f` the `rmsnorm` kernel. `out` may be `x`.
pub(super) fn rmsnorm(
    s: &CudaStream,
    f: &CudaFunction,
    x: Ptr,
    w: Ptr,
    out: Ptr,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<(), String> {
    // SAFETY: rmsnorm(const float *x, const float *w, float *out, int n, float eps); one
    // block of NORM_THREADS per row.
    unsafe {
        launch(
            s,
            f,
            "rmsnorm",
            norm_rows(rows),
            &[Addr(x), Addr(w), Addr(out), Int(n as i32), Float(eps)],
        )
    }
}

/// RoPE in place on x (`n_tok` x `n_heads` x `head_dim`, the shape) from the (cos, sin)
/// table cs, with `f` the `rope` kernel.
pub(super) fn rope(
    s: &CudaStream,
    f: &CudaFunction,
    x: Ptr,
    cs: Ptr,
    (n_tok, n_heads, head_dim): (usize, usize, usize),
    n_rot: usize,
    neox: bool,
) -> Result<(), String> {
    let total = n_tok * n_heads * (n_rot / 2);
    if total == 0 {
        return Ok(());
    }
    // SAFETY: rope(float *x, const float *cs, int n_tok, int n_heads, int head_dim,
    // int n_rot, int neox); one thread per (token, head, pair).
    unsafe {
        launch(
            s,
            f,
            "rope",
            cfg1(total, THREADS),
            &[
                Addr(x),
                Addr(cs),
                Int(n_tok as i32),
                Int(n_heads as i32),
                Int(head_dim as i32),
                Int(n_rot as i32),
                Int(neox as i32),
            ],
        )
    }
}

/// gate <- act(gate) * up over n values, `f` (named) a gated activation's kernel.
pub(super) fn glu(
    s: &CudaStream,
    (f, name): (&CudaFunction, &str),
    gate: Ptr,
    up: Ptr,
    n: usize,
) -> Result<(), String> {
    // SAFETY: silu_mul / gelu_mul / swiglu_oai_mul(float *gate, const float *up,
    // long long n).
    unsafe {
        launch(
            s,
            f,
            name,
            cfg1(n, THREADS),
            &[Addr(gate), Addr(up), Long(n as i64)],
        )
    }
}

/// x += y * scale over n values, `f` the `add_scaled` kernel.
pub(super) fn add_scaled(
    s: &CudaStream,
    f: &CudaFunction,
    x: Ptr,
    y: Ptr,
    scale: f32,
    n: usize,
) -> Result<(), String> {
    // SAFETY: add_scaled(float *x, const float *y, float s, long long n).
    unsafe {
        launch(
            s,
            f,
            "add_scaled",
            cfg1(n, THREADS),
            &[Addr(x), Addr(y), Float(scale), Long(n as i64)],
        )
    }
}

/// Every `cols`-wide row of x (n values in all) += b, `f` the `add_bias` kernel.
pub(super) fn add_bias(
    s: &CudaStream,
    f: &CudaFunction,
    x: Ptr,
    b: Ptr,
    n: usize,
    cols: usize,
) -> Result<(), String> {
    // SAFETY: add_bias(float *x, const float *b, long long n, int cols).
    unsafe {
        launch(
            s,
            f,
            "add_bias",
            cfg1(n, THREADS),
            &[Addr(x), Addr(b), Long(n as i64), Int(cols as i32)],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_type_ids_are_common_cuh() {
        let src = super::super::kernels::COMMON;
        for (t, name) in [
            (KvType::F16, "KV_F16"),
            (KvType::Q8_0, "KV_Q8_0"),
            (KvType::Q4_0, "KV_Q4_0"),
        ] {
            assert!(
                src.contains(&format!("#define {name} {}", kv_type_id(t))),
                "{name}"
            );
        }
        let att = super::super::kernels::file_of("attention_f16_d64")
            .unwrap()
            .body;
        assert!(att.contains(&format!("#define ATT_WARPS {}", ATT_THREADS / 32)));
        let norm = super::super::kernels::file_of("rmsnorm").unwrap().body;
        assert!(norm.contains(&format!("#define NORM_THREADS {NORM_THREADS}")));
        let rope = super::super::kernels::file_of("hadamard_64").unwrap().body;
        assert!(rope.contains("#define HAD_WARPS_MAX 32") && THREADS / 32 <= 32);
        let rec = super::super::kernels::file_of("short_conv").unwrap().body;
        for (name, v) in [
            ("CONV_THREADS", CONV_THREADS),
            ("CONV_MAX_TAPS", CONV_MAX_TAPS),
            ("DN_ROWS", DN_ROWS),
            ("SEQ_INTS", super::super::workspace::SEQ_INTS),
            ("SAVE_INTS", super::super::workspace::SAVE_INTS),
        ] {
            assert!(rec.contains(&format!("#define {name} {v}\n")), "{name}");
        }
        for d in DELTA_HEAD_DIMS {
            assert!(rec.contains(&format!("DELTA_RULE_KERNEL(delta_rule_d{d}, {d})")));
        }
    }
}
