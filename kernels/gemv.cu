// gemv.cu: quantized weight matrix x q8_1 activations, for decode (one token) and small decode
// batches (up to GEMV_MAX_TOK tokens share each weight load).
//
// y[t * rows + r] = sum over the row's blocks of dot(W[r], a[t]); W is rows x cols in ggml blocks
// (row-major, rows contiguous, read in place), a is n_tok rows of cols/32 q8_1 blocks
// (quantize.cu). One warp per output row, GEMV_WARPS rows per thread block: launch with
// blockDim.x = 32 * GEMV_WARPS and gridDim.x = ceil(rows / GEMV_WARPS).
//
// Each lane takes "units" of the row in turn: half a block for Q4_0/Q4_1/Q5_0/Q8_0 (16 weights), a
// 16-weight slice of two sub-blocks for Q4_K, a 64-weight slice for Q6_K. Integer dot products
// use dp4a; each unit's weights are loaded once into registers and used for every token.

#define GEMV_WARPS 4
#define GEMV_MAX_TOK 8

#define M4 0x0F0F0F0F
#define ONES 0x01010101

// ---- Q4_0: x = d * (q - 8); 18-byte blocks, 2-byte aligned ---------------------------------
struct UnitQ4_0 {
    float d;
    int q0, q1; // 8 bytes of packed nibbles
    int blk, h;
};

// The int8 activations half `h` of a 4-bit block meets: its low nibbles are values 8h..8h+8
// (a0, a1), its high nibbles values 16+8h..16+8h+8 (a4, a5).
struct ActHalf {
    int a0, a1, a4, a5;
};

__device__ __forceinline__ ActHalf act_half(const Q8_1 &a, int h) {
    return {ld_i32_a4(a.qs + 8 * h), ld_i32_a4(a.qs + 8 * h + 4), ld_i32_a4(a.qs + 16 + 8 * h),
            ld_i32_a4(a.qs + 16 + 8 * h + 4)};
}

// Four words of int8 weights (values 8h..8h+8, then 16+8h..16+8h+8) against their activations.
__device__ __forceinline__ int half_dot(int q0, int q1, int q2, int q3, const ActHalf &x) {
    int sumi = dp4a(q0, x.a0, 0);
    sumi = dp4a(q1, x.a1, sumi);
    sumi = dp4a(q2, x.a4, sumi);
    return dp4a(q3, x.a5, sumi);
}

// Eight 4-bit weights of a half block (two packed words) against their int8 activations.
__device__ __forceinline__ int nibble_dot(int q0, int q1, const ActHalf &x) {
    return half_dot(q0 & M4, q1 & M4, (int)(((u32)q0 >> 4) & M4), (int)(((u32)q1 >> 4) & M4), x);
}

__device__ __forceinline__ UnitQ4_0 load_q4_0(const u8 *row, int unit) {
    UnitQ4_0 u;
    u.blk = unit >> 1;
    u.h = unit & 1;
    const u8 *b = row + (long long)u.blk * BYTES_Q4_0;
    u.d = f16_to_f32(ld_u16(b));
    u.q0 = ld_i32_a2(b + 2 + 8 * u.h);
    u.q1 = ld_i32_a2(b + 2 + 8 * u.h + 4);
    return u;
}

__device__ __forceinline__ float dot_q4_0(const UnitQ4_0 &u, const u8 *act) {
    const Q8_1 a = q8_1_at(act, u.blk);
    const ActHalf x = act_half(a, u.h);
    const int sumi = nibble_dot(u.q0, u.q1, x);
    const int suma = half_dot(ONES, ONES, ONES, ONES, x);
    return u.d * a.d * (float)(sumi - 8 * suma);
}

// ---- Q4_1: x = d * q + m; 20-byte blocks, 4-byte aligned -----------------------------------
struct UnitQ4_1 {
    float d, m;
    int q0, q1;
    int blk, h;
};

__device__ __forceinline__ UnitQ4_1 load_q4_1(const u8 *row, int unit) {
    UnitQ4_1 u;
    u.blk = unit >> 1;
    u.h = unit & 1;
    const u8 *b = row + (long long)u.blk * BYTES_Q4_1;
    u.d = f16_to_f32(ld_u16(b));
    u.m = f16_to_f32(ld_u16(b + 2));
    u.q0 = ld_i32_a4(b + 4 + 8 * u.h);
    u.q1 = ld_i32_a4(b + 4 + 8 * u.h + 4);
    return u;
}

