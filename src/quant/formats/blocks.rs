//! Block layouts of the ggml quantized types, byte-for-byte as in llama.cpp's
//! `ggml-common.h`, plus the one sound way of viewing raw bytes as blocks.
//!
//! Weights come straight out of a memory-mapped GGUF file, so nothing about
//! their address can be assumed. Every struct here is therefore made of byte
//! arrays only (f16/f32/i16 fields are stored as little-endian `[u8; N]`),
//! which gives them alignment 1 and no padding: casting any `&[u8]` whose
//! length is a multiple of the block size to `&[Block]` is then always sound.
//! The compile-time asserts below pin both properties down.

use std::mem::{align_of, size_of};

use crate::quant::GgmlType;

/// Values per block of the "legacy" quants (Q4_0 … Q8_1).
pub const QK: usize = 32;
/// Values per super-block of the k-quants.
pub const QK_K: usize = 256;
/// Bytes of packed 6-bit scales/mins in Q4_K and Q5_K.
pub const K_SCALE_SIZE: usize = 12;

/// Reads an IEEE half stored little-endian.
#[inline(always)]
pub fn f16_to_f32(b: [u8; 2]) -> f32 {
    half::f16::from_bits(u16::from_le_bytes(b)).to_f32()
}

/// Rounds to nearest-even half, as ggml's `GGML_FP32_TO_FP16`.
#[inline(always)]
pub fn f32_to_f16(v: f32) -> [u8; 2] {
    half::f16::from_f32(v).to_bits().to_le_bytes()
}

/// The doubled E2M1 values an MXFP4 nibble stands for (ggml's `kvalues_mxfp4`).
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Half of the E8M0 scale `e` (2^(e − 128)), as ggml's `GGML_E8M0_TO_FP32_HALF`: the two
/// smallest exponents are subnormal.
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// bf16 is the top half of an f32 (`GGML_BF16_TO_FP32`).
#[inline(always)]
pub fn bf16_to_f32(b: [u8; 2]) -> f32 {
    f32::from_bits((u16::from_le_bytes(b) as u32) << 16)
}

/// `ggml_compute_fp32_to_bf16`: NaNs are forced quiet, everything else is
/// rounded to nearest-even (overflow goes to inf like the C code).
#[inline(always)]
pub fn f32_to_bf16(v: f32) -> [u8; 2] {
    let u = v.to_bits();
    let h = if (u & 0x7fff_ffff) > 0x7f80_0000 {
        (u >> 16) | 64
    } else {
        u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16
    };
    (h as u16).to_le_bytes()
}

/// Marker for the block structs of this file.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, have alignment 1, no padding, and be
/// built only from `u8`/`i8` arrays, so every byte pattern is a valid value.
pub unsafe trait Block: Copy + 'static {
    /// The ggml type this block encodes (used for size sanity checks).
    const TYPE: GgmlType;
}

/// Views `bytes` as a slice of blocks. Panics when the length is not a whole
/// number of blocks (callers have already validated lengths; this is the
/// last line of defence and costs one division).
#[inline(always)]
pub fn cast<B: Block>(bytes: &[u8]) -> &[B] {
    let sz = size_of::<B>();
    debug_assert_eq!(sz, B::TYPE.block_bytes());
    assert!(
        bytes.len().is_multiple_of(sz),
        "byte length is not whole blocks"
    );
    // SAFETY: `B: Block` guarantees align 1 (so any address is aligned), no
    // padding and no invalid bit patterns; the length is an exact multiple of
    // the block size, so the new slice covers exactly the same bytes, with
    // the same lifetime and shared-borrow semantics.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / sz) }
}

/// Mutable counterpart of [`cast`].
#[inline(always)]
pub fn cast_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    let sz = size_of::<B>();
    assert!(
        bytes.len().is_multiple_of(sz),
        "byte length is not whole blocks"
    );
    // SAFETY: as in `cast`; additionally the exclusive borrow of `bytes` is
    // moved into the returned slice, and any value written through it is a
    // valid byte pattern for the underlying `u8`s.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), bytes.len() / sz) }
}

