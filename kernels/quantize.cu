// quantize.cu: f32 activations -> q8_1 blocks for the dp4a dot products (src/quant/formats/quantize.rs
// `q8_1`, the x86 rounding the CPU backend follows): d = amax/127, q = round_ties_even(x *
// 127/amax), d stored as f16, s = f16(d * sum(q)).

// x: rows x cols f32 (cols a multiple of 32); y: rows x cols/32 q8_1 blocks.
// One warp per block of 32 values; any grid of whole warps (blockDim a multiple of 32).
extern "C" __global__ void quantize_q8_1(const float *__restrict__ x, u8 *__restrict__ y,
                                         int rows, int cols) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const long long blocks_per_row = cols / QK;
    if (warp >= (long long)rows * blocks_per_row) return;
    const float v = x[warp * QK + lane];
    const float amax = warp_max(fabsf(v));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const int q = __float2int_rn(__fmul_rn(v, id)); // |q| <= 127
    const int sum = warp_sum_i(q);
    u8 *b = y + warp * BYTES_Q8_1;
    b[4 + lane] = (u8)(i8)q;
    if (lane == 0) {
        *(u16 *)b = f32_to_f16(d);
        *(u16 *)(b + 2) = f32_to_f16(__fmul_rn(d, (float)sum));
    }
}
