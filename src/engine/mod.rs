//! Sequences, sampling and the loops that drive the model.

mod rng;
pub mod sampler;
mod session;

pub use rng::Rng;
pub use sampler::{Sampler, SamplingParams};
pub use session::Session;
