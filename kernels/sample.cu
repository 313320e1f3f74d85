// sample.cu: choosing the next token on the device, so only token ids come back.
//
// argmax_rows: greedy sampling, the index of the largest logit of each row, the first one on
// ties (src/engine/sampler.rs `argmax`); NaNs never win (the CPU's scan differs only when
// logit 0 itself is NaN: it then returns 0).
//
// sample_rows: temperature, top-k, min-p and top-p sampling per row, the CPU sampler's rules
// in the CPU sampler's order (src/engine/sampler.rs `Sampler::sample`):
//   candidates ordered by logit, highest first, lower token id first on equal logits;
//   top-k keeps the first k; probabilities exp((l - max) / T) over those (normalised by their
//   sum); min-p keeps the prefix with p >= min_p * p_max; top-p the shortest prefix of that
//   whose normalised mass reaches top_p; then one uniform u picks, by inverse CDF in the same
//   order, the first token whose running mass exceeds u * (the kept mass).
// The uniform is the CPU's: the step-th draw of `Rng::new(seed)` (SplitMix64 is counter-based:
// draw n is mix(seed + n * golden)), so the caller passes per row the request's seed and the
// number of draws its sampler has made (src/engine/rng.rs `Rng::nth_f32`).
//
// What cannot match the CPU bit for bit: probabilities come from CUDA's expf (within 2 ulp of
// Rust's exp); sums are exact 32.32 fixed point here (order-free, so a seeded request gives the
// same tokens on every run), f32 running sums of normalised values on the CPU. So the top-p
// cut or the drawn token can differ where a running sum lands within about 1e-6 of its
// target. At the top-k boundary tied logits keep the lowest ids here, an unspecified one on
// the CPU (select_nth_unstable). NaN logits count as -inf. Repetition, presence and frequency
// penalties are not applied here: they change the logits before sampling (the caller applies
// them, or samples such rows on the CPU).
//
// How, without sorting the vocabulary: every rule is "the first element in the order at which
// a running sum (of 1s for top-k, of probabilities otherwise) reaches a target". That element
// is found by a radix search over the logit's order-preserving 32-bit key: three passes over
// 11/11/10-bit digits, each building a histogram of the weights per digit in shared memory
// and scanning it for the digit where the running sum crosses the target. When the
// candidates left after top-k and min-p fit in SAMPLE_CAP, they are gathered into shared
// memory first, so the later passes never read the row again.

#define ARGMAX_THREADS 256

// logits: rows x n; out[row] = argmax. One thread block of ARGMAX_THREADS per row.
extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
    argmax_rows(const float *__restrict__ logits, int n, u32 *__restrict__ out) {
    __shared__ float sv[ARGMAX_THREADS / WARP];
    __shared__ int si[ARGMAX_THREADS / WARP];
    const float *row = logits + (long long)blockIdx.x * n;
    float best = __uint_as_float(0xff800000u); // -inf
    int at = n;                              // "none yet": loses every comparison
    for (int i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
        const float v = row[i];
        if (v > best || (at == n && v == best)) { // -inf logits still produce an index
            best = v;
            at = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
        const int i2 = __shfl_xor_sync(0xffffffffu, at, o);
        if (v2 > best || (v2 == best && i2 < at)) {
            best = v2;
            at = i2;
        }
    }
    if ((threadIdx.x & 31) == 0) {
        sv[threadIdx.x >> 5] = best;
        si[threadIdx.x >> 5] = at;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / WARP; ++w) {
            if (sv[w] > best || (sv[w] == best && si[w] < at)) {
                best = sv[w];
                at = si[w];
            }
        }
        out[blockIdx.x] = at < n ? (u32)at : 0u; // all NaN: token 0, as the CPU's scan gives
    }
}

// ---- sample_rows ----------------------------------------------------------------------------
// Launch: grid = rows, block = SAMPLE_THREADS, static shared memory only (about 41 KiB).
//   sample_rows(const float *logits, int n, const SampleRow *params, u32 *out)
// logits: rows x n f32; params: one SampleRow per row; out: one token id per row.
#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP)
#define SAMPLE_CAP 2048  // candidates gathered into shared memory
#define SAMPLE_BINS 2048 // 11-bit digits: key bits 31..21, 20..10, 9..0
#define ONE_FIXED 4294967296.0f // probabilities (the best token's is 1) in 32.32 fixed point
static_assert(SAMPLE_BINS == 4 * SAMPLE_THREADS, "scan_bins gives each thread 4 bins");

