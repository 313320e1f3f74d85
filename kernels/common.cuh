// common.cuh: prepended (as text) to every kernels/*.cu before NVRTC compiles it, so that the
// kernels need no include path: no CUDA header is included anywhere (the box that compiles them
// at start-up may have libnvrtc but no toolkit headers). Half conversions and dp4a are inline
// PTX; everything else is a compiler built-in.
//
// Memory layouts follow the CPU backend byte for byte:
// - weights: ggml blocks as in src/quant/formats/blocks.rs, read in place from the GGUF tensor data
//   (blocks are only 2-byte aligned for Q4_0, Q8_0 and Q6_K: 32-bit values are assembled from
//   16-bit loads there);
// - activations for the integer dot products: q8_1 blocks (`BlockQ8_1`, 36 bytes: f16 d, f16
//   s = d * sum(qs), 32 x int8), quantized as ggml-cpu's x86 path does (127/amax, ties to even);
// - KV pages: src/kv/pages.rs, `[layer][block][k|v][kv_head][slot][row_bytes]`.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

#define WARP 32
#define QK 32
#define QK_K 256

// ggml type ids (src/quant/formats/types.rs).
#define GGML_F32 0
#define GGML_F16 1
#define GGML_Q4_0 2
#define GGML_Q4_1 3
#define GGML_Q5_0 6
#define GGML_Q8_0 8
#define GGML_Q4_K 12
#define GGML_Q6_K 14
#define GGML_BF16 30

// KV page formats (src/kv/page_format.rs), as the kernels' `kv_type` argument.
#define KV_F16 0
#define KV_Q8_0 1
#define KV_Q4_0 2

// Block sizes in bytes.
#define BYTES_Q4_0 18
#define BYTES_Q4_1 20
#define BYTES_Q5_0 22
#define BYTES_Q8_0 34
#define BYTES_Q8_1 36
#define BYTES_Q4_K 144
#define BYTES_Q6_K 210

// EDGELM_EMU: the host build of these sources (emu/cuda/), which has no PTX.
__device__ __forceinline__ float f16_to_f32(u16 h) {
#ifdef EDGELM_EMU
    return emu::f16_to_f32(h);
#else
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}

// Round to nearest even, as half::f16::from_f32 and ggml's GGML_FP32_TO_FP16.
__device__ __forceinline__ u16 f32_to_f16(float f) {
#ifdef EDGELM_EMU
    return emu::f32_to_f16(f);
#else
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
#endif
}

__device__ __forceinline__ float bf16_to_f32(u16 h) {
    return __uint_as_float(((u32)h) << 16);
}

__device__ __forceinline__ u16 ld_u16(const u8 *p) {
    return *(const u16 *)p;
}

// 32 bits from a 2-byte aligned address.
__device__ __forceinline__ int ld_i32_a2(const u8 *p) {
    const u16 *q = (const u16 *)p;
    return (int)((u32)q[0] | ((u32)q[1] << 16));
}

// 32 bits from a 4-byte aligned address.
__device__ __forceinline__ int ld_i32_a4(const u8 *p) {
    return *(const int *)p;
}

// Four signed 8-bit products summed into c (sm_61+).
__device__ __forceinline__ int dp4a(int a, int b, int c) {
#ifdef EDGELM_EMU
    return emu::dp4a(a, b, c);
#else
    int r;
    asm("dp4a.s32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Q5_0's fifth bits: bit i of `bits` (the high bits of four consecutive values) moved to bit 4
// of byte i, so that OR-ing the result into four low nibbles gives four 5-bit values.
__device__ __forceinline__ int spread_bit4(u32 bits) {
    return (int)(((bits & 1u) << 4) | ((bits & 2u) << 11) | ((bits & 4u) << 18) |
                 ((bits & 8u) << 25));
}

// One q8_1 activation block as the dot kernels read it.
struct Q8_1 {
    float d;          // scale (rounded to f16, as stored)
    float s;          // d * sum(qs) (rounded to f16, as stored)
    const u8 *qs;     // 32 int8, 4-byte aligned
};

__device__ __forceinline__ Q8_1 q8_1_at(const u8 *base, long long block) {
    const u8 *b = base + block * BYTES_Q8_1;
    Q8_1 r;
    r.d = f16_to_f32(ld_u16(b));
    r.s = f16_to_f32(ld_u16(b + 2));
    r.qs = b + 4;
    return r;
}

// ggml-cpu's vectorised expf (ggml_v_expf), one value at a time: the same fused operations as
// src/backend/cpu/ops.rs `expf_v`, so SiLU rounds as on the CPU.
__device__ __forceinline__ float expf_v(float x) {
    const float r = __uint_as_float(0x4B400000u);
    float z = fmaf(x, __uint_as_float(0x3FB8AA3Bu), r);
    float n = __fsub_rn(z, r);
    float b = fmaf(-n, __uint_as_float(0x35BFBE8Eu), fmaf(-n, __uint_as_float(0x3F317200u), x));
    float u = __fmul_rn(b, b);
    float j = fmaf(fmaf(fmaf(__uint_as_float(0x3C072010u), b, __uint_as_float(0x3D2B9F17u)), u,
                        fmaf(__uint_as_float(0x3E2AAF33u), b, __uint_as_float(0x3EFFFEDBu))),
                   u, fmaf(__uint_as_float(0x3F7FFFF6u), b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : __uint_as_float(0x7F800000u);
    int e = (int)n;
    int h = e / 2;
    int rest = e - h;
    // j * 2^h * 2^rest, each factor a normal or subnormal power of two.
    float p1 = h < -126 ? __uint_as_float(1u << min(max(h + 149, 0), 22))
                        : __uint_as_float((u32)(min(max(h, -126), 127) + 127) << 23);
    float p2 = rest < -126 ? __uint_as_float(1u << min(max(rest + 149, 0), 22))
                           : __uint_as_float((u32)(min(max(rest, -126), 127) + 127) << 23);
    return __fmul_rn(__fmul_rn(j, p1), p2);
}

// Byte offset of the first row of (layer, block, part, head) in the KV pool (src/kv/pages.rs).
__device__ __forceinline__ u64 kv_head_offset(int layer, int blocks, int block, int part,
                                              int kv_heads, int head, u64 head_bytes) {
    return ((((u64)layer * blocks + block) * 2 + part) * kv_heads + head) * head_bytes;
}

__device__ __forceinline__ int kv_row_bytes(int kv_type, int head_dim) {
    return kv_type == KV_F16 ? head_dim * 2
         : kv_type == KV_Q8_0 ? (head_dim / QK) * BYTES_Q8_0
                              : (head_dim / QK) * BYTES_Q4_0;
}
