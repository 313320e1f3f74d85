//! The systemd service-manager protocol, `sd_notify(3)` style: state lines (`READY=1`,
//! `STATUS=…`, `WATCHDOG=1`, `STOPPING=1`) sent as one datagram to the Unix socket named by
//! `NOTIFY_SOCKET` (a path, or an abstract name when it starts with '@'). Without
//! `NOTIFY_SOCKET` every call here does nothing.
//!
//! Written over std rather than the `sd-notify` crate because that crate (0.5) does not
//! reach abstract sockets.

use std::ffi::OsStr;
use std::io;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Where notifications go: the socket named by `NOTIFY_SOCKET`.
pub struct Notifier {
    socket: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// Parses a `NOTIFY_SOCKET` value: an absolute path, or '@' and an abstract name.
    pub fn new(target: &OsStr) -> io::Result<Notifier> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = target.as_bytes();
        let addr = match bytes.first() {
            Some(b'/') => SocketAddr::from_pathname(target)?,
            Some(b'@') => abstract_addr(&bytes[1..])?,
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "NOTIFY_SOCKET is neither an absolute path nor an abstract name ('@…')",
                ))
            }
        };
        Ok(Notifier {
            socket: UnixDatagram::unbound()?,
            addr,
        })
    }

    /// Sends the state lines as one datagram.
    pub fn send(&self, states: &[&str]) -> io::Result<()> {
        let msg = message(states);
        let sent = self.socket.send_to_addr(msg.as_bytes(), &self.addr)?;
        if sent != msg.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "short notify write",
            ));
        }
        Ok(())
    }
}

#[cfg(any(target_os = "linux", target_os = "android"))]
fn abstract_addr(name: &[u8]) -> io::Result<SocketAddr> {
    #[cfg(target_os = "android")]
    use std::os::android::net::SocketAddrExt;
    #[cfg(target_os = "linux")]
    use std::os::linux::net::SocketAddrExt;
    SocketAddr::from_abstract_name(name)
}

#[cfg(not(any(target_os = "linux", target_os = "android")))]
fn abstract_addr(_name: &[u8]) -> io::Result<SocketAddr> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "abstract sockets exist only on Linux",
    ))
}

/// One datagram: each state on its own line (newlines inside a value would start a new
/// assignment, so they become spaces).
pub fn message(states: &[&str]) -> String {
    let mut msg = String::new();
    for s in states {
        msg.push_str(&s.replace(['\n', '\r'], " "));
        msg.push('\n');
    }
    msg
}

/// The process-wide notifier, from `NOTIFY_SOCKET` at first use (None: not under systemd,
/// or the variable is unusable, which is logged once).
fn notifier() -> Option<&'static Notifier> {
    static N: OnceLock<Option<Notifier>> = OnceLock::new();
    N.get_or_init(|| {
        let target = std::env::var_os("NOTIFY_SOCKET")?;
        match Notifier::new(&target) {
            Ok(n) => Some(n),
            Err(e) => {
                log::warn!("NOTIFY_SOCKET={target:?} is unusable: {e}");
                None
            }
        }
    })
    .as_ref()
}

/// Sends state lines to systemd if it is listening; failures are logged, never fatal.
pub fn notify(states: &[&str]) {
    if let Some(n) = notifier() {
        if let Err(e) = n.send(states) {
            log::warn!("sd_notify {:?} failed: {e}", states.first().unwrap_or(&""));
        }
    }
}

/// The watchdog ping interval: half of `WATCHDOG_USEC`, if that is set to a positive number
/// and `WATCHDOG_PID` (when set) names this process.
pub fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, our_pid: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid {
        if pid.trim().parse::<u32>().ok()? != our_pid {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2).max(Duration::from_millis(1)))
}

/// Rate-limited `WATCHDOG=1` pings, sent by whoever calls `ping` often enough (the engine
/// loop): a loop that stops turning stops the pings, and systemd restarts the service.
pub struct Watchdog {
    interval: Duration,
    last: Option<Instant>,
}

