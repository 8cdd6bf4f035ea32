//! `mappa run MANIFEST`: resolve the manifest into a run directory with
//! `manifest.lock.json` (whose sha256 is the run id), then train, evaluate
//! and checkpoint there; `--resume RUN_DIR` continues a stopped run.
//! `mappa eval MANIFEST`: held-out accuracy of the base models or a run's
//! checkpoint on the manifest's backend (its device checked first), or of a
//! served model.

use std::path::PathBuf;

use anyhow::anyhow;
use clap::Args;
use mappa_judge::cache::CacheMode;
use mappa_judge::openai::OpenAiConfig;
use mappa_train::manifest::Manifest;
use mappa_train::records::MetricsLine;
use mappa_train::run::RunOptions;

use crate::rundir::{check_backend, check_memory, execute, prepare, prepare_in};

/// Arguments of `mappa run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The experiment manifest (TOML).
    manifest: PathBuf,
    /// Continue the run in this directory from its last checkpoint.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Start the run in this new directory instead of `RUNS_DIR/<name>-<run id>`
    /// (`mappa reproduce` names its runs' directories itself).
    #[arg(long, conflicts_with = "resume")]
    run_dir: Option<PathBuf>,
    /// Stop after this many training steps in total (the run can be resumed).
    #[arg(long)]
    max_steps: Option<usize>,
    /// Where new run directories go.
    #[arg(long, default_value = "runs")]
    runs_dir: PathBuf,
    /// Override the coach cache mode: `off`, `read-write` or `replay` (hits only).
    #[arg(long, value_parser = parse_mode)]
    coach: Option<CacheMode>,
}

fn parse_mode(s: &str) -> Result<CacheMode, String> {
    match s {
        "off" => Ok(CacheMode::Off),
        "read-write" => Ok(CacheMode::ReadWrite),
        "replay" => Ok(CacheMode::Replay),
        other => Err(format!("{other:?}: expected off, read-write or replay")),
    }
}

/// Runs `mappa run`, then writes the run's `report.md` (as `mappa reproduce` does).
pub fn run_manifest(args: &RunArgs) -> anyhow::Result<()> {
    let manifest = Manifest::load(&args.manifest)?;
    check_backend(manifest.backend)?;
    check_memory(&manifest)?;
    let run_dir = match &args.run_dir {
        Some(dir) => prepare_in(&manifest, dir)?,
        None => prepare(&manifest, args.resume.as_deref(), &args.runs_dir)?,
    };
    let options = RunOptions {
        max_steps: args.max_steps,
        resume: args.resume.is_some(),
        coach_mode: args.coach,
        progress: true,
    };
    execute(&manifest, &run_dir, &options)?;
    let report = crate::reproduce::run_report(&manifest, &run_dir, "")?;
    eprintln!("report: {}", report.display());
    Ok(())
}

/// Held-out evaluation of local models on the manifest's backend (its
/// device checked by the caller).
fn evaluate_on_backend(
    manifest: &Manifest,
    out: &std::path::Path,
    checkpoint: Option<&std::path::Path>,
) -> anyhow::Result<mappa_train::records::EvalLine> {
    Ok(crate::rundir::on_backend!(manifest.backend, B => {
        mappa_train::run::evaluate::<B>(manifest, out, checkpoint, &Default::default())?
    }))
}

/// Arguments of `mappa eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The experiment manifest: its held-out tasks, workflow and base models.
    manifest: PathBuf,
    /// Evaluate this run's latest checkpoint instead of the base models.
    #[arg(long)]
    run: Option<PathBuf>,
    /// Where eval.jsonl goes (default: the run directory, else `runs/<name>-eval`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Evaluate a served model (OpenAI-compatible base URL, e.g. vLLM's
    /// `http://127.0.0.1:8000/v1`) as every agent, instead of local models.
    #[arg(long, requires = "remote_model", conflicts_with = "run")]
    remote_url: Option<String>,
    /// The served model's name.
    #[arg(long)]
    remote_model: Option<String>,
    /// Environment variable holding the endpoint's API key, if it needs one.
    #[arg(long)]
    remote_key_env: Option<String>,
}

/// Runs `mappa eval`.
pub fn eval(args: &EvalArgs) -> anyhow::Result<()> {
    let manifest = Manifest::load(&args.manifest)?;
    manifest.resolve()?;
    let checkpoint = args
        .run
        .as_ref()
        .map(|r| r.join("checkpoints").join("latest"));
    let out = args
        .out
        .clone()
        .or_else(|| args.run.clone())
        .unwrap_or_else(|| PathBuf::from("runs").join(format!("{}-eval", manifest.name)));
    let line = match (&args.remote_url, &args.remote_model) {
        (Some(url), Some(model)) => {
            let mut endpoint: OpenAiConfig =
                toml::from_str(&format!("base_url = {url:?}\nmodel = {model:?}"))
                    .map_err(|e| anyhow!("--remote-url/--remote-model: {e}"))?;
            endpoint.api_key_env = args.remote_key_env.clone();
            mappa_train::run::evaluate_remote(&manifest, &out, endpoint)?
        }
        _ => {
            check_backend(manifest.backend)?;
            evaluate_on_backend(&manifest, &out, checkpoint.as_deref())?
        }
    };
    println!(
        "{}",
        serde_json::to_string(&MetricsLine::Eval(line.clone()))?
    );
    eprintln!(
        "held-out accuracy {:.3} ({} trajectories); appended to {}",
        line.accuracy,
        line.trajectories,
        out.join("eval.jsonl").display()
    );
    Ok(())
}
