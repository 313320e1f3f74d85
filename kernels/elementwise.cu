// elementwise.cu: the gated activations, the residual add, biases, scales and the logit
// soft-cap, each as src/backend/cpu/step.rs computes it (same operations, same roundings).
// One thread per value; any 1-D grid covering n.

// gate = silu(gate) * up with ggml's vectorised exp, as src/backend/cpu/ops.rs `silu_mul`:
// g / (1 + expf_v(0 - g)) * u, each operation rounded on its own.
extern "C" __global__ void silu_mul(float *gate, const float *__restrict__ up, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float g = gate[i];
    const float e = expf_v(__fsub_rn(0.0f, g));
    gate[i] = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, e)), up[i]);
}

// GELU's tanh approximation in f32, as src/backend/cpu/ops.rs `gelu` (the 1 + a*x*x fused).
__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608f; // sqrt(2 / pi)
    const float a = 0.044715f;
    const float inner = __fmul_rn(__fmul_rn(k, x), fmaf(__fmul_rn(a, x), x, 1.0f));
    return __fmul_rn(__fmul_rn(0.5f, x), __fadd_rn(1.0f, tanhf(inner)));
}

// GELU as ggml-cpu (and src/backend/cpu/ops.rs `gelu_mul`) looks it up: the input rounded to
// f16, the result rounded to f16, the tails beyond +-10 taken exactly.
__device__ __forceinline__ float gelu_looked_up(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    return f16_to_f32(f32_to_f16(gelu_tanh(f16_to_f32(f32_to_f16(x)))));
}

// gate = gelu(gate) * up.
extern "C" __global__ void gelu_mul(float *gate, const float *__restrict__ up, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    gate[i] = __fmul_rn(gelu_looked_up(gate[i]), up[i]);
}

// x = gelu(x): an encoder's ungated FFN (src/backend/cpu/ops.rs `activate`).
extern "C" __global__ void gelu(float *x, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = gelu_looked_up(x[i]);
}

// gpt-oss's clamped SwiGLU, as src/backend/cpu/ops.rs `swiglu_oai_mul`: the gate clamped above
// at 7, up to +-7, then x * sigmoid(1.702 x) * (up + 1).
extern "C" __global__ void swiglu_oai_mul(float *gate, const float *__restrict__ up,
                                          long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float x = fminf(gate[i], 7.0f);
    const float y = fminf(fmaxf(up[i], -7.0f), 7.0f);
    const float e = expf(__fmul_rn(1.702f, -x));
    gate[i] = __fmul_rn(__fdiv_rn(x, __fadd_rn(1.0f, e)), __fadd_rn(y, 1.0f));
}

// x += y * s (scaled first, then added: two roundings, as ggml's scale then add); s = 1 is a
// plain add.
extern "C" __global__ void add_scaled(float *x, const float *__restrict__ y, float s,
                                      long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fadd_rn(x[i], __fmul_rn(y[i], s));
}

// Every row of x (rows x cols, n = rows * cols values) += b (cols values).
extern "C" __global__ void add_bias(float *x, const float *__restrict__ b, long long n,
                                    int cols) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fadd_rn(x[i], b[i % cols]);
}

// x *= s.
extern "C" __global__ void scale(float *x, float s, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fmul_rn(x[i], s);
}

// x = cap * tanh(x / cap) (Gemma's final logit soft-cap; x * (1 / cap), as on the CPU).
extern "C" __global__ void softcap(float *x, float cap, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fmul_rn(tanhf(__fmul_rn(x[i], __fdiv_rn(1.0f, cap))), cap);
}
