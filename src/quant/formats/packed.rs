//! The packed weight layout: a matrix's rows in groups of [`GROUP`], each group's blocks
//! interleaved so that one 512-bit load holds the same four quant bytes of all sixteen rows.
//!
//! Why: a row-major matrix makes a one-token product (decode) a horizontal problem, a dot
//! product per row, with its unpacking, scale conversions and final sums spent on one row at a
//! time. Interleaved, every vector instruction serves sixteen rows: the quants of dword `j` of
//! a block arrive as sixteen rows' lanes, `vpdpbusd` against the token's dword `j` broadcast
//! gives each row's integer lane sum, and the rows' scales come in one load. That is the same
//! idea as llama.cpp's repacked `q4_0_8x8` buffers, applied to every type edgelm computes from.
//!
//! Packing keeps every byte of the file's blocks (a group block is exactly sixteen blocks'
//! bytes, rearranged), so a packed matrix is the size of the original and any row can be
//! restored bit for bit ([`unpack_rows`]). Rows past the last whole group are zero blocks
//! (scale zero), whose outputs are computed and dropped.
//!
//! Layout of group `g`'s block `b`, at `(g * nb + b) * group_block_bytes(ty)`:
//! - Q8_0: 16 f16 `d` (32 B), then 8 × 64 B: dword `j` of every row's quants (row `i` at
//!   `4 i`);
//! - Q4_0: 16 `d`, then 4 × 64 B of quant dwords (the low nibbles of dword `j` are values
//!   `4j..4j+4`, the high nibbles values `16+4j..16+4j+4`);
//! - Q4_1: 16 `d`, 16 `m`, then the quant dwords as Q4_0;
//! - Q5_0: 16 `d`, 16 rearranged `qh` words (below), then the quant dwords as Q4_0;
//! - Q4_K (a super-block of 256 values): 16 `d`, 16 `dmin`, the six-bit scales unpacked as
//!   bytes `[sub-block][row]` (8 × 16), the minimums likewise, then 32 × 64 B of quant dwords
//!   (dword `w`: the low nibbles are values `64(w/8) + 4(w%8)..`, the high ones 32 further);
//! - Q6_K: 16 `d`, the signed scales as bytes `[sub-block][row]` (16 × 16), then the 32 `ql`
//!   dwords and the 16 `qh` dwords, 64 B each.
//!
//! A Q5_0 `qh` word is rearranged so that the fifth bits of a quant dword's values sit in the
//! bytes those values come from: bit `j` of byte `p` is the fifth bit of value `4j + p`, and
//! bit `4 + j` of byte `p` that of value `16 + 4j + p`. A shift by a constant then lines them
//! up with bit 4 of each byte.

use crate::quant::formats::blocks::{cast, pack_scale_min_k4, unpack_scale_min_k4, Block};
use crate::quant::GgmlType;

/// Rows per group: one 512-bit register of f32 or i32 lanes.
pub const GROUP: usize = 16;

/// Every type with a packed layout (`packable` says for which matrices).
pub const TYPES: [GgmlType; 6] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Whether a matrix of `ty` that is part of a tensor `height` rows high can be packed: there
/// are kernels for every order the peer would compute it in (`order::order`). On x86-64 Q4_K
/// is packed where the peer repacks it (heights a multiple of 8), its only order there; on
/// aarch64 packed matrices take the chain order alone (`order::prompt_order`), whatever the
/// height.
pub fn packable(ty: GgmlType, height: usize) -> bool {
    use GgmlType::*;
    match ty {
        Q4_0 | Q4_1 | Q5_0 | Q8_0 | Q6_K => true,
        Q4_K => {
            cfg!(target_arch = "aarch64")
                || crate::quant::order(ty, height, 1) == crate::quant::Order::Repacked
        }
        _ => false,
    }
}

/// Groups of a matrix of `rows` rows.
pub fn groups(rows: usize) -> usize {
    rows.div_ceil(GROUP)
}

/// Bytes of one group's block: sixteen blocks of `ty` (and for Q4_K 64 more: its scales and
/// minimums are kept unpacked, a byte each).
pub fn group_block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_K => offsets::Q4_K_QS + 32 * 64,
        _ => GROUP * ty.block_bytes(),
    }
}

/// Bytes of one group: `nb` group blocks.
pub fn group_bytes(ty: GgmlType, cols: usize) -> usize {
    cols / ty.block_elems() * group_block_bytes(ty)
}

/// Bytes of a packed `rows` × `cols` matrix of `ty`.
pub fn packed_bytes(ty: GgmlType, rows: usize, cols: usize) -> usize {
    groups(rows) * group_bytes(ty, cols)
}

