//! AVX-512 VNNI kernels over packed K-quant groups (`packed`): Q4_K in the peer's repacked
//! order and Q6_K in its lane order (small batches) and tiled order (8 tokens or more), each
//! bit-identical to `order::dot` / `vec_dot` for the same pair (tested in `gemm`).
//!
//! As in `packed_avx512`, a register holds one lane per row of the group. The integer parts
//! are exact whatever the instruction (`vpdpbusd` sums of four products, a sub-block's sum
//! times its scale with `vpmulld`); what must match the peer is only where the float steps
//! round, which each kernel below states.

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;
use crate::quant::formats::packed::{checked, group_block_bytes, offsets, Out, GROUP};
use crate::quant::x86::packed_avx512::halves_at;
use crate::quant::GgmlType;

/// Sixteen bytes at `p` (one per row) as i32 lanes, zero- or sign-extended.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn bytes_u32(p: *const u8) -> __m512i {
    _mm512_cvtepu8_epi32(_mm_loadu_si128(p.cast()))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn bytes_i32(p: *const u8) -> __m512i {
    _mm512_cvtepi8_epi32(_mm_loadu_si128(p.cast()))
}

/// Dword at byte `at` of an activation super-block's quants, in every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn x_dword(x: &BlockQ8K, at: usize) -> __m512i {
    _mm512_set1_epi32(x.qs.as_ptr().add(at).cast::<i32>().read_unaligned())
}

/// 64 bytes of a group block at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn load(p: *const u8) -> __m512i {
    _mm512_loadu_si512(p.cast())
}

// ------------------------------------------------------------------------------- Q4_K

/// Q4_K × Q8_K in the peer's repacked order, `T` tokens: per row a fused chain for the scales
/// and one for the minimums, `acc + int·(d·dx)` and `acc_min + int·(dmin·dx)`, subtracted at
/// the end; token `t` steps once per 64 values where `per64[t]` (the peer's 4-token GEMM),
/// else once per super-block (its GEMV, for the batch's last `n mod 4` tokens).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn q4_k_group<const T: usize>(
    nb: usize,
    g: *const u8,
    x: [&[BlockQ8K]; T],
    per64: [bool; T],
) -> [__m512; T] {
    let gbb = group_block_bytes(GgmlType::Q4_K);
    let m4 = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); T];
    let mut acc_min = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let gb = g.add(b * gbb);
        // SAFETY (get_unchecked): the entry checked every token holds nb super-blocks.
        let xb: [&BlockQ8K; T] = std::array::from_fn(|t| unsafe { x[t].get_unchecked(b) });
        let dw = halves_at(gb.add(offsets::D));
        let dmin = halves_at(gb.add(offsets::Q4_K_DMIN));
        let dd: [__m512; T] = std::array::from_fn(|t| _mm512_mul_ps(dw, _mm512_set1_ps(xb[t].d())));
        let dm: [__m512; T] =
            std::array::from_fn(|t| _mm512_mul_ps(dmin, _mm512_set1_ps(xb[t].d())));
        let mut whole_s = [_mm512_setzero_si512(); T];
        let mut whole_m = [_mm512_setzero_si512(); T];
        for j in 0..4 {
            let sc_lo = bytes_u32(gb.add(offsets::Q4_K_SC + GROUP * 2 * j));
            let sc_hi = bytes_u32(gb.add(offsets::Q4_K_SC + GROUP * (2 * j + 1)));
            // Each row's two minimums as i16 halves of one dword, for `vpmaddwd`.
            let min_pair = _mm512_or_si512(
                bytes_u32(gb.add(offsets::Q4_K_MIN + GROUP * 2 * j)),
                _mm512_slli_epi32::<16>(bytes_u32(gb.add(offsets::Q4_K_MIN + GROUP * (2 * j + 1)))),
            );
            let mut dl = [_mm512_setzero_si512(); T];
            let mut dh = [_mm512_setzero_si512(); T];
            for w in 0..8 {
                let q = load(gb.add(offsets::Q4_K_QS + 64 * (8 * j + w)));
                let lo = _mm512_and_si512(q, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4);
                for t in 0..T {
                    dl[t] = _mm512_dpbusd_epi32(dl[t], lo, x_dword(xb[t], 64 * j + 4 * w));
                    dh[t] = _mm512_dpbusd_epi32(dh[t], hi, x_dword(xb[t], 64 * j + 32 + 4 * w));
                }
            }
            for t in 0..T {
                let s = _mm512_add_epi32(
                    _mm512_mullo_epi32(dl[t], sc_lo),
                    _mm512_mullo_epi32(dh[t], sc_hi),
                );
                // Σ of 32 quants per minimum: two 16-value sums each.
                let bs =
                    |k: usize| (xb[t].bsum(2 * k) as i32 + xb[t].bsum(2 * k + 1) as i32) as u32;
                let bs_pair = ((bs(2 * j) & 0xFFFF) | (bs(2 * j + 1) << 16)) as i32;
                let m = _mm512_madd_epi16(min_pair, _mm512_set1_epi32(bs_pair));
                if per64[t] {
                    acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), dd[t], acc[t]);
                    acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), dm[t], acc_min[t]);
                } else {
                    whole_s[t] = _mm512_add_epi32(whole_s[t], s);
                    whole_m[t] = _mm512_add_epi32(whole_m[t], m);
                }
            }
        }
        for t in 0..T {
            if !per64[t] {
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(whole_s[t]), dd[t], acc[t]);
                acc_min[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(whole_m[t]), dm[t], acc_min[t]);
            }
        }
    }
    std::array::from_fn(|t| _mm512_sub_ps(acc[t], acc_min[t]))
}

