//! The CPU backend: quantized matmul, paged attention and the small element-wise ops.

pub mod attention;
pub mod delta_net;
mod f16_round;
pub mod gemm;
mod lora;
pub mod matmul;
pub mod moe;
pub mod ops;
pub mod packed_weights;
pub mod parallel;
pub mod peak;
pub mod pool;
pub mod short_conv;
pub mod step;