// 32 bytes, 8-aligned: src/backend/cuda/launch.rs `SampleRow` writes the same layout.
struct SampleRow {
    float temperature; // <= 0 (or NaN): greedy, as argmax_rows
    float top_p;       // >= 1: off
    float min_p;       // 0: off
    u32 top_k;         // 0 (or >= n): off
    u64 seed;
    u64 step; // draws this request's sampler has made before this one
};

// Order-preserving key: a larger logit has a larger key (NaN maps to -inf's key).
#define KEY_NEG_INF 0x007fffffu
#define KEY_POS_INF 0xff800000u

__device__ __forceinline__ u32 order_key(float l) {
    const u32 b = l != l ? 0xff800000u : __float_as_uint(l);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float key_logit(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// An element of the order and everything before it: (key, idx) is "in" when it comes first.
struct Cut {
    u32 key, idx;
};
#define CUT_ALL (Cut{0u, 0xffffffffu})

__device__ __forceinline__ bool in_cut(const Cut &c, u32 key, u32 idx) {
    return key > c.key || (key == c.key && idx <= c.idx);
}

// The CPU's `Rng::new(seed)` after `step` draws: 24 random bits of its next f32.
__device__ __forceinline__ u32 draw24(u64 seed, u64 step) {
    u64 z = seed + (step + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (u32)((z ^ (z >> 31)) >> 40);
}

struct SampleShared {
    u64 hist[SAMPLE_BINS];  // weight per digit
    u32 first[SAMPLE_BINS]; // lowest token id per digit (last pass)
    u32 list_key[SAMPLE_CAP];
    u32 list_idx[SAMPLE_CAP];
    u64 warp_total[SAMPLE_WARPS];
    u64 before; // weight of the members ahead of the digit found
    int bin, found, count;
};

__device__ __forceinline__ u64 shfl_up_u64(u64 v, int d) {
    const u32 lo = __shfl_up_sync(0xffffffffu, (u32)v, d);
    const u32 hi = __shfl_up_sync(0xffffffffu, (u32)(v >> 32), d);
    return ((u64)hi << 32) | lo;
}

__device__ __forceinline__ u64 shfl_xor_u64(u64 v, int d) {
    const u32 lo = __shfl_xor_sync(0xffffffffu, (u32)v, d);
    const u32 hi = __shfl_xor_sync(0xffffffffu, (u32)(v >> 32), d);
    return ((u64)hi << 32) | lo;
}

// Block-wide reductions; every thread gets the result. OP: 0 sum, 1 max, 2 min.
template <int OP> __device__ __forceinline__ u64 combine(u64 a, u64 b) {
    return OP == 0 ? a + b : OP == 1 ? (a > b ? a : b) : (a < b ? a : b);
}

template <int OP> __device__ u64 block_reduce(u64 v, SampleShared &sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = combine<OP>(v, shfl_xor_u64(v, o));
    __syncthreads(); // warp_total's previous readers are done
    if ((threadIdx.x & 31) == 0) sh.warp_total[threadIdx.x >> 5] = v;
    __syncthreads();
    u64 r = sh.warp_total[0];
    for (int w = 1; w < SAMPLE_WARPS; ++w) r = combine<OP>(r, sh.warp_total[w]);
    return r;
}

// The candidates: a whole row of logits, or the ones gathered into shared memory.
struct RowSrc {
    const float *l;
    int n;
    template <class F> __device__ __forceinline__ void each(const F &f) const {
        for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS) f(order_key(l[i]), (u32)i);
    }
};

struct ListSrc {
    const u32 *key, *idx;
    int n;
    template <class F> __device__ __forceinline__ void each(const F &f) const {
        for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS) f(key[i], idx[i]);
    }
};

// One digit's scan: thread i holds bins 2047-4i down to 2044-4i (highest keys first); the one
// thread whose range crosses the target (running sums are exact integers, so at most one
// does) finds the bin. reach(x) is x > target (strict) or x >= target.
__device__ void scan_bins(u64 above, u64 target, bool strict, SampleShared &sh) {
    const int i = threadIdx.x, lane = i & 31, warp = i >> 5;
    u64 w[4], local = 0;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        w[q] = sh.hist[SAMPLE_BINS - 1 - 4 * i - q];
        local += w[q];
    }
    u64 incl = local;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 v = shfl_up_u64(incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) sh.warp_total[warp] = incl;
    if (i == 0) sh.found = 0;
    __syncthreads();
    for (int v = 0; v < warp; ++v) incl += sh.warp_total[v];
    const u64 excl = incl - local;
    const bool reached = strict ? above + incl > target : above + incl >= target;
    const bool before = strict ? above + excl > target : above + excl >= target;
    if (reached && !before) {
        u64 cum = above + excl;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            if (strict ? cum + w[q] > target : cum + w[q] >= target) {
                sh.bin = SAMPLE_BINS - 1 - 4 * i - q;
                sh.before = cum;
                sh.found = 1;
                break;
            }
            cum += w[q];
        }
    }
}