// ------------------------------------------------------------------------------- Q6_K

/// The four 6-bit quant vectors of lane group `l` of half `h` (quarters 0..4: values
/// `128h + 32c + 4l..`), from the group block's `ql` and `qh` dwords, as ggml forms them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn q6_k_quarters(gb: *const u8, h: usize, l: usize) -> [__m512i; 4] {
    let m15 = _mm512_set1_epi8(15);
    let ql1 = load(gb.add(offsets::Q6_K_QL + 64 * (16 * h + l)));
    let ql2 = load(gb.add(offsets::Q6_K_QL + 64 * (16 * h + 8 + l)));
    let qh = load(gb.add(offsets::Q6_K_QH + 64 * (8 * h + l)));
    let bits = |mask: i8| _mm512_and_si512(qh, _mm512_set1_epi8(mask));
    [
        _mm512_or_si512(_mm512_and_si512(ql1, m15), _mm512_slli_epi16::<4>(bits(3))),
        _mm512_or_si512(_mm512_and_si512(ql2, m15), _mm512_slli_epi16::<2>(bits(12))),
        _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql1), m15), bits(48)),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql2), m15),
            _mm512_srli_epi16::<2>(bits(-64)),
        ),
    ]
}

/// Q6_K × Q8_K in ggml's lane order (`vec_dot_q6_K`), one token: per row eight i32 lanes per
/// super-block, lane `l` summing scale × (four products) over the eight 32-value quarters,
/// less 32 × (bsum·scale) of sub-blocks `2l` and `2l+1`; then per lane a fused chain of
/// `(dx·d) × lane` over the super-blocks, summed as `hsum_float_8`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn q6_k_lanes_group(nb: usize, g: *const u8, x: &[BlockQ8K]) -> __m512 {
    let gbb = group_block_bytes(GgmlType::Q6_K);
    let mut acc = [_mm512_setzero_ps(); 8];
    for b in 0..nb {
        let gb = g.add(b * gbb);
        // SAFETY: the entry checked the token holds nb super-blocks.
        let xb = unsafe { x.get_unchecked(b) };
        let d = _mm512_mul_ps(_mm512_set1_ps(xb.d()), halves_at(gb.add(offsets::D)));
        let sc = |k: usize| bytes_i32(gb.add(offsets::Q6_K_SC + GROUP * k));
        let mut sumi: [__m512i; 8] = std::array::from_fn(|l| {
            let off = _mm512_add_epi32(
                _mm512_mullo_epi32(sc(2 * l), _mm512_set1_epi32(xb.bsum(2 * l) as i32)),
                _mm512_mullo_epi32(sc(2 * l + 1), _mm512_set1_epi32(xb.bsum(2 * l + 1) as i32)),
            );
            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32::<5>(off))
        });
        for h in 0..2 {
            for (l, lane) in sumi.iter_mut().enumerate() {
                let q = q6_k_quarters(gb, h, l);
                for (c, &qc) in q.iter().enumerate() {
                    let p = _mm512_dpbusd_epi32(
                        _mm512_setzero_si512(),
                        qc,
                        x_dword(xb, 128 * h + 32 * c + 4 * l),
                    );
                    *lane =
                        _mm512_add_epi32(*lane, _mm512_mullo_epi32(p, sc(8 * h + 2 * c + l / 4)));
                }
            }
        }
        for l in 0..8 {
            acc[l] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi[l]), acc[l]);
        }
    }
    _mm512_add_ps(
        _mm512_add_ps(_mm512_add_ps(acc[0], acc[4]), _mm512_add_ps(acc[2], acc[6])),
        _mm512_add_ps(_mm512_add_ps(acc[1], acc[5]), _mm512_add_ps(acc[3], acc[7])),
    )
}

