//! `edgelm serve`: the OpenAI-compatible HTTP endpoint, configured by a firmware profile and
//! flags. SIGTERM/SIGINT drain in-flight requests (bounded), then the process exits 0; a second
//! signal exits at once (status 1).

use super::{engine_config, init_threads, model_section};
use crate::cli::{ComputeArgs, ConfigCheckArgs, ServeArgs};
use anyhow::{Context, Result};
use edgelm::config::Profile;
use edgelm::server::{serve, FrontConfig, Reread, ServeConfig};
use std::net::ToSocketAddrs;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

pub fn run(args: ServeArgs) -> Result<()> {
    let p = profile(&args)?;
    edgelm::backend::select::resolve(&p.engine.backend, "serving");
    let compute = ComputeArgs::from_profile(&p.engine);
    // The engine's threads at the normal priority; the HTTP threads take a lower one.
    edgelm::backend::cpu::pool::set_compute_nice(edgelm::server::compute_nice());
    init_threads(&compute)?;
    let addr = (p.server.host.as_str(), p.server.port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}:{}", p.server.host, p.server.port))?
        .next()
        .context("no address to listen on")?;
    check_memory(&p)?;
    let api_key = args
        .api_key
        .clone()
        .or_else(|| {
            (!p.server.api_key_env.is_empty())
                .then(|| std::env::var(&p.server.api_key_env).ok())
                .flatten()
        })
        .filter(|k| !k.is_empty());
    let (stop, reload) = (stop_on_signals()?, reload_on_sighup()?);
    let profile_name = args
        .config
        .as_ref()
        .and_then(|c| c.file_stem())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "defaults".into());
    let drain = Duration::from_secs(p.server.drain_seconds);
    let config = ServeConfig {
        addr,
        engine: engine_config(&compute),
        api_key,
        max_queue: p.server.max_queue,
        max_queue_wait: std::time::Duration::from_secs_f64(p.server.max_queue_wait_s),
        body_limit: p.server.body_limit_kib * 1024,
        profile: profile_name,
        front: front_config(&p),
        response_store: (
            p.server.response_store_count,
            p.server.response_store_mib << 20,
        ),
        models: p.served_models(),
        images: p.images.clone(),
        prefix_cache: p.prefix_cache.clone(),
        reread: Some(Reread(Arc::new(move || reread(&args)))),
    };
    serve(config, stop, reload, drain)
}

/// The profile (`--config`) with the flags given over it, checked.
fn profile(args: &ServeArgs) -> Result<Profile> {
    let mut p = match &args.config {
        Some(path) => Profile::load(path)?,
        None => Profile::default(),
    };
    args.override_profile(&mut p);
    args.attach_files(&mut p)?;
    p.validate().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(p)
}

/// A reload's profile: the models it serves now, if they fit in memory beside the running
/// ones (whose KV pool is held until their last request ends). Its `[engine]` and `[server]`
/// sections take a restart.
fn reread(args: &ServeArgs) -> Result<Vec<edgelm::config::ModelSection>> {
    let p = profile(args)?;
    let mut beside = p.clone();
    beside.engine.kv_memory_mib *= 2;
    check_memory(&beside).context("beside the running models (twice the KV pool)")?;
    Ok(p.served_models())
}

/// The flag SIGHUP sets, which asks for a reload.
fn reload_on_sighup() -> Result<Arc<AtomicBool>> {
    let reload = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, reload.clone())
        .context("cannot install signal handlers")?;
    Ok(reload)
}

impl ServeArgs {
    /// Each `--mmproj` and `--chat-template-file` (`[ID=]PATH`) given to the model it names
    /// (a path that exists is a path, as for `-m`); each `--lora` to the one model served.
    fn attach_files(&self, p: &mut Profile) -> Result<()> {
        if !self.lora.is_empty() && !p.models.is_empty() {
            anyhow::bail!(
                "--lora: several models are served; give each its adapters in its profile \
                 table ([[model.lora]], [[models.lora]])"
            );
        }
        for lora in &self.lora {
            p.model.lora.push(lora.clone());
        }
        for (flag, args) in [
            ("--mmproj", &self.mmproj),
            ("--chat-template-file", &self.chat_template_file),
        ] {
            for arg in args {
                let given = model_section(arg);
                let id = (!given.id.is_empty()).then_some(given.id.as_str());
                let section = p.served_section(flag, id)?;
                match flag {
                    "--mmproj" => section.mmproj = Some(given.path),
                    _ => section.chat_template_file = Some(given.path),
                }
            }
        }
        Ok(())
    }

