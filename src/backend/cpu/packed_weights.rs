//! The weight matrices in the packed layout (`quant::packed`), the CPU's copy of them, made
//! once when the CPU first runs the model.
//!
//! They live in one anonymous mapping that asks for transparent huge pages: decode streams
//! every weight once per token, and on 4 KiB pages the core's prefetchers stop at every page
//! boundary and every page costs a TLB walk (one core read 17 GB/s from 4 KiB pages against
//! 25 GB/s from 2 MiB ones on the 2-core AVX-512 VM). As rows are packed, their pages of the
//! file mapping are dropped from this process (`GgufFile::release_bytes`, every 16 MiB), so the
//! process holds each weight once: resident memory stays weights + KV pool + a little, and
//! packing raises the peak by one round, not by the whole model.
//!
//! Only the matrices the matmuls read are packed (the output head, which is the embedding
//! table too when the model ties them, and every layer's); the embedding lookup reads packed
//! rows where its table was packed.

use super::pool;
use crate::backend::ops::Mat;
use crate::gguf::GgufFile;
use crate::quant::packed::{self, GROUP};
use std::collections::HashMap;

/// One packed matrix: which rows of which tensor, and where its groups are.
struct Entry {
    /// Index of the matrix in the list it was built from.
    mat: usize,
    tensor: usize,
    first_row: usize,
    rows: usize,
    offset: usize,
    len: usize,
}

/// Which rows of which tensor a matrix is: (tensor, first row, rows).
type RowsKey = (usize, usize, usize);

fn key(m: &Mat) -> RowsKey {
    (m.tensor, m.first_row, m.rows)
}

/// Packed matrices, by the tensor rows they hold.
#[derive(Default)]
pub struct PackedWeights {
    region: Option<Region>,
    entries: Vec<Entry>,
    /// Entry of each packed matrix: a mixture of experts has thousands of matrices, and every
    /// matmul looks its weights up.
    by_rows: HashMap<RowsKey, usize>,
}

impl PackedWeights {
    /// Packs every matrix of `mats` whose type has a packed layout and kernels on this CPU
    /// (`quant::packs_type`); otherwise holds none.
    pub fn build(file: &GgufFile, mats: &[&Mat]) -> PackedWeights {
        if !enabled() {
            return PackedWeights::default();
        }
        let mut entries: Vec<Entry> = Vec::new();
        let mut by_rows = HashMap::new();
        let mut total = 0usize;
        for (i, m) in mats.iter().enumerate() {
            let height = file.tensors()[m.tensor].dims[1] as usize;
            let kernels = packed::packable(m.ty, height) && crate::quant::packs_type(m.ty);
            if !kernels || by_rows.contains_key(&key(m)) {
                continue;
            }
            by_rows.insert(key(m), entries.len());
            let len = packed::packed_bytes(m.ty, m.rows, m.cols);
            entries.push(Entry {
                mat: i,
                tensor: m.tensor,
                first_row: m.first_row,
                rows: m.rows,
                offset: total,
                len,
            });
            // Each matrix starts on a cache line.
            total += len.next_multiple_of(64);
        }
        if entries.is_empty() {
            return PackedWeights::default();
        }
        let started = std::time::Instant::now();
        let mut region = Region::new(total);
        pack_all(file, mats, &entries, region.bytes_mut());
        release_packed_tensors(file, &entries);
        log::info!(
            "packed {} matrices ({} MiB) for the CPU in {} ms",
            entries.len(),
            total >> 20,
            started.elapsed().as_millis()
        );
        PackedWeights {
            region: Some(region),
            entries,
            by_rows,
        }
    }

    /// `m`'s packed groups, if it was packed.
    pub fn get(&self, m: &Mat) -> Option<&[u8]> {
        let e = &self.entries[*self.by_rows.get(&key(m))?];
        Some(&self.region.as_ref()?.bytes()[e.offset..e.offset + e.len])
    }

