// recurrent.cu: the layers of hybrid models that keep a recurrent state instead of KV pages,
// as the CPU computes them: LFM2's short convolution (src/backend/cpu/short_conv.rs
// `conv_span`), Qwen3.5's gated DeltaNet (src/backend/cpu/delta_net.rs: the convolution with
// SiLU, q and k L2-normalised, the gated delta rule one token at a time, the RMSNorm gated by
// SiLU(z)) and its attention layers' query/gate split and sigmoid output gate
// (src/backend/cpu/step.rs).
//
// A sequence's state lives in its state slot of the pool (`states`: slots of `slot_floats`
// f32 values each; a layer's part starts at `state_off` within a slot). Which slot, and where
// its span lies in the step, the kernels read from the step's metadata (src/backend/cuda/
// step_meta.rs), not from launch arguments, so a captured decode graph replays with the next
// step's slots:
// - seqs[s * SEQ_INTS + SEQ_*]: sequence s's span (first token, tokens), its state slot,
//   whether the span starts the sequence (then its state starts at zero, whatever the slot
//   held), and its snapshot saves (the first and how many);
// - saves[j * SAVE_INTS + SAVE_*]: a save's tokens of the span before it and its slot: the
//   state after those tokens is written there too (a prefix-cache snapshot).

#define SEQ_INTS 6
#define SEQ_START 0
#define SEQ_LEN 1
#define SEQ_SLOT 2
#define SEQ_FRESH 3
#define SEQ_SAVE_FIRST 4
#define SEQ_SAVES 5
#define SAVE_INTS 2
#define SAVE_AFTER 0
#define SAVE_SLOT 1

// Positions a convolution spans at most (the loaders take up to 16).
#define CONV_MAX_TAPS 16
#define CONV_THREADS 256

// SiLU as the CPU's delta_net.rs `silu`: x / (1 + expf_v(0 - x)).
__device__ __forceinline__ float silu_v(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, expf_v(__fsub_rn(0.0f, x))));
}

__device__ __forceinline__ float *slot_part(float *states, long long slot_floats, int slot,
                                            long long off) {
    return states + (long long)slot * slot_floats + off;
}

// Channel j's `d` state rows (rows of n, oldest first) from `win` to `to`.
__device__ __forceinline__ void conv_store(const float *win, int d, float *to, int n, int j) {
#pragma unroll
    for (int k = 0; k < CONV_MAX_TAPS - 1; ++k) {
        if (k < d) to[(long long)k * n + j] = win[k];
    }
}

// The causal convolution of one sequence's channel j (thread j of grid row s). `win` holds the
// `taps - 1` rows before the current token (oldest first); each sum is an f32 sum over the
// taps from the oldest, each product rounded on its own (the CPU's, bit for bit).
// SILU: the input is `io` itself, replaced by SiLU of the sum (a DeltaNet's q, k and v); else
// the input is b * x and `io` (C) is multiplied by the sum (LFM2).
template <bool SILU>
__device__ __forceinline__ void conv_channel(const float *b, const float *x, float *io,
                                             float *states, long long slot_floats,
                                             long long state_off, const int *seq,
                                             const int *saves, const float *kernel, int taps,
                                             int n, int j) {
    const int start = seq[SEQ_START], len = seq[SEQ_LEN], d = taps - 1;
    float *state = slot_part(states, slot_floats, seq[SEQ_SLOT], state_off);
    float win[CONV_MAX_TAPS - 1], w[CONV_MAX_TAPS];
#pragma unroll
    for (int k = 0; k < CONV_MAX_TAPS; ++k) {
        if (k < taps) w[k] = kernel[(long long)j * taps + k];
        if (k < d) win[k] = seq[SEQ_FRESH] ? 0.0f : state[(long long)k * n + j];
    }
    for (int t = 0;; ++t) {
        // Snapshots after t tokens: the window is the state there.
        for (int q = seq[SEQ_SAVE_FIRST]; q < seq[SEQ_SAVE_FIRST] + seq[SEQ_SAVES]; ++q) {
            if (saves[q * SAVE_INTS + SAVE_AFTER] == t) {
                const int to = saves[q * SAVE_INTS + SAVE_SLOT];
                conv_store(win, d, slot_part(states, slot_floats, to, state_off), n, j);
            }
        }
        if (t == len) break;
        const long long i = (long long)(start + t) * n + j;
        const float v = SILU ? io[i] : __fmul_rn(b[i], x[i]);
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < CONV_MAX_TAPS - 1; ++k) {
            if (k < d) sum = __fadd_rn(sum, __fmul_rn(win[k], w[k]));
        }
        sum = __fadd_rn(sum, __fmul_rn(v, w[d]));
        io[i] = SILU ? silu_v(sum) : __fmul_rn(io[i], sum);
#pragma unroll
        for (int k = 0; k < CONV_MAX_TAPS - 1; ++k) {
            if (k + 1 < d) win[k] = win[k + 1];
            if (k == d - 1) win[k] = v;
        }
    }
    conv_store(win, d, state, n, j);
}

