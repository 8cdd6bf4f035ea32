//! `mappa ablate NAME --credit a,b,c --seeds N`: credit variants side by
//! side, as a study whose arms are generated from the variants
//! ([`crate::study::run_ablation`]): the runs go to
//! `RUNS_DIR/NAME-ablate-study/`, with one report comparing them. An
//! ablation registers no claim, so its report has no verdict.

use std::path::PathBuf;

use clap::Args;
use mappa_train::manifest::Manifest;

use crate::rundir::repo_root;
use crate::study::{run_ablation, Profile, StudyOptions};

/// Arguments of `mappa ablate`.
#[derive(Args, Debug)]
pub struct AblateArgs {
    /// The experiment: `experiments/NAME.toml`, or a path to a manifest.
    name: String,
    /// Credit variants, comma-separated: strategy kinds (`process`, `outcome`,
    /// `outcome_final_agent`, `min_form`, `mixed=0.5`, `discounted_outcome=0.9`)
    /// or normalisation scopes (`scope=per_prompt_group`, ...) or the handling
    /// of sets with equal rewards (`uniform=skip`, `uniform=keep`,
    /// `uniform_floor=0.5`), joined by `+` to combine (`process+scope=none`).
    #[arg(long, value_delimiter = ',', required = true)]
    credit: Vec<String>,
    /// Seeds per variant (the manifest's seed, +1, +2, ...).
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Runs at once (default: the number of CPUs).
    #[arg(long)]
    jobs: Option<usize>,
    /// Where the study directory goes.
    #[arg(long, default_value = "runs")]
    runs_dir: PathBuf,
}

/// The default number of runs at once: the number of CPUs.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Runs `mappa ablate`.
pub fn ablate(args: &AblateArgs) -> anyhow::Result<()> {
    let path = if args.name.ends_with(".toml") {
        PathBuf::from(&args.name)
    } else {
        repo_root()
            .join("experiments")
            .join(format!("{}.toml", args.name))
    };
    let mut base = Manifest::load(&path)?;
    base.study = None;
    let dir = run_ablation(
        &base,
        &args.credit,
        args.seeds,
        &StudyOptions {
            profile: Profile::Full,
            jobs: args.jobs.unwrap_or_else(default_jobs),
            runs_dir: args.runs_dir.clone(),
            manifest_path: None,
        },
    )?;
    println!("{}", dir.join("report.md").display());
    Ok(())
}
