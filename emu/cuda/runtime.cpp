// runtime.cpp: fibers, barriers and grid execution for the host build of the kernels
// (runtime.h says what it does).
#include "runtime.h"

#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

extern "C" void emu_switch(void **save_sp, void *next_sp);

// Saves the callee-saved registers on the current stack, stores the stack pointer in *save_sp,
// switches to next_sp and restores what was saved there (x86-64 System V).
asm(R"(
    .text
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");

namespace emu {

thread_local Fiber *g_fiber;
thread_local Block *g_block;

namespace {

constexpr size_t STACK_BYTES = 256 << 10;
constexpr size_t GUARD_BYTES = 4096;
constexpr int MAX_THREADS = 1024;

struct Warp {
    unsigned alive = 0;   // lanes that exist and have not ended
    unsigned arrived = 0; // lanes waiting at a warp barrier
    unsigned want[32];    // each waiting lane's mask
    unsigned gen[32];     // bumped when that lane's barrier completes
    int phase = 0;        // which half of `slot` the next exchange uses
    uint64_t slot[2][32];
    MmaFragments mma[2];
};

struct BlockRun : Block {
    const Kernel *kernel;
    void **params;
    int threads;
    int alive;
    int bar_arrived;
    unsigned bar_gen;
    uint64_t progress; // bumped on every barrier release and fiber end
    void *sched_sp;
    Fiber fibers[MAX_THREADS];
    Warp warps[MAX_THREADS / 32];
};

// A set of fiber stacks, one per thread of a block, reused between blocks and launches.
struct Stacks {
    char *base[MAX_THREADS] = {};
    char *get(int i) {
        if (!base[i]) {
            void *p = mmap(nullptr, STACK_BYTES + GUARD_BYTES, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (p == MAP_FAILED) {
                std::fprintf(stderr, "cuda-emu: cannot map a fiber stack\n");
                std::abort();
            }
            mprotect(p, GUARD_BYTES, PROT_NONE); // overflow faults instead of corrupting
            base[i] = (char *)p + GUARD_BYTES;
        }
        return base[i];
    }
};

std::mutex stacks_mu;
std::vector<Stacks *> free_stacks;

Stacks *take_stacks() {
    std::lock_guard<std::mutex> g(stacks_mu);
    if (free_stacks.empty()) return new Stacks();
    Stacks *s = free_stacks.back();
    free_stacks.pop_back();
    return s;
}

void give_stacks(Stacks *s) {
    std::lock_guard<std::mutex> g(stacks_mu);
    free_stacks.push_back(s);
}

BlockRun *run() { return static_cast<BlockRun *>(g_block); }

void yield() {
    Fiber *f = g_fiber;
    emu_switch(&f->sp, run()->sched_sp);
}

Warp &warp_of(Fiber *f) { return run()->warps[f->linear >> 5]; }

// Completes the barrier lane `l` waits at if every live lane of its mask has arrived.
void try_release(Warp &w, int l) {
    const unsigned m = w.want[l];
    if ((m & w.alive & ~w.arrived) != 0) return;
    for (int j = 0; j < 32; ++j) {
        if ((m >> j & 1) && (w.arrived >> j & 1)) {
            w.gen[j]++;
            w.arrived &= ~(1u << j);
        }
    }
    w.phase ^= 1;
    run()->progress++;
}

void fiber_ended(BlockRun *b, Fiber *f) {
    f->done = true;
    b->alive--;
    b->progress++;
    // Threads that ended count as arrived at __syncthreads (as on the GPU).
    if (b->bar_arrived > 0 && b->bar_arrived == b->alive) {
        b->bar_arrived = 0;
        b->bar_gen++;
    }
    Warp &w = b->warps[f->linear >> 5];
    w.alive &= ~(1u << (f->linear & 31));
    for (int j = 0; j < 32; ++j)
        if (w.arrived >> j & 1) try_release(w, j);
}

void fiber_main() {
    BlockRun *b = run();
    b->kernel->invoke(b->kernel->fn, b->params);
    fiber_ended(b, g_fiber);
    emu_switch(&g_fiber->sp, b->sched_sp);
    __builtin_unreachable();
}

void *initial_sp(char *stack) {
    uint64_t *sp = (uint64_t *)(stack + STACK_BYTES);
    *--sp = 0;                        // fiber_main's return address: it never returns
    *--sp = (uint64_t)&fiber_main;    // where emu_switch's `ret` goes
    for (int i = 0; i < 6; ++i) *--sp = 0; // rbp rbx r12 r13 r14 r15
    return sp;
}

bool schedule_reversed();

void run_block(BlockRun *b, Stacks *stacks) {
    const Dim3 d = b->dim;
    b->alive = b->threads;
    b->bar_arrived = 0;
    b->bar_gen = 0;
    b->progress = 0;
    for (int w = 0; w < (b->threads + 31) / 32; ++w) {
        Warp &wp = b->warps[w];
        const int lanes = b->threads - 32 * w < 32 ? b->threads - 32 * w : 32;
        wp.alive = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
        wp.arrived = 0;
        wp.phase = 0;
        std::memset(wp.gen, 0, sizeof wp.gen);
    }
    for (int i = 0; i < b->threads; ++i) {
        Fiber &f = b->fibers[i];
        f.linear = i;
        f.tid = Dim3{(unsigned)(i % d.x), (unsigned)(i / d.x % d.y), (unsigned)(i / (d.x * d.y))};
        f.done = false;
        f.sp = initial_sp(stacks->get(i));
    }
    g_block = b;
    int live = b->threads;
    const bool reverse = schedule_reversed();
    while (live > 0) {
        const uint64_t before = b->progress;
        live = 0;
        for (int k = 0; k < b->threads; ++k) {
            Fiber &f = b->fibers[reverse ? b->threads - 1 - k : k];
            if (f.done) continue;
            g_fiber = &f;
            emu_switch(&b->sched_sp, f.sp);
            live += !f.done;
        }
        if (live > 0 && b->progress == before) {
            // A whole round in which every live thread waited and nothing was released.
            std::fprintf(stderr,
                         "cuda-emu: deadlock in %s, block (%u,%u,%u): %d of %d threads wait at "
                         "barriers that cannot complete\n",
                         b->kernel->name, b->idx.x, b->idx.y, b->idx.z, live, b->threads);
            std::abort();
        }
    }
    g_fiber = nullptr;
    g_block = nullptr;
}

std::map<std::string, Kernel> &registry() {
    static std::map<std::string, Kernel> r;
    return r;
}

// EDGELM_EMU_SCHEDULE=reverse runs a block's threads last to first between barriers: a kernel
// whose result depends on that order reads shared data another thread writes without a barrier
// in between (a race a GPU may or may not show).
bool schedule_reversed() {
    static bool r = [] {
        const char *e = std::getenv("EDGELM_EMU_SCHEDULE");
        return e && std::string(e) == "reverse";
    }();
    return r;
}

int worker_count() {
    static int n = [] {
        const char *e = std::getenv("EDGELM_EMU_THREADS");
        int v = e ? std::atoi(e) : (int)std::thread::hardware_concurrency();
        return v < 1 ? 1 : v > 64 ? 64 : v;
    }();
    return n;
}

} // namespace

void sync_block() {
    BlockRun *b = run();
    const unsigned g = b->bar_gen;
    if (++b->bar_arrived == b->alive) {
        b->bar_arrived = 0;
        b->bar_gen++;
        b->progress++;
        return;
    }
    while (b->bar_gen == g) yield();
}

void sync_warp(unsigned mask) {
    Fiber *f = g_fiber;
    Warp &w = warp_of(f);
    const int l = f->linear & 31;
    w.want[l] = mask | (1u << l);
    w.arrived |= 1u << l;
    const unsigned g = w.gen[l];
    try_release(w, l);
    while (w.gen[l] == g) yield();
}

uint64_t exchange_bits(unsigned mask, uint64_t bits, int src) {
    Fiber *f = g_fiber;
    Warp &w = warp_of(f);
    const int p = w.phase;
    w.slot[p][f->linear & 31] = bits;
    sync_warp(mask);
    return w.slot[p][src & 31];
}

const MmaFragments &gather_mma(const int a[4], int b0, int b1) {
    Fiber *f = g_fiber;
    Warp &w = warp_of(f);
    const int p = w.phase, l = f->linear & 31;
    std::memcpy(w.mma[p].a[l], a, sizeof(int) * 4);
    w.mma[p].b[l][0] = b0;
    w.mma[p].b[l][1] = b1;
    if (w.alive != 0xffffffffu) {
        std::fprintf(stderr, "cuda-emu: mma.sync in %s with a partial warp (lanes %08x)\n",
                     run()->kernel->name, w.alive);
        std::abort();
    }
    sync_warp(0xffffffffu);
    return w.mma[p];
}

void register_kernel(const Kernel &k) { registry()[k.name] = k; }

const Kernel *find_kernel(const char *name) {
    auto it = registry().find(name);
    return it == registry().end() ? nullptr : &it->second;
}

void launch(const Kernel &k, Dim3 grid, Dim3 dim, void **params) {
    const long long blocks = (long long)grid.x * grid.y * grid.z;
    const int threads = (int)(dim.x * dim.y * dim.z);
    std::atomic<long long> next{0};
    auto work = [&] {
        Stacks *stacks = take_stacks();
        BlockRun *b = new BlockRun();
        b->kernel = &k;
        b->params = params;
        b->threads = threads;
        b->dim = dim;
        b->grid = grid;
        for (long long i; (i = next.fetch_add(1)) < blocks;) {
            b->idx = Dim3{(unsigned)(i % grid.x), (unsigned)(i / grid.x % grid.y),
                          (unsigned)(i / ((long long)grid.x * grid.y))};
            run_block(b, stacks);
        }
        delete b;
        give_stacks(stacks);
    };
    const long long n = blocks < worker_count() ? blocks : worker_count();
    std::vector<std::thread> pool;
    for (long long i = 1; i < n; ++i) pool.emplace_back(work);
    work();
    for (auto &t : pool) t.join();
}

} // namespace emu
