//! Factorial studies (`[study.factorial]`): the study's method and baseline
//! in every cell of a grid of manifest variants (chain length x start
//! accuracy, say), each seed a block that runs every cell, and registered
//! contrasts of the cells' per-seed differences.
//!
//! - [`design`] checks the design and makes each cell's arms;
//! - this module runs them in two phases: first the method arm of every
//!   (seed, cell), whose step-0 evaluation decides whether the warm start
//!   lies in the cell's registered `start_band` (one outside is replaced by
//!   the next warm start, offset by [`REPLACEMENT_STRIDE`], and counted);
//!   then every other arm on the accepted warm starts. Finished runs are
//!   reused, so a stopped study continues where it stopped, with the same
//!   result;
//! - [`analysis`] computes the contrasts (exact sign-flip tests, Holm's
//!   correction over the primary ones, bootstrap intervals) and the power
//!   statement; [`output`] writes the report, the per-seed CSV and the
//!   script that recomputes every p-value from it without mappa.

pub mod analysis;
pub mod design;
pub mod output;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail};
use mappa_train::manifest::{Factorial, Manifest, Study};

use super::execute::execute_plan;
use super::plan::{plan_run, slug, PlannedRun};
use super::{Profile, StudyOptions};
use crate::report::{load_run, RunData};
use design::CellArms;

/// Replacement warm starts of seed `s` are offset by `s + k *
/// REPLACEMENT_STRIDE` (k = 1, 2, ...): far from every first warm start.
pub const REPLACEMENT_STRIDE: u64 = 1000;

/// A warm start tried for one (seed, cell): its attempt number and the
/// step-0 held-out accuracy it gave.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Tried {
    /// 0 for the seed's own warm start, k for its k-th replacement.
    pub attempt: u64,
    /// The step-0 held-out accuracy.
    pub start: f64,
}

/// Everything a factorial study ran: per (seed index, cell index), the
/// warm starts tried (the last accepted) and the runs of every arm on it.
pub struct Ran {
    /// The warm starts tried, per (seed index, cell index).
    pub tried: BTreeMap<(u64, usize), Vec<Tried>>,
    /// Per (seed index, cell index, arm index): the run.
    pub runs: BTreeMap<(u64, usize, usize), RunData>,
}

/// Run a factorial study; returns the study directory (with `report.md`).
pub fn run_factorial(
    base: &Manifest,
    study: &Study,
    factorial: &Factorial,
    options: &StudyOptions,
) -> anyhow::Result<PathBuf> {
    let profile = options.profile;
    let seeds = design::seeds(study, factorial, profile)?;
    let manifest_dir = options
        .manifest_path
        .as_deref()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."));
    let profiled = super::plan::profile_manifest(base, study, profile)?;
    let cells = design::cell_arms(&profiled, study, factorial, manifest_dir)?;
    let name = format!("{}{}", base.name, profile.suffix());
    let study_dir = options.runs_dir.join(format!("{name}-study"));
    let dirs = Dirs::make(&study_dir)?;
    let registration =
        (study.confirmatory && profile == Profile::Full).then(|| match &options.manifest_path {
            Some(path) => super::registration::find_factorial(path),
            None => Err("the manifest's file is not known".to_string()),
        });
    let started = Instant::now();
    let run = Runner {
        name: &name,
        base_seed: base.seed,
        cells: &cells,
        dirs: &dirs,
        jobs: options.jobs,
        enforce_bands: profile != Profile::Quick,
    };
    let tried = run.warm_starts(seeds, factorial.max_warm_starts)?;
    let runs = run.arms(&tried)?;
    output::write(&output::FactorialData {
        name: &name,
        base: &profiled,
        study,
        factorial,
        profile,
        cells: &cells,
        ran: &Ran { tried, runs },
        seeds,
        elapsed: started.elapsed(),
        jobs: options.jobs,
        out: &study_dir,
        registration,
    })?;
    Ok(study_dir)
}

/// What a dry run says of a factorial study: its cells and arms, and the
/// smallest mean each contrast detects with 80% power at its seeds (the
/// power statement registered with the design).
pub fn describe(
    base: &Manifest,
    study: &Study,
    factorial: &Factorial,
    profile: Profile,
    manifest_dir: &Path,
) -> anyhow::Result<Vec<String>> {
    let seeds = design::seeds(study, factorial, profile)?;
    let profiled = super::plan::profile_manifest(base, study, profile)?;
    let cells = design::cell_arms(&profiled, study, factorial, manifest_dir)?;
    let mut lines = vec![format!(
        "{:<22} {} cells x {seeds} seeds (blocks), up to {} warm starts per cell and seed",
        "factorial study",
        cells.len(),
        factorial.max_warm_starts
    )];
    for c in &cells {
        let arms: Vec<&str> = c.arms.iter().map(|(a, _)| a.label.as_str()).collect();
        let [lo, hi] = c.cell.start_band;
        lines.push(format!(
            "  cell {:<16} start band {:.1}% to {:.1}%; arms: {}",
            c.cell.name,
            100.0 * lo,
            100.0 * hi,
            arms.join("; ")
        ));
    }
    for contrast in &factorial.contrasts {
        let detectable = analysis::detectable(contrast, factorial, seeds, base.seed);
        lines.push(format!(
            "  contrast {:<24} {}: {} (planned sd {:.1} points, level {:.4})",
            contrast.name,
            if contrast.primary {
                "primary"
            } else {
                "secondary"
            },
            detectable.map_or(format!("{seeds} seeds cannot reach its level"), |d| {
                format!("detects {:+.1} points with 80% power", 100.0 * d)
            }),
            100.0 * analysis::planned_sd(contrast, factorial.prior_sd),
            analysis::planned_alpha(contrast, factorial),
        ));
    }
    Ok(lines)
}

