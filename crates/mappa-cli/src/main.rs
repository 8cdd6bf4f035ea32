//! The `mappa` command line.
//!
//! Subcommands so far:
//! - `mappa grade`: grade model outputs (or bare answers) against reference
//!   answers with the same functions the pipelines use.
//! - `mappa run MANIFEST`: train and evaluate as a manifest says.
//! - `mappa reproduce NAME`: run `experiments/NAME.toml` (or `--dry-run`: the plan).
//! - `mappa coach score`: score action contexts with a configured coach.
//! - `mappa sandbox run`: run a Python program in the sandbox the agents use
//!   and print the result as JSON.

mod coach;
mod grade;
mod run;
mod sandbox;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mappa: multi-agent fine-tuning with per-action process rewards.
#[derive(Parser)]
#[command(name = "mappa", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Grade math answers: JSON lines in, JSON lines out.
    Grade(grade::GradeArgs),
    /// Train and evaluate as an experiment manifest says.
    Run(run::RunArgs),
    /// Run experiments/NAME.toml after checking that everything it needs is present.
    Reproduce(run::ReproduceArgs),
    /// Score agent actions with a coach (HTTP, local model or scripted).
    #[command(subcommand)]
    Coach(coach::CoachCommand),
    /// Run Python programs in the agents' sandbox.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Grade(args) => grade::run(&args),
        Command::Run(args) => run::run_manifest(&args),
        Command::Reproduce(args) => run::reproduce(&args),
        Command::Coach(command) => coach::run(&command),
        Command::Sandbox(command) => sandbox::run(&command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mappa: error: {e}");
            ExitCode::FAILURE
        }
    }
}
