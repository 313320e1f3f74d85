//! The on-disk PTX cache: compiling every kernel with NVRTC takes seconds on a Jetson, so the
//! PTX is kept under `$EDGELM_CACHE_DIR`, else `$CACHE_DIRECTORY` (systemd's `CacheDirectory=`),
//! else `$XDG_CACHE_HOME/edgelm`, else `~/.cache/edgelm`, in `ptx/`, one file per kernel file,
//! named by the SHA-256 of everything that decides its contents: the source, the architecture,
//! the compile options, NVRTC's version and the driver's. A cache that cannot be written is only
//! a slower start.

use super::kernels::KernelFile;
use super::nvrtc::{compile_ptx, options_for, Arch};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// Where PTX files are cached (not created here), or `None` without any usable variable.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let base = var("EDGELM_CACHE_DIR")
        .or_else(|| var("CACHE_DIRECTORY"))
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("edgelm")))
        .or_else(|| var("HOME").map(|h| h.join(".cache").join("edgelm")))?;
    Some(base.join("ptx"))
}

/// Hex SHA-256 over the source and everything else that changes the PTX.
pub fn cache_key(source: &str, arch: Arch, nvrtc: &str, driver: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        source,
        &arch.sm(),
        &options_for(arch).join(" "),
        nvrtc,
        driver,
    ] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// PTX for `file` on `arch`: from the cache when present, else compiled (and stored). Returns
/// the PTX and whether it came from the cache.
pub(crate) fn cached_ptx(
    dir: Option<&Path>,
    file: &KernelFile,
    arch: Arch,
    nvrtc: &str,
    driver: &str,
) -> Result<(String, bool), String> {
    let key = cache_key(&file.source(), arch, nvrtc, driver);
    let path = dir.map(|d| d.join(format!("{}-{}-{key}.ptx", file.name, arch.sm())));
    if let Some(p) = &path {
        if let Ok(ptx) = std::fs::read_to_string(p) {
            if ptx.contains(".entry") {
                return Ok((ptx, true));
            }
        }
    }
    let ptx = compile_ptx(file, arch)?;
    if let Some(p) = &path {
        if let Err(e) = store(p, &ptx) {
            log::warn!("cannot cache PTX in {}: {e}", p.display());
        }
    }
    Ok((ptx, false))
}

/// Writes through a temporary file and a rename, so a reader never sees half a file.
fn store(path: &Path, ptx: &str) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, ptx)?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_changes_with_each_input() {
        let a = Arch::new(8, 7);
        let base = cache_key("src", a, "12.6", "12060");
        assert_eq!(base.len(), 64);
        assert_eq!(base, cache_key("src", a, "12.6", "12060"));
        for other in [
            cache_key("src2", a, "12.6", "12060"),
            cache_key("src", Arch::new(9, 0), "12.6", "12060"),
            cache_key("src", a, "12.8", "12060"),
            cache_key("src", a, "12.6", "12080"),
            // No ambiguity from where one part ends and the next begins.
            cache_key("src1", a, "2.6", "12060"),
        ] {
            assert_ne!(base, other);
        }
    }

    #[test]
    fn a_cached_file_is_used_without_compiling() {
        let dir = std::env::temp_dir().join(format!("edgelm-ptx-test-{}", std::process::id()));
        let file = &super::super::kernels::FILES[0];
        let arch = Arch::new(8, 7);
        let key = cache_key(&file.source(), arch, "v", "d");
        let path = dir.join(format!("{}-{}-{key}.ptx", file.name, arch.sm()));
        store(&path, "// fake\n.entry quantize_q8_1(\n").unwrap();
        // A cache hit never touches libnvrtc, so this passes on any machine.
        let (ptx, hit) = cached_ptx(Some(&dir), file, arch, "v", "d").unwrap();
        assert!(hit && ptx.starts_with("// fake"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