// LFM2: c = c * conv(b * x) over n channels (b, x, c: rows of n per token). Grid
// (ceil(n / CONV_THREADS), sequences), CONV_THREADS threads.
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
    short_conv(const float *__restrict__ b, const float *__restrict__ x, float *c, float *states,
               long long slot_floats, long long state_off, const int *__restrict__ seqs,
               const int *__restrict__ saves, const float *__restrict__ kernel, int taps,
               int n) {
    const int j = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (j >= n) return;
    conv_channel<false>(b, x, c, states, slot_floats, state_off, seqs + blockIdx.y * SEQ_INTS,
                        saves, kernel, taps, n, j);
}

// A gated DeltaNet's q, k and v channels (rows of n per token) replaced by SiLU of their
// causal convolution. Grid (ceil(n / CONV_THREADS), sequences), CONV_THREADS threads.
extern "C" __global__ void __launch_bounds__(CONV_THREADS)
    conv_silu(float *mix, float *states, long long slot_floats, long long state_off,
              const int *__restrict__ seqs, const int *__restrict__ saves,
              const float *__restrict__ kernel, int taps, int n) {
    const int j = blockIdx.x * CONV_THREADS + threadIdx.x;
    if (j >= n) return;
    conv_channel<true>(nullptr, nullptr, mix, states, slot_floats, state_off,
                       seqs + blockIdx.y * SEQ_INTS, saves, kernel, taps, n, j);
}

// The first `heads` heads of hd values in every row (`stride` floats) of x divided by their L2
// norm, as delta_net.rs `l2_normalize`: squares summed in f64, their mean in f32, times
// 1 / sqrt(mean + eps / hd), then times 1 / sqrt(hd). One warp per (row, head); any 1-D grid
// of whole warps covering rows * heads warps.
extern "C" __global__ void l2_norm_heads(float *x, int stride, int heads, int hd, float eps,
                                         long long rows) {
    const long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= rows * heads) return;
    float *v = x + (w / heads) * stride + (w % heads) * hd;
    double sum = 0.0;
    for (int i = lane; i < hd; i += WARP) sum += (double)__fmul_rn(v[i], v[i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float n = (float)hd;
    const float mean = (float)(sum / (double)hd);
    const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn(mean, __fdiv_rn(eps, n))));
    const float after = __fdiv_rn(1.0f, sqrtf(n));
    for (int i = lane; i < hd; i += WARP) v[i] = __fmul_rn(__fmul_rn(v[i], scale), after);
}

// ggml's softplus: ln(1 + e^x), x itself above 20.
__device__ __forceinline__ float softplus(float x) {
    return x > 20.0f ? x : logf(__fadd_rn(1.0f, expf(x)));
}

// Rows of a head's state matrix each warp keeps in registers (row j: column j of the d_k x d_v
// matrix S, d_k values, as ggml stores it): a block of HD / DN_ROWS warps holds the head.
#define DN_ROWS 8