/// Q6_K × Q8_K in the peer's tiled order (batches of 8 tokens or more), `T` tokens: per row
/// and super-block the exact integer Σ scale·Σ(q − 32)·x, then `acc + (d·int)·dx`, fused.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn q6_k_tiled_group<const T: usize, const U: bool>(
    nb: usize,
    g: *const u8,
    x: [&[BlockQ8K]; T],
) -> [__m512; T] {
    let gbb = if U {
        UNPACKED_BYTES
    } else {
        group_block_bytes(GgmlType::Q6_K)
    };
    let mut acc = [_mm512_setzero_ps(); T];
    for b in 0..nb {
        let gb = g.add(b * gbb);
        // SAFETY: the entry checked every token holds nb super-blocks.
        let xb: [&BlockQ8K; T] = std::array::from_fn(|t| unsafe { x[t].get_unchecked(b) });
        let mut s = [_mm512_setzero_si512(); T];
        for h in 0..2 {
            // Per quarter c, its two 16-value sub-blocks' sums, started at −32·bsum (the
            // −32 of every quant) so that one product by the scale takes both.
            let mut sub: [[[__m512i; 2]; 4]; T] = std::array::from_fn(|t| {
                std::array::from_fn(|c| {
                    std::array::from_fn(|k| {
                        let bsum = xb[t].bsum(8 * h + 2 * c + k) as i32;
                        _mm512_set1_epi32(-32 * bsum)
                    })
                })
            });
            for l in 0..8 {
                let q = if U {
                    let at = gb.add(UNPACKED_VALUES + 64 * (32 * h + 4 * l));
                    std::array::from_fn(|c| load(at.add(64 * c)))
                } else {
                    q6_k_quarters(gb, h, l)
                };
                for (c, &qc) in q.iter().enumerate() {
                    for t in 0..T {
                        let at = 128 * h + 32 * c + 4 * l;
                        sub[t][c][l / 4] =
                            _mm512_dpbusd_epi32(sub[t][c][l / 4], qc, x_dword(xb[t], at));
                    }
                }
            }
            for sub_block in 0..8 {
                let (c, k) = (sub_block / 2, sub_block % 2);
                let scale = bytes_i32(gb.add(offsets::Q6_K_SC + GROUP * (8 * h + sub_block)));
                for t in 0..T {
                    s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(sub[t][c][k], scale));
                }
            }
        }
        let dw = halves_at(gb.add(offsets::D));
        for t in 0..T {
            let r = _mm512_mul_ps(dw, _mm512_cvtepi32_ps(s[t]));
            acc[t] = _mm512_fmadd_ps(r, _mm512_set1_ps(xb[t].d()), acc[t]);
        }
    }
    acc
}

// ------------------------------------------------------------------------ unpacking

/// A Q6_K group block unpacked for a batch: the packed block's scales as they were (at the
/// same offsets), then the unsigned quant bytes of its 64 registers, 64 B each, in the order
/// the kernels read them. A batch of several tokens unpacks each group once instead of once
/// per pass of two tokens: Q6_K's quants take about as many instructions to assemble as one
/// token's products (+20% at 64 tokens, measured); Q4_K's nibbles are cheap enough that the
/// store and reload would cost more than they save, so Q4_K is never unpacked.
const UNPACKED_VALUES: usize = offsets::Q6_K_QL;
const UNPACKED_BYTES: usize = UNPACKED_VALUES + 64 * 64;

/// Batches of at least this many tokens unpack each group once for all their passes.
const UNPACK_FROM_TOKENS: usize = 4;

/// The `nb` Q6_K group blocks at `g`, unpacked into `dst` (`nb * UNPACKED_BYTES`) with the
/// same arithmetic the direct kernels use.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn unpack_q6_k(nb: usize, g: *const u8, dst: &mut Vec<u8>) {
    dst.resize(nb * UNPACKED_BYTES, 0);
    let gbb = group_block_bytes(GgmlType::Q6_K);
    for b in 0..nb {
        let gb = g.add(b * gbb);
        let out = dst.as_mut_ptr().add(b * UNPACKED_BYTES);
        let store = |slot: usize, v: __m512i| unsafe {
            _mm512_storeu_si512(out.add(UNPACKED_VALUES + 64 * slot).cast(), v)
        };
        std::ptr::copy_nonoverlapping(gb, out, offsets::Q6_K_QL);
        for h in 0..2 {
            for l in 0..8 {
                for (c, q) in q6_k_quarters(gb, h, l).into_iter().enumerate() {
                    store(32 * h + 4 * l + c, q);
                }
            }
        }
    }
}