struct Hit {
    u32 key;   // the search key found
    u64 above; // weight of the members with larger keys
    u32 first; // lowest token id among the members with this key
};

// The search key (keyf of a member) at which the members' running weight, in decreasing
// key order, reaches target. False when their total weight never does.
template <class Src, class Member, class Weight, class KeyF>
__device__ bool radix_find(const Src &src, const Member &member, const Weight &weight,
                           const KeyF &keyf, u64 target, bool strict, SampleShared &sh,
                           Hit &hit) {
    u32 prefix = 0;
    u64 above = 0;
#pragma unroll 1
    for (int pass = 0; pass < 3; ++pass) {
        const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
        const u32 fixed = pass == 0 ? 0u : 0xffffffffu << (pass == 1 ? 21 : 10);
        __syncthreads(); // the previous scan's readers are done with the histogram
        for (int b = threadIdx.x; b < SAMPLE_BINS; b += SAMPLE_THREADS) {
            sh.hist[b] = 0;
            sh.first[b] = 0xffffffffu;
        }
        __syncthreads();
        src.each([&](u32 key, u32 idx) {
            const u32 k = keyf(key, idx);
            if ((k & fixed) != prefix || !member(key, idx)) return;
            const u32 bin = (k >> shift) & (SAMPLE_BINS - 1);
            atomicAdd(&sh.hist[bin], weight(key));
            if (pass == 2) atomicMin(&sh.first[bin], idx);
        });
        __syncthreads();
        scan_bins(above, target, strict, sh);
        __syncthreads();
        if (!sh.found) return false;
        prefix |= (u32)sh.bin << shift;
        above = sh.before;
    }
    hit.key = prefix;
    hit.above = above;
    hit.first = sh.first[sh.bin];
    return true;
}

// The first member, in the order, at which the running weight reaches target: the logit key by
// radix_find, then, among members tied on that logit, the right one by token id (the j-th
// lowest; equal logits have equal weights).
template <class Src, class Member, class Weight>
__device__ bool select_first(const Src &src, const Member &member, const Weight &weight,
                             u64 target, bool strict, SampleShared &sh, Cut &out) {
    Hit h;
    if (!radix_find(src, member, weight, [](u32 key, u32) { return key; }, target, strict, sh,
                    h))
        return false;
    out.key = h.key;
    out.idx = h.first;
    const u64 w1 = weight(h.key), need = target - h.above;
    const u64 j = w1 == 0 ? 1 : strict ? need / w1 + 1 : (need + w1 - 1) / w1;
    if (j > 1) {
        const u32 v = h.key;
        Hit t;
        if (radix_find(
                src, [&](u32 key, u32 idx) { return key == v && member(key, idx); },
                [](u32) -> u64 { return 1; }, [](u32, u32 idx) { return ~idx; }, j, false, sh,
                t))
            out.idx = ~t.key;
    }
    return true;
}

