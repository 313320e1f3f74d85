// attention.cu: causal attention over the paged KV pool for decode tokens and prefill chunks,
// reading f16, q8_0 or q4_0 pages in place through each token's block table (GQA: the query
// heads that share a KV head are scored together, so each K/V row is read once for all of them).
// A layer with a sliding window sees only the last `window` positions (itself included); its
// table's entries before them may be gone (src/kv/layout.rs NO_BLOCK) and are never read.
//
// One thread block of ATT_WARPS warps per (token, KV head). The positions first..=pos are cut
// into tiles of 32; warp w takes tiles w, w + ATT_WARPS, ...: each lane scores one position (its K
// row against every query head of the group), the warp updates its online softmax once per
// tile, then walks the tile's positions in order adding V rows (each lane owning head_dim/32
// output dimensions). At the end the warps' partial softmax states are merged in shared memory.
//
// Arithmetic: f32 throughout with accurate expf; the CPU's per-row path (f16 query, ggml's lane
// order, f16 accumulator) is not reproduced, so results agree to f16-accumulation precision,
// not bit for bit. Quantized pages hold Hadamard-rotated K/V: the caller rotates q before and the
// output after (rope.cu `hadamard_64`), as src/model/forward.rs does.

#define ATT_WARPS 4
#define ATT_MAX_REP 8      // query heads per KV head at most (the host checks)...
#define ATT_MAX_REP_D256 4 // ...and at D = 256, where eight heads' accumulators spill on sm_87
                           // (every Gemma 3 size has at most 4)
// __launch_bounds__(128, 1) below: without the minimum-blocks hint ptxas picked 72-96 registers
// for some of these kernels and spilled (sm_90); with it, 123-255 registers and no spill.
// Occupancy tuning waits for a GPU to measure on.

// DPL consecutive values of one page row from dimension d0 (d0 a multiple of DPL), dequantized
// as src/kv/page_format.rs `decode_row` does.
template <int KT, int DPL>
__device__ __forceinline__ void load_dims(const u8 *row, int d0, float *v) {
    if (KT == KV_F16) {
        const u16 *h = (const u16 *)row + d0;
#pragma unroll
        for (int i = 0; i < DPL; ++i) v[i] = f16_to_f32(h[i]);
    } else if (KT == KV_Q8_0) {
        const u8 *b = row + (d0 / QK) * BYTES_Q8_0;
        const float d = f16_to_f32(ld_u16(b));
        const i8 *q = (const i8 *)(b + 2 + d0 % QK);
#pragma unroll
        for (int i = 0; i < DPL; ++i) v[i] = __fmul_rn((float)q[i], d);
    } else {
        const u8 *b = row + (d0 / QK) * BYTES_Q4_0;
        const float d = f16_to_f32(ld_u16(b));
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
            const int j = d0 % QK + i;
            const u8 q = b[2 + (j & 15)];
            v[i] = __fmul_rn((float)((j < 16 ? (q & 0xF) : (q >> 4)) - 8), d);
        }
    }
}

