//! Service checks: the firmware profile, and the listening port (free, or a live edgelm).

use super::{Check, Context, DEFAULT_PROFILE};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(2);

pub fn profile(ctx: &Context) -> Check {
    let mut c = Check::new("profile");
    let Some(path) = &ctx.profile_path else {
        return c.warn(
            format!("no profile; defaults (no --config and no {DEFAULT_PROFILE})"),
            format!("install a firmware profile at {DEFAULT_PROFILE} or pass --config FILE"),
        );
    };
    c.detail("path", path.display().to_string());
    if let Some(e) = &ctx.profile_error {
        return c.fail(
            e.clone(),
            format!(
                "fix the profile (`edgelm config check {}`); the checks below use defaults",
                path.display()
            ),
        );
    }
    let p = &ctx.profile;
    let key_env = &p.server.api_key_env;
    let key_set = !key_env.is_empty() && std::env::var_os(key_env).is_some_and(|v| !v.is_empty());
    c.detail("backend", p.engine.backend.clone());
    c.detail("kv_type", p.engine.kv_type.to_string());
    c.detail("kv_memory_mib", p.engine.kv_memory_mib);
    c.detail("max_seqs", p.engine.max_seqs);
    c.detail("host", p.server.host.clone());
    c.detail("port", p.server.port);
    c.detail("api_key_env", key_env.clone());
    c.detail("api_key_set_here", key_set);
    c.pass(format!(
        "{} is valid (backend {}, {}:{}, kv {} {} MiB, max_seqs {})",
        path.display(),
        p.engine.backend,
        p.server.host,
        p.server.port,
        p.engine.kv_type,
        p.engine.kv_memory_mib,
        p.engine.max_seqs
    ))
}

/// Where a client on this box reaches the profile's listener (wildcards become loopback).
pub fn connect_addr(host: &str, port: u16) -> Option<SocketAddr> {
    let host = match host {
        "0.0.0.0" | "" => "127.0.0.1",
        "::" | "[::]" => "::1",
        h => h.trim_start_matches('[').trim_end_matches(']'),
    };
    (host, port).to_socket_addrs().ok()?.next()
}

/// A minimal HTTP/1.0 GET; returns (status code, body).
pub fn http_get(
    addr: SocketAddr,
    path: &str,
    bearer: Option<&str>,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
    s.set_read_timeout(Some(TIMEOUT))?;
    s.set_write_timeout(Some(TIMEOUT))?;
    let auth = bearer
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: edgelm-doctor\r\n{auth}Connection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.take(4 << 20).read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .filter(|l| l.starts_with("HTTP/"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP response"))?;
    Ok((status, body.to_owned()))
}

pub fn port(ctx: &Context) -> Check {
    let mut c = Check::new("port");
    let (host, port) = (&ctx.profile.server.host, ctx.profile.server.port);
    c.detail("host", host.clone());
    c.detail("port", port);
    let Some(addr) = connect_addr(host, port) else {
        return c.fail(
            format!("cannot resolve {host}:{port}"),
            "set server.host to an address of this box (127.0.0.1 or 0.0.0.0)",
        );
    };
    if TcpStream::connect_timeout(&addr, TIMEOUT).is_ok() {
        return match http_get(addr, "/health", None) {
            Ok((code, body)) => {
                let health = serde_json::from_str::<serde_json::Value>(&body).ok();
                let state = health
                    .as_ref()
                    .and_then(|v| v["status"].as_str().map(str::to_owned));
                let reload_failed = health.is_some_and(|v| v["last_reload"] == "failed");
                c.detail("http_status", code);
                match state {
                    Some(s) => {
                        c.detail("service_state", s.clone());
                        let reason = format!("edgelm answers on {addr}: /health {code} {s}");
                        match s.as_str() {
                            "ready" if reload_failed => c.warn(
                                format!("{reason}, but its last reload failed"),
                                "the models loaded before it serve; why: `journalctl -u \
                                 edgelm | grep reload` or /api/status's reloads",
                            ),
                            "ready" => c.pass(reason),
                            "loading" | "draining" => c.warn(
                                reason,
                                "the service is starting or stopping; run doctor again shortly",
                            ),
                            _ => c.fail(
                                reason,
                                "the service failed to load its model: `journalctl -u edgelm`",
                            ),
                        }
                    }
                    None => c.fail(
                        format!(
                            "{addr} is in use by something that is not edgelm (/health {code})"
                        ),
                        "another program holds the port: stop it or change server.port",
                    ),
                }
            }
            Err(e) => c.fail(
                format!("{addr} is in use by something that does not answer HTTP ({e})"),
                "another program holds the port: stop it or change server.port",
            ),
        };
    }
    // Nothing answers: can the service bind it?
    let bind_addr = (host.trim_start_matches('[').trim_end_matches(']'), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .unwrap_or(addr);
    match TcpListener::bind(bind_addr) {
        Ok(_) => c.pass(format!("{bind_addr} is free (no edgelm running there)")),
        Err(e) => c.fail(
            format!("cannot bind {bind_addr}: {e}"),
            "the port is taken or the address is not on this box: change server.host/port",
        ),
    }
}
