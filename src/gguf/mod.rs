//! GGUF model files: parsing, validation, zero-copy tensor access, a writer
//! for synthetic test models, and the `inspect` summary.
//!
//! Layout of the module, one concern per file:
//! - `reader`: bounded little-endian cursor (no read can go out of bounds);
//! - `value`: metadata value model and decoder;
//! - `header`: header parsing and every structural check;
//! - `tensor`: tensor descriptors and views;
//! - `file`: the memory-mapped (or owned) file plus its header;
//! - `fault`: one clear line and a restart, not a silent SIGBUS, when a mapped file is cut
//!   short under its mapping;
//! - `writer`: building GGUF images (tests, tools);
//! - `summary`: what `edgelm inspect` shows;
//! - `error`: the error type.

mod error;
mod fault;
mod file;
mod header;
mod reader;
mod summary;
mod tensor;
mod value;
mod writer;

#[cfg(test)]
mod hostile_tests;

pub use error::GgufError;
pub use file::GgufFile;
pub use header::{GgufHeader, DEFAULT_ALIGNMENT, MAX_KEY_LEN};
pub use reader::{Reader, Short};
pub use summary::{
    file_type_name, summarize, HyperParams, SpecialToken, Summary, TokenizerSummary,
};
pub use tensor::{TensorInfo, TensorView, MAX_DIMS, MAX_TENSOR_NAME};
pub use value::{Array, Value, ValueType, MAX_ARRAY_DEPTH};
pub use writer::{Field, FieldKind, GgufWriter, Layout};

/// Path of the reference model for tests: `$EDGELM_MODEL`, else `models/` in
/// the crate. Panics (failing the test, never skipping it) when it is missing.
#[cfg(test)]
pub(crate) fn test_model_path() -> std::path::PathBuf {
    let path = std::env::var_os("EDGELM_MODEL").map_or_else(
        || {
            std::path::PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
            ))
        },
        std::path::PathBuf::from,
    );
    assert!(
        path.is_file(),
        "reference model {} is missing: run packaging/fetch-model.sh (or set EDGELM_MODEL)",
        path.display()
    );
    path
}