// q, out: n_tok x n_head x D (q already rotated); block_tables: every token's table, token t's
// starting at table_offsets[t]; positions[t]: the token's position, through[t]: the last
// position it attends to (its own, or an image's last where the image's positions see each
// other): it attends to first..=through[t], first = max(0, positions[t] + 1 - window) or 0
// without a window (window = 0), whose K/V must already be in the pages: kv.cu `kv_append`
// runs first; sinks: per query head, a logit
// that joins the softmax's denominator only (gpt-oss), or null. Grid: n_tok * kv_heads blocks
// of 32 * ATT_WARPS threads.
template <int KT, int D>
__device__ __forceinline__ void attention_body(
    const float *__restrict__ q, float *__restrict__ out, const u8 *__restrict__ pages,
    const int *__restrict__ block_tables, const int *__restrict__ table_offsets,
    const int *__restrict__ positions, const int *__restrict__ through, int layer, int blocks,
    int n_head, int kv_heads, int block_size, float scale, int window,
    const float *__restrict__ sinks) {
    constexpr int DPL = D / WARP;
    constexpr int R = D >= 256 ? ATT_MAX_REP_D256 : ATT_MAX_REP;
    __shared__ float q_sh[R][D];
    __shared__ float sm_acc[ATT_WARPS][R][D];
    __shared__ float sm_m[ATT_WARPS][R];
    __shared__ float sm_l[ATT_WARPS][R];
    const float NEG_INF = __uint_as_float(0xff800000u);

    const int g = blockIdx.x % kv_heads;
    const long long t = blockIdx.x / kv_heads;
    const int rep = n_head / kv_heads;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int pos = through[t];
    const int first = window > 0 ? max(0, positions[t] + 1 - window) : 0;
    const int n_ctx = pos + 1 - first; // positions seen, from `first`
    const int *table = block_tables + table_offsets[t];
    const int row_bytes = kv_row_bytes(KT, D);
    const u64 head_bytes = (u64)block_size * row_bytes;
    const u64 v_delta = (u64)kv_heads * head_bytes; // V rows follow the K rows of a block

    const float *qg = q + (t * n_head + (long long)g * rep) * D;
    for (int i = threadIdx.x; i < rep * D; i += blockDim.x) q_sh[i / D][i % D] = qg[i];
    __syncthreads();

    float m[R], l[R], acc[R][DPL];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.0f;
    }

    const int n_tiles = (n_ctx + WARP - 1) / WARP;
    for (int tile = warp; tile < n_tiles; tile += ATT_WARPS) {
        const int p = first + tile * WARP + lane;
        const bool valid = p <= pos;
        u64 k_off = 0;
        float s[R];
#pragma unroll
        for (int r = 0; r < R; ++r) s[r] = 0.0f;
        if (valid) {
            const int blk = table[p / block_size];
            k_off = kv_head_offset(layer, blocks, blk, 0, kv_heads, g, head_bytes) +
                    (u64)(p % block_size) * row_bytes;
            const u8 *krow = pages + k_off;
#pragma unroll
            for (int d0 = 0; d0 < D; d0 += 4) {
                float kv[4];
                load_dims<KT, 4>(krow, d0, kv);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    if (r < rep) {
#pragma unroll
                        for (int i = 0; i < 4; ++i) s[r] = fmaf(q_sh[r][d0 + i], kv[i], s[r]);
                    }
                }
            }
        }
        float pr[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            pr[r] = 0.0f;
            if (r < rep) {
                const float sc = valid ? s[r] * scale : NEG_INF;
                const float m_new = fmaxf(m[r], warp_max(sc));
                const float alpha = expf(m[r] - m_new); // 0 on the first tile (m = -inf)
                pr[r] = valid ? expf(sc - m_new) : 0.0f;
                l[r] = fmaf(l[r], alpha, warp_sum(pr[r]));
                m[r] = m_new;
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc[r][i] *= alpha;
            }
        }
        const int len = min(WARP, n_ctx - tile * WARP);
        for (int j = 0; j < len; ++j) {
            const u64 v_off = __shfl_sync(0xffffffffu, k_off, j) + v_delta;
            float vv[DPL];
            load_dims<KT, DPL>(pages + v_off, lane * DPL, vv);
#pragma unroll
            for (int r = 0; r < R; ++r) {
                if (r < rep) {
                    const float pj = __shfl_sync(0xffffffffu, pr[r], j);
#pragma unroll
                    for (int i = 0; i < DPL; ++i) acc[r][i] = fmaf(pj, vv[i], acc[r][i]);
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; ++r) {
        if (r < rep) {
            if (lane == 0) {
                sm_m[warp][r] = m[r];
                sm_l[warp][r] = l[r];
            }
#pragma unroll
            for (int i = 0; i < DPL; ++i) sm_acc[warp][r][lane * DPL + i] = acc[r][i];
        }
    }
    __syncthreads();
    float *og = out + (t * n_head + (long long)g * rep) * D;
    for (int i = threadIdx.x; i < rep * D; i += blockDim.x) {
        const int r = i / D, d = i % D;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) mx = fmaxf(mx, sm_m[w][r]);
        float sum = 0.0f, o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; ++w) {
            const float f = expf(sm_m[w][r] - mx); // 0 for a warp that had no tile
            sum = fmaf(sm_l[w][r], f, sum);
            o = fmaf(sm_acc[w][r][d], f, o);
        }
        if (sinks != nullptr) {
            // The head's sink logit joins the denominator (src/backend/cpu/attention.rs
            // `with_sink`): the output so far is rescaled to the larger maximum.
            const float sk = sinks[g * rep + r];
            const float m2 = fmaxf(mx, sk);
            const float f = expf(mx - m2);
            sum = fmaf(sum, f, expf(sk - m2));
            o *= f;
        }
        og[i] = sum > 0.0f ? o / sum : 0.0f;
    }
}

#define ATTENTION_KERNEL(NAME, KT, D)                                                          \
    extern "C" __global__ void __launch_bounds__(32 * ATT_WARPS, 1) NAME(                      \
        const float *__restrict__ q, float *__restrict__ out, const u8 *__restrict__ pages,    \
        const int *__restrict__ block_tables, const int *__restrict__ table_offsets,           \
        const int *__restrict__ positions, const int *__restrict__ through, int layer,         \
        int blocks, int n_head, int kv_heads, int block_size, float scale, int window,         \
        const float *__restrict__ sinks) {                                                     \
        attention_body<KT, D>(q, out, pages, block_tables, table_offsets, positions, through,  \
                              layer, blocks, n_head, kv_heads, block_size, scale, window,      \
                              sinks);                                                          \
    }

ATTENTION_KERNEL(attention_f16_d64, KV_F16, 64)
ATTENTION_KERNEL(attention_q8_0_d64, KV_Q8_0, 64)
ATTENTION_KERNEL(attention_q4_0_d64, KV_Q4_0, 64)
ATTENTION_KERNEL(attention_f16_d128, KV_F16, 128)
ATTENTION_KERNEL(attention_q8_0_d128, KV_Q8_0, 128)
ATTENTION_KERNEL(attention_q4_0_d128, KV_Q4_0, 128)
ATTENTION_KERNEL(attention_f16_d256, KV_F16, 256)
ATTENTION_KERNEL(attention_q8_0_d256, KV_Q8_0, 256)
ATTENTION_KERNEL(attention_q4_0_d256, KV_Q4_0, 256)
