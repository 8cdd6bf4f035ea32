//! The registered analysis of a factorial study, fixed before its runs:
//!
//! - **Endpoint**: per run, the learning-curve area (the mean held-out
//!   accuracy over the evaluations after step 0), as in [`super::super::verdict`].
//! - **Per-seed values**: a cell's difference is its method's area minus
//!   its baseline's at that seed (one warm start, one data order); a
//!   contrast is a weighted sum of cells' differences (a key `cell`) and of
//!   arms' areas (a key `cell/arm`), computed per seed. Seeds are blocks:
//!   every seed runs every cell.
//! - **Test**: each contrast one-sided (that it is above 0), by the exact
//!   sign-flip test over seeds ([`mappa_core::paired`]); the primary
//!   contrasts together with Holm's step-down correction at
//!   [`ALPHA`]; secondary ones with their unadjusted p-values, labelled so.
//! - **Intervals**: 95% percentile bootstrap intervals of each contrast's
//!   mean over seeds.
//! - **Power**, stated before the runs: the smallest mean each contrast
//!   detects with 80% power at the study's seeds, simulated with the
//!   per-seed spread `prior_sd * sqrt(sum of cell weights^2 + sum of arm
//!   weights^2 / 2)` (cells independent, an arm's area carrying half a
//!   difference's variance), at the contrast's own level (`alpha / primary
//!   contrasts` for a primary one: Holm's strictest step).

use std::collections::BTreeMap;

use mappa_core::paired::{bootstrap_mean_interval, detectable_effect, sign_flip_p_value};
use mappa_core::rng::SeedTree;
use mappa_core::stats::mean_sample_std;
use mappa_train::manifest::{Contrast, Factorial, Study};
use serde::Serialize;

use super::super::summarise::{area, eval_series};
use super::super::verdict::{ALPHA, POWER};
use super::design::CellArms;
use super::Ran;

/// One run's numbers, as the per-seed CSV has them.
#[derive(Debug, Clone)]
pub struct SeedRow {
    /// The run's seed.
    pub seed: u64,
    /// The cell's name.
    pub cell: String,
    /// The arm's label.
    pub arm: String,
    /// The warm start's attempt (0: the seed's own; k: its k-th replacement).
    pub warm_start: u64,
    /// Step-0 held-out accuracy.
    pub start: f64,
    /// Learning-curve area (the endpoint).
    pub area: f64,
    /// Final held-out accuracy.
    pub final_accuracy: f64,
}

/// Every run's row, seed by seed, cell by cell, arm by arm.
pub fn rows(cells: &[CellArms], ran: &Ran, base_seed: u64) -> Vec<SeedRow> {
    ran.runs
        .iter()
        .map(|(&(s, c, a), run)| {
            let curve = eval_series(run);
            SeedRow {
                seed: base_seed + s,
                cell: cells[c].cell.name.clone(),
                arm: cells[c].arms[a].0.label.clone(),
                warm_start: ran.tried[&(s, c)].last().map_or(0, |t| t.attempt),
                start: curve.first().map_or(f64::NAN, |p| p.1),
                area: area(&curve),
                final_accuracy: curve.last().map_or(f64::NAN, |p| p.1),
            }
        })
        .collect()
}

/// A contrast's result.
#[derive(Debug, Clone, Serialize)]
pub struct ContrastResult {
    /// Its name.
    pub name: String,
    /// What it tests.
    pub hypothesis: String,
    /// Whether it is primary (Holm-corrected).
    pub primary: bool,
    /// The seeds, in order.
    pub seeds: Vec<u64>,
    /// Its value per seed.
    pub per_seed: Vec<f64>,
    /// Their mean and sample standard deviation.
    pub mean: f64,
    /// Sample standard deviation over seeds.
    pub std: f64,
    /// The one-sided sign-flip p-value.
    pub p_value: f64,
    /// Holm-adjusted p-value (primary contrasts).
    pub holm_p_value: Option<f64>,
    /// Whether it is above 0 at alpha (Holm-adjusted for primary ones).
    pub holds: bool,
    /// 95% bootstrap interval of the mean.
    pub interval: (f64, f64),
    /// The per-seed spread the power statement assumed.
    pub planned_sd: f64,
    /// The level the power statement used.
    pub planned_alpha: f64,
    /// The smallest mean detected with 80% power at that spread and level
    /// (None: the seeds cannot reach the level).
    pub detectable: Option<f64>,
}