__device__ __forceinline__ float dot_q4_1(const UnitQ4_1 &u, const u8 *act) {
    const Q8_1 a = q8_1_at(act, u.blk);
    const ActHalf x = act_half(a, u.h);
    const int sumi = nibble_dot(u.q0, u.q1, x);
    // The minimum meets the whole block's activation sum once (s = d * sum(qs)), as on the CPU.
    const float min_term = u.h == 0 ? u.m * a.s : 0.0f;
    return fmaf(u.d * a.d, (float)sumi, min_term);
}

// ---- Q5_0: x = d * (q - 16), q = the nibble plus a fifth bit from qh; 22-byte blocks,
// 2-byte aligned. A unit is half a block, as for Q4_0, with the fifth bits already in place.
struct UnitQ5_0 {
    float d;
    int q0, q1, q2, q3; // values 8h..8h+8 (q0, q1) and 16+8h..16+8h+8 (q2, q3), one per byte
    int blk, h;
};

__device__ __forceinline__ UnitQ5_0 load_q5_0(const u8 *row, int unit) {
    UnitQ5_0 u;
    u.blk = unit >> 1;
    u.h = unit & 1;
    const u8 *b = row + (long long)u.blk * BYTES_Q5_0;
    u.d = f16_to_f32(ld_u16(b));
    const u32 qh = (u32)ld_i32_a2(b + 2);
    const int w0 = ld_i32_a2(b + 6 + 8 * u.h), w1 = ld_i32_a2(b + 10 + 8 * u.h);
    const int lo = 8 * u.h; // the value index of w0's low nibbles
    u.q0 = (w0 & M4) | spread_bit4(qh >> lo);
    u.q1 = (w1 & M4) | spread_bit4(qh >> (lo + 4));
    u.q2 = (int)(((u32)w0 >> 4) & M4) | spread_bit4(qh >> (16 + lo));
    u.q3 = (int)(((u32)w1 >> 4) & M4) | spread_bit4(qh >> (20 + lo));
    return u;
}

__device__ __forceinline__ float dot_q5_0(const UnitQ5_0 &u, const u8 *act) {
    const Q8_1 a = q8_1_at(act, u.blk);
    const ActHalf x = act_half(a, u.h);
    const int sumi = half_dot(u.q0, u.q1, u.q2, u.q3, x);
    const int suma = half_dot(ONES, ONES, ONES, ONES, x);
    return u.d * a.d * (float)(sumi - 16 * suma);
}

// ---- Q8_0: x = d * q; 34-byte blocks, 2-byte aligned ---------------------------------------
struct UnitQ8_0 {
    float d;
    int q[4];
    int blk, h;
};

__device__ __forceinline__ UnitQ8_0 load_q8_0(const u8 *row, int unit) {
    UnitQ8_0 u;
    u.blk = unit >> 1;
    u.h = unit & 1;
    const u8 *b = row + (long long)u.blk * BYTES_Q8_0;
    u.d = f16_to_f32(ld_u16(b));
#pragma unroll
    for (int i = 0; i < 4; ++i) u.q[i] = ld_i32_a2(b + 2 + 16 * u.h + 4 * i);
    return u;
}

__device__ __forceinline__ float dot_q8_0(const UnitQ8_0 &u, const u8 *act) {
    const Q8_1 a = q8_1_at(act, u.blk);
    int sumi = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) sumi = dp4a(u.q[i], ld_i32_a4(a.qs + 16 * u.h + 4 * i), sumi);
    return u.d * a.d * (float)sumi;
}

// ---- Q4_K: 256-value super-blocks of 8 sub-blocks with 6-bit scales and mins ---------------
// x = d * sc[s] * q - dmin * m[s]; qs[32j..32j+32] holds sub-block 2j (low nibbles) and 2j+1
// (high nibbles). A unit is (super-block, j, half h): 16 values of each of the two sub-blocks.
struct UnitQ4_K {
    float d0, d1;   // d * sc for the two sub-blocks
    float m0, m1;   // dmin * m
    int q[4];
    int sb, j, h;
};

