//! Studies: arms x seeds of one manifest, run and compared in one report.
//!
//! - `mappa reproduce NAME` for a manifest with a `[study]`: every arm (the
//!   method, the baseline, further credit variants, and the method under
//!   other scripted coaches) over every seed, and a verdict on the method
//!   against the baseline.
//! - `mappa ablate`: a study whose arms are generated from `--credit`
//!   variants; it registers no claim, so it has no verdict.
//!
//! [`plan`] makes the arms and runs, [`execute`] runs them as child `mappa
//! run` processes a few at a time, [`summarise`] computes the numbers,
//! [`verdict`] the pre-registered test of the claim, and [`render`] writes
//! `report.md`, `summary.json` and the plots.
//!
//! Runs go seed by seed. Warm starts are cached: every seed shares one, or
//! with `vary_warm_start` each seed makes its own; a run never starts beside
//! the run that is making its warm start. A finished run (same manifest,
//! same code) is reused, an unfinished one started again.
//!
//! A study has up to three profiles: the study itself (the result),
//! `[study.quick]` (a smoke test for CI) and `[study.validation]` (the same
//! study on other generated problems, for choosing values without looking
//! at the held-out set).

pub mod execute;
pub mod factorial;
pub mod plan;
pub mod registration;
pub mod render;
pub mod summarise;
pub mod verdict;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};
use mappa_train::manifest::{Manifest, Study, StudyProfile};

use crate::report::{load_run, RunData};

/// Which question an arm answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArmGroup {
    /// A credit variant under the manifest's coach.
    Credit,
    /// The method under another scripted coach (its name in `study.coaches`).
    Coach(String),
}

/// One arm of a study.
#[derive(Debug, Clone)]
pub struct Arm {
    /// Shown in the report: the credit variant, or `method, coach X`.
    pub label: String,
    /// The question it answers.
    pub group: ArmGroup,
}

/// Which version of a study to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The study as the manifest says it: the result.
    Full,
    /// `[study.quick]` (`--quick`): a smoke test for CI, not a result.
    Quick,
    /// `[study.validation]` (`--validation`): the study on other generated
    /// problems, where values may be tuned.
    Validation,
}

impl Profile {
    /// The profile's table under `[study]` and flag (`quick`), if any.
    pub fn key(self) -> Option<&'static str> {
        match self {
            Profile::Full => None,
            Profile::Quick => Some("quick"),
            Profile::Validation => Some("validation"),
        }
    }

    /// What the study's name gets: `""`, `"-quick"`, `"-validation"`.
    pub fn suffix(self) -> String {
        self.key().map(|k| format!("-{k}")).unwrap_or_default()
    }

    /// The profile's overrides; an error when the manifest lacks them.
    pub(crate) fn overrides(self, study: &Study) -> anyhow::Result<Option<&StudyProfile>> {
        let table = match self {
            Profile::Full => return Ok(None),
            Profile::Quick => study.quick.as_ref(),
            Profile::Validation => study.validation.as_ref(),
        };
        let key = self.key().unwrap_or_default();
        table
            .map(Some)
            .ok_or_else(|| anyhow!("--{key} needs a [study.{key}] profile in the manifest"))
    }

    /// Seeds per arm under this profile.
    pub fn seeds(self, study: &Study) -> anyhow::Result<u64> {
        let seeds = self
            .overrides(study)?
            .and_then(|p| p.seeds)
            .unwrap_or(study.seeds);
        if seeds == 0 {
            return Err(anyhow!("study.seeds: expected at least 1"));
        }
        let needed = mappa_core::paired::min_pairs(verdict::ALPHA) as u64;
        if self == Profile::Full && study.confirmatory && seeds < needed {
            return Err(anyhow!(
                "study.seeds = {seeds}: a confirmatory study needs at least {needed} paired seeds \
                 for its one-sided sign-flip test to be able to reach alpha = {} (its smallest \
                 p-value is 2^-seeds)",
                verdict::ALPHA
            ));
        }
        Ok(seeds)
    }
}

/// What a study asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Question {
    /// Does the method arm beat the baseline arm? (A `[study]`.)
    Claim {
        /// The method's arm label.
        method: String,
        /// The baseline's arm label.
        baseline: String,
    },
    /// How do the arms compare? (`mappa ablate`: exploratory, no verdict.)
    Ablation,
}

impl Question {
    /// The indices of the method and baseline arms, for a claim.
    pub fn arms(&self, arms: &[Arm]) -> Option<(usize, usize)> {
        let Question::Claim { method, baseline } = self else {
            return None;
        };
        let find = |label: &str| arms.iter().position(|a| a.label == label);
        Some((find(method)?, find(baseline)?))
    }
}

/// How to run a study.
pub struct StudyOptions {
    /// Which version of the study.
    pub profile: Profile,
    /// Runs at once.
    pub jobs: usize,
    /// Where the study directory goes.
    pub runs_dir: PathBuf,
    /// The manifest file, for a confirmatory study's registration.
    pub manifest_path: Option<PathBuf>,
}