/// Byte offsets in a group block: the scales `d`, the minimums `m` (Q4_1), the rearranged
/// `qh` words (Q5_0) and the quant dwords.
pub(in crate::quant) mod offsets {
    pub const D: usize = 0;
    pub const M: usize = 32;
    pub const QH: usize = 32;
    pub const Q4_0_QS: usize = 32;
    pub const Q4_1_QS: usize = 64;
    pub const Q5_0_QS: usize = 96;
    pub const Q8_0_QS: usize = 32;
    pub const Q4_K_DMIN: usize = 32;
    pub const Q4_K_SC: usize = 64;
    pub const Q4_K_MIN: usize = 192;
    pub const Q4_K_QS: usize = 320;
    pub const Q6_K_SC: usize = 32;
    pub const Q6_K_QL: usize = 288;
    pub const Q6_K_QH: usize = Q6_K_QL + 32 * 64;
}

/// Packs groups `groups` of the row-major matrix `src` (`rows` rows of `cols` values of `ty`)
/// into `dst`, which holds exactly those groups.
///
/// # Panics
/// If `ty` is not [`packable`] or a length does not match.
pub fn pack_groups(
    ty: GgmlType,
    cols: usize,
    src: &[u8],
    rows: usize,
    groups: std::ops::Range<usize>,
    dst: &mut [u8],
) {
    let (bb, gbb) = (ty.block_bytes(), group_block_bytes(ty));
    let nb = cols / ty.block_elems();
    let row_bytes = nb * bb;
    assert_eq!(src.len(), rows * row_bytes);
    assert_eq!(dst.len(), groups.len() * nb * gbb);
    let zero = vec![0u8; bb];
    for (gi, g) in groups.enumerate() {
        for b in 0..nb {
            let out = &mut dst[(gi * nb + b) * gbb..][..gbb];
            for lane in 0..GROUP {
                let r = g * GROUP + lane;
                let block = if r < rows {
                    &src[r * row_bytes + b * bb..][..bb]
                } else {
                    &zero[..]
                };
                pack_block(ty, block, lane, out);
            }
        }
    }
}

/// Row-major bytes of rows `rows` of a packed matrix (`cols` values of `ty` per row) into
/// `dst` (`rows.len()` rows).
pub fn unpack_rows(
    ty: GgmlType,
    cols: usize,
    packed: &[u8],
    rows: std::ops::Range<usize>,
    dst: &mut [u8],
) {
    let (bb, gbb) = (ty.block_bytes(), group_block_bytes(ty));
    let nb = cols / ty.block_elems();
    assert_eq!(dst.len(), rows.len() * nb * bb);
    for (ri, r) in rows.enumerate() {
        let (g, lane) = (r / GROUP, r % GROUP);
        for b in 0..nb {
            let src = &packed[(g * nb + b) * gbb..][..gbb];
            unpack_block(ty, src, lane, &mut dst[(ri * nb + b) * bb..][..bb]);
        }
    }
}

/// One part of a block's bytes and where the group block keeps it (each part of row `lane`).
#[derive(Clone, Copy)]
enum Part {
    /// An f16 at `from` in the block: the group's sixteen of them at `at`.
    Half { at: usize, from: usize },
    /// `count` dwords from `from`: dword `j` of the sixteen rows in the 64 bytes at `at + 64 j`.
    Dwords {
        at: usize,
        from: usize,
        count: usize,
    },
    /// `count` bytes from `from`: byte `k` of the sixteen rows in the 16 bytes at `at + 16 k`.
    Bytes {
        at: usize,
        from: usize,
        count: usize,
    },
    /// Q5_0's `qh` word at `from`, rearranged ([`rearrange_qh`]), the sixteen at `at`.
    Q5Bits { at: usize, from: usize },
    /// Q4_K's twelve bytes of six-bit scales and minimums at `from`, unpacked: the scales as
    /// [`Part::Bytes`] at `at`, the minimums at `mins_at`.
    ScaleMinK4 {
        at: usize,
        mins_at: usize,
        from: usize,
    },
}