__device__ __forceinline__ UnitQ4_K load_q4_k(const u8 *row, int unit) {
    UnitQ4_K u;
    u.sb = unit >> 3;
    u.j = (unit >> 1) & 3;
    u.h = unit & 1;
    const u8 *b = row + (long long)u.sb * BYTES_Q4_K;
    const float d = f16_to_f32(ld_u16(b));
    const float dmin = f16_to_f32(ld_u16(b + 2));
    const u8 *sc = b + 4;
    // get_scale_min_k4 for sub-blocks 2j and 2j+1 (src/quant/formats/blocks.rs unpack_scale_min_k4).
    int s[2], m[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
        const int js = 2 * u.j + k;
        if (js < 4) {
            s[k] = sc[js] & 63;
            m[k] = sc[js + 4] & 63;
        } else {
            s[k] = (sc[js + 4] & 0xF) | ((sc[js - 4] >> 6) << 4);
            m[k] = (sc[js + 4] >> 4) | ((sc[js] >> 6) << 4);
        }
    }
    u.d0 = d * (float)s[0];
    u.d1 = d * (float)s[1];
    u.m0 = dmin * (float)m[0];
    u.m1 = dmin * (float)m[1];
#pragma unroll
    for (int i = 0; i < 4; ++i) u.q[i] = ld_i32_a4(b + 16 + 32 * u.j + 16 * u.h + 4 * i);
    return u;
}

__device__ __forceinline__ float dot_q4_k(const UnitQ4_K &u, const u8 *act) {
    const Q8_1 a0 = q8_1_at(act, (long long)u.sb * 8 + 2 * u.j);
    const Q8_1 a1 = q8_1_at(act, (long long)u.sb * 8 + 2 * u.j + 1);
    int s0 = 0, s1 = 0, t0 = 0, t1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int x0 = ld_i32_a4(a0.qs + 16 * u.h + 4 * i);
        const int x1 = ld_i32_a4(a1.qs + 16 * u.h + 4 * i);
        s0 = dp4a(u.q[i] & M4, x0, s0);
        s1 = dp4a((int)(((u32)u.q[i] >> 4) & M4), x1, s1);
        t0 = dp4a(ONES, x0, t0);
        t1 = dp4a(ONES, x1, t1);
    }
    return a0.d * (u.d0 * (float)s0 - u.m0 * (float)t0) +
           a1.d * (u.d1 * (float)s1 - u.m1 * (float)t1);
}

// ---- Q6_K: 256-value super-blocks, 6-bit quants (4 low bits in ql, 2 high in qh), 16 int8
// scales, d last; 210-byte blocks, 2-byte aligned. x = d * sc * (q - 32). A unit is
// (super-block, half n, group g): for l in 16g..16g+16, the values 128n + l + 32k, k = 0..3.
struct UnitQ6_K {
    float d;
    float sc[4];
    int ql_a[4], ql_b[4], qh[4];
    int sb, n, g;
};

__device__ __forceinline__ UnitQ6_K load_q6_k(const u8 *row, int unit) {
    UnitQ6_K u;
    u.sb = unit >> 2;
    u.n = (unit >> 1) & 1;
    u.g = unit & 1;
    const u8 *b = row + (long long)u.sb * BYTES_Q6_K;
    u.d = f16_to_f32(ld_u16(b + 208));
    const i8 *scales = (const i8 *)(b + 192) + 8 * u.n + u.g;
#pragma unroll
    for (int k = 0; k < 4; ++k) u.sc[k] = (float)scales[2 * k];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        u.ql_a[i] = ld_i32_a2(b + 64 * u.n + 16 * u.g + 4 * i);
        u.ql_b[i] = ld_i32_a2(b + 64 * u.n + 32 + 16 * u.g + 4 * i);
        u.qh[i] = ld_i32_a2(b + 128 + 32 * u.n + 16 * u.g + 4 * i);
    }
    return u;
}

__device__ __forceinline__ float dot_q6_k(const UnitQ6_K &u, const u8 *act) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const Q8_1 a = q8_1_at(act, (long long)u.sb * 8 + 4 * u.n + k);
        int sumi = 0, suma = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 ql = (u32)((k & 1) ? u.ql_b[i] : u.ql_a[i]);
            const u32 lo = (k < 2 ? ql : ql >> 4) & M4;
            const u32 hi = (((u32)u.qh[i] >> (2 * k)) & 0x03030303u) << 4;
            const int x = ld_i32_a4(a.qs + 16 * u.g + 4 * i);
            sumi = dp4a((int)(lo | hi), x, sumi);
            suma = dp4a(ONES, x, suma);
        }
        sum = fmaf(a.d * u.sc[k], (float)(sumi - 32 * suma), sum);
    }
    return u.d * sum;
}

