// gemm.cu: quantized weight matrix x q8_1 activations for prefill and batched decode, on the
// tensor cores: y[t * rows + r] = sum over the row's blocks of dot(W[r], a[t]), the same
// contract as gemv.cu (which stays the path for 1..GEMV_MAX_TOK tokens).
//
// Launch contract (src/backend/cuda/launch.rs `gemm_config` mirrors it):
//   gemm_{q4_0,q4_1,q5_0,q8_0,q4_k,q6_k}(const u8 *w, const u8 *act, float *y,
//                                    int rows, int cols, int n_tok)
//   grid  = (ceil(rows / GEMM_BM), ceil(n_tok / GEMM_BN)), block = GEMM_THREADS,
//   shared memory: static only (about 21 KiB), nothing dynamic.
//   w: rows x cols weights in their GGUF blocks, read in place (row-major, rows contiguous);
//   act: n_tok rows of cols/32 q8_1 blocks (quantize.cu); y: n_tok x rows f32.
//   cols is a multiple of 32 (of 256 for Q4_K and Q6_K); rows and n_tok are anything >= 1.
//
// Why int8 MMA on q8_1 activations (llama.cpp's MMQ approach) rather than dequantizing to f16
// tiles and m16n8k16 f16 MMA:
// - the numbers are gemv.cu's: the same q8_1 activations, the same exact integer dot per
//   32-value block, the same per-block scales applied in f32 (only the f32 summation order
//   differs), so a prompt's logits do not change with the number of tokens in the launch;
// - one m16n8k32 MMA is exactly one quant block (or one Q4_K sub-block): every scale applies
//   to one MMA result, and integer tensor cores do twice the f16 rate on sm_80+;
// - the activations are already quantized once per matmul by quantize_q8_1 for the GEMV.
// The cost is an f32 epilogue per 32-value block (convert, scale, add) that f16 MMA would not
// have; for this appliance's small models (hidden sizes of a few hundred) that is cheap next
// to the weight reads.
//
// Tiling: each thread block computes GEMM_BM weight rows x GEMM_BN tokens. Each of its
// GEMM_WARPS warps owns 16 rows against all the block's tokens (GEMM_BN / 8 MMA tiles), so a
// weight fragment is read from global memory once by the one warp that uses it, straight
// into registers in the MMA's A layout (no shared-memory copy: no other warp needs it).
// The activations are shared by all warps: each K stage (GEMM_KB blocks of 32 values, one
// K-quant super-block) stages GEMM_BN tokens' q8_1 blocks in shared memory, padded so that
// the B-fragment loads are free of bank conflicts.
//
// Before sm_80 (no int8 m16n8k32 MMA) the same tiles run with the MMA emulated by dp4a: each
// lane gathers the A row and B columns its four outputs need with warp shuffles. That is
// slower than a dp4a kernel written for it (8 shuffles per 8 dp4a), but it computes the same
// numbers from the same code, and only pre-Ampere discrete GPUs take it (Jetson Orin is
// sm_87).

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_WARPS 4
#define GEMM_THREADS (32 * GEMM_WARPS)
#define GEMM_MIN_BLOCKS 4 // per SM (<= 128 registers, 4 x 21 KiB of shared memory): with no such
                          // bound ptxas spilled gemm_q4_0 at 80 registers
#define GEMM_KB 8                     // 32-value blocks per K stage
#define GEMM_NT (GEMM_BN / 8)         // MMA tiles (8 tokens each) per warp
#define GEMM_QS_STRIDE (8 * GEMM_KB + 4) // words per staged token: 4 pad words shift each token
                                      // by 4 banks, so the 32 lanes of a fragment load hit 32

static_assert(GEMM_BM == 16 * GEMM_WARPS, "each warp owns 16 rows (one MMA tile)");
static_assert(GEMM_BN % 8 == 0, "tokens come in MMA tiles of 8");

#define M4 0x0F0F0F0F
#define ONES 0x01010101

// Four unsigned bytes x (each below 0x80 + o) minus o each, as four signed bytes: no borrow
// crosses a byte because x + 0x80 - o never exceeds 0xFF per byte.
__device__ __forceinline__ int sub_bias(int x, int o) {
    return (int)(((u32)x + (u32)(0x80 - o) * 0x01010101u) ^ 0x80808080u);
}

