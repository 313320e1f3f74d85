//! The descriptor limit: every connection the front holds is a descriptor, so the soft limit
//! (often 1,024) is raised to the hard limit at start, and `server.max_connections` is lowered
//! with a warning when even that would leave too few for the rest of the process.

/// Descriptors kept for everything but the front's connections: the model file, the
/// listener, the runtime's poller, logs and the like.
pub const RESERVED: u64 = 512;

/// Raises the soft limit to the hard limit if `max_connections` needs more than it allows;
/// returns the connections that fit.
pub fn raise_for(max_connections: usize) -> usize {
    let need = max_connections as u64 + RESERVED;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return max_connections;
    }
    if lim.rlim_cur < need && lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max.min(need.max(lim.rlim_cur)),
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads one rlimit from the struct we own; raising the soft limit up
        // to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim.rlim_cur = raised.rlim_cur;
        }
    }
    let fits = lim.rlim_cur.saturating_sub(RESERVED) as usize;
    if fits < max_connections {
        log::warn!(
            "server.max_connections = {max_connections} does not fit the descriptor limit \
             ({}); serving at most {fits} connections (raise LimitNOFILE)",
            lim.rlim_cur
        );
        return fits.max(1);
    }
    max_connections
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_fits_is_at_most_what_was_asked() {
        assert_eq!(raise_for(16), 16);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as above.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let huge = raise_for(usize::MAX / 2);
        assert!(huge as u64 <= lim.rlim_max, "{huge}");
    }
}