// top-p, then the draw, over the members (top-k and min-p applied) of `src`.
template <class Src, class Member, class Fixed>
__device__ u32 top_p_and_draw(const Src &src, const Member &member, const Fixed &fixed, u64 z,
                              const SampleRow &p, u32 best_idx, SampleShared &sh) {
    Cut cp = CUT_ALL;
    if (p.top_p < 1.0f) {
        u64 target = (u64)ceil((double)p.top_p * (double)z);
        Cut c;
        if (select_first(src, member, fixed, target > 0 ? target : 1, false, sh, c)) cp = c;
    }
    auto kept = [&](u32 key, u32 idx) { return member(key, idx) && in_cut(cp, key, idx); };
    u64 mass = 0;
    src.each([&](u32 key, u32 idx) {
        if (kept(key, idx)) mass += fixed(key);
    });
    mass = block_reduce<0>(mass, sh);
    // floor(mass * u) with u = draw24 / 2^24 < 1: always below the mass, so a token is found.
    const u64 r = __umul64hi(mass, (u64)draw24(p.seed, p.step) << 40);
    Cut t;
    return select_first(src, kept, fixed, r, true, sh, t) ? t.idx : best_idx;
}

// One block per SM is all a batch of rows needs; saying so gives ptxas the register budget
// (with the thread count alone it aimed at 64 registers and spilled on sm_90).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
    sample_rows(const float *__restrict__ logits, int n, const SampleRow *__restrict__ params,
                u32 *__restrict__ out) {
    __shared__ SampleShared sh;
    const SampleRow p = params[blockIdx.x];
    const RowSrc row{logits + (long long)blockIdx.x * n, n};

    u64 best = 0;
    row.each([&](u32 key, u32) { best = key > best ? key : best; });
    best = block_reduce<1>(best, sh);
    u64 first = 0xffffffffu;
    row.each([&](u32 key, u32 idx) {
        if (key == best && idx < first) first = idx;
    });
    first = block_reduce<2>(first, sh);
    // Greedy; also when no logit is finite or one is +inf (no distribution to sample from).
    if (!(p.temperature > 0.0f) || best <= KEY_NEG_INF || best >= KEY_POS_INF) {
        if (threadIdx.x == 0) out[blockIdx.x] = (u32)first;
        return;
    }

    const float m = key_logit((u32)best), inv_t = 1.0f / p.temperature, min_p = p.min_p;
    // As the CPU: exp((l - max) * (1 / T)), the subtraction and product rounded separately.
    auto prob = [=](u32 key) { return expf(__fmul_rn(__fsub_rn(key_logit(key), m), inv_t)); };
    auto fixed = [=](u32 key) -> u64 { return __float2ull_rn(prob(key) * ONE_FIXED); };

    Cut ck = CUT_ALL;
    if (p.top_k > 0 && p.top_k < (u32)n)
        select_first(
            row, [](u32, u32) { return true; }, [](u32) -> u64 { return 1; }, p.top_k, false,
            sh, ck);
    auto member = [=](u32 key, u32 idx) { return in_cut(ck, key, idx) && prob(key) >= min_p; };

    // The top-k set's total (what the CPU normalises by) and how many pass min-p.
    u64 z = 0, count = 0;
    row.each([&](u32 key, u32 idx) {
        if (!in_cut(ck, key, idx)) return;
        z += fixed(key);
        count += prob(key) >= min_p;
    });
    z = block_reduce<0>(z, sh);
    count = block_reduce<0>(count, sh);

    u32 tok;
    if (count <= SAMPLE_CAP) {
        if (threadIdx.x == 0) sh.count = 0;
        __syncthreads();
        row.each([&](u32 key, u32 idx) {
            if (!member(key, idx)) return;
            const int s = atomicAdd(&sh.count, 1);
            sh.list_key[s] = key;
            sh.list_idx[s] = idx;
        });
        __syncthreads();
        const ListSrc list{sh.list_key, sh.list_idx, (int)count};
        tok = top_p_and_draw(list, member, fixed, z, p, (u32)first, sh);
    } else {
        tok = top_p_and_draw(row, member, fixed, z, p, (u32)first, sh);
    }
    if (threadIdx.x == 0) out[blockIdx.x] = tok;
}