// ---- the MMAs -------------------------------------------------------------------------------
// Fragments (PTX ISA, mma.m16n8k32 .s8; g = lane / 4, t = lane % 4):
//   A (16 x 32, row): a[0] = row g,   k 4t..4t+3     a[1] = row g+8, k 4t..4t+3
//                     a[2] = row g,   k 16+4t..      a[3] = row g+8, k 16+4t..
//   B (32 x 8, col):  b0 = token g, k 4t..4t+3       b1 = token g, k 16+4t..
//   C (16 x 8, s32):  c[0] = (g, 2t)  c[1] = (g, 2t+1)  c[2] = (g+8, 2t)  c[3] = (g+8, 2t+1)
// m16n8k16 .s8 uses the first halves: A {a[0], a[1]}, B b0 (or A {a[2], a[3]}, B b1).

__device__ __forceinline__ void mma_k32(int c[4], const int a[4], int b0, int b1) {
#if __CUDA_ARCH__ >= 800 && defined(EDGELM_EMU)
    emu::mma_m16n8k32_s8(c, a, b0, b1);
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    // Lane 4g+u holds row g's (and g+8's) k chunk u of A, and token g's k chunk u of B.
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    c[0] = c[1] = c[2] = c[3] = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int ra = 4 * g + u, rb0 = 8 * t + u, rb1 = 8 * t + 4 + u;
        const int x0 = __shfl_sync(0xffffffffu, a[0], ra), x2 = __shfl_sync(0xffffffffu, a[2], ra);
        const int x1 = __shfl_sync(0xffffffffu, a[1], ra), x3 = __shfl_sync(0xffffffffu, a[3], ra);
        const int p0 = __shfl_sync(0xffffffffu, b0, rb0), p1 = __shfl_sync(0xffffffffu, b1, rb0);
        const int q0 = __shfl_sync(0xffffffffu, b0, rb1), q1 = __shfl_sync(0xffffffffu, b1, rb1);
        c[0] = dp4a(x2, p1, dp4a(x0, p0, c[0]));
        c[1] = dp4a(x2, q1, dp4a(x0, q0, c[1]));
        c[2] = dp4a(x3, p1, dp4a(x1, p0, c[2]));
        c[3] = dp4a(x3, q1, dp4a(x1, q0, c[3]));
    }
#endif
}

__device__ __forceinline__ void mma_k16(int c[4], int a0, int a1, int b0) {
#if __CUDA_ARCH__ >= 800 && defined(EDGELM_EMU)
    emu::mma_m16n8k16_s8(c, a0, a1, b0);
#elif __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
        "{%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    c[0] = c[1] = c[2] = c[3] = 0;
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int ra = 4 * g + u;
        const int x0 = __shfl_sync(0xffffffffu, a0, ra), x1 = __shfl_sync(0xffffffffu, a1, ra);
        const int p = __shfl_sync(0xffffffffu, b0, 8 * t + u);
        const int q = __shfl_sync(0xffffffffu, b0, 8 * t + 4 + u);
        c[0] = dp4a(x0, p, c[0]);
        c[1] = dp4a(x0, q, c[1]);
        c[2] = dp4a(x1, p, c[2]);
        c[3] = dp4a(x1, q, c[3]);
    }
#endif
}

// ---- weight fragments -----------------------------------------------------------------------
// One 32-value block of rows g and g+8 as int8 in the A layout, with what turns the integer
// dot into the block's contribution (per row i = 0 for g, 1 for g+8):
//   Q4_0, Q5_0, Q8_0: d * da * dot                (the -8 / -16 are folded into the int8 values)
//   Q4_1:       d * da * dot + m * sa             (sa = the q8_1 block's s = f16(da * sum))
//   Q4_K:       da * (d * dot - m * sum)          (d, m = super d * sc, dmin * min; sum exact)
//   Q6_K:       da * (d * dot_lo + e * dot_hi)    (two 16-value scales; -32 folded in)
struct WFrag {
    int a[4];
    float d[2], e[2], m[2];
};

template <int T> struct Layout;
template <> struct Layout<GGML_Q4_0> { static constexpr int bytes = BYTES_Q4_0, per = 1; };
template <> struct Layout<GGML_Q4_1> { static constexpr int bytes = BYTES_Q4_1, per = 1; };
template <> struct Layout<GGML_Q5_0> { static constexpr int bytes = BYTES_Q5_0, per = 1; };
template <> struct Layout<GGML_Q8_0> { static constexpr int bytes = BYTES_Q8_0, per = 1; };
template <> struct Layout<GGML_Q4_K> { static constexpr int bytes = BYTES_Q4_K, per = 8; };
template <> struct Layout<GGML_Q6_K> { static constexpr int bytes = BYTES_Q6_K, per = 8; };

