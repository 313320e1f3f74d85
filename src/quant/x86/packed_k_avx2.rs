//! 256-bit VNNI kernels over packed K-quant groups (`packed`), each group of sixteen rows as
//! two halves of eight: `packed_k_avx512`'s kernels (Q4_K in the peer's repacked order and
//! the chain order; Q6_K in its lane order and tiled order, a batch's six-bit values assembled
//! once per group), lane for lane, at half the register width, so bit-identical to them and to
//! `order::dot` / `vec_dot` (tested in `gemm`).
//! Built three times, as `packed_avx2` is: `vex` (AVX-VNNI), `evex` (AVX-512 VNNI + VL) and
//! `plain` (AVX2 alone, `vpdpbusd` emulated by `packed_avx2::dpbusd_u7`, exact here since
//! Q4_K's quants stay under 16 and Q6_K's under 64).

use std::arch::x86_64::*;

use crate::quant::formats::blocks::*;
use crate::quant::formats::packed::{checked, group_block_bytes, offsets, Out, PackedFn, GROUP};
use crate::quant::order::Order;
use crate::quant::x86::packed_avx2::dpbusd_u7;
use crate::quant::GgmlType;

/// Rows per register: half a group.
const HALF: usize = GROUP / 2;

/// One Q6_K super-block of a group unpacked: for each half, `h`, lane group `l` and quarter
/// `c`, the 32 bytes of eight rows' four values.
const Q6_K_UNPACKED_BYTES: usize = 2 * 2 * 8 * 4 * 32;

/// Where quarter `c` of lane group `l` of part `h` of half `half` of super-block `b` lies in
/// an unpacked group.
const fn q6_k_unpacked_at(b: usize, half: usize, h: usize, l: usize, c: usize) -> usize {
    b * Q6_K_UNPACKED_BYTES + (((half * 2 + h) * 8 + l) * 4 + c) * 32
}

