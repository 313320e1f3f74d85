//! The prefix cache on disk: the cached blocks a restart reads back into the pool before the
//! first request, so that prompts the box keeps seeing (a long system prompt) do not pay their
//! prefill again after every reboot.
//!
//! One file per model: a header (magic, layout version, the key, the block shape, the count),
//! then each block (its chained hash, KV group, tokens and page bytes) with a CRC-32 of its
//! own, hottest first. The key hashes what makes the bytes mean something: the model file
//! (`GgufFile::fingerprint`), the KV page format and geometry, this layout and edgelm's
//! version (block hashes come from the build's hasher). A file whose key, shape or version
//! differs is ignored; one whose checksum fails anywhere is discarded whole (a torn write, a
//! bad sector). It is written beside the old file and renamed over it, so a crash mid-write
//! leaves the previous one.

use std::io::Write;
use std::path::Path;

/// Bumped whenever the file or the page layout changes meaning.
pub const LAYOUT_VERSION: u32 = 1;
const MAGIC: &[u8; 8] = b"EDGELMKV";

/// One cached block as saved.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedBlock {
    /// Its identity in the prefix cache (chained over its parents and its adapter).
    pub hash: u64,
    pub group: u32,
    pub tokens: Vec<u32>,
    /// Every layer's K and V rows of the block (`KvPages::block_image`).
    pub bytes: Vec<u8>,
}

/// What a file must match to be read: its key and the shape of its blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheShape {
    pub key: [u8; 32],
    pub block_size: usize,
    pub block_bytes: usize,
}

impl CacheShape {
    /// Bytes one saved block takes on disk.
    pub fn entry_bytes(&self) -> usize {
        8 + 4 + 4 * self.block_size + self.block_bytes + 4
    }
}

/// Why nothing was read.
#[derive(Debug, PartialEq)]
pub enum NotRead {
    /// No file yet.
    Missing,
    /// Another model, page format, layout or build: ignored (and deleted by the caller).
    Mismatch,
    /// Torn or damaged: discarded.
    Corrupt(String),
}

/// Writes `blocks` as the cache of `shape` to `path` (beside it first, then renamed over it).
pub fn write(path: &Path, shape: &CacheShape, blocks: &[SavedBlock]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(64 + blocks.len() * shape.entry_bytes());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
    out.extend_from_slice(&shape.key);
    out.extend_from_slice(&(shape.block_size as u64).to_le_bytes());
    out.extend_from_slice(&(shape.block_bytes as u64).to_le_bytes());
    out.extend_from_slice(&(blocks.len() as u64).to_le_bytes());
    let header_crc = crc32fast::hash(&out);
    out.extend_from_slice(&header_crc.to_le_bytes());
    for b in blocks {
        assert_eq!(
            b.tokens.len(),
            shape.block_size,
            "a block holds block_size tokens"
        );
        assert_eq!(
            b.bytes.len(),
            shape.block_bytes,
            "a block's image has its shape"
        );
        let start = out.len();
        out.extend_from_slice(&b.hash.to_le_bytes());
        out.extend_from_slice(&b.group.to_le_bytes());
        for t in &b.tokens {
            out.extend_from_slice(&t.to_le_bytes());
        }
        out.extend_from_slice(&b.bytes);
        let crc = crc32fast::hash(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The blocks of the cache at `path`, if it was written for `shape`.
pub fn read(path: &Path, shape: &CacheShape) -> Result<Vec<SavedBlock>, NotRead> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(NotRead::Missing),
        Err(e) => return Err(NotRead::Corrupt(e.to_string())),
    };
    let corrupt = |why: &str| NotRead::Corrupt(why.to_string());
    const HEADER: usize = 8 + 4 + 32 + 8 + 8 + 8;
    if data.len() < HEADER + 4 || &data[..8] != MAGIC {
        return Err(corrupt("not a prefix cache file"));
    }
    let crc = u32::from_le_bytes(data[HEADER..HEADER + 4].try_into().expect("4 bytes"));
    if crc32fast::hash(&data[..HEADER]) != crc {
        return Err(corrupt("its header's checksum fails"));
    }
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8 bytes"));
    let version = u32::from_le_bytes(data[8..12].try_into().expect("4 bytes"));
    let same = version == LAYOUT_VERSION
        && data[12..44] == shape.key
        && u64_at(44) == shape.block_size as u64
        && u64_at(52) == shape.block_bytes as u64;
    if !same {
        return Err(NotRead::Mismatch);
    }
    let count = u64_at(60) as usize;
    let entry = shape.entry_bytes();
    let body = &data[HEADER + 4..];
    if count.checked_mul(entry) != Some(body.len()) {
        return Err(corrupt("it is cut short or has bytes to spare"));
    }
    body.chunks_exact(entry)
        .map(|e| {
            let (fields, crc) = e.split_at(entry - 4);
            if crc32fast::hash(fields) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
                return Err(corrupt("a block's checksum fails"));
            }
            let tokens_end = 12 + 4 * shape.block_size;
            Ok(SavedBlock {
                hash: u64::from_le_bytes(fields[..8].try_into().expect("8 bytes")),
                group: u32::from_le_bytes(fields[8..12].try_into().expect("4 bytes")),
                tokens: fields[12..tokens_end]
                    .chunks_exact(4)
                    .map(|t| u32::from_le_bytes(t.try_into().expect("4 bytes")))
                    .collect(),
                bytes: fields[tokens_end..].to_vec(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(n: usize) -> Vec<SavedBlock> {
        (0..n)
            .map(|i| SavedBlock {
                hash: 1000 + i as u64,
                group: (i % 2) as u32,
                tokens: (0..4).map(|t| (i * 4 + t) as u32).collect(),
                bytes: (0..24).map(|b| (i + b) as u8).collect(),
            })
            .collect()
    }

    #[test]
    fn a_cache_reads_back_only_for_its_key_and_whole() {
        let dir = std::env::temp_dir().join(format!("edgelm-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.kvcache");
        let shape = CacheShape {
            key: [7; 32],
            block_size: 4,
            block_bytes: 24,
        };
        assert_eq!(read(&path, &shape), Err(NotRead::Missing));
        write(&path, &shape, &blocks(5)).unwrap();
        assert_eq!(read(&path, &shape).unwrap(), blocks(5));
        // Another model, or another page shape: ignored.
        let other = CacheShape {
            key: [8; 32],
            ..shape
        };
        assert_eq!(read(&path, &other), Err(NotRead::Mismatch));
        let wider = CacheShape {
            block_bytes: 48,
            ..shape
        };
        assert_eq!(read(&path, &wider), Err(NotRead::Mismatch));
        // One flipped byte in a block's pages, or a torn tail: discarded.
        let good = std::fs::read(&path).unwrap();
        let mut bad = good.clone();
        let last = bad.len() - 10;
        bad[last] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        assert!(matches!(read(&path, &shape), Err(NotRead::Corrupt(_))));
        std::fs::write(&path, &good[..good.len() - 7]).unwrap();
        assert!(matches!(read(&path, &shape), Err(NotRead::Corrupt(_))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