// ---- MXFP4: 32 E2M1 values with one E8M0 scale; 17-byte blocks, byte aligned ---------------
// x = kvalues_mxfp4[q] * 2^(e - 128) (the table holds doubled E2M1 values, so the scale is
// halved: ggml's GGML_E8M0_TO_FP32_HALF). Nibbles as Q4_0's: byte j holds values j and j + 16.
// A unit is half a block, as for Q4_0.
#define BYTES_MXFP4 17

// The doubled E2M1 value of a nibble (ggml's kvalues_mxfp4) without a table: magnitudes
// 0, 1, 2, 3, 4, 6, 8, 12, the high bit the sign.
__device__ __forceinline__ int e2m1_doubled(u32 n) {
    const int m = (int)(n & 7);
    const int mag = m < 4 ? m : (m < 6 ? 2 * m - 4 : 4 * m - 16);
    return (n & 8) ? -mag : mag;
}

// Four bytes' nibbles (the low ones, or the high ones with shift 4) as four packed int8 values.
__device__ __forceinline__ int e2m1_word(const u8 *q, int shift) {
    u32 r = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) r |= ((u32)e2m1_doubled((u32)(q[i] >> shift)) & 0xFFu) << (8 * i);
    return (int)r;
}

__device__ __forceinline__ float e8m0_to_f32_half(u8 e) {
    return __uint_as_float(e < 2 ? (0x00200000u << e) : ((u32)(e - 1) << 23));
}

struct UnitMxfp4 {
    float d;
    int q0, q1, q2, q3; // values 8h..8h+8 (q0, q1) and 16+8h..16+8h+8 (q2, q3), one per byte
    int blk, h;
};

__device__ __forceinline__ UnitMxfp4 load_mxfp4(const u8 *row, int unit) {
    UnitMxfp4 u;
    u.blk = unit >> 1;
    u.h = unit & 1;
    const u8 *b = row + (long long)u.blk * BYTES_MXFP4;
    u.d = e8m0_to_f32_half(b[0]);
    const u8 *qs = b + 1 + 8 * u.h;
    u.q0 = e2m1_word(qs, 0);
    u.q1 = e2m1_word(qs + 4, 0);
    u.q2 = e2m1_word(qs, 4);
    u.q3 = e2m1_word(qs + 4, 4);
    return u;
}

__device__ __forceinline__ float dot_mxfp4(const UnitMxfp4 &u, const u8 *act) {
    const Q8_1 a = q8_1_at(act, u.blk);
    const ActHalf x = act_half(a, u.h);
    return u.d * a.d * (float)half_dot(u.q0, u.q1, u.q2, u.q3, x);
}

// ---- the kernels ---------------------------------------------------------------------------
// A macro rather than a template so each extern "C" entry point has one obvious body.
#define GEMV_KERNEL(NAME, UNIT, LOAD, DOT, UNITS_PER_ROW, ROW_BYTES)                           \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)                              \
        NAME(const u8 *__restrict__ w, const u8 *__restrict__ act, float *__restrict__ y,      \
             int rows, int cols, int n_tok) {                                                  \
        const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);                          \
        const int lane = threadIdx.x & 31;                                                     \
        if (row >= rows) return;                                                               \
        const int units = (UNITS_PER_ROW);                                                     \
        const u8 *wr = w + (long long)row * (long long)(ROW_BYTES);                            \
        const long long act_row = (long long)(cols / QK) * BYTES_Q8_1;                         \
        float acc[GEMV_MAX_TOK];                                                               \
        _Pragma("unroll") for (int t = 0; t < GEMV_MAX_TOK; ++t) acc[t] = 0.0f;                \
        for (int unit = lane; unit < units; unit += WARP) {                                    \
            const UNIT u = LOAD(wr, unit);                                                     \
            _Pragma("unroll") for (int t = 0; t < GEMV_MAX_TOK; ++t) {                         \
                if (t < n_tok) acc[t] += DOT(u, act + t * act_row);                            \
            }                                                                                  \
        }                                                                                      \
        _Pragma("unroll") for (int t = 0; t < GEMV_MAX_TOK; ++t) {                             \
            if (t < n_tok) {                                                                   \
                const float s = warp_sum(acc[t]);                                              \
                if (lane == 0) y[(long long)t * rows + row] = s;                               \
            }                                                                                  \
        }                                                                                      \
    }

