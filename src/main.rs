//! edgelm's entry point: parse flags, dispatch, turn errors into one line and an exit code.

mod cli;
mod commands;

use clap::Parser;
use cli::{Cli, Command};

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

fn main() {
    let cli = Cli::parse();
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or(default_log_level(&cli.command)),
    )
    .target(env_logger::Target::Stderr)
    .init();
    let result = match cli.command {
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Run(a) => commands::generate::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::KvPlan(a) => commands::kv_plan::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::ConfigCheck(a) => commands::serve::check(a),
    };
    if let Err(e) = result {
        // One line: the chain of causes joined, no backtrace noise.
        eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}
