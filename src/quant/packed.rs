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
//! - Q5_0: 16 `d`, 16 rearranged `qh` words (below), then the quant dwords as Q4_0.
//!
//! A Q5_0 `qh` word is rearranged so that the fifth bits of a quant dword's values sit in the
//! bytes those values come from: bit `j` of byte `p` is the fifth bit of value `4j + p`, and
//! bit `4 + j` of byte `p` that of value `16 + 4j + p`. A shift by a constant then lines them
//! up with bit 4 of each byte.

use super::GgmlType;

/// Rows per group: one 512-bit register of f32 or i32 lanes.
pub const GROUP: usize = 16;

/// Whether matrices of `ty` can be packed (the legacy block types the matmuls use).
pub fn packable(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q4_0 | Q4_1 | Q5_0 | Q8_0)
}

/// Groups of a matrix of `rows` rows.
pub fn groups(rows: usize) -> usize {
    rows.div_ceil(GROUP)
}

/// Bytes of one group's block: sixteen blocks of `ty`.
pub fn group_block_bytes(ty: GgmlType) -> usize {
    GROUP * ty.block_bytes()
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
pub(super) mod offsets {
    pub const D: usize = 0;
    pub const M: usize = 32;
    pub const QH: usize = 32;
    pub const Q4_0_QS: usize = 32;
    pub const Q4_1_QS: usize = 64;
    pub const Q5_0_QS: usize = 96;
    pub const Q8_0_QS: usize = 32;
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
    assert!(packable(ty), "{ty} has no packed layout");
    let (bb, gbb) = (ty.block_bytes(), group_block_bytes(ty));
    let nb = cols / ty.block_elems();
    let row_bytes = nb * bb;
    assert_eq!(src.len(), rows * row_bytes);
    assert_eq!(dst.len(), groups.len() * nb * gbb);
    let zero = vec![0u8; bb];
    for (gi, g) in groups.enumerate() {
        for b in 0..nb {
            let blocks: [&[u8]; GROUP] = std::array::from_fn(|i| {
                let r = g * GROUP + i;
                if r < rows {
                    &src[r * row_bytes + b * bb..][..bb]
                } else {
                    &zero[..]
                }
            });
            let out = &mut dst[(gi * nb + b) * gbb..][..gbb];
            pack_block(ty, &blocks, out);
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

/// Where the quant dwords of a group block start.
fn qs_offset(ty: GgmlType) -> usize {
    use GgmlType::*;
    match ty {
        Q4_0 => offsets::Q4_0_QS,
        Q4_1 => offsets::Q4_1_QS,
        Q5_0 => offsets::Q5_0_QS,
        Q8_0 => offsets::Q8_0_QS,
        _ => unreachable!("{ty} has no packed layout"),
    }
}

/// Sixteen blocks (`blocks[i]` of row `i`) into one group block.
fn pack_block(ty: GgmlType, blocks: &[&[u8]; GROUP], out: &mut [u8]) {
    use GgmlType::*;
    let qs_at = qs_offset(ty);
    // Where each block keeps its quants, and how many dwords of them.
    let (own_qs, dwords) = match ty {
        Q4_0 => (2, 4),
        Q4_1 => (4, 4),
        Q5_0 => (6, 4),
        Q8_0 => (2, 8),
        _ => unreachable!(),
    };
    for (i, blk) in blocks.iter().enumerate() {
        out[offsets::D + 2 * i..][..2].copy_from_slice(&blk[..2]);
        match ty {
            Q4_1 => out[offsets::M + 2 * i..][..2].copy_from_slice(&blk[2..4]),
            Q5_0 => {
                let qh = u32::from_le_bytes(blk[2..6].try_into().expect("4 bytes"));
                out[offsets::QH + 4 * i..][..4].copy_from_slice(&rearrange_qh(qh).to_le_bytes());
            }
            _ => {}
        }
        for j in 0..dwords {
            out[qs_at + 64 * j + 4 * i..][..4].copy_from_slice(&blk[own_qs + 4 * j..][..4]);
        }
    }
}

/// Block `lane` of a group block, back in ggml's layout.
fn unpack_block(ty: GgmlType, src: &[u8], lane: usize, out: &mut [u8]) {
    use GgmlType::*;
    let qs_at = qs_offset(ty);
    let (own_qs, dwords) = match ty {
        Q4_0 => (2, 4),
        Q4_1 => (4, 4),
        Q5_0 => (6, 4),
        Q8_0 => (2, 8),
        _ => unreachable!("{ty} has no packed layout"),
    };
    out[..2].copy_from_slice(&src[offsets::D + 2 * lane..][..2]);
    match ty {
        Q4_1 => out[2..4].copy_from_slice(&src[offsets::M + 2 * lane..][..2]),
        Q5_0 => {
            let w = u32::from_le_bytes(src[offsets::QH + 4 * lane..][..4].try_into().expect("4"));
            out[2..6].copy_from_slice(&restore_qh(w).to_le_bytes());
        }
        _ => {}
    }
    for j in 0..dwords {
        out[own_qs + 4 * j..][..4].copy_from_slice(&src[qs_at + 64 * j + 4 * lane..][..4]);
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

/// Unpacks through [`unpack_rows`] for the types without packed kernels on this CPU: the
/// bytes of groups `groups`, row-major, into a reused buffer.
pub(super) fn rows_of_groups<'a>(
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
    use super::super::test_util::{random_row, Rng};
    use super::*;

    #[test]
    fn packing_keeps_every_byte_and_pads_with_zero_rows() {
        let mut rng = Rng::new(0x9ac4_ed01);
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q8_0,
        ] {
            for rows in [1, 15, 16, 17, 40] {
                let cols = 3 * ty.block_elems();
                let src: Vec<u8> = (0..rows)
                    .flat_map(|_| random_row(&mut rng, ty, cols))
                    .collect();
                let mut packed = vec![0xAA; packed_bytes(ty, rows, cols)];
                pack_groups(ty, cols, &src, rows, 0..groups(rows), &mut packed);
                assert_eq!(packed.len(), groups(rows) * GROUP * src.len() / rows);
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
