//! edgelm's entry point: parse flags, dispatch, turn errors into one line and an exit code.

mod cli;
mod commands;

use clap::Parser;
use cli::{Cli, Command};

/// The server logs requests at info level by default; the one-shot commands stay quiet.
fn default_log_level(cmd: &Command) -> &'static str {
    match cmd {
        Command::Serve(_) => "info",
        _ => "warn",
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
    };
    if let Err(e) = result {
        // One line: the chain of causes joined, no backtrace noise.
        eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}