/// A contrast's value at every seed index that has all its terms.
fn per_seed(
    contrast: &Contrast,
    rows: &[SeedRow],
    method: &str,
    baseline: &str,
) -> (Vec<u64>, Vec<f64>) {
    let areas: BTreeMap<(u64, &str, &str), f64> = rows
        .iter()
        .map(|r| ((r.seed, r.cell.as_str(), r.arm.as_str()), r.area))
        .collect();
    let mut seeds: Vec<u64> = rows.iter().map(|r| r.seed).collect();
    seeds.dedup();
    let value = |seed: u64| -> Option<f64> {
        contrast.weights.iter().try_fold(0.0, |sum, (key, w)| {
            let term = match key.split_once('/') {
                Some((cell, arm)) => *areas.get(&(seed, cell, arm))?,
                None => {
                    areas.get(&(seed, key.as_str(), method))?
                        - areas.get(&(seed, key.as_str(), baseline))?
                }
            };
            Some(sum + w * term)
        })
    };
    seeds
        .iter()
        .filter_map(|&s| value(s).map(|v| (s, v)))
        .unzip()
}

/// The per-seed spread a contrast has under the power statement's
/// assumption (see the module docs).
pub fn planned_sd(contrast: &Contrast, prior_sd: f64) -> f64 {
    let variance: f64 = contrast
        .weights
        .iter()
        .map(|(key, w)| {
            if key.contains('/') {
                w * w / 2.0
            } else {
                w * w
            }
        })
        .sum();
    prior_sd * variance.sqrt()
}

/// The number of primary contrasts (at least 1): Holm's strictest step is
/// alpha divided by it.
pub fn primaries(factorial: &Factorial) -> usize {
    factorial
        .contrasts
        .iter()
        .filter(|c| c.primary)
        .count()
        .max(1)
}

/// The level a contrast is planned at: Holm's strictest step for a primary
/// contrast, alpha for a secondary one.
pub fn planned_alpha(contrast: &Contrast, factorial: &Factorial) -> f64 {
    if contrast.primary {
        ALPHA / primaries(factorial) as f64
    } else {
        ALPHA
    }
}

/// The smallest mean a contrast detects with 80% power at `seeds` seeds.
pub fn detectable(
    contrast: &Contrast,
    factorial: &Factorial,
    seeds: u64,
    rng_seed: u64,
) -> Option<f64> {
    let mut rng = SeedTree::new(rng_seed).stream(&format!("factorial/power/{}", contrast.name));
    detectable_effect(
        seeds as usize,
        planned_sd(contrast, factorial.prior_sd),
        planned_alpha(contrast, factorial),
        POWER,
        &mut rng,
    )
}

/// Holm's step-down adjustment of `p` (same order out).
pub fn holm(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut adjusted = vec![0.0; m];
    let mut running: f64 = 0.0;
    for (rank, &i) in order.iter().enumerate() {
        running = running.max(((m - rank) as f64 * p[i]).min(1.0));
        adjusted[i] = running;
    }
    adjusted
}

/// Every registered contrast's result, in the manifest's order.
pub fn contrasts(
    rows: &[SeedRow],
    study: &Study,
    factorial: &Factorial,
    seeds: u64,
    rng_seed: u64,
) -> Vec<ContrastResult> {
    let tree = SeedTree::new(rng_seed);
    let mut results: Vec<ContrastResult> = factorial
        .contrasts
        .iter()
        .map(|c| {
            let (seed_list, values) = per_seed(c, rows, &study.method, &study.baseline);
            let (mean, std) = mean_sample_std(&values);
            let p_value = sign_flip_p_value(
                &values,
                &mut tree.stream(&format!("factorial/flips/{}", c.name)),
            );
            let interval = bootstrap_mean_interval(
                &values,
                0.95,
                &mut tree.stream(&format!("factorial/bootstrap/{}", c.name)),
            );
            ContrastResult {
                name: c.name.clone(),
                hypothesis: c.hypothesis.clone(),
                primary: c.primary,
                seeds: seed_list,
                per_seed: values,
                mean,
                std,
                p_value,
                holm_p_value: None,
                holds: !c.primary && p_value <= ALPHA,
                interval,
                planned_sd: planned_sd(c, factorial.prior_sd),
                planned_alpha: planned_alpha(c, factorial),
                detectable: detectable(c, factorial, seeds, rng_seed),
            }
        })
        .collect();
    let primary: Vec<usize> = (0..results.len()).filter(|&i| results[i].primary).collect();
    let adjusted = holm(
        &primary
            .iter()
            .map(|&i| results[i].p_value)
            .collect::<Vec<_>>(),
    );
    for (&i, p) in primary.iter().zip(adjusted) {
        results[i].holm_p_value = Some(p);
        results[i].holds = p <= ALPHA;
    }
    results
}

