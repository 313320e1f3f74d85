//! AArch64 kernels (NEON, and NEON with `sdot` where the CPU has dotprod), one file per
//! operation, handed out by `quant`'s dispatch after `crate::cpu_features` detection.
//!
//! - `dot`: per-pair dots for Q4_0, Q4_1, Q8_0 (the `vec_dot` tables).

pub(super) mod dot;
