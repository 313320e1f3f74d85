//! What quantized data looks like and how values get in and out of it: the ggml types, their
//! block layouts, scalar dequantization, activation quantization, and the packed layout the
//! AVX-512 kernels read.

pub(super) mod blocks;
pub(super) mod dequant;
pub mod packed;
pub(super) mod quantize;
pub mod types;
