//! Compute backends. The CPU backend is always built; CUDA comes with the `cuda` feature.

#[macro_use]
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod select;
