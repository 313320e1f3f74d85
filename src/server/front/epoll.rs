//! A thin wrapper over Linux epoll: the front watches every connection it holds from one
//! thread, so an open connection costs a descriptor and a few hundred bytes, never a thread.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

pub struct Epoll {
    fd: OwnedFd,
}

/// Readable, or the peer hung up / the socket failed (level-triggered: a connection whose
/// bytes are left unread keeps reporting, which the front relies on when it pauses reading).
pub const READ: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
/// Writable (a response that did not fit the send buffer at once).
pub const WRITE: u32 = libc::EPOLLOUT as u32;

fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: epoll_create1 takes no pointers; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call; the kernel copies it.
        check(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(|_| ())
    }

    pub fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    pub fn modify(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits up to `timeout` and fills `events` (its capacity bounds how many come back).
    pub fn wait(&self, events: &mut Vec<libc::epoll_event>, timeout: Duration) -> io::Result<()> {
        events.clear();
        let cap = events.capacity().max(1) as libc::c_int;
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: the kernel writes at most `cap` events into the vector's spare capacity,
        // which holds at least that many; `set_len` then covers only what it wrote.
        let n = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), cap, ms) };
        match check(n) {
            Ok(n) => {
                // SAFETY: see above: the first `n` entries were written by the kernel.
                unsafe { events.set_len(n as usize) };
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::net::UnixStream;

    #[test]
    fn reports_readable_sockets_by_token() {
        let ep = Epoll::new().unwrap();
        let (mut a, b) = UnixStream::pair().unwrap();
        ep.add(b.as_raw_fd(), 42, READ).unwrap();
        let mut events = Vec::with_capacity(8);
        ep.wait(&mut events, Duration::from_millis(0)).unwrap();
        assert!(events.is_empty());
        a.write_all(b"x").unwrap();
        ep.wait(&mut events, Duration::from_millis(1000)).unwrap();
        assert_eq!(events.len(), 1);
        let token = events[0].u64;
        assert_eq!(token, 42);
        ep.delete(b.as_raw_fd()).unwrap();
        ep.wait(&mut events, Duration::from_millis(0)).unwrap();
        assert!(events.is_empty());
    }
}
