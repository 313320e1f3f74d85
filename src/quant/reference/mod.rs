//! The scalar reference implementations: what every fast path is tested against, and what runs
//! where no fast path exists. A faithful transcription of ggml-cpu's generic C code.
//!
//! - `dot`: the dot products in ggml's `vec_dot` order (eight lanes per pair);
//! - [`order`]: the other accumulation orders ggml-cpu uses per (weight type, height, batch
//!   size), and scalar dots that follow each.

pub(super) mod dot;
pub mod order;

use super::GgmlType;

/// Same contract as [`super::vec_dot`], always using the scalar kernels.
pub fn vec_dot(ty: GgmlType, n: usize, w_row: &[u8], x_q: &[u8]) -> f32 {
    super::dot_with(&super::SCALAR, ty, n, w_row, x_q)
}
