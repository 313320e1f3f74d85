//! KV memory: page storage (bytes) and block bookkeeping (ids, refcounts). No backend here.

mod block_pool;
mod page_format;
mod pages;

pub use block_pool::BlockPool;
pub use page_format::KvType;
pub use pages::{KvPages, PageGeometry, Part};
