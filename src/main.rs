//! edgelm's entry point: parse flags, dispatch, turn errors into one line and an exit code.

mod cli;
mod commands;

use clap::Parser;
use cli::{Cli, Command};

fn main() {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .target(env_logger::Target::Stderr)
        .init();
    let result = match cli.command {
        Command::Inspect(a) => commands::inspect::run(a),
        Command::Tokenize(a) => commands::tokenize::run(a),
        Command::Run(a) => commands::generate::run(a),
        Command::Perplexity(a) => commands::perplexity::run(a),
        Command::KvPlan(a) => commands::kv_plan::run(a),
        Command::Bench(a) => commands::bench::run(a),
    };
    if let Err(e) = result {
        // One line: the chain of causes joined, no backtrace noise.
        eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}
