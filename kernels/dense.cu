// dense.cu: a matrix of F16, BF16 or F32 weights times f32 rows, in f32 (a vision encoder's
// matrices: mmproj files keep them dense). y[t * rows + r] = sum over c of W[r][c] * x[t][c],
// each weight widened to f32 exactly, products fused into an f32 sum over c in order.
//
// Launch contract (src/backend/cuda/encoder_ops.rs `EncoderOps::linear` mirrors it):
//   dense_matmul(const u8 *w, int ty, const float *x, float *y, int rows, int cols,
//                int n_tok)
//   grid  = (ceil(rows / DM_TILE), ceil(n_tok / DM_TILE)), block = DM_THREADS,
//   shared memory: static only (8.5 KiB), nothing dynamic.
//   w: rows x cols row-major of type ty (GGML_F16, GGML_BF16 or GGML_F32); x: n_tok x cols;
//   y: n_tok x rows. Any sizes >= 1.
//
// Tiling: each block computes DM_TILE weight rows x DM_TILE tokens, each of its 16 x 16
// threads 4 x 4 of them (rows tx + 16i, tokens ty + 16j); K steps of DM_K values stage both
// tiles in shared memory (the weights widened there), padded against bank conflicts.

#define DM_TILE 64
#define DM_K 16
#define DM_THREADS 256

__device__ __forceinline__ float dense_weight(const u8 *w, int ty, long long i) {
    if (ty == GGML_F16) return f16_to_f32(((const u16 *)w)[i]);
    if (ty == GGML_BF16) return bf16_to_f32(((const u16 *)w)[i]);
    return ((const float *)w)[i];
}

extern "C" __global__ void __launch_bounds__(DM_THREADS)
    dense_matmul(const u8 *__restrict__ w, int ty, const float *__restrict__ x, float *y,
                 int rows, int cols, int n_tok) {
    __shared__ float ws[DM_K][DM_TILE + 1];
    __shared__ float xs[DM_K][DM_TILE + 1];
    const int r0 = blockIdx.x * DM_TILE, t0 = blockIdx.y * DM_TILE;
    const int tx = threadIdx.x % 16, ty_ = threadIdx.x / 16;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
    for (int k0 = 0; k0 < cols; k0 += DM_K) {
        // Each thread stages four weights and four activations: a row's DM_K values are read
        // by DM_K neighbouring threads.
        for (int i = threadIdx.x; i < DM_TILE * DM_K; i += DM_THREADS) {
            const int r = i / DM_K, k = i % DM_K, c = k0 + k;
            const int gr = r0 + r, gt = t0 + r;
            ws[k][r] = gr < rows && c < cols ? dense_weight(w, ty, (long long)gr * cols + c)
                                             : 0.0f;
            xs[k][r] = gt < n_tok && c < cols ? x[(long long)gt * cols + c] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < DM_K; ++k) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) a[i] = ws[k][tx + 16 * i];
#pragma unroll
            for (int j = 0; j < 4; ++j) b[j] = xs[k][ty_ + 16 * j];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int t = t0 + ty_ + 16 * j;
        if (t >= n_tok) continue;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = r0 + tx + 16 * i;
            if (r < rows) y[(long long)t * rows + r] = acc[i][j];
        }
    }
}
