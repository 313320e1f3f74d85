// vit.cu: a vision encoder's bidirectional attention over an image's rows, and the row moves of
// its heads, each as src/vision/ computes them on the CPU.

#define VA_QUERIES 32
#define VA_KEYS 8
// The largest head the attention takes (src/backend/cuda/encoder_ops.rs VIT_MAX_HEAD_DIM).
#define VA_MAX_HD 128
#define NEG_INF __uint_as_float(0xff800000u)

// out = softmax(q kᵀ / sqrt(hd)) v for each head, each query row over the key rows its span
// names (a window's, or all of them), as src/vision/attention.rs: scores in f32, exp by
// ggml's vectorised expf of (score - max) * scale, outputs divided by the sum at the end. Here
// the maximum and the sum run over the keys as they come (flash attention's rescaling).
// q, k, v, out: n x heads*hd; spans: per query row, its first key row and the one past its
// last, non-decreasing along the rows (windows are runs of rows in order).
// grid = (ceil(n / VA_QUERIES), heads), block = VA_QUERIES: one thread per query row, each
// step of VA_KEYS keys staged in shared memory; hd <= VA_MAX_HD.
extern "C" __global__ void __launch_bounds__(VA_QUERIES)
    vit_attention(const float *__restrict__ q, const float *__restrict__ k,
                  const float *__restrict__ v, float *__restrict__ out,
                  const int *__restrict__ spans, int n, int heads, int hd) {
    __shared__ float qs[VA_QUERIES][VA_MAX_HD + 1];
    __shared__ float acc[VA_QUERIES][VA_MAX_HD + 1];
    __shared__ float ks[VA_KEYS][VA_MAX_HD];
    __shared__ float vs[VA_KEYS][VA_MAX_HD];
    const int t = threadIdx.x, q0 = blockIdx.x * VA_QUERIES;
    const long long width = (long long)heads * hd, col = (long long)blockIdx.y * hd;
    const int row = q0 + t;
    const int last = min(q0 + VA_QUERIES, n) - 1;
    // The block's keys: from its first query's span to its last query's.
    const int from = spans[2 * q0], to = spans[2 * last + 1];
    const int mine_from = row < n ? spans[2 * row] : 0, mine_to = row < n ? spans[2 * row + 1] : 0;
    for (int r = 0; r < VA_QUERIES; ++r) {
        for (int d = t; d < hd; d += VA_QUERIES) {
            qs[r][d] = q0 + r < n ? q[(q0 + r) * width + col + d] : 0.0f;
            acc[r][d] = 0.0f;
        }
    }
    const float scale = 1.0f / sqrtf((float)hd);
    float most = NEG_INF, sum = 0.0f;
    for (int k0 = from; k0 < to; k0 += VA_KEYS) {
        __syncthreads();
        for (int i = t; i < VA_KEYS * hd; i += VA_QUERIES) {
            const int key = k0 + i / hd, d = i % hd;
            ks[i / hd][d] = key < to ? k[key * width + col + d] : 0.0f;
            vs[i / hd][d] = key < to ? v[key * width + col + d] : 0.0f;
        }
        __syncthreads();
        float s[VA_KEYS];
        float step_most = NEG_INF;
#pragma unroll
        for (int j = 0; j < VA_KEYS; ++j) {
            const int key = k0 + j;
            s[j] = NEG_INF;
            if (key < mine_from || key >= mine_to) continue;
            float dot = 0.0f;
            for (int d = 0; d < hd; ++d) dot = fmaf(qs[t][d], ks[j][d], dot);
            s[j] = dot;
            step_most = fmaxf(step_most, dot);
        }
        if (step_most == NEG_INF) continue;
        const float now = fmaxf(most, step_most);
        // exp(-inf) is 0: the first keys rescale nothing.
        const float rescale = most == NEG_INF ? 0.0f : expf_v(__fmul_rn(most - now, scale));
        sum = __fmul_rn(sum, rescale);
        for (int d = 0; d < hd; ++d) acc[t][d] = __fmul_rn(acc[t][d], rescale);
#pragma unroll
        for (int j = 0; j < VA_KEYS; ++j) {
            if (s[j] == NEG_INF) continue;
            const float p = expf_v(__fmul_rn(s[j] - now, scale));
            sum = __fadd_rn(sum, p);
            for (int d = 0; d < hd; ++d) acc[t][d] = fmaf(p, vs[j][d], acc[t][d]);
        }
        most = now;
    }
    if (row >= n) return;
    for (int d = 0; d < hd; ++d) out[row * width + col + d] = __fdiv_rn(acc[t][d], sum);
}

// dst row r = src row index[r] (rows of `width` values): a permutation or a selection of an
// encoder's rows (Idefics3's pixel shuffle, Qwen-VL's windows put back in the grid's order).
// One thread per value of dst (rows x width); any 1-D grid covering them.
extern "C" __global__ void gather_rows(float *__restrict__ dst, const float *__restrict__ src,
                                       const int *__restrict__ index, int rows, int width) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)rows * width) return;
    const long long r = i / width, c = i % width;
    dst[i] = src[(long long)index[r] * width + c];
}

// Each k x k square of a side x side grid of rows (of `width` values) averaged into one row,
// as src/vision/head.rs `average_pool` (ggml's pool_2d): summed over the square's rows, then
// its columns, from 0, then divided by k * k. One thread per value of dst ((side / k)^2 rows
// of width); any 1-D grid covering them.
extern "C" __global__ void pool_squares(float *__restrict__ dst, const float *__restrict__ src,
                                        int side, int k, int width) {
    const int out_side = side / k;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)out_side * out_side * width) return;
    const long long o = i / width, c = i % width;
    const int oy = (int)(o / out_side), ox = (int)(o % out_side);
    float total = 0.0f;
    for (int ky = 0; ky < k; ++ky) {
        for (int kx = 0; kx < k; ++kx) {
            const long long at = (long long)(oy * k + ky) * side + ox * k + kx;
            total = __fadd_rn(total, src[at * width + c]);
        }
    }
    dst[i] = __fdiv_rn(total, (float)(k * k));
}
