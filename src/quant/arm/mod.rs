//! AArch64 kernels (NEON, and NEON with `sdot` where the CPU has dotprod), one file per
//! operation, each compiled once per level; handed out by `quant`'s dispatch after
//! `crate::cpu_features` detection.
//!
//! - `dot`: per-pair dots in ggml's lane order (the `vec_dot` tables);
//! - `packed`, `packed_k`: kernels over packed groups in the chain order (legacy quants,
//!   K-quants), and the integer steps, conversions and stores they share;
//! - `packed_i8mm`: the i8mm level's two-token passes (`smmla`) over packed legacy quants.

pub(super) mod dot;
pub(super) mod packed;
pub(super) mod packed_i8mm;
pub(super) mod packed_k;