// Block `kb` (in 32-value units) of row `wr` for row slot i of the fragment; t = lane % 4.
template <int T>
__device__ __forceinline__ void load_w(WFrag &f, int i, const u8 *wr, int kb, int t) {
    if constexpr (T == GGML_Q4_0) {
        const u8 *b = wr + (long long)kb * BYTES_Q4_0;
        f.d[i] = f16_to_f32(ld_u16(b));
        const int q = ld_i32_a2(b + 2 + 4 * t); // values 4t.. (low nibbles), 16+4t.. (high)
        f.a[i] = sub_bias(q & M4, 8);
        f.a[2 + i] = sub_bias((int)(((u32)q >> 4) & M4), 8);
    } else if constexpr (T == GGML_Q4_1) {
        const u8 *b = wr + (long long)kb * BYTES_Q4_1;
        f.d[i] = f16_to_f32(ld_u16(b));
        f.m[i] = f16_to_f32(ld_u16(b + 2));
        const int q = ld_i32_a4(b + 4 + 4 * t);
        f.a[i] = q & M4;
        f.a[2 + i] = (int)(((u32)q >> 4) & M4);
    } else if constexpr (T == GGML_Q5_0) {
        const u8 *b = wr + (long long)kb * BYTES_Q5_0;
        f.d[i] = f16_to_f32(ld_u16(b));
        const u32 qh = (u32)ld_i32_a2(b + 2);
        const int q = ld_i32_a2(b + 6 + 4 * t); // values 4t.. (low nibbles), 16+4t.. (high)
        f.a[i] = sub_bias((q & M4) | spread_bit4(qh >> (4 * t)), 16);
        f.a[2 + i] = sub_bias((int)(((u32)q >> 4) & M4) | spread_bit4(qh >> (16 + 4 * t)), 16);
    } else if constexpr (T == GGML_Q8_0) {
        const u8 *b = wr + (long long)kb * BYTES_Q8_0;
        f.d[i] = f16_to_f32(ld_u16(b));
        f.a[i] = ld_i32_a2(b + 2 + 4 * t);
        f.a[2 + i] = ld_i32_a2(b + 2 + 16 + 4 * t);
    } else if constexpr (T == GGML_Q4_K) {
        // Sub-block s of the super-block: the low (s even) or high nibbles of qs[32(s/2)..].
        const int s = kb & 7;
        const u8 *b = wr + (long long)(kb >> 3) * BYTES_Q4_K;
        const u8 *sc = b + 4;
        int scale, min;
        if (s < 4) { // get_scale_min_k4 (src/quant/formats/blocks.rs unpack_scale_min_k4)
            scale = sc[s] & 63;
            min = sc[s + 4] & 63;
        } else {
            scale = (sc[s + 4] & 0xF) | ((sc[s - 4] >> 6) << 4);
            min = (sc[s + 4] >> 4) | ((sc[s] >> 6) << 4);
        }
        f.d[i] = f16_to_f32(ld_u16(b)) * (float)scale;
        f.m[i] = f16_to_f32(ld_u16(b + 2)) * (float)min;
        const u8 *qs = b + 16 + 32 * (s >> 1);
        const int sh = 4 * (s & 1);
        f.a[i] = (int)(((u32)ld_i32_a4(qs + 4 * t) >> sh) & M4);
        f.a[2 + i] = (int)(((u32)ld_i32_a4(qs + 16 + 4 * t) >> sh) & M4);
    } else {
        // Q6_K: block s = 4h + k is values 128h + 32k + l: low 4 bits in ql[64h + 32(k & 1) + l]
        // (low nibble for k < 2), high 2 bits at bit 2k of qh[32h + l]; scale sc[8h + 2k + l/16].
        const int s = kb & 7, h = s >> 2, k = s & 3;
        const u8 *b = wr + (long long)(kb >> 3) * BYTES_Q6_K;
        const float d = f16_to_f32(ld_u16(b + 208));
        const i8 *sc = (const i8 *)(b + 192) + 8 * h + 2 * k;
        f.d[i] = d * (float)sc[0];
        f.e[i] = d * (float)sc[1];
        const u8 *ql = b + 64 * h + 32 * (k & 1);
        const u8 *qh = b + 128 + 32 * h;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const u32 lo = ((u32)ld_i32_a2(ql + 16 * half + 4 * t) >> (4 * (k >> 1))) & M4;
            const u32 hi = (((u32)ld_i32_a2(qh + 16 * half + 4 * t) >> (2 * k)) & 0x03030303u) << 4;
            f.a[2 * half + i] = sub_bias((int)(lo | hi), 32);
        }
    }
}

