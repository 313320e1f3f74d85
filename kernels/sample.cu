// sample.cu: greedy sampling on the device: the index of the largest logit of each row, the
// first one on ties (src/engine/sampler.rs `argmax`); NaNs never win (the CPU's scan differs
// only when logit 0 itself is NaN: it then returns 0).

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
