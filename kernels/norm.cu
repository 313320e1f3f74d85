// norm.cu: RMSNorm and the layer norm, one thread block per row.
//
// RMSNorm as src/backend/cpu/ops.rs `rmsnorm` computes it: each square in f32, summed in f64,
// the mean rounded to f32, scale = 1 / sqrt(mean + eps), out = (x * scale) * w with two
// roundings. (The f64 sum is taken in a different order than on the CPU, so the mean can differ
// in its last bit; every other step is the same IEEE operation.)

#define NORM_THREADS 256

// The block's sum of one f64 per thread (every thread gets it). `partial`: NORM_THREADS / WARP
// slots; the barrier at the end lets the caller use them again.
__device__ __forceinline__ double block_sum(double v, double *partial) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = v;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_THREADS / WARP; ++k) total += partial[k];
    __syncthreads();
    return total;
}

// x, out: rows x n (out may alias x); w: n. One thread block of NORM_THREADS per row.
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    rmsnorm(const float *x, const float *__restrict__ w, float *out, int n, float eps) {
    __shared__ double partial[NORM_THREADS / WARP];
    const long long row = blockIdx.x;
    const float *xr = x + row * n;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float v = xr[i];
        sum += (double)__fmul_rn(v, v);
    }
    const float mean = (float)(block_sum(sum, partial) / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    float *orow = out + row * n;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        orow[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
    }
}

// A layer norm as src/backend/cpu/ops.rs `layernorm_in_place` computes it: the mean of the
// values (summed in f64, rounded to f32) subtracted, the mean of the squares of what is left
// (squares in f32, summed in f64, rounded to f32), scale = 1 / sqrt(var + eps), then
// out = (x - mean) * scale * w + b with each operation rounded. (The f64 sums run in another
// order than on the CPU.)
// x, out: rows x n (out may alias x); w, b: n. One thread block of NORM_THREADS per row.
extern "C" __global__ void __launch_bounds__(NORM_THREADS)
    layernorm(const float *x, const float *__restrict__ w, const float *__restrict__ b,
              float *out, int n, float eps) {
    __shared__ double partial[NORM_THREADS / WARP];
    const long long row = blockIdx.x;
    const float *xr = x + row * n;
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) sum += (double)xr[i];
    const float mean = (float)(block_sum(sum, partial) / (double)n);
    double squares = 0.0;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float v = __fsub_rn(xr[i], mean);
        squares += (double)__fmul_rn(v, v);
    }
    const float var = (float)(block_sum(squares, partial) / (double)n);
    const float scale = 1.0f / sqrtf(__fadd_rn(var, eps));
    float *orow = out + row * n;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        const float v = __fsub_rn(xr[i], mean);
        orow[i] = __fadd_rn(__fmul_rn(__fmul_rn(v, scale), w[i]), b[i]);
    }
}
