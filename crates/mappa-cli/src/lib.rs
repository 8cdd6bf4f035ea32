//! The `mappa` command line, as a library: every subcommand is a module
//! with its clap arguments and a function that runs it; `main.rs` only
//! parses and reports errors.
//!
//! - [`grade`]: grade model outputs (or bare answers) against reference
//!   answers with the same functions the pipelines use.
//! - [`run`]: `mappa run MANIFEST` (train and evaluate as a manifest says)
//!   and `mappa eval` (held-out accuracy of base models, a checkpoint or a
//!   served model).
//! - [`reproduce`]: `mappa reproduce NAME` (`experiments/NAME.toml` after
//!   checking that everything it needs is present; `--dry-run`: the plan).
//! - [`study`]: a manifest's `[study]` (arms x seeds, a report with a
//!   verdict) and ablations; [`ablate`]: `mappa ablate`; [`claim`]: a
//!   single run's `[claim]` (base against trained, paired over problems).
//! - [`report`]: `mappa report` (runs side by side) and `mappa inspect`
//!   (one trajectory, readable).
//! - [`coach`]: `mappa coach score`; [`sandbox`]: `mappa sandbox run`.
//! - [`serve`]: `mappa serve` (a checkpoint behind vLLM's API, for engine
//!   rollouts on the CPU).
//! - [`doctor`]: `mappa doctor` (a backend checked on this machine: parity,
//!   memory against the plan, throughput, determinism).
//! - [`rundir`]: run directories and lock files; [`plot`]: SVG charts.

#![warn(missing_docs)]

pub mod ablate;
pub mod claim;
pub mod coach;
pub mod doctor;
pub mod grade;
pub mod model;
pub mod plot;
pub mod report;
pub mod reproduce;
pub mod run;
pub mod run_report;
pub mod rundir;
pub mod sandbox;
pub mod serve;
pub mod study;

use clap::{Parser, Subcommand};

/// mappa: multi-agent fine-tuning with per-action process rewards.
#[derive(Parser, Debug)]
#[command(name = "mappa", version, about)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Grade math answers: JSON lines in, JSON lines out.
    Grade(grade::GradeArgs),
    /// Train and evaluate as an experiment manifest says.
    Run(run::RunArgs),
    /// Run experiments/NAME.toml after checking that everything it needs is present.
    Reproduce(reproduce::ReproduceArgs),
    /// Evaluate base models or a run's checkpoint on a manifest's held-out tasks.
    Eval(run::EvalArgs),
    /// One run per credit variant and seed, then a comparison report and plots.
    Ablate(ablate::AblateArgs),
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
    /// Convert a GGUF model (llama.cpp's format) into a HF checkpoint directory.
    Convert(model::ConvertArgs),
    /// Chat with a checkpoint: one prompt, or interactively on standard input.
    Chat(model::ChatArgs),
    /// Fold a LoRA adapter (PEFT layout) into its base checkpoint, for export.
    MergeLora(model::MergeLoraArgs),
    /// Serve a checkpoint through vLLM's OpenAI-compatible API (completions,
    /// chat, LoRA hot-loading) on the CPU: engine rollouts without a GPU.
    Serve(serve::ServeArgs),
    /// Check a backend on this machine: parity with the CPU, training steps,
    /// memory against the plan, throughput, a tiny run, run-to-run bits.
    Doctor(doctor::DoctorArgs),
}

/// Run one parsed command line.
pub fn execute(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Grade(args) => grade::run(&args),
        Command::Run(args) => run::run_manifest(&args),
        Command::Reproduce(args) => reproduce::reproduce(&args),
        Command::Eval(args) => run::eval(&args),
        Command::Ablate(args) => ablate::ablate(&args),
        Command::Report(args) => report::report(&args),
        Command::Inspect(args) => report::inspect(&args),
        Command::Coach(command) => coach::run(&command),
        Command::Sandbox(command) => sandbox::run(&command),
        Command::Convert(args) => model::convert(&args),
        Command::Chat(args) => model::chat(&args),
        Command::MergeLora(args) => model::merge_lora(&args),
        Command::Serve(args) => serve::serve(&args),
        Command::Doctor(args) => doctor::doctor(&args),
    }
}