impl Watchdog {
    /// Some when systemd asked for a watchdog (`WATCHDOG_USEC`) and is listening.
    pub fn from_env() -> Option<Watchdog> {
        notifier()?;
        let interval = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )?;
        log::info!(
            "systemd watchdog: pinging every {:.3} s",
            interval.as_secs_f64()
        );
        Some(Watchdog::with_interval(interval))
    }

    pub fn with_interval(interval: Duration) -> Watchdog {
        Watchdog {
            interval,
            last: None,
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// How long until the next ping is due (zero: now).
    pub fn due_in(&self) -> Duration {
        match self.last {
            None => Duration::ZERO,
            Some(t) => self.interval.saturating_sub(t.elapsed()),
        }
    }

    /// Pings if a ping is due; returns whether it did. Costs a clock read otherwise.
    pub fn ping(&mut self) -> bool {
        if !self.due_in().is_zero() {
            return false;
        }
        self.last = Some(Instant::now());
        notify(&["WATCHDOG=1"]);
        true
    }
}

/// Whether stderr goes to the journal (or at least to a systemd unit), so log lines should
/// carry `<N>` priority prefixes and no timestamp of their own.
pub fn under_journal() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some() || std::env::var_os("INVOCATION_ID").is_some()
}

/// The sd-daemon priority prefix for a log level (`<3>` error … `<7>` debug).
pub fn syslog_prefix(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "<3>",
        log::Level::Warn => "<4>",
        log::Level::Info => "<6>",
        log::Level::Debug | log::Level::Trace => "<7>",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_is_one_line_per_state_and_newline_free_values() {
        assert_eq!(message(&["READY=1"]), "READY=1\n");
        assert_eq!(
            message(&["READY=1", "STATUS=serving a\nb"]),
            "READY=1\nSTATUS=serving a b\n"
        );
        assert_eq!(message(&[]), "");
    }

    #[test]
    fn watchdog_interval_is_half_of_usec_for_our_pid() {
        let half = Some(Duration::from_millis(500));
        assert_eq!(watchdog_interval(Some("1000000"), None, 42), half);
        assert_eq!(watchdog_interval(Some("1000000"), Some("42"), 42), half);
        assert_eq!(watchdog_interval(Some("1000000"), Some("43"), 42), None);
        assert_eq!(watchdog_interval(Some("1000000"), Some("x"), 42), None);
        assert_eq!(watchdog_interval(Some("0"), None, 42), None);
        assert_eq!(watchdog_interval(Some("-5"), None, 42), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 42), None);
        assert_eq!(watchdog_interval(None, Some("42"), 42), None);
        assert_eq!(
            watchdog_interval(Some("30000000"), None, 1),
            Some(Duration::from_secs(15))
        );
    }

    #[test]
    fn watchdog_pings_are_rate_limited() {
        let mut w = Watchdog::with_interval(Duration::from_millis(50));
        assert!(w.ping(), "the first ping goes out at once");
        assert!(!w.ping());
        assert!(w.due_in() > Duration::from_millis(30));
        std::thread::sleep(Duration::from_millis(60));
        assert!(w.due_in().is_zero());
        assert!(w.ping());
    }

    #[test]
    fn notifier_reaches_path_sockets() {
        let dir = std::env::temp_dir().join(format!("edgelm-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::new(path.as_os_str()).unwrap();
        n.send(&["READY=1", "STATUS=ok"]).unwrap();
        let mut buf = [0u8; 256];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=ok\n");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn notifier_reaches_abstract_sockets() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("edgelm-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        let n = Notifier::new(OsStr::new(&format!("@{name}"))).unwrap();
        n.send(&["WATCHDOG=1"]).unwrap();
        let mut buf = [0u8; 64];
        let len = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1\n");
    }

    #[test]
    fn notifier_rejects_relative_targets() {
        assert!(Notifier::new(OsStr::new("relative.sock")).is_err());
        assert!(Notifier::new(OsStr::new("")).is_err());
    }

    #[test]
    fn syslog_prefixes() {
        assert_eq!(syslog_prefix(log::Level::Error), "<3>");
        assert_eq!(syslog_prefix(log::Level::Warn), "<4>");
        assert_eq!(syslog_prefix(log::Level::Info), "<6>");
        assert_eq!(syslog_prefix(log::Level::Debug), "<7>");
    }
}
