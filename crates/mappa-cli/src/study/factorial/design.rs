//! A factorial design, checked: every combination of levels exactly once,
//! bands and contrasts that name what exists, and enough seeds for the
//! primary contrasts to be able to reach alpha after Holm's correction;
//! and each cell's arms (its manifest, then the method, the baseline and
//! its coach arms).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{anyhow, bail};
use mappa_train::manifest::{Cell, Factorial, Manifest, Study};

use super::super::plan::{apply_coach, apply_variants};
use super::super::{verdict::ALPHA, Arm, ArmGroup, Profile};

/// The columns of `per_seed.csv` besides one per factor: no factor may
/// take their names.
pub const CSV_COLUMNS: [&str; 7] = [
    "seed",
    "cell",
    "arm",
    "warm_start",
    "start_accuracy",
    "area",
    "final_accuracy",
];

/// A cell and its arms: the method first, then the baseline, then the
/// method under the cell's coach arms; each with its manifest (seed not
/// yet set).
pub struct CellArms {
    /// The cell as registered.
    pub cell: Cell,
    /// Its arms.
    pub arms: Vec<(Arm, Manifest)>,
}

/// The seeds (blocks) of the study under `profile`, refused for a
/// confirmatory study when too few for its smallest Holm threshold
/// (`alpha / primary contrasts`) to be reachable by the sign-flip test.
pub fn seeds(study: &Study, factorial: &Factorial, profile: Profile) -> anyhow::Result<u64> {
    let seeds = profile
        .overrides(study)?
        .and_then(|p| p.seeds)
        .unwrap_or(study.seeds);
    if seeds == 0 {
        bail!("study.seeds: expected at least 1");
    }
    let primaries = super::analysis::primaries(factorial);
    let needed = mappa_core::paired::min_pairs(ALPHA / primaries as f64) as u64;
    if profile == Profile::Full && study.confirmatory && seeds < needed {
        bail!(
            "study.seeds = {seeds}: a confirmatory factorial study with {primaries} primary \
             contrasts needs at least {needed} seeds, so that its smallest Holm threshold \
             (alpha / {primaries} = {}) is reachable by the sign-flip test (smallest p-value 2^-seeds)",
            ALPHA / primaries as f64
        );
    }
    Ok(seeds)
}

/// Check the design; the error names the key.
pub fn check(factorial: &Factorial, study: &Study) -> anyhow::Result<()> {
    let e = |msg: String| anyhow!("study.factorial: {msg}");
    if factorial.factors.is_empty() || factorial.cells.is_empty() {
        return Err(e("expected at least one factor and one cell".into()));
    }
    for factor in &factorial.factors {
        if CSV_COLUMNS.contains(&factor.name.as_str()) {
            return Err(e(format!(
                "a factor is called {:?}, a column per_seed.csv already has ({})",
                factor.name,
                CSV_COLUMNS.join(", ")
            )));
        }
    }
    let mut combinations: BTreeSet<Vec<&str>> = BTreeSet::new();
    for cell in &factorial.cells {
        let mut combination = Vec::new();
        for factor in &factorial.factors {
            let level = cell.levels.get(&factor.name).ok_or_else(|| {
                e(format!(
                    "cell {:?} has no level of factor {:?}",
                    cell.name, factor.name
                ))
            })?;
            if !factor.levels.contains(level) {
                return Err(e(format!(
                    "cell {:?}: {level:?} is not a level of {:?} (levels: {:?})",
                    cell.name, factor.name, factor.levels
                )));
            }
            combination.push(level.as_str());
        }
        if cell.levels.len() != factorial.factors.len() {
            return Err(e(format!(
                "cell {:?} names a factor that is not declared",
                cell.name
            )));
        }
        if !combinations.insert(combination) {
            return Err(e(format!(
                "cell {:?} repeats another cell's levels",
                cell.name
            )));
        }
        let [lo, hi] = cell.start_band;
        if !(0.0..=1.0).contains(&lo) || !(0.0..=1.0).contains(&hi) || lo > hi {
            return Err(e(format!(
                "cell {:?}: start_band = [{lo}, {hi}]: expected 0 <= low <= high <= 1",
                cell.name
            )));
        }
        for coach in &cell.coaches {
            if !study.coach_arms.contains_key(coach) {
                return Err(e(format!(
                    "cell {:?}: coaches names {coach:?}, which is not in study.coach_arms",
                    cell.name
                )));
            }
        }
    }
    let full: usize = factorial.factors.iter().map(|f| f.levels.len()).product();
    if combinations.len() != full {
        return Err(e(format!(
            "{} cells for {full} combinations of levels: every combination needs its cell",
            combinations.len()
        )));
    }
    check_contrasts(factorial, study)
}

