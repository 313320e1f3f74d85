//! A mapped file cut short under its mapping (truncated or rewritten in place by another
//! process) faults with SIGBUS on the first read past its new end. Without a handler the
//! process dies of the signal with nothing in its log. Here each mapping is registered with
//! its path, and the handler for a fault inside one writes one line naming the file and exits
//! with status 1, so that systemd (`Restart=on-failure`) starts the service again on the file
//! as it is now. A fault anywhere else is left to the default action, as before.
//!
//! The handler may only touch what is async-signal-safe: a fixed table of atomics, write(2)
//! and _exit(2).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};
use std::sync::Once;

/// Mappings at once (models, projectors, adapters read by mapping); more go unregistered and
/// fault as they would without the handler.
const SLOTS: usize = 64;

struct Slot {
    /// First byte of the mapping; 0 while the slot is free.
    start: AtomicUsize,
    len: AtomicUsize,
    /// The file's path (leaked, so that a handler running late never reads freed memory).
    path: AtomicPtr<u8>,
    path_len: AtomicUsize,
}

#[allow(clippy::declare_interior_mutable_const)] // each array element is its own slot
const FREE: Slot = Slot {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    path: AtomicPtr::new(std::ptr::null_mut()),
    path_len: AtomicUsize::new(0),
};

static MAPPED: [Slot; SLOTS] = [FREE; SLOTS];
static INSTALL: Once = Once::new();
/// Whether stderr goes to the journal: the line then takes the `<2>` (critical) prefix.
static JOURNAL: AtomicBool = AtomicBool::new(false);

/// A registered mapping; unregistered when dropped (before the mapping goes).
pub struct Registration(Option<usize>);

impl Drop for Registration {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            MAPPED[i].start.store(0, Ordering::Release);
        }
    }
}

/// Registers `bytes`, the mapping of `path`, with the handler (installed on first use).
pub fn register(bytes: &[u8], path: &Path) -> Registration {
    INSTALL.call_once(install);
    let start = bytes.as_ptr() as usize;
    for (i, slot) in MAPPED.iter().enumerate() {
        if slot
            .start
            .compare_exchange(0, usize::MAX, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        let name: &'static mut [u8] = Box::leak(
            path.as_os_str()
                .as_encoded_bytes()
                .to_vec()
                .into_boxed_slice(),
        );
        slot.path_len.store(name.len(), Ordering::Relaxed);
        slot.path.store(name.as_mut_ptr(), Ordering::Relaxed);
        slot.len.store(bytes.len(), Ordering::Relaxed);
        // Claimed with usize::MAX (no address matches it) until every field is written.
        slot.start.store(start, Ordering::Release);
        return Registration(Some(i));
    }
    Registration(None)
}

fn install() {
    JOURNAL.store(crate::systemd::under_journal(), Ordering::Relaxed);
    // SAFETY: a zeroed sigaction is a valid value; the handler has the SA_SIGINFO signature.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigbus as *const () as usize;
        action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut());
    }
}

extern "C" fn on_sigbus(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() } as usize;
    let hit = MAPPED.iter().find(|s| {
        let start = s.start.load(Ordering::Acquire);
        start != 0
            && start != usize::MAX
            && (start..start + s.len.load(Ordering::Relaxed)).contains(&addr)
    });
    let Some(slot) = hit else {
        // Not a mapping of ours: the default action, as if no handler were installed (the
        // fault happens again on return).
        // SAFETY: resetting a signal's disposition is async-signal-safe.
        unsafe { libc::signal(libc::SIGBUS, libc::SIG_DFL) };
        return;
    };
    let path = slot.path.load(Ordering::Relaxed);
    let path_len = slot.path_len.load(Ordering::Relaxed);
    let prefix: &[u8] = match JOURNAL.load(Ordering::Relaxed) {
        true => b"<2>edgelm: ",
        false => b"edgelm: fatal: ",
    };
    let parts: [(*const u8, usize); 3] = [
        (prefix.as_ptr(), prefix.len()),
        (path, path_len),
        (MESSAGE.as_ptr(), MESSAGE.len()),
    ];
    for (p, n) in parts {
        // SAFETY: each part is a live byte range (the path is leaked); write(2) and _exit(2)
        // are async-signal-safe.
        unsafe { libc::write(2, p.cast(), n) };
    }
    // SAFETY: as above.
    unsafe { libc::_exit(1) };
}

const MESSAGE: &[u8] = b" was truncated or rewritten in place while mapped (a read past its \
end faulted): exiting so that the service restarts on the file as it is now; replace a model by \
renaming a new file over it\n";

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::{AsRawFd, FromRawFd};

    #[test]
    fn a_read_past_a_truncation_exits_with_one_line_naming_the_file() {
        let path = std::env::temp_dir().join(format!("edgelm-fault-{}.gguf", std::process::id()));
        std::fs::write(&path, vec![7u8; 1 << 16]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: the test truncates the file on purpose, in the child, to fault.
        let map = unsafe { memmap2::MmapOptions::new().map_copy_read_only(&file) }.unwrap();
        let registration = register(&map, &path);
        let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let mut fds = [0; 2];
        // SAFETY: pipe(2) into a two-int array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // The child only makes system calls (no allocation after fork in a threaded process).
        // SAFETY: fork(2); the child ends in _exit or in the handler's _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: plain system calls on descriptors this process owns, and a read of the
            // mapping past the file's new end (the fault under test).
            unsafe {
                libc::dup2(fds[1], 2);
                libc::ftruncate(writer.as_raw_fd(), 4096);
                std::ptr::read_volatile(map.as_ptr().add(60_000));
                libc::_exit(0);
            }
        }
        // SAFETY: closing our copy of the write end; the read end is owned by `out` below.
        unsafe { libc::close(fds[1]) };
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        let mut line = String::new();
        // SAFETY: fds[0] is an open descriptor nothing else owns.
        let mut out = unsafe { std::fs::File::from_raw_fd(fds[0]) };
        out.read_to_string(&mut line).unwrap();
        assert!(libc::WIFEXITED(status), "status {status:#x}: {line}");
        assert_eq!(libc::WEXITSTATUS(status), 1, "{line}");
        assert!(line.contains(&*path.to_string_lossy()), "{line}");
        assert!(line.contains("truncated or rewritten in place"), "{line}");
        assert_eq!(line.lines().count(), 1, "{line}");
        drop(registration);
        std::fs::remove_file(&path).unwrap();
    }
}
