//! `edgelm serve`: the OpenAI-compatible HTTP endpoint. SIGTERM/SIGINT drain in-flight
//! requests (bounded by --drain-seconds), then the process exits 0.

use super::{engine_config, init_threads};
use crate::cli::ServeArgs;
use anyhow::{Context, Result};
use edgelm::server::{serve, ServeConfig};
use std::net::ToSocketAddrs;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

pub fn run(args: ServeArgs) -> Result<()> {
    init_threads(&args.compute)?;
    let addr = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}:{}", args.host, args.port))?
        .next()
        .context("no address to listen on")?;
    if !args.model.exists() {
        anyhow::bail!("model {} does not exist", args.model.display());
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let config = ServeConfig {
        model: args.model,
        addr,
        engine: engine_config(&args.compute),
        api_key: args.api_key.filter(|k| !k.is_empty()),
        max_queue: args.max_queue,
        body_limit: args.body_limit_kib * 1024,
        profile: "command line".into(),
    };
    serve(config, stop, Duration::from_secs(args.drain_seconds))
}