/// A cell's method-minus-baseline area difference at each seed that ran
/// both arms, in seed order.
pub fn cell_gains(rows: &[SeedRow], cell: &str, study: &Study) -> Vec<f64> {
    let area = |arm: &str| -> BTreeMap<u64, f64> {
        rows.iter()
            .filter(|r| r.cell == cell && r.arm == arm)
            .map(|r| (r.seed, r.area))
            .collect()
    };
    let (method, baseline) = (area(&study.method), area(&study.baseline));
    method
        .iter()
        .filter_map(|(s, m)| Some(m - baseline.get(s)?))
        .collect()
}

/// The mean method-minus-baseline area difference of each level of
/// `factor`, averaged over seeds and the other factors' levels: a factor's
/// main-effect table.
pub fn gain_by_level(
    rows: &[SeedRow],
    cells: &[CellArms],
    study: &Study,
    factor: &str,
) -> Vec<(String, f64, usize)> {
    let mut by_level: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for c in cells {
        if let Some(level) = c.cell.levels.get(factor) {
            let gains = cell_gains(rows, &c.cell.name, study);
            by_level.entry(level.clone()).or_default().extend(gains);
        }
    }
    by_level
        .into_iter()
        .map(|(level, gains)| {
            let n = gains.len();
            (level, gains.iter().sum::<f64>() / n.max(1) as f64, n)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holm_adjusts_step_down_and_stays_monotone() {
        let adjusted = holm(&[0.01, 0.04, 0.03]);
        assert_eq!(adjusted, vec![0.03, 0.06, 0.06]);
        assert_eq!(holm(&[0.5]), vec![0.5]);
        assert_eq!(holm(&[0.6, 0.9]), vec![1.0, 1.0]);
    }

    fn contrast(weights: &[(&str, f64)]) -> Contrast {
        Contrast {
            name: "c".into(),
            hypothesis: "h".into(),
            primary: true,
            weights: weights.iter().map(|(k, w)| (k.to_string(), *w)).collect(),
        }
    }

    fn row(seed: u64, cell: &str, arm: &str, area: f64) -> SeedRow {
        SeedRow {
            seed,
            cell: cell.into(),
            arm: arm.into(),
            warm_start: 0,
            start: 0.0,
            area,
            final_accuracy: area,
        }
    }

    #[test]
    fn a_contrast_weighs_cell_differences_and_arm_areas_per_seed() {
        let rows = vec![
            row(1, "a", "process", 0.5),
            row(1, "a", "outcome", 0.3),
            row(1, "b", "process", 0.4),
            row(1, "b", "outcome", 0.4),
            row(1, "b", "process, x coach", 0.1),
            row(2, "a", "process", 0.2),
            row(2, "a", "outcome", 0.3),
            row(2, "b", "process", 0.6),
            row(2, "b", "outcome", 0.2),
        ];
        let interaction = contrast(&[("a", 1.0), ("b", -1.0)]);
        let (seeds, values) = per_seed(&interaction, &rows, "process", "outcome");
        assert_eq!(seeds, vec![1, 2]);
        assert!(
            (values[0] - 0.2).abs() < 1e-12 && (values[1] + 0.5).abs() < 1e-12,
            "{values:?}"
        );
        // Seed 2 lacks the coach arm: only seed 1 has every term.
        let cost = contrast(&[("b/process", 1.0), ("b/process, x coach", -1.0)]);
        let (seeds, values) = per_seed(&cost, &rows, "process", "outcome");
        assert_eq!(seeds, vec![1]);
        assert!((values[0] - 0.3).abs() < 1e-12);
        // An interaction (two cells) has twice a cell's variance; an arm
        // difference as much as a cell's.
        assert!((planned_sd(&interaction, 1.0) - 2f64.sqrt()).abs() < 1e-12);
        assert!((planned_sd(&cost, 1.0) - 1.0).abs() < 1e-12);
        assert!(
            (planned_sd(&contrast(&[("a", 0.5), ("b", 0.5)]), 1.0) - 0.5f64.sqrt()).abs() < 1e-12
        );
    }
}
