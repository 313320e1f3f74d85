//! Compute backends: the op set the forward pass is written against (`ops`), what a step
//! computes (`batch`), a sequence's sampling settings (`sampling`, which the device sampler
//! reads), the CPU backend (always built) and CUDA (feature `cuda`).

pub mod adapter;
pub mod batch;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod ops;
pub mod sampling;
pub mod select;
