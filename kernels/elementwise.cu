// elementwise.cu: SwiGLU and the residual add.

// gate = silu(gate) * up with ggml's vectorised exp, as src/backend/cpu/ops.rs `silu_mul`:
// g / (1 + expf_v(0 - g)) * u, each operation rounded on its own.
extern "C" __global__ void silu_mul(float *gate, const float *__restrict__ up, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    const float e = expf_v(__fsub_rn(0.0f, g));
    gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, e)), up[i]);
}

// x += y.
extern "C" __global__ void add_inplace(float *x, const float *__restrict__ y, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fadd_rn(x[i], y[i]);
}
