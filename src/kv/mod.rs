//! KV memory: page storage (bytes), block bookkeeping (ids, refcounts, prefix cache, the
//! per-sequence tables of each KV group), the prefix cache's file on disk (`persist`) and the
//! sizing arithmetic. No backend here.

mod block_pool;
mod layout;
mod lru;
mod page_format;
mod pages;
pub mod persist;
pub mod plan;
mod seq_blocks;
pub mod shares;
mod snapshots;
mod states;

pub use block_pool::{block_hash, BlockPool};
pub use layout::{KvGroup, KvLayout, NO_BLOCK};
pub use page_format::{KvType, HADAMARD_DIM};
pub use pages::{KvPages, PageGeometry, Part};
pub use seq_blocks::SeqBlocks;
pub use snapshots::{snapshot_count, StateSnapshots, SNAPSHOT_STRIDE_TOKENS};
pub use states::StateSlots;