    /// Bytes of packed weights held.
    pub fn bytes(&self) -> usize {
        self.entries.iter().map(|e| e.len).sum()
    }
}

/// Whether the CPU computes from packed matrices: where it has kernels for them
/// (`quant::packs`), unless `EDGELM_PACK=0` asks for the file's layout.
fn enabled() -> bool {
    crate::quant::packs() && std::env::var_os("EDGELM_PACK").is_none_or(|v| v != "0")
}

/// Packs every entry's matrix into its place in `dst`, in tasks of a few groups over the pool.
///
/// The tasks run in rounds of about [`ROUND_BYTES`] of the file's bytes, and after each round
/// the file pages it read are dropped: the two copies of a weight are resident together only
/// for the round in flight, so packing raises the process's peak memory by a round, not by the
/// whole model.
fn pack_all(file: &GgufFile, mats: &[&Mat], entries: &[Entry], dst: &mut [u8]) {
    /// Groups per task: enough work per task (tens of KiB) to hide the claiming.
    const GROUPS_PER_TASK: usize = 64;
    /// The file's bytes packed between two releases.
    const ROUND_BYTES: usize = 16 << 20;
    let mat_of = |e: &Entry| mats[e.mat];
    // (entry, first group, the task's rows of the file)
    let tasks: Vec<(usize, usize, &[u8])> = entries
        .iter()
        .enumerate()
        .flat_map(|(i, e)| {
            let m = mat_of(e);
            let (data, row_bytes) = (m.data(file), m.row_bytes());
            (0..packed::groups(e.rows))
                .step_by(GROUPS_PER_TASK)
                .map(move |g| {
                    let rows = g * GROUP..((g + GROUPS_PER_TASK) * GROUP).min(e.rows);
                    (i, g, &data[rows.start * row_bytes..rows.end * row_bytes])
                })
        })
        .collect();
    let shared = super::parallel::SharedSlice::new(dst);
    let mut first = 0;
    while first < tasks.len() {
        let mut end = first;
        let mut bytes = 0;
        while end < tasks.len() && (end == first || bytes + tasks[end].2.len() <= ROUND_BYTES) {
            bytes += tasks[end].2.len();
            end += 1;
        }
        let round = &tasks[first..end];
        pool::parallel_for(round.len(), |task| {
            let (i, g0, _) = round[task];
            let (e, m) = (&entries[i], mat_of(&entries[i]));
            let g1 = (g0 + GROUPS_PER_TASK).min(packed::groups(e.rows));
            let gb = packed::group_bytes(m.ty, m.cols);
            // SAFETY: tasks write disjoint group ranges of disjoint entries.
            let out = unsafe { shared.slice_mut(e.offset + g0 * gb, (g1 - g0) * gb) };
            packed::pack_groups(m.ty, m.cols, m.data(file), m.rows, g0..g1, out);
        });
        for &(_, _, rows) in round {
            file.release_bytes(rows);
        }
        first = end;
    }
}

/// Drops from this process the file pages of every tensor the entries cover whole (a fused
/// tensor is covered once all its bands are packed): the pages that straddled two rounds of
/// [`pack_all`], which it could not drop. Nothing on the CPU reads them again.
fn release_packed_tensors(file: &GgufFile, entries: &[Entry]) {
    let mut tensors: Vec<usize> = entries.iter().map(|e| e.tensor).collect();
    tensors.sort_unstable();
    tensors.dedup();
    for t in tensors {
        // Rows of every slice: a 3-D tensor of experts is one matrix per expert.
        let info = &file.tensors()[t];
        let height = (info.n_elements() / info.dims[0].max(1)) as usize;
        let mut covered = vec![false; height];
        for e in entries.iter().filter(|e| e.tensor == t) {
            covered[e.first_row..e.first_row + e.rows].fill(true);
        }
        if covered.iter().all(|&c| c) {
            file.release(&file.tensors()[t]);
        }
    }
}

