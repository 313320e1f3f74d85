//! x86-64 kernels (AVX2 + FMA + F16C, and AVX-512 VNNI), one file per operation and level.
//! Every one is an `unsafe` `target_feature` function, handed out by `quant`'s dispatch only
//! after `crate::cpu_features` saw the features it was compiled for.
//!
//! - `dot`: per-pair dots in ggml's lane order (AVX2), the `vec_dot` table;
//! - `panel`: tiles of up to 4 rows × 4 tokens, AVX2 or AVX-512 VNNI's 256-bit integer part;
//! - `panel_avx512`: 512-bit VNNI panels, two tokens per register;
//! - `order`: AVX2 dots in the peer's repacked and tiled orders;
//! - `packed_avx512`, `packed_k_avx512`: VNNI kernels over packed groups (legacy quants,
//!   K-quants);
//! - `packed_avx2`, `packed_k_avx2`: the same in 256-bit registers, eight rows each, with
//!   AVX-VNNI's `vpdpbusd` (or AVX-512 VNNI's 256-bit form).

pub(super) mod dot;
pub(super) mod order;
pub(super) mod packed_avx2;
pub(super) mod packed_avx512;
pub(super) mod packed_k_avx2;
pub(super) mod packed_k_avx512;
pub(super) mod panel;
pub(super) mod panel_avx512;