/// The parts of a block of `ty`, which together cover all its bytes.
fn parts(ty: GgmlType) -> &'static [Part] {
    use offsets::*;
    use GgmlType::*;
    use Part::*;
    match ty {
        Q8_0 => &[
            Half { at: D, from: 0 },
            Dwords {
                at: Q8_0_QS,
                from: 2,
                count: 8,
            },
        ],
        Q4_0 => &[
            Half { at: D, from: 0 },
            Dwords {
                at: Q4_0_QS,
                from: 2,
                count: 4,
            },
        ],
        Q4_1 => &[
            Half { at: D, from: 0 },
            Half { at: M, from: 2 },
            Dwords {
                at: Q4_1_QS,
                from: 4,
                count: 4,
            },
        ],
        Q5_0 => &[
            Half { at: D, from: 0 },
            Q5Bits { at: QH, from: 2 },
            Dwords {
                at: Q5_0_QS,
                from: 6,
                count: 4,
            },
        ],
        // d, dmin, scales[12], qs[128]
        Q4_K => &[
            Half { at: D, from: 0 },
            Half {
                at: Q4_K_DMIN,
                from: 2,
            },
            ScaleMinK4 {
                at: Q4_K_SC,
                mins_at: Q4_K_MIN,
                from: 4,
            },
            Dwords {
                at: Q4_K_QS,
                from: 16,
                count: 32,
            },
        ],
        // ql[128], qh[64], scales[16], d
        Q6_K => &[
            Dwords {
                at: Q6_K_QL,
                from: 0,
                count: 32,
            },
            Dwords {
                at: Q6_K_QH,
                from: 128,
                count: 16,
            },
            Bytes {
                at: Q6_K_SC,
                from: 192,
                count: 16,
            },
            Half { at: D, from: 208 },
        ],
        _ => unreachable!("{ty} has no packed layout"),
    }
}

/// Row `lane`'s block into its places in the group block.
fn pack_block(ty: GgmlType, block: &[u8], lane: usize, group: &mut [u8]) {
    for part in parts(ty) {
        match *part {
            Part::Half { at, from } => {
                group[at + 2 * lane..][..2].copy_from_slice(&block[from..from + 2])
            }
            Part::Dwords { at, from, count } => {
                for j in 0..count {
                    group[at + 64 * j + 4 * lane..][..4]
                        .copy_from_slice(&block[from + 4 * j..][..4]);
                }
            }
            Part::Bytes { at, from, count } => {
                for k in 0..count {
                    group[at + GROUP * k + lane] = block[from + k];
                }
            }
            Part::Q5Bits { at, from } => {
                let qh = u32::from_le_bytes(block[from..from + 4].try_into().expect("4 bytes"));
                group[at + 4 * lane..][..4].copy_from_slice(&rearrange_qh(qh).to_le_bytes());
            }
            Part::ScaleMinK4 { at, mins_at, from } => {
                let (sc, m) = unpack_scale_min_k4(block[from..from + 12].try_into().expect("12"));
                for k in 0..8 {
                    group[at + GROUP * k + lane] = sc[k];
                    group[mins_at + GROUP * k + lane] = m[k];
                }
            }
        }
    }
}

/// Row `lane`'s block, back in ggml's layout.
fn unpack_block(ty: GgmlType, group: &[u8], lane: usize, block: &mut [u8]) {
    for part in parts(ty) {
        match *part {
            Part::Half { at, from } => {
                block[from..from + 2].copy_from_slice(&group[at + 2 * lane..][..2])
            }
            Part::Dwords { at, from, count } => {
                for j in 0..count {
                    block[from + 4 * j..][..4]
                        .copy_from_slice(&group[at + 64 * j + 4 * lane..][..4]);
                }
            }
            Part::Bytes { at, from, count } => {
                for k in 0..count {
                    block[from + k] = group[at + GROUP * k + lane];
                }
            }
            Part::Q5Bits { at, from } => {
                let w = u32::from_le_bytes(group[at + 4 * lane..][..4].try_into().expect("4"));
                block[from..from + 4].copy_from_slice(&restore_qh(w).to_le_bytes());
            }
            Part::ScaleMinK4 { at, mins_at, from } => {
                let sc: [u8; 8] = std::array::from_fn(|k| group[at + GROUP * k + lane]);
                let m: [u8; 8] = std::array::from_fn(|k| group[mins_at + GROUP * k + lane]);
                block[from..from + 12].copy_from_slice(&pack_scale_min_k4(&sc, &m));
            }
        }
    }
}

/// A Q5_0 block's `qh` (bit `v` is value `v`'s fifth bit) in the packed arrangement: bit `j`
/// of byte `p` ← value `4j + p`, bit `4 + j` of byte `p` ← value `16 + 4j + p`.
fn rearrange_qh(qh: u32) -> u32 {
    let mut out = 0u32;
    for p in 0..4 {
        for j in 0..4 {
            let lo = (qh >> (4 * j + p)) & 1;
            let hi = (qh >> (16 + 4 * j + p)) & 1;
            out |= lo << (8 * p + j) | hi << (8 * p + 4 + j);
        }
    }
    out
}