// What one block of the delta rule reads beside the state.
struct DeltaArgs {
    const float *mix;     // convolved channels: q (k_heads x HD), k (same), v (v_heads x HD)
    const float *beta;    // per token and value head, the beta and alpha logits
    const float *alpha;
    float *z;             // per token v_heads x HD: z in, the gated-normed output out
    const float *dt_bias; // per value head
    const float *a;
    const float *norm;    // HD values, shared by the heads
    float eps;
    int k_heads, v_heads;
};

// The state's rows of this warp, from (or to) a slot's head matrix.
template <int HD>
__device__ __forceinline__ void dn_load(float (&s)[DN_ROWS][HD / 32], const float *m, int row0,
                                        int lane) {
#pragma unroll
    for (int r = 0; r < DN_ROWS; ++r)
#pragma unroll
        for (int e = 0; e < HD / 32; ++e) s[r][e] = m[(row0 + r) * HD + lane + 32 * e];
}

template <int HD>
__device__ __forceinline__ void dn_store(const float (&s)[DN_ROWS][HD / 32], float *m, int row0,
                                         int lane) {
#pragma unroll
    for (int r = 0; r < DN_ROWS; ++r)
#pragma unroll
        for (int e = 0; e < HD / 32; ++e) m[(row0 + r) * HD + lane + 32 * e] = s[r][e];
}

// One token of the gated delta rule on this warp's rows: S *= exp(softplus(alpha + dt_bias)
// * a); S += k (x) sigmoid(beta)(v - S^T k); o = S^T q / sqrt(d_k) into o_sh.
template <int HD>
__device__ __forceinline__ void dn_token(float (&s)[DN_ROWS][HD / 32], const DeltaArgs &p,
                                         long long tok, int h, int row0, int lane,
                                         float *o_sh) {
    constexpr int E = HD / 32;
    const int key_dim = p.k_heads * HD, kh = h % p.k_heads;
    const float *row = p.mix + tok * (2 * key_dim + p.v_heads * HD);
    float q[E], k[E];
#pragma unroll
    for (int e = 0; e < E; ++e) {
        q[e] = row[kh * HD + lane + 32 * e];
        k[e] = row[key_dim + kh * HD + lane + 32 * e];
    }
    const long long bh = tok * p.v_heads + h;
    const float decay = expf(__fmul_rn(softplus(__fadd_rn(p.alpha[bh], p.dt_bias[h])), p.a[h]));
    const float beta = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-p.beta[bh])));
    const float scale = __fdiv_rn(1.0f, sqrtf((float)HD));
#pragma unroll
    for (int r = 0; r < DN_ROWS; ++r) {
        float sk = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            s[r][e] = __fmul_rn(s[r][e], decay);
            sk = fmaf(s[r][e], k[e], sk);
        }
        sk = warp_sum(sk);
        const float v = row[2 * key_dim + h * HD + row0 + r];
        const float delta = __fmul_rn(__fsub_rn(v, sk), beta);
        float o = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) {
            s[r][e] = fmaf(k[e], delta, s[r][e]);
            o = fmaf(s[r][e], q[e], o);
        }
        o = warp_sum(o);
        if (lane == 0) o_sh[row0 + r] = __fmul_rn(o, scale);
    }
}

