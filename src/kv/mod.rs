//! KV memory: page storage (bytes), block bookkeeping (ids, refcounts, prefix cache) and the
//! sizing arithmetic. No backend here.

mod block_pool;
mod lru;
mod page_format;
mod pages;
pub mod plan;

pub use block_pool::{block_hash, BlockPool};
pub use page_format::KvType;
pub use pages::{KvPages, PageGeometry, Part};