/// The inverse of [`rearrange_qh`].
fn restore_qh(w: u32) -> u32 {
    let mut qh = 0u32;
    for p in 0..4 {
        for j in 0..4 {
            qh |= ((w >> (8 * p + j)) & 1) << (4 * j + p);
            qh |= ((w >> (8 * p + 4 + j)) & 1) << (16 + 4 * j + p);
        }
    }
    qh
}

/// Where a packed kernel writes row `r` (of the groups it computes, padding rows included) for
/// token `t`: `ptr + t * stride + r`. Each architecture's kernels add their own stores.
#[derive(Clone, Copy)]
pub(crate) struct Out {
    pub ptr: *mut f32,
    pub stride: usize,
}

/// A packed kernel: row `i` of group `g` (padding rows included) against token `t`, for a
/// packed matrix of `groups` groups of `nb` blocks.
///
/// # Safety
/// The CPU has the kernel's features, and `out` may be written for every token and row: no
/// other access to those floats while the kernel runs.
pub(crate) type PackedFn =
    unsafe fn(nb: usize, w: &[u8], groups: usize, x: &[u8], toks: usize, out: Out);

/// The activation blocks of a call, checked against the matrix: `toks` tokens of `nb` blocks,
/// `groups` groups of packed `ty`. Every entry starts here, so the kernels may index the
/// blocks unchecked.
pub(in crate::quant) fn checked<'a, B: Block>(
    ty: GgmlType,
    nb: usize,
    w: &[u8],
    groups: usize,
    x: &'a [u8],
    toks: usize,
) -> &'a [B] {
    let x = cast::<B>(x);
    assert!(w.len() >= groups * (nb * group_block_bytes(ty)) && x.len() >= toks * nb);
    x
}

/// Unpacks through [`unpack_rows`] for the types without packed kernels on this CPU: the
/// bytes of groups `groups`, row-major, into a reused buffer.
pub(in crate::quant) fn rows_of_groups<'a>(
    ty: GgmlType,
    cols: usize,
    packed: &[u8],
    groups: std::ops::Range<usize>,
    buf: &'a mut Vec<u8>,
) -> &'a [u8] {
    let row_bytes = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let n = groups.len() * GROUP;
    buf.clear();
    buf.resize(n * row_bytes, 0);
    let first = groups.start;
    let local = &packed[first * group_bytes(ty, cols)..];
    unpack_rows(ty, cols, local, 0..n, buf);
    buf
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::{random_row, Rng};

    #[test]
    fn packing_keeps_every_byte_and_pads_with_zero_rows() {
        let mut rng = Rng::new(0x9ac4_ed01);
        for ty in TYPES {
            for rows in [1, 15, 16, 17, 40] {
                let cols = 3 * ty.block_elems();
                let src: Vec<u8> = (0..rows)
                    .flat_map(|_| random_row(&mut rng, ty, cols))
                    .collect();
                let mut packed = vec![0xAA; packed_bytes(ty, rows, cols)];
                pack_groups(ty, cols, &src, rows, 0..groups(rows), &mut packed);
                let mut back = vec![0u8; src.len()];
                unpack_rows(ty, cols, &packed, 0..rows, &mut back);
                assert_eq!(back, src, "{ty} rows={rows}");
                // The padding rows are zero blocks.
                let pad = groups(rows) * GROUP - rows;
                let mut tail = vec![1u8; pad * src.len() / rows];
                unpack_rows(ty, cols, &packed, rows..rows + pad, &mut tail);
                assert!(tail.iter().all(|&b| b == 0), "{ty} padding");
            }
        }
    }

    #[test]
    fn qh_rearrangement_round_trips_and_puts_bits_beside_their_values() {
        let mut rng = Rng::new(7);
        for _ in 0..1000 {
            let qh = rng.u64() as u32;
            let w = rearrange_qh(qh);
            assert_eq!(restore_qh(w), qh);
            for j in 0..4 {
                for p in 0..4 {
                    // What the kernels compute: bit 4 of byte p after the shifts.
                    let lo = ((w << (4 - j)) >> (8 * p + 4)) & 1;
                    let hi = ((w >> j) >> (8 * p + 4)) & 1;
                    assert_eq!(lo, (qh >> (4 * j + p)) & 1);
                    assert_eq!(hi, (qh >> (16 + 4 * j + p)) & 1);
                }
            }
        }
    }
}