/// An anonymous private mapping, asked to be backed by transparent huge pages.
struct Region {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the region is plain memory owned by this value; shared access is read-only
// (`bytes`), writes need `&mut self`.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    fn new(len: usize) -> Region {
        /// Huge pages are 2 MiB on x86-64: the mapping is padded to whole ones and aligned.
        const HUGE: usize = 2 << 20;
        let padded = len.next_multiple_of(HUGE) + HUGE;
        // SAFETY: a fresh anonymous mapping; the result is checked before use.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                padded,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(
            raw != libc::MAP_FAILED,
            "cannot map {padded} bytes for the packed weights: {}",
            std::io::Error::last_os_error()
        );
        // Keep a 2 MiB-aligned run of whole pages, so that huge pages can back all of it.
        let (raw_at, start) = (raw as usize, (raw as usize).next_multiple_of(HUGE));
        let end = start + len.next_multiple_of(4096);
        // SAFETY: unmapping the unused head and tail of the mapping made above; `madvise` only
        // hints (a kernel without transparent huge pages refuses it: 4 KiB pages then).
        unsafe {
            if start > raw_at {
                libc::munmap(raw, start - raw_at);
            }
            if raw_at + padded > end {
                libc::munmap(end as *mut libc::c_void, raw_at + padded - end);
            }
            #[cfg(target_os = "linux")]
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        Region {
            ptr: start as *mut u8,
            len,
        }
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes from `ptr` are mapped (readable) for this value's lifetime.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and writable; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the pages from `ptr` over `len` rounded up to pages were mapped by `new` and
        // nothing borrows them once the region drops.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len.next_multiple_of(4096));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::test_model_path;

    /// Every matrix of the reference model (one of them as two bands of rows, as a fused QKV
    /// is) packs to groups that unpack to its file bytes, and the file reads the same after
    /// its pages were dropped round by round.
    #[test]
    #[cfg_attr(
        not(any(host_avx512vnni, target_arch = "aarch64")),
        ignore = "this CPU has no packed kernels (AVX-512 VNNI, or any aarch64 CPU)"
    )]
    fn packed_matrices_unpack_to_the_file_bytes_after_release() {
        let file = GgufFile::open(test_model_path()).unwrap();
        let mut mats: Vec<Mat> = Vec::new();
        for (tensor, info) in file.tensors().iter().enumerate() {
            let (cols, rows) = (
                info.dims[0] as usize,
                info.dims.get(1).copied().unwrap_or(1),
            );
            if info.dims.len() != 2 || !packed::packable(info.ty, rows as usize) {
                continue;
            }
            let rows = rows as usize;
            let bands = if mats.is_empty() {
                vec![(0, rows / 2), (rows / 2, rows - rows / 2)]
            } else {
                vec![(0, rows)]
            };
            for (first_row, rows) in bands {
                mats.push(Mat {
                    name: info.name.clone(),
                    ty: info.ty,
                    cols,
                    rows,
                    tensor,
                    first_row,
                });
            }
        }
        assert!(mats.len() > 200, "the reference model's matrices");
        let before: Vec<Vec<u8>> = mats.iter().map(|m| m.data(&file).to_vec()).collect();
        let refs: Vec<&Mat> = mats.iter().collect();
        let packed = PackedWeights::build(&file, &refs);
        assert!(enabled(), "packing is on where the CPU has packed kernels");
        for (m, original) in mats.iter().zip(&before) {
            let groups = packed.get(m).expect("every packable matrix is packed");
            let mut rows = vec![0u8; original.len()];
            packed::unpack_rows(m.ty, m.cols, groups, 0..m.rows, &mut rows);
            assert!(rows == *original, "{} rows {}..", m.name, m.first_row);
            assert!(m.data(&file) == &original[..], "{} reads back", m.name);
        }
    }
}
