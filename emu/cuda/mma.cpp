// mma.cpp: the warp-wide integer MMAs and half conversions that kernels/*.cu do in inline PTX.
// Fragment layouts are the PTX ISA's tables for mma.m16n8k32 / m16n8k16 with .s8 operands
// (g = lane / 4, t = lane % 4; byte i of a register is element i):
//   A m16n8k32: reg 0 row g, k 4t+i; reg 1 row g+8, k 4t+i; reg 2 row g, k 16+4t+i;
//               reg 3 row g+8, k 16+4t+i
//   B m16n8k32: reg 0 k 4t+i, column g; reg 1 k 16+4t+i, column g
//   A m16n8k16: reg 0 row g, k 4t+i; reg 1 row g+8, k 4t+i;  B: reg 0 k 4t+i, column g
//   C/D:        d0 (g, 2t), d1 (g, 2t+1), d2 (g+8, 2t), d3 (g+8, 2t+1)
#include "prelude.h"

#include <immintrin.h>

namespace emu {

namespace {

// Lane `l` of the warp computes its own four outputs: (row, column) for d0..d3 as the table
// above says. A's k chunk q (4 values: k = 4q..4q+3 for k < 16, 16 + 4(q-4).. above) of row r
// is register (r >= 8) + 2 * (q >= 4) of lane 4 * (r % 8) + q % 4; B's k chunk q of column c is
// register (q >= 4) of lane 4 * c + q % 4.
void product(const MmaFragments &f, int chunks, int d[4]) {
    const int l = lane(), g = l >> 2, t = l & 3;
    const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int o = 0; o < 4; ++o) {
        const int r = rows[o], c = cols[o];
        int s = 0;
        for (int q = 0; q < chunks; ++q) {
            const int a = f.a[4 * (r % 8) + q % 4][(r >= 8) + 2 * (q >= 4)];
            const int b = f.b[4 * c + q % 4][q >= 4];
            s = dp4a(a, b, s);
        }
        d[o] = s;
    }
}

} // namespace

void mma_m16n8k32_s8(int d[4], const int a[4], int b0, int b1) {
    product(gather_mma(a, b0, b1), 8, d);
}

void mma_m16n8k16_s8(int d[4], int a0, int a1, int b0) {
    const int a[4] = {a0, a1, 0, 0};
    product(gather_mma(a, b0, 0), 4, d);
}

float f16_to_f32(unsigned short h) { return _cvtsh_ss(h); }

unsigned short f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

} // namespace emu
