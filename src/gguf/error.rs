//! The one error type of the GGUF loader.
//!
//! Every message says *what* is wrong and *where*: the byte offset, and the
//! metadata key or tensor being read ("metadata key #12 'tokenizer.ggml.tokens'"),
//! so a bad download or a converter bug can be diagnosed from the message alone.

use std::io;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be opened, stat'ed or mapped.
    #[error("cannot read GGUF file {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },

    /// A field runs past the end of the file.
    #[error(
        "truncated file: {context} needs {needed} bytes at offset {offset}, file has {file_len}"
    )]
    Truncated {
        context: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },

    /// The first four bytes are not "GGUF".
    #[error("not a GGUF file: magic at offset 0 is {found:?}, expected \"GGUF\"{hint}")]
    BadMagic { found: String, hint: &'static str },

    /// The version field only makes sense byte-swapped: a big-endian GGUF.
    #[error("big-endian GGUF file (version field at offset 4 reads as {version} byte-swapped); only little-endian files are supported, re-convert on a little-endian machine")]
    BigEndian { version: u32 },

    /// A version this loader does not read (v1 used 32-bit counts; > 3 is unknown).
    #[error("unsupported GGUF version {version} at offset 4: {reason}")]
    UnsupportedVersion { version: u32, reason: &'static str },

    /// The bytes are there but say something impossible or forbidden.
    #[error("{context} at offset {offset}: {reason}")]
    Malformed {
        context: String,
        offset: u64,
        reason: String,
    },
}

impl GgufError {
    pub(crate) fn malformed(
        context: impl Into<String>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        GgufError::Malformed {
            context: context.into(),
            offset,
            reason: reason.into(),
        }
    }
}