// z = RMSNorm(o) * norm * SiLU(z) for one token's head (delta_net.rs `gated_rmsnorm`): squares
// summed in f64 (each warp sums all of them), the mean in f32.
template <int HD>
__device__ __forceinline__ void dn_gated_norm(const float *o_sh, const DeltaArgs &p,
                                              long long tok, int h) {
    const int lane = threadIdx.x & 31;
    double sum = 0.0;
#pragma unroll
    for (int e = 0; e < HD / 32; ++e) {
        const float o = o_sh[lane + 32 * e];
        sum += (double)__fmul_rn(o, o);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const float mean = (float)(sum / (double)HD);
    const float scale = __fdiv_rn(1.0f, sqrtf(__fadd_rn(mean, p.eps)));
    const int j = threadIdx.x;
    if (j < HD) {
        float *z = p.z + (tok * p.v_heads + h) * HD + j;
        *z = __fmul_rn(__fmul_rn(__fmul_rn(o_sh[j], scale), p.norm[j]), silu_v(*z));
    }
}

// The gated delta rule over one sequence's span for value head blockIdx.x (value head h reads
// key head h mod k_heads), sequence blockIdx.y, from the head's matrix in the state slot
// (zero where the span starts the sequence); snapshots written after the tokens they name;
// the matrix left in the slot. Each token's output is gated-normed over z. HD / DN_ROWS warps.
template <int HD>
__device__ __forceinline__ void delta_rule_block(const DeltaArgs &p, float *states,
                                                 long long slot_floats, long long state_off,
                                                 const int *seqs, const int *saves) {
    __shared__ float o_sh[HD];
    const int h = blockIdx.x, lane = threadIdx.x & 31, row0 = (threadIdx.x >> 5) * DN_ROWS;
    const int *seq = seqs + blockIdx.y * SEQ_INTS;
    const long long head_off = state_off + (long long)h * HD * HD;
    float s[DN_ROWS][HD / 32];
    if (seq[SEQ_FRESH]) {
#pragma unroll
        for (int r = 0; r < DN_ROWS; ++r)
#pragma unroll
            for (int e = 0; e < HD / 32; ++e) s[r][e] = 0.0f;
    } else {
        dn_load<HD>(s, slot_part(states, slot_floats, seq[SEQ_SLOT], head_off), row0, lane);
    }
    for (int t = 0;; ++t) {
        for (int q = seq[SEQ_SAVE_FIRST]; q < seq[SEQ_SAVE_FIRST] + seq[SEQ_SAVES]; ++q) {
            if (saves[q * SAVE_INTS + SAVE_AFTER] == t) {
                const int to = saves[q * SAVE_INTS + SAVE_SLOT];
                dn_store<HD>(s, slot_part(states, slot_floats, to, head_off), row0, lane);
            }
        }
        if (t == seq[SEQ_LEN]) break;
        const long long tok = seq[SEQ_START] + t;
        dn_token<HD>(s, p, tok, h, row0, lane, o_sh);
        __syncthreads();
        dn_gated_norm<HD>(o_sh, p, tok, h);
        // o_sh is rewritten by the next token.
        __syncthreads();
    }
    dn_store<HD>(s, slot_part(states, slot_floats, seq[SEQ_SLOT], head_off), row0, lane);
}

// Grid (v_heads, sequences), HD / DN_ROWS warps per block.
#define DELTA_RULE_KERNEL(NAME, HD)                                                            \
    extern "C" __global__ void __launch_bounds__(HD / DN_ROWS * 32)                            \
        NAME(const float *__restrict__ mix, const float *__restrict__ beta,                    \
             const float *__restrict__ alpha, float *z, const float *__restrict__ dt_bias,     \
             const float *__restrict__ a, const float *__restrict__ norm, float eps,           \
             int k_heads, int v_heads, float *states, long long slot_floats,                   \
             long long state_off, const int *__restrict__ seqs,                                \
             const int *__restrict__ saves) {                                                  \
        const DeltaArgs p = {mix, beta, alpha, z, dt_bias, a, norm, eps, k_heads, v_heads};    \
        delta_rule_block<HD>(p, states, slot_floats, state_off, seqs, saves);                 \
    }

DELTA_RULE_KERNEL(delta_rule_d64, 64)
DELTA_RULE_KERNEL(delta_rule_d128, 128)

// Qwen3.5's gated attention: its query matmul gives per head hd query values then hd gate
// values (rows of 2 * n_head * hd). q = the query halves; the gates stay where they are, for
// output_gate. One thread per value of q (n values).
extern "C" __global__ void split_query(const float *__restrict__ mix, float *__restrict__ q,
                                       int hd, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    q[i] = mix[(i / hd) * 2 * hd + i % hd];
}

// attn *= sigmoid(gate), the gate of each value in the packed query rows split_query read:
// a * (1 / (1 + exp(-g))), as the CPU. One thread per value of attn (n values).
extern "C" __global__ void output_gate(float *attn, const float *__restrict__ mix, int hd,
                                       long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = mix[(i / hd) * 2 * hd + hd + i % hd];
    attn[i] = __fmul_rn(attn[i], __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-g))));
}
