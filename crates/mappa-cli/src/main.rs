//! The `mappa` command line.
//!
//! Subcommands so far:
//! - `mappa grade`: grade model outputs (or bare answers) against reference
//!   answers with the same functions the pipelines use.

mod grade;

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
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Grade(args) => grade::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mappa: error: {e}");
            ExitCode::FAILURE
        }
    }
}