thread_local! {
    /// Per-thread scratch for an unpacked Q6_K group (reused, never shrunk).
    static UNPACKED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Defines the kernels in module `$module`, compiled for `$features`, with `$dpbusd` as the
/// `vpdpbusd` (for unsigned bytes under 128, all these layouts have).
macro_rules! packed_k_kernels {
    ($module:ident, $features:literal, $dpbusd:ident) => {
        pub(crate) mod $module {
            use super::*;

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn dpbusd(acc: __m256i, u: __m256i, x: __m256i) -> __m256i {
                $dpbusd(acc, u, x)
            }

            /// Bytes `8·half..` of the sixteen at `p` (one per row) as i32 lanes.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn bytes_u32(p: *const u8, half: usize) -> __m256i {
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(p.add(HALF * half).cast()))
            }

            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn bytes_i32(p: *const u8, half: usize) -> __m256i {
                _mm256_cvtepi8_epi32(_mm_loadl_epi64(p.add(HALF * half).cast()))
            }

            /// Dword at byte `at` of an activation super-block's quants, in every lane.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn x_dword(x: &BlockQ8K, at: usize) -> __m256i {
                _mm256_set1_epi32(x.qs.as_ptr().add(at).cast::<i32>().read_unaligned())
            }

            /// Half `half` of the 64 bytes of a group block at `p`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn load(p: *const u8, half: usize) -> __m256i {
                _mm256_loadu_si256(p.add(32 * half).cast())
            }

            /// Half `half` of the sixteen f16 at `p`, as f32.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn halves_at(p: *const u8, half: usize) -> __m256 {
                _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * HALF * half).cast()))
            }

            /// `packed_k_avx512::q4_k_group` on half `half` of group `g`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q4_k_group<const T: usize>(
                nb: usize,
                g: *const u8,
                half: usize,
                x: [&[BlockQ8K]; T],
                per64: [bool; T],
            ) -> [__m256; T] {
                let gbb = group_block_bytes(GgmlType::Q4_K);
                let m4 = _mm256_set1_epi8(0x0F);
                let mut acc = [_mm256_setzero_ps(); T];
                let mut acc_min = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    // SAFETY (get_unchecked): the entry checked every token holds nb blocks.
                    let dw = halves_at(gb.add(offsets::D), half);
                    let dmin = halves_at(gb.add(offsets::Q4_K_DMIN), half);
                    // Loops, not `array::from_fn`: its closures lack the target features and
                    // were not inlined (a call per token and super-block).
                    let mut xb: [&BlockQ8K; T] = [&x[0][0]; T];
                    let (mut dd, mut dm) = ([_mm256_setzero_ps(); T], [_mm256_setzero_ps(); T]);
                    for t in 0..T {
                        xb[t] = unsafe { x[t].get_unchecked(b) };
                        dd[t] = _mm256_mul_ps(dw, _mm256_set1_ps(xb[t].d()));
                        dm[t] = _mm256_mul_ps(dmin, _mm256_set1_ps(xb[t].d()));
                    }
                    let mut whole_s = [_mm256_setzero_si256(); T];
                    let mut whole_m = [_mm256_setzero_si256(); T];
                    for j in 0..4 {
                        let sc = |k: usize| bytes_u32(gb.add(offsets::Q4_K_SC + GROUP * k), half);
                        let min = |k: usize| bytes_u32(gb.add(offsets::Q4_K_MIN + GROUP * k), half);
                        let (sc_lo, sc_hi) = (sc(2 * j), sc(2 * j + 1));
                        // Each row's two minimums as i16 halves of one dword, for `vpmaddwd`.
                        let min_pair =
                            _mm256_or_si256(min(2 * j), _mm256_slli_epi32::<16>(min(2 * j + 1)));
                        let mut dl = [_mm256_setzero_si256(); T];
                        let mut dh = [_mm256_setzero_si256(); T];
                        for w in 0..8 {
                            let q = load(gb.add(offsets::Q4_K_QS + 64 * (8 * j + w)), half);
                            let lo = _mm256_and_si256(q, m4);
                            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4);
                            for t in 0..T {
                                dl[t] = dpbusd(dl[t], lo, x_dword(xb[t], 64 * j + 4 * w));
                                dh[t] = dpbusd(dh[t], hi, x_dword(xb[t], 64 * j + 32 + 4 * w));
                            }
                        }
                        for t in 0..T {
                            let s = _mm256_add_epi32(
                                _mm256_mullo_epi32(dl[t], sc_lo),
                                _mm256_mullo_epi32(dh[t], sc_hi),
                            );
                            // Σ of 32 quants per minimum: two 16-value sums each.
                            let bs = |k: usize| {
                                (xb[t].bsum(2 * k) as i32 + xb[t].bsum(2 * k + 1) as i32) as u32
                            };
                            let bs_pair = ((bs(2 * j) & 0xFFFF) | (bs(2 * j + 1) << 16)) as i32;
                            let m = _mm256_madd_epi16(min_pair, _mm256_set1_epi32(bs_pair));
                            if per64[t] {
                                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd[t], acc[t]);
                                acc_min[t] =
                                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dm[t], acc_min[t]);
                            } else {
                                whole_s[t] = _mm256_add_epi32(whole_s[t], s);
                                whole_m[t] = _mm256_add_epi32(whole_m[t], m);
                            }
                        }
                    }
                    for t in 0..T {
                        if !per64[t] {
                            let (s, m) = (whole_s[t], whole_m[t]);
                            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dd[t], acc[t]);
                            acc_min[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(m), dm[t], acc_min[t]);
                        }
                    }
                }
                for t in 0..T {
                    acc[t] = _mm256_sub_ps(acc[t], acc_min[t]);
                }
                acc
            }

            /// `packed_k_avx512::q6_k_quarters` on half `half`: the four 6-bit quant vectors
            /// of lane group `l` of the super-block's half `h`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q6_k_quarters(
                gb: *const u8,
                half: usize,
                h: usize,
                l: usize,
            ) -> [__m256i; 4] {
                let m15 = _mm256_set1_epi8(15);
                let ql1 = load(gb.add(offsets::Q6_K_QL + 64 * (16 * h + l)), half);
                let ql2 = load(gb.add(offsets::Q6_K_QL + 64 * (16 * h + 8 + l)), half);
                let qh = load(gb.add(offsets::Q6_K_QH + 64 * (8 * h + l)), half);
                let bits = |mask: i8| _mm256_and_si256(qh, _mm256_set1_epi8(mask));
                [
                    _mm256_or_si256(_mm256_and_si256(ql1, m15), _mm256_slli_epi16::<4>(bits(3))),
                    _mm256_or_si256(_mm256_and_si256(ql2, m15), _mm256_slli_epi16::<2>(bits(12))),
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m15), bits(48)),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql2), m15),
                        _mm256_srli_epi16::<2>(bits(-64)),
                    ),
                ]
            }

            /// `packed_k_avx512::q6_k_lanes_group` on half `half`: ggml's lane order, one token.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q6_k_lanes_group(
                nb: usize,
                g: *const u8,
                half: usize,
                x: &[BlockQ8K],
            ) -> __m256 {
                let gbb = group_block_bytes(GgmlType::Q6_K);
                let mut acc = [_mm256_setzero_ps(); 8];
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    // SAFETY: the entry checked the token holds nb super-blocks.
                    let xb = unsafe { x.get_unchecked(b) };
                    let d =
                        _mm256_mul_ps(_mm256_set1_ps(xb.d()), halves_at(gb.add(offsets::D), half));
                    let sc = |k: usize| bytes_i32(gb.add(offsets::Q6_K_SC + GROUP * k), half);
                    let mut sumi = [_mm256_setzero_si256(); 8];
                    for (l, sumi) in sumi.iter_mut().enumerate() {
                        let bsum = |k: usize| _mm256_set1_epi32(xb.bsum(k) as i32);
                        let off = _mm256_add_epi32(
                            _mm256_mullo_epi32(sc(2 * l), bsum(2 * l)),
                            _mm256_mullo_epi32(sc(2 * l + 1), bsum(2 * l + 1)),
                        );
                        *sumi =
                            _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(off));
                    }
                    for h in 0..2 {
                        for (l, lane) in sumi.iter_mut().enumerate() {
                            let q = q6_k_quarters(gb, half, h, l);
                            for (c, &qc) in q.iter().enumerate() {
                                let x4 = x_dword(xb, 128 * h + 32 * c + 4 * l);
                                let p = dpbusd(_mm256_setzero_si256(), qc, x4);
                                let s = sc(8 * h + 2 * c + l / 4);
                                *lane = _mm256_add_epi32(*lane, _mm256_mullo_epi32(p, s));
                            }
                        }
                    }
                    for l in 0..8 {
                        acc[l] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(sumi[l]), acc[l]);
                    }
                }
                _mm256_add_ps(
                    _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
                    _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])),
                )
            }

            /// The `nb` Q6_K super-blocks of group `g`, both halves, with their six-bit values
            /// assembled once (`q6_k_quarters`) into `dst` (`nb * Q6_K_UNPACKED_BYTES`), for a
            /// batch's passes to load instead of assembling them again every few tokens.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn unpack_q6_k(nb: usize, g: *const u8, dst: &mut [u8]) {
                assert!(dst.len() >= nb * Q6_K_UNPACKED_BYTES);
                let gbb = group_block_bytes(GgmlType::Q6_K);
                for b in 0..nb {
                    for half in 0..2 {
                        for h in 0..2 {
                            for l in 0..8 {
                                let q = q6_k_quarters(g.add(b * gbb), half, h, l);
                                for (c, q) in q.into_iter().enumerate() {
                                    let at = q6_k_unpacked_at(b, half, h, l, c);
                                    _mm256_storeu_si256(dst.as_mut_ptr().add(at).cast(), q);
                                }
                            }
                        }
                    }
                }
            }

            /// `packed_k_avx512::q6_k_tiled_group` (the peer's tiled order) on half `half` of an
            /// unpacked group `u` (the scales and `d` still from the packed group `g`):
            /// per quarter `c`, its two sub-blocks' sums (started at −32·bsum) over the lane
            /// groups in order, then times their scales. Loading the values leaves registers
            /// for four tokens a pass.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn q6_k_unpacked_group<const T: usize>(
                nb: usize,
                g: *const u8,
                u: *const u8,
                half: usize,
                x: [&[BlockQ8K]; T],
            ) -> [__m256; T] {
                let gbb = group_block_bytes(GgmlType::Q6_K);
                let mut acc = [_mm256_setzero_ps(); T];
                for b in 0..nb {
                    let gb = g.add(b * gbb);
                    // SAFETY: the entry checked every token holds nb super-blocks.
                    macro_rules! xb {
                        ($t:expr) => {
                            unsafe { x[$t].get_unchecked(b) }
                        };
                    }
                    let mut s = [_mm256_setzero_si256(); T];
                    for h in 0..2 {
                        for c in 0..4 {
                            let mut sub = [[_mm256_setzero_si256(); 2]; T];
                            for t in 0..T {
                                for k in 0..2 {
                                    let bsum = xb!(t).bsum(8 * h + 2 * c + k) as i32;
                                    sub[t][k] = _mm256_set1_epi32(-32 * bsum);
                                }
                            }
                            for l in 0..8 {
                                let at = q6_k_unpacked_at(b, half, h, l, c);
                                let qc = _mm256_loadu_si256(u.add(at).cast());
                                for t in 0..T {
                                    let x4 = x_dword(xb!(t), 128 * h + 32 * c + 4 * l);
                                    sub[t][l / 4] = dpbusd(sub[t][l / 4], qc, x4);
                                }
                            }
                            for k in 0..2 {
                                let at = offsets::Q6_K_SC + GROUP * (8 * h + 2 * c + k);
                                let scale = bytes_i32(gb.add(at), half);
                                for t in 0..T {
                                    let p = _mm256_mullo_epi32(sub[t][k], scale);
                                    s[t] = _mm256_add_epi32(s[t], p);
                                }
                            }
                        }
                    }
                    let dw = halves_at(gb.add(offsets::D), half);
                    for t in 0..T {
                        let r = _mm256_mul_ps(dw, _mm256_cvtepi32_ps(s[t]));
                        acc[t] = _mm256_fmadd_ps(r, _mm256_set1_ps(xb!(t).d()), acc[t]);
                    }
                }
                acc
            }

            /// Stores rows of half `half` of group `g` for token `t`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn put(out: Out, t: usize, g: usize, half: usize, v: __m256) {
                _mm256_storeu_ps(out.ptr.add(t * out.stride + g * GROUP + half * HALF), v)
            }

            /// Q4_K's repacked order with the first `gemm_toks` tokens stepping per 64 values
            /// (`gemm_toks` 0: the chain order), a token a pass.
            #[target_feature(enable = $features)]
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
                let gb = nb * group_block_bytes(GgmlType::Q4_K);
                for g in 0..groups {
                    let gp = w.as_ptr().add(g * gb);
                    for half in 0..2 {
                        for t in 0..toks {
                            let xt = &x[t * nb..(t + 1) * nb];
                            let r = q4_k_group::<1>(nb, gp, half, [xt], [t < gemm_toks]);
                            put(out, t, g, half, r[0]);
                        }
                    }
                }
            }

            #[target_feature(enable = $features)]
            unsafe fn q4_k_repacked(
                nb: usize,
                w: &[u8],
                groups: usize,
                x: &[u8],
                toks: usize,
                out: Out,
            ) {
                q4_k(nb, w, groups, x, toks, out, toks - toks % 4)
            }

            #[target_feature(enable = $features)]
            unsafe fn q4_k_chain(
                nb: usize,
                w: &[u8],
                groups: usize,
                x: &[u8],
                toks: usize,
                out: Out,
            ) {
                q4_k(nb, w, groups, x, toks, out, 0)
            }

            /// Q6_K in the lane order (batches under 8 tokens).
            #[target_feature(enable = $features)]
            unsafe fn q6_k_lanes(
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
                    for half in 0..2 {
                        for t in 0..toks {
                            let v = q6_k_lanes_group(nb, gp, half, &x[t * nb..(t + 1) * nb]);
                            put(out, t, g, half, v);
                        }
                    }
                }
            }

            /// Q6_K in the tiled order (batches of 8 tokens or more, and the chain order): each
            /// group's six-bit values assembled once, then passes of up to four tokens over them
            /// (a pass's registers hold no assembly, so four tokens fit).
            #[target_feature(enable = $features)]
            unsafe fn q6_k_tiled(
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
                UNPACKED.with_borrow_mut(|u| {
                    u.resize(nb * Q6_K_UNPACKED_BYTES, 0);
                    // Passes as even as four tokens a pass allows.
                    let size = toks.div_ceil(toks.div_ceil(4).max(1)).max(1);
                    for g in 0..groups {
                        let gp = w.as_ptr().add(g * gb);
                        unpack_q6_k(nb, gp, u);
                        for half in 0..2 {
                            let mut t0 = 0;
                            while t0 < toks {
                                let n = (toks - t0).min(size);
                                macro_rules! pass {
                                    ($t:literal) => {{
                                        let mut xt: [&[BlockQ8K]; $t] = [&[]; $t];
                                        for i in 0..$t {
                                            xt[i] = xs(t0 + i);
                                        }
                                        let up = u.as_ptr();
                                        let r = q6_k_unpacked_group::<$t>(nb, gp, up, half, xt);
                                        for (i, v) in r.into_iter().enumerate() {
                                            put(out, t0 + i, g, half, v);
                                        }
                                    }};
                                }
                                match n {
                                    1 => pass!(1),
                                    2 => pass!(2),
                                    3 => pass!(3),
                                    _ => pass!(4),
                                }
                                t0 += n;
                            }
                        }
                    }
                });
            }

            /// The kernel for `ty` in `order`, where there is one.
            pub(crate) fn kernel(ty: GgmlType, order: Order) -> Option<PackedFn> {
                Some(match (ty, order) {
                    (GgmlType::Q4_K, Order::Repacked) => q4_k_repacked,
                    (GgmlType::Q4_K, Order::Chain) => q4_k_chain,
                    (GgmlType::Q6_K, Order::Lanes) => q6_k_lanes,
                    (GgmlType::Q6_K, Order::Tiled | Order::Chain) => q6_k_tiled,
                    _ => return None,
                })
            }
        }
    };
}

packed_k_kernels!(vex, "avx2,fma,f16c,avxvnni", _mm256_dpbusd_avx_epi32);
packed_k_kernels!(
    evex,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni",
    _mm256_dpbusd_epi32
);
packed_k_kernels!(plain, "avx2,fma,f16c", dpbusd_u7);