macro_rules! block {
    ($(#[$m:meta])* $name:ident, $ty:ident, $size:expr, { $($(#[$fm:meta])* $f:ident : $t:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name { $($(#[$fm])* pub $f: $t),* }
        // SAFETY: repr(C), only byte arrays (checked by the asserts below).
        unsafe impl Block for $name { const TYPE: GgmlType = GgmlType::$ty; }
        const _: () = assert!(size_of::<$name>() == $size);
        const _: () = assert!(align_of::<$name>() == 1);
    };
}

block!(
    /// `block_q4_0`: x = d * (q - 8); low nibbles hold values 0..16, high nibbles 16..32.
    BlockQ4_0, Q4_0, 18, { d: [u8; 2], qs: [u8; QK / 2] }
);
block!(
    /// `block_q4_1`: x = d * q + m.
    BlockQ4_1, Q4_1, 20, { d: [u8; 2], m: [u8; 2], qs: [u8; QK / 2] }
);
block!(
    /// `block_q5_0`: 5th bit of value j is bit j of the little-endian u32 `qh`.
    BlockQ5_0, Q5_0, 22, { d: [u8; 2], qh: [u8; 4], qs: [u8; QK / 2] }
);
block!(
    /// `block_q5_1`.
    BlockQ5_1, Q5_1, 24, { d: [u8; 2], m: [u8; 2], qh: [u8; 4], qs: [u8; QK / 2] }
);
block!(
    /// `block_mxfp4`: x = kvalues_mxfp4[nibble] · 2^(e − 128) (the table holds doubled E2M1
    /// values, so the scale is halved).
    BlockMxfp4, MXFP4, 17, { e: u8, qs: [u8; QK / 2] }
);
block!(
    /// `block_q8_0`.
    BlockQ8_0, Q8_0, 34, { d: [u8; 2], qs: [i8; QK] }
);
block!(
    /// `block_q8_1`: `s` = d * sum(qs), precomputed so Q4_1/Q5_1 dots can
    /// fold in the weight minimum with one multiply.
    BlockQ8_1, Q8_1, 36, { d: [u8; 2], s: [u8; 2], qs: [i8; QK] }
);
block!(
    /// `block_q4_K`: 8 sub-blocks of 32 with 6-bit scales and mins.
    BlockQ4K, Q4_K, 144, {
        d: [u8; 2],
        dmin: [u8; 2],
        scales: [u8; K_SCALE_SIZE],
        qs: [u8; QK_K / 2],
    }
);
block!(
    /// `block_q5_K`.
    BlockQ5K, Q5_K, 176, {
        d: [u8; 2],
        dmin: [u8; 2],
        scales: [u8; K_SCALE_SIZE],
        qh: [u8; QK_K / 8],
        qs: [u8; QK_K / 2],
    }
);
block!(
    /// `block_q6_K`: 16 sub-blocks of 16 with signed 8-bit scales; d comes last.
    BlockQ6K, Q6_K, 210, {
        ql: [u8; QK_K / 2],
        qh: [u8; QK_K / 4],
        scales: [i8; QK_K / 16],
        d: [u8; 2],
    }
);
block!(
    /// `block_q8_K`: f32 scale and per-16 sums (`bsums`, i16) of the quants,
    /// used to apply k-quant minimums without touching every value.
    BlockQ8K, Q8_K, 292, {
        d: [u8; 4],
        qs: [i8; QK_K],
        bsums: [[u8; 2]; QK_K / 16],
    }
);

impl BlockQ8K {
    #[inline(always)]
    pub fn d(&self) -> f32 {
        f32::from_le_bytes(self.d)
    }
    #[inline(always)]
    pub fn bsum(&self, j: usize) -> i16 {
        i16::from_le_bytes(self.bsums[j])
    }
}

/// Unpacks the twelve bytes of 6-bit scales and mins of Q4_K/Q5_K into
/// `(scales[8], mins[8])`; the same result as ggml's `get_scale_min_k4` for
/// j = 0..8 and as the `utmp` shuffling in its vec_dot kernels.
#[inline(always)]
pub fn unpack_scale_min_k4(q: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
    }
    for j in 4..8 {
        sc[j] = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m[j] = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
    (sc, m)
}

/// The inverse of [`unpack_scale_min_k4`]: six-bit `scales` and `mins` back into the twelve
/// bytes (every bit of them is used, so the bytes come back exactly).
pub fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; K_SCALE_SIZE] {
    let mut q = [0u8; K_SCALE_SIZE];
    for j in 0..4 {
        q[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_min_packing_round_trips_every_byte() {
        let mut x = 0x1234_5678_9abc_def1u64;
        for _ in 0..10_000 {
            let mut q = [0u8; K_SCALE_SIZE];
            for b in &mut q {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let (sc, m) = unpack_scale_min_k4(&q);
            assert_eq!(pack_scale_min_k4(&sc, &m), q);
        }
    }

    fn check<B: Block>() {
        assert_eq!(size_of::<B>(), B::TYPE.block_bytes(), "{}", B::TYPE);
    }

    #[test]
    fn sizes_agree_with_types_rs() {
        check::<BlockQ4_0>();
        check::<BlockQ4_1>();
        check::<BlockQ5_0>();
        check::<BlockQ5_1>();
        check::<BlockQ8_0>();
        check::<BlockQ8_1>();
        check::<BlockQ4K>();
        check::<BlockQ5K>();
        check::<BlockQ6K>();
        check::<BlockQ8K>();
    }

    #[test]
    fn cast_works_at_odd_addresses() {
        let buf = [7u8; 1 + 3 * 18];
        let b: &[BlockQ4_0] = cast(&buf[1..]);
        assert_eq!(b.len(), 3);
        assert_eq!(b[2].qs[15], 7);
    }

    #[test]
    #[should_panic]
    fn cast_rejects_partial_blocks() {
        let buf = [0u8; 19];
        let _ = cast::<BlockQ4_0>(&buf);
    }

    #[test]
    fn bf16_rounding_matches_ggml() {
        // 1 + 2^-8 is exactly between two bf16 values: ties go to even (1.0).
        assert_eq!(f32_to_bf16(1.0 + 1.0 / 256.0), 0x3f80u16.to_le_bytes());
        // slightly above the tie rounds up.
        assert_eq!(f32_to_bf16(1.0 + 1.5 / 256.0), 0x3f81u16.to_le_bytes());
        // NaN stays NaN and is quiet.
        let n = u16::from_le_bytes(f32_to_bf16(f32::from_bits(0x7f80_0001)));
        assert!(bf16_to_f32(n.to_le_bytes()).is_nan());
        assert_eq!(n & 0x40, 0x40);
    }

    #[test]
    fn scale_min_unpack_matches_get_scale_min_k4() {
        // Straight port of ggml's get_scale_min_k4 as the oracle.
        fn g(j: usize, q: &[u8; 12]) -> (u8, u8) {
            if j < 4 {
                (q[j] & 63, q[j + 4] & 63)
            } else {
                (
                    (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
                    (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
                )
            }
        }
        let mut q = [0u8; 12];
        let mut s = 0x1234_5678_9abc_def1u64;
        for _ in 0..100 {
            for b in q.iter_mut() {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                *b = s as u8;
            }
            let (sc, m) = unpack_scale_min_k4(&q);
            for j in 0..8 {
                assert_eq!((sc[j], m[j]), g(j, &q));
            }
        }
    }
}
