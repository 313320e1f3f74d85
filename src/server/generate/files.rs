//! The files served models were loaded from, by identity: a reload tells a new file (renamed
//! over the old path: another inode) from the same one, and the same inode changed under its
//! mapping (rewritten or truncated in place) from both.

use crate::config::ModelSection;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One file as it was when read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStamp {
    pub path: PathBuf,
    /// (device, inode): which file the path named.
    pub identity: (u64, u64),
    pub len: u64,
    /// Modification time, in nanoseconds since the epoch.
    pub modified_ns: i128,
}

impl FileStamp {
    /// `path` as it is now (`None`: it cannot be read).
    pub fn of(path: &Path) -> Option<FileStamp> {
        let m = std::fs::metadata(path).ok()?;
        Some(FileStamp {
            path: path.to_path_buf(),
            identity: (m.dev(), m.ino()),
            len: m.len(),
            modified_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }

    /// Whether the file read then was changed in place since: its path names the same inode,
    /// with another length or modification time. A mapping of it now reads other bytes than
    /// the ones checked at load, or faults past a truncation.
    pub fn changed_in_place(&self) -> bool {
        FileStamp::of(&self.path).is_some_and(|now| now.identity == self.identity && now != *self)
    }
}

/// Every file `specs` reads (models, projectors, chat templates, adapters), as they are now.
pub fn stamps(specs: &[ModelSection]) -> Vec<Option<FileStamp>> {
    let mut paths: Vec<&Path> = Vec::new();
    for s in specs {
        paths.push(&s.path);
        paths.extend(s.mmproj.as_deref());
        paths.extend(s.chat_template_file.as_deref());
        paths.extend(s.lora.iter().map(|l| l.path.as_path()));
    }
    paths.into_iter().map(FileStamp::of).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rename_over_is_a_new_file_and_a_rewrite_in_place_is_seen() {
        let dir = std::env::temp_dir().join(format!("edgelm-stamps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        std::fs::write(&path, b"first").unwrap();
        let first = FileStamp::of(&path).unwrap();
        assert!(!first.changed_in_place());
        // A new file renamed over the path: another inode, not a change in place.
        std::fs::write(dir.join("m.new"), b"second!").unwrap();
        std::fs::rename(dir.join("m.new"), &path).unwrap();
        let second = FileStamp::of(&path).unwrap();
        assert_ne!(second.identity, first.identity);
        assert!(!first.changed_in_place());
        // The same inode cut short.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(3)
            .unwrap();
        assert!(second.changed_in_place());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