GEMV_KERNEL(gemv_q4_0, UnitQ4_0, load_q4_0, dot_q4_0, 2 * (cols / QK), (cols / QK) * BYTES_Q4_0)
GEMV_KERNEL(gemv_q4_1, UnitQ4_1, load_q4_1, dot_q4_1, 2 * (cols / QK), (cols / QK) * BYTES_Q4_1)
GEMV_KERNEL(gemv_q5_0, UnitQ5_0, load_q5_0, dot_q5_0, 2 * (cols / QK), (cols / QK) * BYTES_Q5_0)
GEMV_KERNEL(gemv_q8_0, UnitQ8_0, load_q8_0, dot_q8_0, 2 * (cols / QK), (cols / QK) * BYTES_Q8_0)
GEMV_KERNEL(gemv_q4_k, UnitQ4_K, load_q4_k, dot_q4_k, 8 * (cols / QK_K), (cols / QK_K) * BYTES_Q4_K)
GEMV_KERNEL(gemv_q6_k, UnitQ6_K, load_q6_k, dot_q6_k, 4 * (cols / QK_K), (cols / QK_K) * BYTES_Q6_K)

// The experts of a mixture-of-experts layer (moe.cu routes the tokens): pair p (a token and one
// of its picked experts) multiplies expert ids[p]'s matrix, the rows x cols band at
// w + ids[p] * expert_bytes, by activation row p / act_div (act_div = experts per token for
// the gate and up matrices, whose input is the token's row; 1 for the down matrices, whose
// input is the pair's own row), into y[p * rows + row]. Only the picked experts' rows are
// read. One warp per output row as above; gridDim.y = the number of pairs.
#define MOE_GEMV_KERNEL(NAME, UNIT, LOAD, DOT, UNITS_PER_ROW, ROW_BYTES)                       \
    extern "C" __global__ void __launch_bounds__(32 * GEMV_WARPS)                              \
        NAME(const u8 *__restrict__ w, long long expert_bytes, const int *__restrict__ ids,    \
             const u8 *__restrict__ act, int act_div, float *__restrict__ y, int rows,         \
             int cols) {                                                                       \
        const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);                          \
        const int lane = threadIdx.x & 31;                                                     \
        if (row >= rows) return;                                                               \
        const long long pair = blockIdx.y;                                                     \
        const int units = (UNITS_PER_ROW);                                                     \
        const u8 *wr = w + (long long)ids[pair] * expert_bytes +                               \
                       (long long)row * (long long)(ROW_BYTES);                                \
        const long long act_row = (long long)(cols / QK) * BYTES_Q8_1;                         \
        const u8 *a = act + (pair / act_div) * act_row;                                        \
        float acc = 0.0f;                                                                      \
        for (int unit = lane; unit < units; unit += WARP) acc += DOT(LOAD(wr, unit), a);       \
        const float s = warp_sum(acc);                                                         \
        if (lane == 0) y[pair * rows + row] = s;                                               \
    }

MOE_GEMV_KERNEL(moe_gemv_q4_0, UnitQ4_0, load_q4_0, dot_q4_0, 2 * (cols / QK), (cols / QK) * BYTES_Q4_0)
MOE_GEMV_KERNEL(moe_gemv_q4_1, UnitQ4_1, load_q4_1, dot_q4_1, 2 * (cols / QK), (cols / QK) * BYTES_Q4_1)
MOE_GEMV_KERNEL(moe_gemv_q5_0, UnitQ5_0, load_q5_0, dot_q5_0, 2 * (cols / QK), (cols / QK) * BYTES_Q5_0)
MOE_GEMV_KERNEL(moe_gemv_q8_0, UnitQ8_0, load_q8_0, dot_q8_0, 2 * (cols / QK), (cols / QK) * BYTES_Q8_0)
MOE_GEMV_KERNEL(moe_gemv_q4_k, UnitQ4_K, load_q4_k, dot_q4_k, 8 * (cols / QK_K), (cols / QK_K) * BYTES_Q4_K)
MOE_GEMV_KERNEL(moe_gemv_q6_k, UnitQ6_K, load_q6_k, dot_q6_k, 4 * (cols / QK_K), (cols / QK_K) * BYTES_Q6_K)
MOE_GEMV_KERNEL(moe_gemv_mxfp4, UnitMxfp4, load_mxfp4, dot_mxfp4, 2 * (cols / QK), (cols / QK) * BYTES_MXFP4)