thread_local! {
    /// Per-thread scratch for an unpacked group (reused, never shrunk).
    static UNPACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

// --------------------------------------------------------------------------- entries

/// Runs `$pair` for tokens `t0` and `t0 + 1` while two are left, then `$single` for a last
/// odd token `t0`: the K-quant kernels carry two tokens a pass (their accumulators and the
/// unpacked quants fill the registers), so every entry walks the batch this way.
macro_rules! in_pairs {
    ($toks:expr, $t0:ident, $pair:block, $single:block) => {{
        let mut $t0 = 0;
        while $t0 < $toks {
            if $toks - $t0 >= 2 {
                $pair
                $t0 += 2;
            } else {
                $single
                $t0 += 1;
            }
        }
    }};
}

/// Q4_K in the repacked order (see `packed::PackedFn`).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn q4_k_repacked(
    nb: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: Out,
) {
    q4_k(nb, w, groups, x, toks, out, toks - toks % 4)
}

/// Q4_K in the chain order: every token as the peer's GEMV takes one, a step per super-block.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn q4_k_chain(
    nb: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: Out,
) {
    q4_k(nb, w, groups, x, toks, out, 0)
}

/// Q4_K's repacked order with the first `gemm_toks` tokens stepping per 64 values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
unsafe fn q4_k(
    nb: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: Out,
    gemm_toks: usize,
) {
    let x = checked::<BlockQ8K>(GgmlType::Q4_K, nb, w, groups, x, toks);
    let xs = |t: usize| &x[t * nb..(t + 1) * nb];
    let gb = nb * group_block_bytes(GgmlType::Q4_K);
    // Q4_K's nibbles are two instructions a register: unpacking ahead does not pay.
    for g in 0..groups {
        let gp = w.as_ptr().add(g * gb);
        in_pairs!(
            toks,
            t0,
            {
                let per64 = [t0 < gemm_toks, t0 + 1 < gemm_toks];
                let r = q4_k_group::<2>(nb, gp, [xs(t0), xs(t0 + 1)], per64);
                out.put(t0, g, r[0]);
                out.put(t0 + 1, g, r[1]);
            },
            {
                let r = q4_k_group::<1>(nb, gp, [xs(t0)], [t0 < gemm_toks]);
                out.put(t0, g, r[0]);
            }
        );
    }
}

/// Q6_K in the lane order (batches under 8 tokens).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn q6_k_lanes(
    nb: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: Out,
) {
    let x = checked::<BlockQ8K>(GgmlType::Q6_K, nb, w, groups, x, toks);
    let gb = nb * group_block_bytes(GgmlType::Q6_K);
    for g in 0..groups {
        let gp = w.as_ptr().add(g * gb);
        for t in 0..toks {
            out.put(t, g, q6_k_lanes_group(nb, gp, &x[t * nb..(t + 1) * nb]));
        }
    }
}

/// Q6_K in the tiled order (batches of 8 tokens or more).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn q6_k_tiled(
    nb: usize,
    w: &[u8],
    groups: usize,
    x: &[u8],
    toks: usize,
    out: Out,
) {
    let x = checked::<BlockQ8K>(GgmlType::Q6_K, nb, w, groups, x, toks);
    let xs = |t: usize| &x[t * nb..(t + 1) * nb];
    let gb = nb * group_block_bytes(GgmlType::Q6_K);
    macro_rules! passes {
        ($g:expr, $gp:expr, $u:literal) => {{
            let (g, gp) = ($g, $gp);
            in_pairs!(
                toks,
                t0,
                {
                    let r = q6_k_tiled_group::<2, $u>(nb, gp, [xs(t0), xs(t0 + 1)]);
                    out.put(t0, g, r[0]);
                    out.put(t0 + 1, g, r[1]);
                },
                {
                    out.put(t0, g, q6_k_tiled_group::<1, $u>(nb, gp, [xs(t0)])[0]);
                }
            );
        }};
    }
    UNPACKED.with_borrow_mut(|u| {
        for g in 0..groups {
            if toks >= UNPACK_FROM_TOKENS {
                unpack_q6_k(nb, w.as_ptr().add(g * gb), u);
                passes!(g, u.as_ptr(), true);
            } else {
                passes!(g, w.as_ptr().add(g * gb), false);
            }
        }
    });
}
