// kv.cu: writes a step's K and V rows into their KV pages (src/kv/pages.rs `write_row`, the
// row encodings of src/kv/page_format.rs `encode_row`):
// - f16: round to nearest even;
// - q8_0: d = amax/127, q = round_ties_even(v * 127/amax) (ggml-cpu's x86 rounding);
// - q4_0: ggml's reference rounding: the value of largest magnitude (the first, on ties) maps
//   to -8, d = max / -8, q = min(15, (int)(v / d + 8.5)).
// K and V arrive already rotated (RoPE, and the Hadamard rotation for quantized pages).

// k, v: n_tok x kv_heads x head_dim; slots[t]: the pool slot (block * block_size + offset).
// One warp per (token, part, head, 32-value block); blockDim a multiple of 32.
extern "C" __global__ void kv_append(const float *__restrict__ k, const float *__restrict__ v,
                                     const int *__restrict__ slots, int n_tok,
                                     u8 *__restrict__ pages, int layer, int blocks,
                                     int kv_heads, int head_dim, int block_size, int kv_type) {
    const int lane = threadIdx.x & 31;
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int nb = head_dim / QK;
    if (warp >= (long long)n_tok * 2 * kv_heads * nb) return;
    const int c = (int)(warp % nb);
    const int head = (int)((warp / nb) % kv_heads);
    const int part = (int)((warp / ((long long)nb * kv_heads)) % 2);
    const long long t = warp / ((long long)nb * kv_heads * 2);
    const float x = (part ? v : k)[(t * kv_heads + head) * head_dim + c * QK + lane];

    const int slot = slots[t];
    const int row_bytes = kv_row_bytes(kv_type, head_dim);
    const u64 head_bytes = (u64)block_size * row_bytes;
    u8 *row = pages + kv_head_offset(layer, blocks, slot / block_size, part, kv_heads, head,
                                     head_bytes) +
              (u64)(slot % block_size) * row_bytes;

    if (kv_type == KV_F16) {
        ((u16 *)row)[c * QK + lane] = f32_to_f16(x);
    } else if (kv_type == KV_Q8_0) {
        u8 *b = row + c * BYTES_Q8_0;
        const float amax = warp_max(fabsf(x));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        b[2 + lane] = (u8)(i8)__float2int_rn(__fmul_rn(x, id));
        if (lane == 0) *(u16 *)b = f32_to_f16(amax / 127.0f);
    } else {
        u8 *b = row + c * BYTES_Q4_0;
        // The signed value of largest magnitude; ties go to the lowest index, as the CPU's
        // strict `>` scan does.
        float am = fabsf(x);
        int at = lane;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float am2 = __shfl_xor_sync(0xffffffffu, am, o);
            const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
            if (am2 > am || (am2 == am && at2 < at)) {
                am = am2;
                at = at2;
            }
        }
        const float vmax = __shfl_sync(0xffffffffu, x, at);
        const float d = vmax / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int q = min(15, max(0, __float2int_rz(__fadd_rn(__fmul_rn(x, id), 8.5f))));
        const int q_hi = __shfl_down_sync(0xffffffffu, q, 16);
        if (lane < 16) b[2 + lane] = (u8)(q | (q_hi << 4));
        if (lane == 0) *(u16 *)b = f32_to_f16(d);
    }
}

// Copies every layer's rows of block src into block dst (copy-on-write of a shared, partly
// filled block), as src/kv/pages.rs `copy_block`. span = 2 * kv_heads * head_bytes bytes per
// layer, a multiple of 2. One thread per 16-bit word per layer; grid covers layers * span / 2.
extern "C" __global__ void kv_copy_block(u8 *pages, int layers, int blocks, long long span,
                                         int src, int dst) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long words = span / 2;
    if (i >= (long long)layers * words) return;
    const long long layer = i / words, w = i % words;
    u16 *p = (u16 *)pages;
    p[((layer * blocks + dst) * span) / 2 + w] = p[((layer * blocks + src) * span) / 2 + w];
}