// The block's contribution for fragment row i and token k of the pair (da, sa: that token's
// q8_1 d, and s or the exact sum), given the MMA results.
template <int T>
__device__ __forceinline__ float contrib(const WFrag &f, int i, int c, int c_hi, float da,
                                         float sa, float acc) {
    if constexpr (T == GGML_Q4_0 || T == GGML_Q5_0 || T == GGML_Q8_0) {
        return fmaf(f.d[i] * da, (float)c, acc);
    } else if constexpr (T == GGML_Q4_1) {
        return fmaf(f.d[i] * da, (float)c, fmaf(f.m[i], sa, acc));
    } else if constexpr (T == GGML_Q4_K) {
        return fmaf(da, fmaf(f.d[i], (float)c, -f.m[i] * sa), acc);
    } else {
        return fmaf(da, fmaf(f.d[i], (float)c, f.e[i] * (float)c_hi), acc);
    }
}

// ---- the tile -------------------------------------------------------------------------------
// Two floats read as one 8-byte shared-memory load (no CUDA header, so no float2).
struct alignas(8) F2 {
    float x, y;
};

template <int T>
__device__ __forceinline__ void gemm_tile(const u8 *__restrict__ w, const u8 *__restrict__ act,
                                          float *__restrict__ y, int rows, int cols, int n_tok) {
    // Staged activations of one K stage: int8 values, then each block's d and s (or its exact
    // sum for Q4_K) at [block][token], so a lane's two tokens 2t, 2t+1 are one 8-byte load.
    __shared__ int s_qs[GEMM_BN * GEMM_QS_STRIDE];
    __shared__ F2 s_d2[GEMM_KB * GEMM_BN / 2];
    __shared__ F2 s_s2[GEMM_KB * GEMM_BN / 2];
    float *s_d = &s_d2[0].x, *s_s = &s_s2[0].x;

    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int m0 = blockIdx.x * GEMM_BM + warp * 16; // this warp's first row
    const int n0 = blockIdx.y * GEMM_BN;             // the block's first token
    const int nb = cols / QK;                        // 32-value blocks per row
    const int n_here = min(GEMM_BN, n_tok - n0);
    const int nt = (n_here + 7) >> 3;                // MMA tiles with at least one real token
    const int staged = 8 * nt;                       // tokens staged (the rest are never read)
    const long long row_bytes = (long long)(nb / Layout<T>::per) * Layout<T>::bytes;
    const long long act_row = (long long)nb * BYTES_Q8_1;
    // Rows past the end read the last row (valid memory); their results are not stored.
    const u8 *wr0 = w + (long long)min(m0 + g, rows - 1) * row_bytes;
    const u8 *wr1 = w + (long long)min(m0 + g + 8, rows - 1) * row_bytes;
    const bool active = m0 < rows; // warp-uniform: MMAs need the whole warp

    float acc[GEMM_NT][4];
#pragma unroll
    for (int j = 0; j < GEMM_NT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;

    for (int kb0 = 0; kb0 < nb; kb0 += GEMM_KB) {
        const int kb_here = min(GEMM_KB, nb - kb0);
        __syncthreads(); // every warp is done with the previous stage
        // 9 words per q8_1 block: word 0 = (d, s) as two f16, words 1..8 = the 32 int8.
        const u8 *src = act + (long long)n0 * act_row + (long long)kb0 * BYTES_Q8_1;
        for (int i = threadIdx.x; i < staged * 9 * GEMM_KB; i += GEMM_THREADS) {
            const int tok = i / (9 * GEMM_KB), rest = i - tok * (9 * GEMM_KB);
            const int blk = rest / 9, word = rest - blk * 9;
            if (blk >= kb_here) continue;
            const bool real = tok < n_here;
            const int v = real ? ld_i32_a4(src + tok * act_row + rest * 4) : 0;
            if (word == 0) {
                s_d[blk * GEMM_BN + tok] = f16_to_f32((u16)v);
                s_s[blk * GEMM_BN + tok] = f16_to_f32((u16)((u32)v >> 16));
            } else {
                s_qs[tok * GEMM_QS_STRIDE + blk * 8 + word - 1] = v;
            }
        }
        if constexpr (T == GGML_Q4_K) {
            // The min term takes the exact integer sum of the activations, as gemv.cu does.
            __syncthreads();
            for (int i = threadIdx.x; i < staged * GEMM_KB; i += GEMM_THREADS) {
                const int tok = i / GEMM_KB, blk = i - tok * GEMM_KB;
                if (blk >= kb_here) continue;
                const int *q = s_qs + tok * GEMM_QS_STRIDE + blk * 8;
                int sum = 0;
#pragma unroll
                for (int k = 0; k < 8; ++k) sum = dp4a(ONES, q[k], sum);
                s_s[blk * GEMM_BN + tok] = (float)sum;
            }
        }
        __syncthreads();
        if (!active) continue;

        // The next block's weights are loaded while this one's MMAs run.
        WFrag f;
        load_w<T>(f, 0, wr0, kb0, t);
        load_w<T>(f, 1, wr1, kb0, t);
        for (int b = 0; b < kb_here; ++b) {
            WFrag next;
            const int kn = kb0 + min(b + 1, kb_here - 1);
            load_w<T>(next, 0, wr0, kn, t);
            load_w<T>(next, 1, wr1, kn, t);
#pragma unroll
            for (int j = 0; j < GEMM_NT; ++j) {
                if (j >= nt) break; // uniform across the block
                const int *q = s_qs + (8 * j + g) * GEMM_QS_STRIDE + 8 * b + t;
                int c[4], h[4];
                if constexpr (T == GGML_Q6_K) {
                    mma_k16(c, f.a[0], f.a[1], q[0]);
                    mma_k16(h, f.a[2], f.a[3], q[4]);
                } else {
                    mma_k32(c, f.a, q[0], q[4]);
                    h[0] = h[1] = h[2] = h[3] = 0;
                }
                const int tk = b * GEMM_BN + 8 * j + 2 * t; // tokens 2t, 2t+1 of tile j
                const F2 da = s_d2[tk >> 1];
                const F2 sa = s_s2[tk >> 1];
                acc[j][0] = contrib<T>(f, 0, c[0], h[0], da.x, sa.x, acc[j][0]);
                acc[j][1] = contrib<T>(f, 0, c[1], h[1], da.y, sa.y, acc[j][1]);
                acc[j][2] = contrib<T>(f, 1, c[2], h[2], da.x, sa.x, acc[j][2]);
                acc[j][3] = contrib<T>(f, 1, c[3], h[3], da.y, sa.y, acc[j][3]);
            }
            f = next;
        }
    }

    if (!active) return;
    const int r0 = m0 + g, r1 = m0 + g + 8;
#pragma unroll
    for (int j = 0; j < GEMM_NT; ++j) {
        const int ta = n0 + 8 * j + 2 * t, tb = ta + 1;
        if (ta < n_tok && r0 < rows) y[(long long)ta * rows + r0] = acc[j][0];
        if (tb < n_tok && r0 < rows) y[(long long)tb * rows + r0] = acc[j][1];
        if (ta < n_tok && r1 < rows) y[(long long)ta * rows + r1] = acc[j][2];
        if (tb < n_tok && r1 < rows) y[(long long)tb * rows + r1] = acc[j][3];
    }
}

#define GEMM_KERNEL(NAME, TYPE)                                                               \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, GEMM_MIN_BLOCKS)                \
        NAME(const u8 *__restrict__ w, const u8 *__restrict__ act, float *__restrict__ y,      \
             int rows, int cols, int n_tok) {                                                  \
        gemm_tile<TYPE>(w, act, y, rows, cols, n_tok);                                         \
    }

GEMM_KERNEL(gemm_q4_0, GGML_Q4_0)
GEMM_KERNEL(gemm_q4_1, GGML_Q4_1)
GEMM_KERNEL(gemm_q5_0, GGML_Q5_0)
GEMM_KERNEL(gemm_q8_0, GGML_Q8_0)
GEMM_KERNEL(gemm_q4_k, GGML_Q4_K)
GEMM_KERNEL(gemm_q6_k, GGML_Q6_K)
