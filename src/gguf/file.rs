//! An open GGUF file: the bytes (memory-mapped or owned) plus the parsed header.
//!
//! Tensor data is never copied: [`GgufFile::tensor_data`] hands out slices of
//! the map, valid for as long as the `GgufFile` lives. The header parser has
//! already proven every tensor's range lies inside the bytes.

use std::fs::File;
use std::path::Path;

use memmap2::{Mmap, MmapOptions};

use super::error::GgufError;
use super::fault::Registration;
use super::header::GgufHeader;
use super::tensor::{tensor_slice, TensorInfo, TensorView};
use super::value::Value;

enum Backing {
    Mmap(Mmap),
    Owned(Vec<u8>),
}

pub struct GgufFile {
    /// The mapping's entry for the SIGBUS handler (`fault`): declared first, so that it is
    /// dropped before the mapping.
    registration: Option<Registration>,
    backing: Backing,
    header: GgufHeader,
}

impl GgufFile {
    /// Memory-maps `path` read-only and parses its header.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let backing = if len == 0 {
            // Mapping zero bytes is an error on some platforms; parse reports "truncated".
            Backing::Owned(Vec::new())
        } else {
            // SAFETY: the map is read-only and private (`MAP_PRIVATE`, `PROT_READ`):
            // we never write through it and our writes could not reach the file.
            // What we cannot rule out is another process modifying or truncating
            // the file while it is mapped: bytes could then change under a live
            // `&[u8]` (the header was validated against the old contents), and
            // reading a page past a truncation raises SIGBUS. Model files are
            // treated as immutable while served — the same contract llama.cpp
            // relies on — and replacing one should be done by renaming a new file
            // into place, which leaves this mapping on the old inode. A fault past a
            // truncation ends the process with one line naming the file (`fault`).
            let map = unsafe { MmapOptions::new().map_copy_read_only(&file) }.map_err(io)?;
            Backing::Mmap(map)
        };
        let mut file = Self::with_backing(backing)?;
        if let Backing::Mmap(map) = &file.backing {
            file.registration = Some(super::fault::register(map, path));
        }
        Ok(file)
    }

    /// Parses an in-memory image (tests, fuzzing, files read by other means).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, GgufError> {
        Self::with_backing(Backing::Owned(bytes))
    }

    fn with_backing(backing: Backing) -> Result<Self, GgufError> {
        let header = GgufHeader::parse(bytes_of(&backing))?;
        Ok(GgufFile {
            registration: None,
            backing,
            header,
        })
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        bytes_of(&self.backing)
    }

    /// A hash of the file that tells it from another (the prefix cache on disk is kept for
    /// one): its length, everything before the tensor data (metadata and tensor table), and
    /// 32 samples of 64 KiB spread over the data. SHA-256 over about 2 MiB however large the
    /// file, rather than reading gigabytes at every start.
    pub fn fingerprint(&self) -> [u8; 32] {
        use sha2::{Digest, Sha256};
        const SAMPLES: usize = 32;
        const SAMPLE: usize = 64 << 10;
        let bytes = self.bytes();
        let mut h = Sha256::new();
        h.update((bytes.len() as u64).to_le_bytes());
        let data_at = (self.data_offset() as usize).min(bytes.len());
        h.update(&bytes[..data_at]);
        let data = &bytes[data_at..];
        let stride = (data.len() / SAMPLES).max(1);
        for i in 0..SAMPLES {
            let at = (i * stride).min(data.len());
            h.update(&data[at..(at + SAMPLE).min(data.len())]);
        }
        h.finalize().into()
    }

    /// Whether the bytes are memory-mapped (as opposed to owned in memory).
    pub fn is_mapped(&self) -> bool {
        matches!(self.backing, Backing::Mmap(_))
    }

    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    pub fn version(&self) -> u32 {
        self.header.version()
    }

    pub fn file_size(&self) -> u64 {
        self.header.file_size()
    }

    pub fn alignment(&self) -> u64 {
        self.header.alignment()
    }

    /// Absolute offset of the tensor data section.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset()
    }

    /// Metadata in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        self.header.metadata()
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.header.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// Any integer value that fits in a u32.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key).and_then(Value::as_u32)
    }

    /// An f32 (or f64) value.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(Value::as_f32)
    }

    /// `general.architecture`, e.g. "llama"; the prefix of hyper-parameter keys.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// Tensor infos in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        self.header.tensors()
    }

    /// The tensor named `name` with its bytes (zero-copy).
    pub fn tensor(&self, name: &str) -> Option<TensorView<'_>> {
        let info = self.header.tensor_info(name)?;
        Some(TensorView {
            info,
            data: self.tensor_data(info),
        })
    }

    /// The bytes of `info`, a slice of the map.
    ///
    /// # Panics
    /// If `info` did not come from this file and its range lies outside it (a
    /// caller bug; infos from [`tensors`](Self::tensors) are always in range).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        match tensor_slice(self.bytes(), info) {
            Some(data) => data,
            None => panic!(
                "tensor '{}' [{}+{}] is outside this {}-byte GGUF file: TensorInfo from another file?",
                info.name,
                info.offset,
                info.size,
                self.file_size()
            ),
        }
    }
}

