//! Compute backends: the op set the forward pass is written against (`ops`), what a step
//! computes (`batch`), the CPU backend (always built) and CUDA (feature `cuda`).

pub mod batch;
#[macro_use]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ops;
pub mod select;