/// Every contrast weighs cells (or `cell/arm`s) that exist, and at least
/// one is primary.
fn check_contrasts(factorial: &Factorial, study: &Study) -> anyhow::Result<()> {
    let e = |msg: String| anyhow!("study.factorial.contrasts: {msg}");
    if !factorial.contrasts.iter().any(|c| c.primary) {
        return Err(e("expected at least one primary contrast".into()));
    }
    if !(factorial.prior_sd.is_finite() && factorial.prior_sd > 0.0) {
        return Err(anyhow!(
            "study.factorial.prior_sd: expected a positive number"
        ));
    }
    for contrast in &factorial.contrasts {
        if contrast.weights.is_empty() {
            return Err(e(format!("{:?} has no weights", contrast.name)));
        }
        for key in contrast.weights.keys() {
            let (cell, arm) = key
                .split_once('/')
                .map_or((key.as_str(), None), |(c, a)| (c, Some(a)));
            let Some(found) = factorial.cells.iter().find(|c| c.name == cell) else {
                return Err(e(format!(
                    "{:?} weighs {key:?}: no cell is called {cell:?}",
                    contrast.name
                )));
            };
            let labels = arm_labels(study, found);
            if let Some(arm) = arm.filter(|a| !labels.iter().any(|l| l == a)) {
                return Err(e(format!(
                    "{:?} weighs {key:?}: cell {cell:?} has no arm {arm:?} (arms: {labels:?})",
                    contrast.name
                )));
            }
        }
    }
    Ok(())
}

/// The arm labels of a cell: method, baseline, then `method, X coach`.
pub fn arm_labels(study: &Study, cell: &Cell) -> Vec<String> {
    let mut labels = vec![study.method.clone(), study.baseline.clone()];
    labels.extend(
        cell.coaches
            .iter()
            .map(|c| format!("{}, {c} coach", study.method)),
    );
    labels
}

/// Each cell's arms, from `base` (the profile's manifest) with the cell's
/// overrides merged in; relative paths in the overrides are relative to
/// `manifest_dir`.
pub fn cell_arms(
    base: &Manifest,
    study: &Study,
    factorial: &Factorial,
    manifest_dir: &Path,
) -> anyhow::Result<Vec<CellArms>> {
    check(factorial, study)?;
    if study.method == study.baseline {
        bail!("study: method and baseline are both {:?}", study.method);
    }
    factorial
        .cells
        .iter()
        .map(|cell| {
            let overrides = rebased(&cell.manifest, manifest_dir);
            let manifest = base
                .with_overrides(&overrides)
                .map_err(|e| anyhow!("study.factorial cell {:?}: manifest: {e}", cell.name))?;
            let mut arms = Vec::new();
            for (i, label) in arm_labels(study, cell).into_iter().enumerate() {
                let mut m = manifest.clone();
                let coach = i.checked_sub(2).map(|c| cell.coaches[c].clone());
                apply_variants(
                    &mut m,
                    if i == 1 {
                        &study.baseline
                    } else {
                        &study.method
                    },
                )?;
                if let Some(coach) = &coach {
                    apply_coach(&mut m, coach, study)?;
                }
                let group = coach.map_or(ArmGroup::Credit, ArmGroup::Coach);
                arms.push((Arm { label, group }, m));
            }
            Ok(CellArms {
                cell: cell.clone(),
                arms,
            })
        })
        .collect()
}

