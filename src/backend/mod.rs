//! Compute backends. The CPU backend is always built; CUDA comes with the `cuda` feature.

pub mod cpu;
