// embed.cu: token embedding gather, dequantizing rows of token_embd in place (the reference
// model's and Gemma 3's are Q8_0). Each value as src/quant/formats/dequant.rs computes it. And
// the rows an image gives in place of its positions' embeddings.

__device__ __forceinline__ float dequant_one(const u8 *row, int ty, int c) {
    switch (ty) {
    case GGML_F32:
        return ((const float *)row)[c];
    case GGML_F16:
        return f16_to_f32(((const u16 *)row)[c]);
    case GGML_BF16:
        return bf16_to_f32(((const u16 *)row)[c]);
    case GGML_Q4_0: {
        const u8 *b = row + (c / QK) * BYTES_Q4_0;
        const int j = c % QK;
        const u8 q = b[2 + (j & 15)];
        const int v = (j < 16 ? (q & 0xF) : (q >> 4)) - 8;
        return __fmul_rn((float)v, f16_to_f32(ld_u16(b)));
    }
    case GGML_Q4_1: {
        const u8 *b = row + (c / QK) * BYTES_Q4_1;
        const int j = c % QK;
        const u8 q = b[4 + (j & 15)];
        const int v = j < 16 ? (q & 0xF) : (q >> 4);
        return __fadd_rn(__fmul_rn((float)v, f16_to_f32(ld_u16(b))), f16_to_f32(ld_u16(b + 2)));
    }
    case GGML_Q5_0: {
        const u8 *b = row + (c / QK) * BYTES_Q5_0;
        const int j = c % QK;
        const u8 q = b[6 + (j & 15)];
        const u32 qh = (u32)ld_i32_a2(b + 2);
        const int v = ((j < 16 ? (q & 0xF) : (q >> 4)) | (int)(((qh >> j) & 1u) << 4)) - 16;
        return __fmul_rn((float)v, f16_to_f32(ld_u16(b)));
    }
    case GGML_Q8_0: {
        const u8 *b = row + (c / QK) * BYTES_Q8_0;
        return __fmul_rn((float)(i8)b[2 + c % QK], f16_to_f32(ld_u16(b)));
    }
    case GGML_Q4_K: {
        const u8 *b = row + (c / QK_K) * BYTES_Q4_K;
        const int v = c % QK_K;
        const int sub = v / 32, j = sub / 2, l = v % 32;
        const u8 *sc = b + 4;
        int s, m;
        if (sub < 4) {
            s = sc[sub] & 63;
            m = sc[sub + 4] & 63;
        } else {
            s = (sc[sub + 4] & 0xF) | ((sc[sub - 4] >> 6) << 4);
            m = (sc[sub + 4] >> 4) | ((sc[sub] >> 6) << 4);
        }
        const u8 q = b[16 + 32 * j + l];
        const int qv = (sub & 1) ? (q >> 4) : (q & 0xF);
        const float d1 = __fmul_rn(f16_to_f32(ld_u16(b)), (float)s);
        const float m1 = __fmul_rn(f16_to_f32(ld_u16(b + 2)), (float)m);
        return __fsub_rn(__fmul_rn(d1, (float)qv), m1);
    }
    case GGML_Q6_K: {
        const u8 *b = row + (c / QK_K) * BYTES_Q6_K;
        const int v = c % QK_K;
        const int n = v / 128, r = v % 128, k = r / 32, l = r % 32;
        const u8 ql = b[64 * n + l + 32 * (k & 1)];
        const int lo = k < 2 ? (ql & 0xF) : (ql >> 4);
        const int hi = (b[128 + 32 * n + l] >> (2 * k)) & 3;
        const int q = (lo | (hi << 4)) - 32;
        const float sc = (float)((const i8 *)(b + 192))[8 * n + l / 16 + 2 * k];
        return __fmul_rn(__fmul_rn(f16_to_f32(ld_u16(b + 208)), sc), (float)q);
    }
    default:
        return __uint_as_float(0x7fc00000u); // NaN: a type the host should have refused
    }
}

// out[t * cols + c] = token_embd[tokens[t]][c] * scale (Gemma scales by sqrt(n_embd); 1
// elsewhere). row_bytes: bytes of one row of w in type ty. Grid: (ceil(cols / blockDim.x), n_tok).
extern "C" __global__ void embed(const u8 *__restrict__ w, int ty, long long row_bytes, int cols,
                                 const int *__restrict__ tokens, float scale,
                                 float *__restrict__ out) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const long long t = blockIdx.y;
    if (c >= cols) return;
    const u8 *row = w + (long long)tokens[t] * row_bytes;
    out[t * cols + c] = __fmul_rn(dequant_one(row, ty, c), scale);
}

// Rows given in place of tokens' embeddings (an image's): out[tokens[i] * cols + c] =
// rows[i * stride + offset + c], or added to it where `add` (Qwen3-VL's DeepStack rows, each at
// its offset within the input row). Grid: (ceil(cols / blockDim.x), n).
extern "C" __global__ void put_rows(float *__restrict__ out, const float *__restrict__ rows,
                                    const int *__restrict__ tokens, int cols, long long stride,
                                    long long offset, int add) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    const long long i = blockIdx.y;
    if (c >= cols) return;
    const float v = rows[i * stride + offset + c];
    float *o = out + (long long)tokens[i] * cols + c;
    *o = add ? __fadd_rn(*o, v) : v;
}