/// `overrides` with its relative `workflow` and `models.*.path` made
/// relative to `dir`, as [`Manifest::load`] does for the manifest's own.
fn rebased(overrides: &toml::Table, dir: &Path) -> toml::Table {
    let mut out = overrides.clone();
    let rebase = |value: &mut toml::Value| {
        if let Some(path) = value.as_str().filter(|p| Path::new(p).is_relative()) {
            *value = toml::Value::String(dir.join(path).display().to_string());
        }
    };
    if let Some(workflow) = out.get_mut("workflow") {
        rebase(workflow);
    }
    if let Some(models) = out.get_mut("models").and_then(toml::Value::as_table_mut) {
        for model in models.iter_mut().filter_map(|(_, m)| m.as_table_mut()) {
            if let Some(path) = model.get_mut("path") {
                rebase(path);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn factorial_manifest() -> (Manifest, Study, Factorial) {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/arith-factorial.toml");
        let manifest = Manifest::load(&path).unwrap();
        let study = manifest.study.clone().unwrap();
        let factorial = study.factorial.clone().unwrap();
        (manifest, study, factorial)
    }

    #[test]
    fn the_registered_design_is_complete_and_its_cells_have_their_arms() {
        let (manifest, study, factorial) = factorial_manifest();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments");
        let cells = cell_arms(&manifest, &study, &factorial, &dir).unwrap();
        assert_eq!(cells.len(), 4);
        let five_low = cells.iter().find(|c| c.cell.name == "5-low").unwrap();
        let labels: Vec<&str> = five_low
            .arms
            .iter()
            .map(|(a, _)| a.label.as_str())
            .collect();
        assert_eq!(labels, ["process", "outcome", "process, independent coach"]);
        let (_, chain) = &five_low.arms[0];
        assert_eq!(chain.models.len(), 5, "the five-agent chain's models");
        assert!(chain.workflow.ends_with("workflows/arith-chain.toml"));
        assert!(chain.workflow.is_absolute() || chain.workflow.starts_with(&dir));
    }

    #[test]
    fn incomplete_designs_and_unknown_names_are_refused() {
        let (_, study, factorial) = factorial_manifest();
        let refused = |edit: &dyn Fn(&mut Factorial), expected: &str| {
            let mut f = factorial.clone();
            edit(&mut f);
            let e = check(&f, &study).unwrap_err().to_string();
            assert!(e.contains(expected), "{e}");
        };
        refused(
            &|f| {
                f.cells.pop();
            },
            "every combination",
        );
        refused(
            &|f| {
                f.cells[1].levels = f.cells[0].levels.clone();
            },
            "repeats",
        );
        refused(
            &|f| {
                f.cells[0].levels.insert("chain".into(), "7".into());
            },
            "not a level",
        );
        refused(
            &|f| {
                f.cells[0].start_band = [0.5, 0.1];
            },
            "start_band",
        );
        refused(
            &|f| {
                f.cells[0].coaches = vec!["nobody".into()];
            },
            "coach_arms",
        );
        refused(
            &|f| {
                f.contrasts[0].weights.insert("9-low".into(), 1.0);
            },
            "no cell is called",
        );
        refused(
            &|f| {
                f.contrasts[0].weights.insert("3-low/mixed".into(), 1.0);
            },
            "no arm",
        );
        refused(
            &|f| f.contrasts.iter_mut().for_each(|c| c.primary = false),
            "primary",
        );
    }

    #[test]
    fn a_confirmatory_factorial_needs_seeds_for_holms_strictest_step() {
        let (_, mut study, factorial) = factorial_manifest();
        // Two primary contrasts: alpha / 2 = 0.025 needs 2^-n <= 0.025, n >= 6.
        study.seeds = 5;
        let e = seeds(&study, &factorial, Profile::Full)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 6 seeds"), "{e}");
        study.seeds = 6;
        assert_eq!(seeds(&study, &factorial, Profile::Full).unwrap(), 6);
        study.seeds = 2;
        study.confirmatory = false;
        assert_eq!(seeds(&study, &factorial, Profile::Full).unwrap(), 2);
    }
}
