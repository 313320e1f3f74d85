// norm.cu: RMSNorm as src/backend/cpu/ops.rs `rmsnorm` computes it: each square in f32, summed
// in f64, the mean rounded to f32, scale = 1 / sqrt(mean + eps), out = (x * scale) * w with two
// roundings. (The f64 sum is taken in a different order than on the CPU, so the mean can differ
// in its last bit; every other step is the same IEEE operation.)

#define NORM_THREADS 256

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
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = sum;
    __syncthreads();
    double total = 0.0;
#pragma unroll
    for (int k = 0; k < NORM_THREADS / WARP; ++k) total += partial[k];
    const float mean = (float)(total / (double)n);
    const float scale = 1.0f / sqrtf(mean + eps);
    float *orow = out + row * n;
    for (int i = threadIdx.x; i < n; i += NORM_THREADS) {
        orow[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
    }
}
