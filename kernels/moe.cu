// moe.cu: the routing half of a mixture-of-experts FFN, as src/backend/cpu/moe.rs computes it
// (llama.cpp's build_moe_ffn): the router's logits when the router is stored in f32, each
// token's picks and their weights, the experts' biases, and the weighted sum of the picked
// experts' outputs. The experts' matrices themselves are gemv.cu's moe_gemv_* kernels. Every
// buffer of pairs is token-major: pair p = t * used + s is token t's s-th pick, best first.

#define ROUTER_WARPS 4

// y[t * n_expert + e] = dot(w[e], x[t]) in f32 (w: n_expert x cols f32, x: n_tok x cols).
// One warp per (token, expert), ROUTER_WARPS per block: gridDim.x = ceil(n_tok * n_expert /
// ROUTER_WARPS), blockDim.x = 32 * ROUTER_WARPS.
extern "C" __global__ void moe_router_f32(const float *__restrict__ w, const float *__restrict__ x,
                                          float *__restrict__ y, int n_expert, int cols,
                                          int n_tok) {
    const long long i = (long long)blockIdx.x * ROUTER_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (i >= (long long)n_tok * n_expert) return;
    const long long t = i / n_expert, e = i % n_expert;
    const float *wr = w + e * cols, *xr = x + t * cols;
    float acc = 0.0f;
    for (int c = lane; c < cols; c += WARP) acc = fmaf(wr[c], xr[c], acc);
    const float s = warp_sum(acc);
    if (lane == 0) y[i] = s;
}

#define GATING_SOFTMAX_THEN_TOP_K 0
#define GATING_TOP_K_THEN_SOFTMAX 1
// The smallest sum of weights divided by (llama.cpp clamps it to the least normal f16).
#define MIN_WEIGHT_SUM 6.103515625e-5f

// Token t's `used` picks from its logits (n_tok x n_expert), best first, into ids and wts
// (n_tok x used): softmax then top k (gating 0) or top k then a softmax over the picks
// (gating 1); then, if `normalize`, the weights divided by their sum; then times `scale`
// (unless 0 or 1). Ties go to the lower expert, as the CPU's stable sort. One thread per token.
extern "C" __global__ void moe_route(const float *__restrict__ logits, int n_expert, int used,
                                     int gating, int normalize, float scale,
                                     int *__restrict__ ids, float *__restrict__ wts, int n_tok) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n_tok) return;
    const float *l = logits + (long long)t * n_expert;
    int *id = ids + (long long)t * used;
    float *wt = wts + (long long)t * used;
    const float NEG_INF = __uint_as_float(0xff800000u);
    float mx = NEG_INF;
    for (int e = 0; e < n_expert; ++e) mx = fmaxf(mx, l[e]);
    float inv = 1.0f;
    if (gating == GATING_SOFTMAX_THEN_TOP_K) {
        double sum = 0.0;
        for (int e = 0; e < n_expert; ++e) sum += (double)expf(l[e] - mx);
        inv = (float)(1.0 / sum);
    }
    // Each pick is the best expert after the previous one in (logit descending, expert
    // ascending) order, so nothing but the picks is kept.
    int prev = -1;
    float prev_v = 0.0f;
    for (int s = 0; s < used; ++s) {
        int best = -1;
        float bv = 0.0f;
        for (int e = 0; e < n_expert; ++e) {
            const float v = l[e];
            const bool after = prev < 0 || v < prev_v || (v == prev_v && e > prev);
            if (after && (best < 0 || v > bv)) {
                best = e;
                bv = v;
            }
        }
        // NaN logits order nothing: take some expert rather than read outside the tensor.
        if (best < 0) {
            best = s % n_expert;
            bv = l[best];
        }
        id[s] = best;
        wt[s] = gating == GATING_SOFTMAX_THEN_TOP_K ? __fmul_rn(expf(bv - mx), inv) : bv;
        prev = best;
        prev_v = bv;
    }
    if (gating == GATING_TOP_K_THEN_SOFTMAX) {
        const float m = wt[0];
        double sum = 0.0;
        for (int s = 0; s < used; ++s) {
            wt[s] = expf(wt[s] - m);
            sum += (double)wt[s];
        }
        const float inv_picks = (float)(1.0 / sum);
        for (int s = 0; s < used; ++s) wt[s] = __fmul_rn(wt[s], inv_picks);
    }
    if (normalize) {
        float sum = 0.0f;
        for (int s = 0; s < used; ++s) sum = __fadd_rn(sum, wt[s]);
        sum = fmaxf(sum, MIN_WEIGHT_SUM);
        for (int s = 0; s < used; ++s) wt[s] = __fdiv_rn(wt[s], sum);
    }
    if (scale != 0.0f && scale != 1.0f) {
        for (int s = 0; s < used; ++s) wt[s] = __fmul_rn(wt[s], scale);
    }
}

// Every pair's row of x (pairs x cols, n = pairs * cols values) += its expert's bias, row
// ids[pair] of b (n_expert x cols). One thread per value.
extern "C" __global__ void moe_add_bias(float *x, const float *__restrict__ b,
                                        const int *__restrict__ ids, long long n, int cols) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    x[i] = __fadd_rn(x[i], b[(long long)ids[i / cols] * cols + i % cols]);
}

// out[t] = sum over s of y[t * used + s] * wts[t * used + s], the picks in order (weighted,
// then added: ggml's views and adds). out: n_tok x cols (n values), y: pairs x cols. One
// thread per value of out.
extern "C" __global__ void moe_combine(const float *__restrict__ y, const float *__restrict__ wts,
                                       float *__restrict__ out, int used, int cols, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const long long t = i / cols;
    const float *w = wts + t * used;
    const float *yr = y + t * used * cols + i % cols;
    float o = __fmul_rn(yr[0], w[0]);
    for (int s = 1; s < used; ++s) o = __fadd_rn(o, __fmul_rn(yr[(long long)s * cols], w[s]));
    out[i] = o;
}
