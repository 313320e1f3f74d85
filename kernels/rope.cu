// rope.cu: rotary position embedding and the 64-wide Walsh-Hadamard rotation of quantized KV.
//
// RoPE takes its (cos, sin) table from the host, computed by src/backend/cpu/ops.rs
// `rope_cos_sin` (ggml's sequential theta products, libm's cos/sin): the device then applies
// exactly the CPU's rotation, `x0*c - x1*s` as one fused multiply-add over a rounded product.

// x: n_tok x n_heads x head_dim, rotated in place; cs: n_tok x (n_rot/2) (cos, sin) pairs.
// neox = 0: adjacent pairs (x[2i], x[2i+1]) (llama); 1: halves (x[i], x[i + n_rot/2]) (qwen2).
// One thread per (token, head, pair); any 1-D grid covering them.
extern "C" __global__ void rope(float *x, const float *__restrict__ cs, int n_tok, int n_heads,
                                int head_dim, int n_rot, int neox) {
    const int half = n_rot / 2;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long total = (long long)n_tok * n_heads * half;
    if (idx >= total) return;
    const int i = (int)(idx % half);
    const long long th = idx / half; // token * n_heads + head
    const long long t = th / n_heads;
    float *head = x + th * head_dim;
    const float c = cs[(t * half + i) * 2];
    const float s = cs[(t * half + i) * 2 + 1];
    const int i0 = neox ? i : 2 * i;
    const int i1 = neox ? i + half : 2 * i + 1;
    const float x0 = head[i0], x1 = head[i1];
    head[i0] = fmaf(x0, c, -__fmul_rn(x1, s));
    head[i1] = fmaf(x0, s, __fmul_rn(x1, c));
}

// Rotates every 64-value chunk of x (n_chunks of them, contiguous) by the orthonormal
// Walsh-Hadamard matrix, as src/backend/cpu/ops.rs `hadamard_64`: the same butterflies in the
// same stage order, then * 0.125, so the result is bit-identical. One warp per chunk; blockDim
// a multiple of 32.
#define HAD_WARPS_MAX 32
extern "C" __global__ void hadamard_64(float *x, long long n_chunks) {
    __shared__ float buf[HAD_WARPS_MAX][64];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    const long long chunk = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (chunk >= n_chunks || wib >= HAD_WARPS_MAX) return;
    float *v = x + chunk * 64;
    float *s = buf[wib];
    s[lane] = v[lane];
    s[lane + 32] = v[lane + 32];
    __syncwarp();
    for (int h = 1; h < 64; h <<= 1) {
        const int i = (lane / h) * 2 * h + (lane % h);
        const float a = s[i], b = s[i + h];
        __syncwarp();
        s[i] = __fadd_rn(a, b);
        s[i + h] = __fsub_rn(a, b);
        __syncwarp();
    }
    v[lane] = __fmul_rn(s[lane], 0.125f);
    v[lane + 32] = __fmul_rn(s[lane + 32], 0.125f);
}