    /// The flags given override the profile's values.
    fn override_profile(&self, p: &mut Profile) {
        let (server, engine) = (&mut p.server, &mut p.engine);
        if let Some((first, more)) = self.model.split_first() {
            p.model = model_section(first);
            p.models = more.iter().map(|m| model_section(m)).collect();
        }
        if let Some(h) = &self.host {
            server.host = h.clone();
        }
        if let Some(dir) = &self.prefix_cache_dir {
            p.prefix_cache.dir = dir.clone();
        }
        set(&mut server.port, self.port);
        set(&mut engine.threads, self.threads);
        set(&mut engine.kv_type, self.kv_type);
        set(&mut engine.kv_memory_mib, self.kv_memory_mib);
        set(&mut engine.max_seqs, self.max_seqs);
        set(&mut engine.prefill_pacing, self.prefill_pacing);
        set(&mut engine.prompt_lookup, self.prompt_lookup);
        set(&mut engine.state_snapshot_mib, self.state_snapshot_mib);
        set(&mut server.max_queue_wait_s, self.max_queue_wait);
        set(&mut server.max_queue, self.max_queue);
        set(&mut server.drain_seconds, self.drain_seconds);
        set(&mut server.header_timeout_s, self.header_timeout);
        set(&mut server.max_connections, self.max_connections);
        set(&mut server.client_rate_per_s, self.client_rate);
        set(&mut server.client_burst, self.client_burst);
    }
}

/// `value`, when the flag was given.
fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

/// The model files and the KV pool must fit in RAM with the profile's reserve left over
/// (`Profile::check_memory`); a missing model file is the error to report first.
fn check_memory(p: &Profile) -> Result<()> {
    let mut model_bytes = 0;
    for m in p.served_models() {
        let projector = m.mmproj.iter().map(|p| (p, "projector"));
        let adapters = m.lora.iter().map(|l| (&l.path, "adapter"));
        for (path, what) in std::iter::once((&m.path, "model"))
            .chain(projector)
            .chain(adapters)
        {
            match std::fs::metadata(path) {
                Ok(meta) => model_bytes += meta.len(),
                Err(_) if what == "model" => {
                    anyhow::bail!("{}", edgelm::config::missing_model(path))
                }
                Err(e) => anyhow::bail!("{what} {}: {e}", path.display()),
            }
        }
    }
    if let Some(total) = total_ram_bytes() {
        p.check_memory(model_bytes, total)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok(())
}

/// The flag SIGTERM and SIGINT set, which starts the drain.
fn stop_on_signals() -> Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        // A second signal while draining exits at once (status 1): someone at the terminal
        // pressing Ctrl-C again wants out now, not after the drain. Registered before the flag
        // so that the first signal only sets it.
        signal_hook::flag::register_conditional_shutdown(sig, 1, stop.clone())
            .context("cannot install signal handlers")?;
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    Ok(stop)
}

/// The HTTP front's timeouts and bounds from the profile.
fn front_config(p: &Profile) -> FrontConfig {
    FrontConfig {
        header_timeout: Duration::from_secs_f64(p.server.header_timeout_s),
        body_timeout: Duration::from_secs_f64(p.server.body_timeout_s),
        idle_timeout: Duration::from_secs_f64(p.server.idle_timeout_s),
        max_connections: p.server.max_connections,
        client_rate_per_s: p.server.client_rate_per_s,
        client_burst: p.server.client_burst,
        max_rejections_per_s: p.server.max_rejections_per_s,
    }
}

/// Physical RAM from sysinfo(2), which works where /proc/meminfo is hidden (the systemd unit's
/// ProcSubset=pid).
fn total_ram_bytes() -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: libc::sysinfo is plain integers and padding: all-zero bytes are a valid value.
        let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable sysinfo struct for the duration of the call.
        if unsafe { libc::sysinfo(&mut info) } == 0 {
            return Some(info.totalram as u64 * info.mem_unit.max(1) as u64);
        }
    }
    None
}

/// `edgelm config-check FILE...`: exit 1 naming the key and line of the first error per file.
pub fn check(args: ConfigCheckArgs) -> Result<()> {
    let mut failed = Vec::new();
    for f in &args.files {
        match Profile::load(f) {
            Ok(_) => println!("{}: ok", f.display()),
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        anyhow::bail!("{}", failed.join("; "))
    }
}
