//! `[prefix_cache]`: the prefix cache kept on disk across restarts (`engine::DiskCacheConfig`).

use serde::Deserialize;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrefixCacheSection {
    /// The folder its files go in; empty: `$STATE_DIRECTORY/prefix-cache` under systemd
    /// (`StateDirectory=`), else the cache is not kept.
    pub dir: PathBuf,
    /// The most MiB each model's file takes (its hottest blocks); 0: not kept.
    pub disk_mib: usize,
    /// Seconds between saves while serving (when idle, after new work); 0: at a clean
    /// shutdown only.
    pub save_every_s: u64,
}

impl Default for PrefixCacheSection {
    fn default() -> Self {
        PrefixCacheSection {
            dir: PathBuf::new(),
            disk_mib: 512,
            save_every_s: 300,
        }
    }
}

impl PrefixCacheSection {
    /// Its values within bounds: (the key, why) for the first that is not.
    pub fn check(&self) -> Result<(), (&'static str, String)> {
        if self.disk_mib > 1 << 20 {
            return Err(("prefix_cache.disk_mib", "must be 0 to 1048576".into()));
        }
        if self.save_every_s > 7 * 86_400 {
            return Err(("prefix_cache.save_every_s", "must be 0 to 604800".into()));
        }
        Ok(())
    }

    /// Where the engine of the model `name` keeps its cache, if anywhere.
    pub fn for_model(&self, name: &str) -> Option<crate::engine::DiskCacheConfig> {
        let dir = match self.dir.as_os_str().is_empty() {
            false => self.dir.clone(),
            true => PathBuf::from(std::env::var_os("STATE_DIRECTORY")?).join("prefix-cache"),
        };
        (self.disk_mib > 0).then(|| crate::engine::DiskCacheConfig {
            dir,
            name: name.to_string(),
            disk_bytes: self.disk_mib << 20,
            save_every: Duration::from_secs(self.save_every_s),
        })
    }
}