impl GgufFile {
    /// Drops `info`'s data pages from this process's mapping, for a tensor the process keeps a
    /// copy of (the CPU's packed weights): its resident memory then counts that data once. The
    /// bytes stay readable; a later read faults them in again from the page cache or the file.
    /// A no-op for owned images and for the partial pages at either end of the range.
    pub fn release(&self, info: &TensorInfo) {
        self.release_bytes(self.tensor_data(info));
    }

    /// [`GgufFile::release`] for `data`, a part of a tensor's data (rows already copied).
    pub fn release_bytes(&self, data: &[u8]) {
        let Backing::Mmap(map) = &self.backing else {
            return;
        };
        let at = (data.as_ptr() as usize)
            .checked_sub(map.as_ptr() as usize)
            .filter(|&at| at + data.len() <= map.len())
            .expect("released bytes lie in the map");
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let start = at.next_multiple_of(page);
        let end = (at + data.len()) / page * page;
        if end > start {
            // SAFETY: the mapping is private and read-only, so no page holds anything but the
            // file's bytes: dropping them changes no value a live `&[u8]` sees, only whether
            // the next read faults. The range lies inside the map (asserted above).
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}

fn bytes_of(backing: &Backing) -> &[u8] {
    match backing {
        Backing::Mmap(m) => m,
        Backing::Owned(v) => v,
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version())
            .field("file_size", &self.file_size())
            .field("mapped", &self.is_mapped())
            .field("metadata", &self.metadata().len())
            .field("tensors", &self.tensors().len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::test_model_path;
    use crate::gguf::writer::GgufWriter;
    use crate::quant::GgmlType;

    fn synthetic() -> Vec<u8> {
        GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("llama.block_count", Value::U64(2))
            .kv("llama.rope.freq_base", Value::F32(10000.0))
            .tensor("w", &[4, 2], GgmlType::F32, (0..32).collect())
            .to_bytes()
    }

    #[test]
    fn from_bytes_api() {
        let f = GgufFile::from_bytes(synthetic()).unwrap();
        assert!(!f.is_mapped());
        assert_eq!(f.version(), 3);
        assert_eq!(f.architecture(), Some("llama"));
        assert_eq!(f.get_u32("llama.block_count"), Some(2));
        assert_eq!(f.get_f32("llama.rope.freq_base"), Some(10000.0));
        assert_eq!(f.get_str("llama.block_count"), None);
        assert_eq!(f.metadata()[1].0, "llama.block_count");
        let t = f.tensor("w").unwrap();
        assert_eq!((t.info.n_elements(), t.info.rows()), (8, 2));
        assert_eq!(t.data, &(0..32).collect::<Vec<u8>>()[..]);
        assert!(f.tensor("nope").is_none());
        assert_eq!(
            format!("{f:?}"),
            format!(
                "GgufFile {{ version: 3, file_size: {}, mapped: false, metadata: 3, tensors: 1 }}",
                f.file_size()
            )
        );
    }

    #[test]
    #[should_panic(expected = "TensorInfo from another file?")]
    fn foreign_info_panics_clearly() {
        let f = GgufFile::from_bytes(synthetic()).unwrap();
        let mut info = f.tensors()[0].clone();
        info.offset = f.file_size();
        f.tensor_data(&info);
    }

    #[test]
    fn open_errors_name_the_path() {
        let e = GgufFile::open("/nonexistent/x.gguf")
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("cannot read GGUF file /nonexistent/x.gguf: "),
            "{e}"
        );
        let dir = std::env::temp_dir().join(format!("edgelm-gguf-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.gguf");
        std::fs::write(&empty, b"").unwrap();
        assert!(GgufFile::open(&empty)
            .unwrap_err()
            .to_string()
            .starts_with("truncated file: magic"));
        let good = dir.join("good.gguf");
        std::fs::write(&good, synthetic()).unwrap();
        let f = GgufFile::open(&good).unwrap();
        assert!(f.is_mapped());
        assert_eq!(f.tensor("w").unwrap().data[31], 31);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn real_model() {
        let f = GgufFile::open(test_model_path()).unwrap();
        assert_eq!(f.version(), 3);
        assert_eq!(f.architecture(), Some("llama"));
        assert_eq!(f.get_u32("llama.block_count"), Some(30));
        assert_eq!(f.get_u32("llama.embedding_length"), Some(576));
        assert_eq!(
            f.get("tokenizer.ggml.tokens")
                .and_then(Value::as_string_array)
                .map(<[String]>::len),
            Some(49152)
        );
        assert_eq!(
            f.get("tokenizer.ggml.token_type")
                .and_then(Value::as_i32_array)
                .map(<[i32]>::len),
            Some(49152)
        );
        assert_eq!(f.metadata().len(), 33);
        assert_eq!(f.tensors().len(), 272);
        assert_eq!(f.data_offset(), 1_785_664);
        let emb = f.tensor("token_embd.weight").unwrap();
        assert_eq!(emb.info.ty, GgmlType::Q8_0);
        assert_eq!(emb.info.dims, [576, 49152]);
        assert_eq!(emb.data.len(), 30_081_024);
        let last = f.tensors().iter().map(|t| t.offset + t.size).max();
        assert_eq!(
            last,
            Some(f.file_size()),
            "tensor data runs to the end of the file"
        );
        for t in f.tensors() {
            assert_eq!(f.tensor_data(t).len() as u64, t.size);
        }
    }
}
