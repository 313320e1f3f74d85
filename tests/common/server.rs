//! `edgelm serve` for a test: started on a free port, waited for, asked over HTTP/1.0, stopped
//! (SIGTERM) when dropped.

use super::edgelm;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// A served model, stopped (SIGTERM) when dropped.
pub struct Server {
    child: Child,
    port: u16,
    /// The `--api-key` it was started with, which its requests send.
    key: Option<String>,
    /// It has exited (and been waited for): its pid may be another process's now.
    exited: bool,
}

impl Server {
    pub fn start(model: &Path) -> Server {
        Server::start_with(model, &[])
    }

    /// [`Server::start`] with more `serve` flags.
    pub fn start_with(model: impl AsRef<OsStr>, flags: &[&str]) -> Server {
        Server::start_logging(model, flags, None)
    }

    /// [`Server::start_with`], its stderr written to `log` (else dropped).
    pub fn start_logging(model: impl AsRef<OsStr>, flags: &[&str], log: Option<&Path>) -> Server {
        let stderr = match log {
            Some(path) => Stdio::from(std::fs::File::create(path).unwrap()),
            None => Stdio::null(),
        };
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = edgelm()
            .args(["serve", "--port", &port.to_string(), "-t", "2"])
            .args(["--kv-memory-mib", "64"])
            .args(flags)
            .arg("-m")
            .arg(model.as_ref())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let key = flags
            .iter()
            .position(|f| *f == "--api-key")
            .map(|i| flags[i + 1].to_string());
        let mut server = Server {
            child,
            port,
            key,
            exited: false,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while server.request("GET", "/health", "").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "{:?} never became healthy",
                model.as_ref()
            );
            assert!(server.child.try_wait().unwrap().is_none(), "serve exited");
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Sends `signal` to the server.
    pub fn signal(&self, signal: i32) {
        if !self.exited {
            // SAFETY: kill(2) on our own child's pid, not yet waited for.
            unsafe { libc::kill(self.child.id() as i32, signal) };
        }
    }

    /// How the server exited, once it has, within `limit` (`None`: still running).
    pub fn exit_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.exited = true;
                return Some(status);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// (status, JSON document of the body) of one request; status 0 when the server cannot be
    /// reached.
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        let (status, body) = self.request_raw(method, path, body);
        let json = match (body.find('{'), body.rfind('}')) {
            (Some(a), Some(b)) if a < b => &body[a..=b],
            _ => &body,
        };
        (status, json.to_string())
    }

    /// (status, body) of one request.
    pub fn request_raw(&self, method: &str, path: &str, body: &str) -> (u16, String) {
        self.request_keyed(method, path, body, self.key.as_deref())
    }

    /// [`Server::request_raw`] with `key` as its API key (none: no Authorization header).
    pub fn request_keyed(
        &self,
        method: &str,
        path: &str,
        body: &str,
        key: Option<&str>,
    ) -> (u16, String) {
        let Ok(mut c) = TcpStream::connect(("127.0.0.1", self.port)) else {
            return (0, String::new());
        };
        c.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let auth = key.map_or(String::new(), |k| format!("Authorization: Bearer {k}\r\n"));
        let req = format!(
            "{method} {path} HTTP/1.0\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        let mut resp = String::new();
        if c.write_all(req.as_bytes()).is_err() || c.read_to_string(&mut resp).is_err() {
            return (0, String::new());
        }
        let status = resp
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        (status, body.to_string())
    }

    /// [`Server::metric`] once it has reached 0, or after two seconds, whichever comes first.
    pub fn settled_metric(&self, name: &str) -> f64 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        loop {
            let v = self.metric(name);
            if v == 0.0 || std::time::Instant::now() > deadline {
                return v;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// The value of an unlabelled series in /metrics.
    pub fn metric(&self, name: &str) -> f64 {
        let (_, text) = self.request_raw("GET", "/metrics", "");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.signal(libc::SIGTERM);
        let _ = self.child.wait();
    }
}
