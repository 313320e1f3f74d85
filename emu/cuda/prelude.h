// prelude.h: what kernels/*.cu need from CUDA, for a host (g++) build of the very same sources,
// so the CUDA backend can be exercised end to end on a machine without a GPU (see README.md).
//
// Every CUDA thread runs as a fiber (runtime.h); a thread block's fibers share one OS thread,
// so `__shared__` variables become `static thread_local` and are shared by exactly the threads
// of one block. Warp primitives exchange values through the warp's slots and wait at a warp
// barrier; `__syncthreads` waits at the block barrier. Arithmetic is IEEE f32 without
// contraction (the build uses -ffp-contract=off), so results match the GPU's to rounding, not
// bit for bit (nvcc fuses a*b+c where the source does not say __fmul_rn).
#pragma once

#include "runtime.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static thread_local

#define threadIdx (emu::self()->tid)
#define blockIdx (emu::block()->idx)
#define blockDim (emu::block()->dim)
#define gridDim (emu::block()->grid)

inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::sync_warp(mask); }

template <class T> inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    const int lane = emu::lane();
    const int base = lane & ~(width - 1);
    return emu::exchange(mask, v, base + (src & (width - 1)));
}
template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int x, int width = 32) {
    const int lane = emu::lane();
    const int base = lane & ~(width - 1);
    return emu::exchange(mask, v, base + ((lane ^ x) & (width - 1)));
}
template <class T> inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const int lane = emu::lane();
    const int in = lane & (width - 1);
    return emu::exchange(mask, v, in + (int)d < width ? lane + (int)d : lane);
}
template <class T> inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    const int lane = emu::lane();
    const int in = lane & (width - 1);
    return emu::exchange(mask, v, in >= (int)d ? lane - (int)d : lane);
}

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline int __float2int_rz(float f) { return (int)std::trunc(f); }
inline unsigned long long __float2ull_rn(float f) {
    return f <= 0.0f ? 0ull : (unsigned long long)std::nearbyint(f);
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}

// CUDA's overloaded min/max (integer and floating point, mixed widths promote).
#define EMU_MINMAX(T)                                                                           \
    inline T min(T a, T b) { return a < b ? a : b; }                                            \
    inline T max(T a, T b) { return a > b ? a : b; }
EMU_MINMAX(int)
EMU_MINMAX(unsigned)
EMU_MINMAX(long long)
EMU_MINMAX(unsigned long long)
#undef EMU_MINMAX
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline long long min(int a, long long b) { return a < b ? a : b; }
inline long long min(long long a, int b) { return a < b ? a : b; }
inline long long max(int a, long long b) { return a > b ? a : b; }
inline long long max(long long a, int b) { return a > b ? a : b; }

// Atomics: blocks may run on different OS threads.
template <class T> inline T atomicAdd(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline float atomicAdd(float *p, float v) {
    unsigned *u = (unsigned *)p;
    unsigned old = __atomic_load_n(u, __ATOMIC_SEQ_CST), next;
    do {
        next = __float_as_uint(__uint_as_float(old) + v);
    } while (!__atomic_compare_exchange_n(u, &old, next, false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_SEQ_CST));
    return __uint_as_float(old);
}
template <class T> inline T atomicMin(T *p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {
    }
    return old;
}
template <class T> inline T atomicMax(T *p, T v) {
    T old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
    while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST,
                                                   __ATOMIC_SEQ_CST)) {
    }
    return old;
}

// What common.cuh and gemm.cu do in inline PTX.
namespace emu {
float f16_to_f32(unsigned short h);
unsigned short f32_to_f16(float f);
inline int dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
// mma.sync.aligned.m16n8k{32,16}.row.col.s32.s8.s8.s32 with C = 0, from the PTX ISA's fragment
// tables (not from gemm.cu's comment), through the warp's slots.
void mma_m16n8k32_s8(int d[4], const int a[4], int b0, int b1);
void mma_m16n8k16_s8(int d[4], int a0, int a1, int b0);
} // namespace emu
