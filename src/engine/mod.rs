//! Sequences, scheduling, sampling and the engine thread that drives the model.

mod core;
pub mod executor;
mod handle;
mod heap;
pub mod metrics;
mod pacer;
pub mod pooled;
mod prompt_lookup;
pub mod request;
pub mod sampler;
pub mod scheduler;
pub mod sequence;
mod session;
pub mod turns;

pub use self::core::{
    cache_on_disk, DiskCacheConfig, Engine, EngineConfig, DEFAULT_GPU_RESERVE_MIB,
    DEFAULT_PREFILL_PACING, DEFAULT_STATE_SNAPSHOT_MIB,
};
pub use handle::{EngineHandle, EngineLimits};
pub use request::{Event, FinishReason, GenParams, PromptImage, RequestId, TokenLogprob};
pub use sampler::Rng;
pub use sampler::{Sampler, SamplingParams};
pub use session::{Session, SessionConfig};
