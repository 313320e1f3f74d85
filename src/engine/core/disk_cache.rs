//! The prefix cache kept across restarts (`kv::persist`): read back into the pool before the
//! engine takes its first request, written when it shuts down cleanly and every
//! `save_every` while it serves (when idle, after steps since the last save). Only a pool
//! whose pages the executor can copy out keeps it: the CPU's, for a model that only attends (a
//! hybrid's cached blocks need their state snapshots, which are not kept).

use super::Engine;
use crate::kv::persist::{self, CacheShape, NotRead, SavedBlock};
use crate::kv::PageGeometry;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Where and how much (`EngineConfig::disk_cache`).
#[derive(Clone, Debug, PartialEq)]
pub struct DiskCacheConfig {
    /// The folder (under systemd, `StateDirectory=`); the file is `NAME.kvcache` in it.
    pub dir: PathBuf,
    /// The served model's id, which names its file.
    pub name: String,
    /// The most bytes the file may take: the hottest blocks that fit.
    pub disk_bytes: usize,
    /// Saves while serving, this often at most; zero: at a clean shutdown only.
    pub save_every: Duration,
}

/// An engine's cache file.
pub(super) struct DiskCache {
    path: PathBuf,
    shape: CacheShape,
    max_blocks: usize,
    save_every: Duration,
    /// When the next save is due: set by the first step after a save.
    pub(super) due: Option<Instant>,
}

impl DiskCache {
    /// The file for a model with `fingerprint` over pages of `geom`.
    pub(super) fn new(c: &DiskCacheConfig, fingerprint: &[u8; 32], geom: &PageGeometry) -> Self {
        use sha2::{Digest, Sha256};
        let mut key = Sha256::new();
        key.update(fingerprint);
        key.update(geom.kv_type.name().as_bytes());
        for n in [geom.layers, geom.kv_heads, geom.head_dim, geom.block_size] {
            key.update((n as u64).to_le_bytes());
        }
        key.update(persist::LAYOUT_VERSION.to_le_bytes());
        key.update(env!("CARGO_PKG_VERSION").as_bytes());
        let shape = CacheShape {
            key: key.finalize().into(),
            block_size: geom.block_size,
            block_bytes: geom.block_bytes(),
        };
        let file: String = c
            .name
            .chars()
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || "-_.".contains(ch) {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
        DiskCache {
            path: c.dir.join(format!("{file}.kvcache")),
            max_blocks: c.disk_bytes / shape.entry_bytes(),
            shape,
            save_every: c.save_every,
            due: None,
        }
    }

    /// After a step: a save falls due `save_every` from now, unless one is already due.
    pub(super) fn stepped(&mut self) {
        if !self.save_every.is_zero() && self.due.is_none() {
            self.due = Some(Instant::now() + self.save_every);
        }
    }
}

/// What a start of the model with `fingerprint` over pages of `geom` would restore from its
/// file: (the file, its blocks, or why none).
pub fn on_disk(
    c: &DiskCacheConfig,
    fingerprint: &[u8; 32],
    geom: &PageGeometry,
) -> (PathBuf, Result<usize, NotRead>) {
    let cache = DiskCache::new(c, fingerprint, geom);
    let blocks = persist::read(&cache.path, &cache.shape).map(|b| b.len());
    (cache.path, blocks)
}

impl Engine {
    /// Reads the cache file back into the pool (before the first request). A file for
    /// another model, format or build is deleted; a corrupt one is discarded with one line.
    pub(super) fn restore_cache(&mut self) {
        let Some(cache) = &self.disk_cache else {
            return;
        };
        if self.exec.block_image(0).is_none() {
            log::info!("prefix cache: not kept on disk for this pool (CUDA, or a hybrid model)");
            self.disk_cache = None;
            return;
        }
        let path = cache.path.clone();
        let t0 = Instant::now();
        let blocks = match persist::read(&path, &cache.shape) {
            Ok(blocks) => blocks,
            Err(NotRead::Missing) => return,
            Err(NotRead::Mismatch) => {
                log::info!(
                    "prefix cache {}: written for another model file, KV format or edgelm; \
                     deleted, not used",
                    path.display()
                );
                let _ = std::fs::remove_file(&path);
                return;
            }
            Err(NotRead::Corrupt(why)) => {
                log::warn!("prefix cache {}: {why}; discarded", path.display());
                let _ = std::fs::remove_file(&path);
                return;
            }
        };
        let (pool, exec) = (&mut self.sched.pool, &mut self.exec);
        // Coldest first, so that the hottest are the last freed (the last evicted).
        let room = pool.total().min(blocks.len());
        let restored = blocks[..room]
            .iter()
            .rev()
            .filter(|b| {
                let group = b.group as usize;
                pool.restore(b.hash, group, &b.tokens, |at| {
                    exec.set_block_image(at as usize, &b.bytes)
                })
            })
            .count();
        self.local.restored_blocks = restored;
        log::info!(
            "prefix cache: {restored} blocks ({} tokens) restored from {} in {:.2} s",
            restored * self.sched.pool.block_size(),
            path.display(),
            t0.elapsed().as_secs_f64()
        );
    }

    /// Writes the hottest cached blocks that fit the budget to the cache file.
    pub(super) fn save_cache(&mut self) {
        let Some(cache) = &mut self.disk_cache else {
            return;
        };
        cache.due = None;
        let t0 = Instant::now();
        let blocks: Vec<SavedBlock> = self
            .sched
            .pool
            .cached_hottest_first()
            .into_iter()
            .take(cache.max_blocks)
            .filter_map(|(block, hash, group, tokens)| {
                Some(SavedBlock {
                    hash,
                    group: group as u32,
                    tokens: tokens.to_vec(),
                    bytes: self.exec.block_image(block as usize)?,
                })
            })
            .collect();
        if let Some(dir) = cache.path.parent() {
            let _ = std::fs::create_dir_all(dir);
        }
        match persist::write(&cache.path, &cache.shape, &blocks) {
            Ok(()) => {
                self.local.saved_blocks = blocks.len();
                log::info!(
                    "prefix cache: {} blocks saved to {} in {:.2} s",
                    blocks.len(),
                    cache.path.display(),
                    t0.elapsed().as_secs_f64()
                );
            }
            Err(e) => log::warn!("prefix cache: cannot write {}: {e}", cache.path.display()),
        }
    }
}
