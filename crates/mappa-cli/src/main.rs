//! The `mappa` command line.
//!
//! Subcommands so far:
//! - `mappa grade`: grade model outputs (or bare answers) against reference
//!   answers with the same functions the pipelines use.
//! - `mappa run MANIFEST`: train and evaluate as a manifest says.
//! - `mappa reproduce NAME`: run `experiments/NAME.toml` (or `--dry-run`: the
//!   plan); a manifest with a `[study]` runs every arm and seed and writes a
//!   report with a verdict (`--quick`: its CI profile; `--validation`: the study
//!   on other generated problems, to tune on).
//! - `mappa eval MANIFEST [--run RUN_DIR]`: held-out accuracy of base models or a checkpoint.
//! - `mappa ablate NAME --credit a,b,c --seeds N`: credit variants side by side.
//! - `mappa report RUN_DIR...`: compare runs in a markdown table with plots.
//! - `mappa inspect RUN_DIR --trajectory N`: one trajectory, readable.
//! - `mappa coach score`: score action contexts with a configured coach.
//! - `mappa sandbox run`: run a Python program in the sandbox the agents use
//!   and print the result as JSON.

mod coach;
mod grade;
mod report;
mod run;
mod sandbox;
mod study;
mod study_report;

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
    /// Evaluate base models or a run's checkpoint on a manifest's held-out tasks.
    Eval(run::EvalArgs),
    /// One run per credit variant and seed, then a comparison table and plots.
    Ablate(run::AblateArgs),
    /// Compare runs: a markdown table with the paper's numbers beside it, and SVG plots.
    Report(report::ReportArgs),
    /// Print one trajectory of a run: every action, tool output and coach rationale.
    Inspect(report::InspectArgs),
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
        Command::Eval(args) => run::eval(&args),
        Command::Ablate(args) => run::ablate(&args),
        Command::Report(args) => report::report(&args),
        Command::Inspect(args) => report::inspect(&args),
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