/// The study directory's parts.
struct Dirs {
    study: PathBuf,
    manifests: PathBuf,
    logs: PathBuf,
}

impl Dirs {
    fn make(study: &Path) -> anyhow::Result<Self> {
        let dirs = Self {
            study: study.to_path_buf(),
            manifests: study.join("manifests"),
            logs: study.join("logs"),
        };
        for dir in [&dirs.manifests, &dirs.logs] {
            std::fs::create_dir_all(dir).map_err(|e| anyhow!("{}: {e}", dir.display()))?;
        }
        Ok(dirs)
    }
}

/// What the two phases share.
struct Runner<'a> {
    name: &'a str,
    base_seed: u64,
    cells: &'a [CellArms],
    dirs: &'a Dirs,
    jobs: usize,
    /// Whether warm starts outside a cell's band are replaced (not in the
    /// quick profile, a smoke test).
    enforce_bands: bool,
}

impl Runner<'_> {
    /// The run of arm `arm` of cell `cell` at seed index `s` on warm start
    /// `attempt`.
    fn planned(&self, s: u64, cell: usize, arm: usize, attempt: u64) -> anyhow::Result<PlannedRun> {
        let c = &self.cells[cell];
        let (label, manifest) = (&c.arms[arm].0, &c.arms[arm].1);
        let seed = self.base_seed + s;
        let replaced = if attempt > 0 {
            format!("-w{attempt}")
        } else {
            String::new()
        };
        let run_name = format!(
            "{}-{}-{}-s{seed}{replaced}",
            self.name,
            slug(&c.cell.name),
            slug(&label.label)
        );
        let offset = s + attempt * REPLACEMENT_STRIDE;
        plan_run(
            (arm, &label.label),
            manifest,
            (seed, Some(offset)),
            run_name,
            &self.dirs.study,
        )
        .map_err(|e| anyhow!("cell {}: {e}", c.cell.name))
    }

    fn execute(&self, plan: &[PlannedRun]) -> anyhow::Result<()> {
        execute_plan(plan, &self.dirs.manifests, &self.dirs.logs, self.jobs)
    }

    /// Phase 1: the method arm of every (seed, cell), on the seed's warm
    /// start and then on replacements while its step-0 accuracy lies
    /// outside the cell's band.
    fn warm_starts(
        &self,
        seeds: u64,
        max_tries: u64,
    ) -> anyhow::Result<BTreeMap<(u64, usize), Vec<Tried>>> {
        let mut tried: BTreeMap<(u64, usize), Vec<Tried>> = BTreeMap::new();
        let mut pending: Vec<(u64, usize)> = (0..seeds)
            .flat_map(|s| (0..self.cells.len()).map(move |c| (s, c)))
            .collect();
        for attempt in 0..max_tries.max(1) {
            if pending.is_empty() {
                break;
            }
            let plan: Vec<PlannedRun> = pending
                .iter()
                .map(|&(s, c)| self.planned(s, c, 0, attempt))
                .collect::<anyhow::Result<_>>()?;
            self.execute(&plan)?;
            let mut still = Vec::new();
            for (&(s, c), run) in pending.iter().zip(&plan) {
                let start = step0_accuracy(&load_run(&run.dir)?, &run.dir)?;
                tried
                    .entry((s, c))
                    .or_default()
                    .push(Tried { attempt, start });
                let [lo, hi] = self.cells[c].cell.start_band;
                if self.enforce_bands && !(lo..=hi).contains(&start) {
                    still.push((s, c));
                }
            }
            pending = still;
        }
        if let Some(&(s, c)) = pending.first() {
            let cell = &self.cells[c].cell;
            let seen: Vec<String> = tried[&(s, c)]
                .iter()
                .map(|t| format!("{:.1}%", 100.0 * t.start))
                .collect();
            bail!(
                "cell {}, seed {}: none of {max_tries} warm starts had a step-0 held-out accuracy in \
                 the registered band [{}, {}] (they had {}); the band or the cell's teacher needs \
                 calibrating on the validation profile",
                cell.name,
                self.base_seed + s,
                cell.start_band[0],
                cell.start_band[1],
                seen.join(", ")
            );
        }
        Ok(tried)
    }

    /// Phase 2: every arm of every (seed, cell) on its accepted warm start
    /// (the method arms are already done, and reused).
    fn arms(
        &self,
        tried: &BTreeMap<(u64, usize), Vec<Tried>>,
    ) -> anyhow::Result<BTreeMap<(u64, usize, usize), RunData>> {
        let mut keys = Vec::new();
        let mut plan = Vec::new();
        for (&(s, c), tries) in tried {
            let attempt = tries.last().map_or(0, |t| t.attempt);
            for arm in 0..self.cells[c].arms.len() {
                keys.push((s, c, arm));
                plan.push(self.planned(s, c, arm, attempt)?);
            }
        }
        self.execute(&plan)?;
        keys.into_iter()
            .zip(&plan)
            .map(|(key, run)| Ok((key, load_run(&run.dir)?)))
            .collect()
    }
}

/// The step-0 held-out accuracy of a run.
fn step0_accuracy(run: &RunData, dir: &Path) -> anyhow::Result<f64> {
    run.evals()
        .find(|e| e.step == 0)
        .map(|e| e.accuracy)
        .ok_or_else(|| anyhow!("{}: no step-0 evaluation in metrics.jsonl", dir.display()))
}
