//! edgelm's entry point: parse flags, dispatch, turn errors into one line and an exit code.

mod cli;
mod commands;

use clap::Parser;
use cli::{Cli, Command, ConfigCommand};

/// The server logs at its profile's level (info by default); one-shot commands stay quiet.
/// `RUST_LOG` overrides both.
fn default_log_level(cmd: &Command) -> String {
    match cmd {
        Command::Serve(a) => a
            .config
            .as_deref()
            .and_then(|c| edgelm::config::Profile::load(c).ok())
            .map(|p| p.log.level)
            .unwrap_or_else(|| "info".into()),
        _ => "warn".into(),
    }
}

/// Keeps memory that is not weights or KV pool small and stable while serving: buffers of 1 MiB
/// and more (a prefill chunk's activations) are mapped and returned on free instead of
/// lingering in the heap (glibc otherwise raises that threshold as it sees them freed), and
/// the ~100 mostly idle HTTP threads share two malloc arenas instead of growing their own.
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes glibc allocator parameters; called before other threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() {
    tune_allocator();
    let cli = Cli::parse();
    let journal = edgelm::systemd::under_journal();
    let mut logger = env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or(default_log_level(&cli.command)),
    );
    logger.target(env_logger::Target::Stderr);
    if journal {
        // Under systemd the journal stamps each line itself; a `<N>` prefix (sd-daemon(3))
        // gives it the priority.
        logger.format(|buf, record| {
            use std::io::Write;
            writeln!(
                buf,
                "{}{}: {}",
                edgelm::systemd::syslog_prefix(record.level()),
                record.target(),
                record.args()
            )
        });
    }
    logger.init();
    let result = match cli.command {
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Run(a) => commands::generate::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::KvPlan(a) => commands::kv_plan::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Loadgen(a) => commands::loadgen::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::ConfigCheck(a) | Command::Config(ConfigCommand::Check(a)) => {
            commands::serve::check(a)
        }
        Command::Doctor(a) => match commands::doctor::run(a) {
            Ok(true) => Ok(()),
            Ok(false) => std::process::exit(1),
            Err(e) => Err(e),
        },
    };
    if let Err(e) = result {
        // One line: the chain of causes joined, no backtrace noise.
        let prefix = if journal { "<3>" } else { "" };
        // A write error (stderr on a full disk) must not turn exit 1 into a panic's 101.
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "{prefix}error: {}",
            format!("{e:#}").replace('\n', " ")
        );
        std::process::exit(1);
    }
}