/// Everything a study's report is made from.
pub struct StudyData<'a> {
    /// The study's name (`arith`, `arith-quick`, `tiny-arith-ablate`).
    pub name: &'a str,
    /// The experiment's name (`arith`).
    pub base_name: &'a str,
    /// The manifest the arms were made from.
    pub base: &'a Manifest,
    /// The manifest's `[study]`, if it has one.
    pub study: Option<&'a Study>,
    /// What the study asks.
    pub question: &'a Question,
    /// Which version of the study.
    pub profile: Profile,
    /// The arms, in order.
    pub arms: &'a [Arm],
    /// Every run: its arm's index and its data.
    pub runs: &'a [(usize, RunData)],
    /// Seeds per arm.
    pub seeds: u64,
    /// Wall time of the study (runs reused from an earlier call count as zero).
    pub elapsed: Duration,
    /// Runs at once.
    pub jobs: usize,
    /// Where report.md, summary.json and the plots go.
    pub out: &'a Path,
    /// A confirmatory study's registration as it stood when the runs began
    /// (or why there is none); `None` for other studies and profiles.
    pub registration: Option<Result<registration::Registration, String>>,
}

/// A study ready to run: its arms, seeds and question.
struct Planned<'a> {
    name: String,
    base: Manifest,
    study: Option<&'a Study>,
    question: Question,
    arms: Vec<(Arm, Manifest)>,
    seeds: u64,
}

/// Runs a manifest's `[study]`; returns the study directory (with `report.md`).
pub fn run_study(base: &Manifest, options: &StudyOptions) -> anyhow::Result<PathBuf> {
    let study = base
        .study
        .as_ref()
        .ok_or_else(|| anyhow!("{}: the manifest has no [study]", base.name))?;
    if let Some(factorial) = &study.factorial {
        return factorial::run_factorial(base, study, factorial, options)
            .map_err(|e| anyhow!("{}: {e}", base.name));
    }
    let profile = options.profile;
    let seeds = profile
        .seeds(study)
        .map_err(|e| anyhow!("{}: {e}", base.name))?;
    run_planned(
        base,
        Planned {
            name: format!("{}{}", base.name, profile.suffix()),
            base: plan::profile_manifest(base, study, profile)?,
            study: Some(study),
            question: Question::Claim {
                method: study.method.clone(),
                baseline: study.baseline.clone(),
            },
            arms: plan::arms(base, study, profile)?,
            seeds,
        },
        options,
    )
}

/// Runs an ablation: one arm per credit variant, `seeds` seeds each.
pub fn run_ablation(
    base: &Manifest,
    variants: &[String],
    seeds: u64,
    options: &StudyOptions,
) -> anyhow::Result<PathBuf> {
    if seeds == 0 {
        bail!("--seeds 0: expected at least 1");
    }
    run_planned(
        base,
        Planned {
            name: format!("{}-ablate", base.name),
            base: base.clone(),
            study: None,
            question: Question::Ablation,
            arms: plan::variant_arms(base, variants)?,
            seeds,
        },
        options,
    )
}

/// Run every arm and seed of `planned`, then write the report.
fn run_planned(
    base: &Manifest,
    planned: Planned<'_>,
    options: &StudyOptions,
) -> anyhow::Result<PathBuf> {
    let study_dir = options.runs_dir.join(format!("{}-study", planned.name));
    let manifests_dir = study_dir.join("manifests");
    let logs_dir = study_dir.join("logs");
    for dir in [&manifests_dir, &logs_dir] {
        std::fs::create_dir_all(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
    }
    let plan = plan::plan_runs(
        &planned.name,
        base.seed,
        &planned.arms,
        planned.seeds,
        planned.study.is_some_and(|s| s.vary_warm_start),
        &study_dir,
    )?;
    let registration = planned
        .study
        .filter(|s| s.confirmatory && options.profile == Profile::Full)
        .map(|_| match &options.manifest_path {
            Some(path) => registration::find(path),
            None => Err("the manifest's file is not known".to_string()),
        });
    let started = Instant::now();
    execute::execute_plan(&plan, &manifests_dir, &logs_dir, options.jobs)?;
    let elapsed = started.elapsed();
    let runs: Vec<(usize, RunData)> = plan
        .iter()
        .map(|r| Ok((r.arm, load_run(&r.dir)?)))
        .collect::<anyhow::Result<_>>()?;
    let arms: Vec<Arm> = planned.arms.into_iter().map(|(a, _)| a).collect();
    render::write(&StudyData {
        name: &planned.name,
        base_name: &base.name,
        base: &planned.base,
        study: planned.study,
        question: &planned.question,
        profile: options.profile,
        arms: &arms,
        runs: &runs,
        seeds: planned.seeds,
        elapsed,
        jobs: options.jobs,
        out: &study_dir,
        registration,
    })?;
    Ok(study_dir)
}
