// runtime.h: runs a CUDA grid on the host. Each thread block runs on one OS thread with its
// CUDA threads as fibers (cooperative: a fiber runs until it waits at a barrier or ends), so
// __syncthreads and the warp primitives have their real meaning; blocks are spread over a few
// OS threads. A barrier that can never complete (threads waiting for ones that ended or wait
// elsewhere) is reported as a deadlock naming the kernel and the block, and aborts.
#pragma once

#include <cstdint>
#include <cstring>

namespace emu {

struct Dim3 {
    unsigned x, y, z;
};

struct Fiber {
    Dim3 tid;
    int linear;
    void *sp;
    bool done;
};

struct Block {
    Dim3 idx, dim, grid;
};

extern thread_local Fiber *g_fiber;
extern thread_local Block *g_block;

inline Fiber *self() { return g_fiber; }
inline Block *block() { return g_block; }
inline int lane() { return g_fiber->linear & 31; }

void sync_block();
void sync_warp(unsigned mask);
// Publishes `bits` in this lane's slot, waits for the lanes of `mask`, reads lane `src`'s.
uint64_t exchange_bits(unsigned mask, uint64_t bits, int src);

template <class T> inline T exchange(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "a shuffle moves at most 64 bits");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof(T));
    bits = exchange_bits(mask, bits, src);
    T out;
    std::memcpy(&out, &bits, sizeof(T));
    return out;
}

// All 32 lanes' (a[4], b[2]) fragments of one warp-wide MMA, gathered for every lane.
struct MmaFragments {
    int a[32][4];
    int b[32][2];
};
const MmaFragments &gather_mma(const int a[4], int b0, int b1);

// A kernel as the driver sees it: `invoke(fn, params)` calls `fn` with the arguments that
// cuLaunchKernel's `kernelParams` point to.
using Invoker = void (*)(void *fn, void **params);
constexpr int MAX_PARAMS = 32;
struct Kernel {
    const char *name;
    Invoker invoke;
    void *fn;
    int param_count;
    size_t param_size[MAX_PARAMS]; // bytes of each argument, as the kernel declares it
};
void register_kernel(const Kernel &k);
const Kernel *find_kernel(const char *name);
// Runs the whole grid; returns only when every block has finished.
void launch(const Kernel &k, Dim3 grid, Dim3 block, void **params);

} // namespace emu
