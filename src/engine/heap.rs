//! Giving freed heap memory back to the system once the engine goes idle.
//!
//! glibc's malloc keeps what a burst freed (a long prompt's token vectors, sixteen streams'
//! JSON, each HTTP thread's own arena) mapped and resident, to reuse it. On an appliance
//! whose memory budget is weights + KV pool + a little, a box that served one burst would
//! then carry that burst's peak for the rest of its life. `malloc_trim` returns every
//! arena's free pages (not only the top of the main heap), and an idle engine is when
//! nobody is waiting for the few milliseconds it takes. musl's allocator returns freed
//! memory eagerly, so the static builds have nothing to do.

/// Returns the heap's free pages to the system (glibc); a no-op elsewhere.
pub fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only walks glibc's own arenas under their
    // locks and madvises pages that hold no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn releasing_keeps_live_allocations_intact() {
        let live: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 * 1024]).collect();
        drop((0..64).map(|_| vec![0u8; 64 * 1024]).collect::<Vec<_>>());
        super::release_free_memory();
        for (i, v) in live.iter().enumerate() {
            assert!(v.iter().all(|&b| b == i as u8));
        }
    }
}
