//! The pre-registered analysis of a study's claim ("`method` beats
//! `baseline`"), fixed in code before any confirmatory run:
//!
//! - **Endpoint**: per seed, the area under the held-out learning curve:
//!   the mean held-out accuracy over the evaluations after step 0.
//!   Secondary endpoints: the final held-out accuracy, and the training
//!   rollouts until the curve first reaches `[study] threshold` (when set).
//! - **Pairs**: the method's and the baseline's run of the same seed (same
//!   data order, same warm start); method minus baseline.
//! - **Test**: one-sided exact sign-flip permutation test of the paired
//!   differences ([`mappa_core::paired`]) at `alpha` = [`ALPHA`]; the claim
//!   holds when `p <= alpha`. The mean difference comes with a 95%
//!   percentile bootstrap interval, and the study with the mean difference
//!   it detects with 80% power at the observed spread.
//! - **Refusals**: a claim of an arm against itself, a study with fewer than
//!   two arms, or arms missing from it; with fewer paired seeds than the
//!   test needs to reach `alpha` there is no verdict ("not judged"), and the
//!   note says how many are needed.

use mappa_core::paired::{
    bootstrap_mean_interval, detectable_effect, min_pairs, sign_flip_p_value,
};
use mappa_core::rng::SeedTree;
use mappa_core::stats::mean_sample_std;
use serde::Serialize;

use super::summarise::ArmSummary;

/// The test's level.
pub const ALPHA: f64 = 0.05;

/// The power at which the detectable effect is stated.
pub const POWER: f64 = 0.8;

/// The primary endpoint, as reports name it.
pub const ENDPOINT: &str =
    "learning-curve area (mean held-out accuracy over the evaluations after step 0)";

/// A paired comparison of one endpoint.
#[derive(Debug, Clone, Serialize)]
pub struct Paired {
    /// The seeds both arms ran, in order.
    pub seeds: Vec<u64>,
    /// Method minus baseline, per seed.
    pub differences: Vec<f64>,
    /// Their mean.
    pub mean_difference: f64,
    /// Their sample standard deviation.
    pub std_difference: f64,
    /// The one-sided sign-flip p-value.
    pub p_value: f64,
}

/// The verdict on the method against the baseline.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The method arm's label.
    pub method: String,
    /// The baseline arm's label.
    pub baseline: String,
    /// The primary endpoint.
    pub endpoint: &'static str,
    /// The test's level.
    pub alpha: f64,
    /// Paired seeds the test needs to be able to reach `alpha`.
    pub min_seeds: usize,
    /// The primary endpoint, paired.
    pub primary: Paired,
    /// 95% bootstrap interval of the primary mean difference.
    pub interval_95: (f64, f64),
    /// The mean difference the study detects with [`POWER`] at the
    /// observed spread (None: too few seeds to detect any).
    pub detectable_effect: Option<f64>,
    /// Secondary: the final held-out accuracy, paired.
    pub final_accuracy: Paired,
    /// Secondary: training rollouts until the curve first reached
    /// `[study] threshold`, per seed (None: never reached), per arm.
    pub rollouts_to_threshold: Option<RolloutsToThreshold>,
    /// Whether the claim holds (`p <= alpha`); None when not judged.
    pub holds: Option<bool>,
}

/// Rollouts until a fixed held-out accuracy.
#[derive(Debug, Clone, Serialize)]
pub struct RolloutsToThreshold {
    /// The threshold.
    pub threshold: f64,
    /// The method's rollouts per seed.
    pub method: Vec<Option<u64>>,
    /// The baseline's rollouts per seed.
    pub baseline: Vec<Option<u64>>,
}

/// Pair `method` with `baseline` on the seeds both have.
fn paired(
    method: &ArmSummary,
    baseline: &ArmSummary,
    value: impl Fn(&ArmSummary, usize) -> f64,
    tree: &SeedTree,
    name: &str,
) -> Paired {
    let mut seeds = Vec::new();
    let mut differences = Vec::new();
    for (i, seed) in method.seeds.iter().enumerate() {
        if let Some(j) = baseline.seeds.iter().position(|s| s == seed) {
            seeds.push(*seed);
            differences.push(value(method, i) - value(baseline, j));
        }
    }
    let (mean_difference, std_difference) = mean_sample_std(&differences);
    let p_value = sign_flip_p_value(&differences, &mut tree.stream(&format!("{name}/flips")));
    Paired {
        seeds,
        differences,
        mean_difference,
        std_difference,
        p_value,
    }
}

/// The pre-registered verdict on `method` against `baseline` among `arms`.
/// `seed` seeds the bootstrap and power simulations; `threshold` and
/// `rollouts_per_step` give the rollouts-to-threshold endpoint.
pub fn verdict(
    method: &str,
    baseline: &str,
    arms: &[ArmSummary],
    seed: u64,
    threshold: Option<f64>,
    rollouts_per_step: u64,
) -> Result<Verdict, String> {
    if method == baseline {
        return Err(format!(
            "the claim compares `{method}` with itself: method and baseline must differ"
        ));
    }
    if arms.len() < 2 {
        return Err(format!(
            "a claim needs two arms, and this study has {}",
            arms.len()
        ));
    }
    let find = |label: &str| {
        arms.iter().find(|a| a.label == label).ok_or_else(|| {
            let labels: Vec<&str> = arms.iter().map(|a| a.label.as_str()).collect();
            format!(
                "no arm `{label}` in this study (arms: {})",
                labels.join(", ")
            )
        })
    };
    let (m, b) = (find(method)?, find(baseline)?);
    let tree = SeedTree::new(seed);
    let primary = paired(m, b, |a, i| a.areas[i], &tree, "study-verdict/area");
    let final_accuracy = paired(m, b, |a, i| a.finals[i], &tree, "study-verdict/final");
    let min_seeds = min_pairs(ALPHA);
    let judged = primary.seeds.len() >= min_seeds;
    let interval_95 = bootstrap_mean_interval(
        &primary.differences,
        0.95,
        &mut tree.stream("study-verdict/bootstrap"),
    );
    let detectable = detectable_effect(
        primary.seeds.len(),
        primary.std_difference,
        ALPHA,
        POWER,
        &mut tree.stream("study-verdict/power"),
    );
    let rollouts_to_threshold = threshold.map(|threshold| {
        let reach = |arm: &ArmSummary| {
            arm.per_seed_curves
                .iter()
                .map(|curve| {
                    curve
                        .iter()
                        .find(|(_, accuracy)| *accuracy >= threshold)
                        .map(|(step, _)| *step as u64 * rollouts_per_step)
                })
                .collect()
        };
        RolloutsToThreshold {
            threshold,
            method: reach(m),
            baseline: reach(b),
        }
    });
    Ok(Verdict {
        method: method.to_string(),
        baseline: baseline.to_string(),
        endpoint: ENDPOINT,
        alpha: ALPHA,
        min_seeds,
        holds: judged.then_some(primary.p_value <= ALPHA),
        primary,
        interval_95,
        detectable_effect: detectable,
        final_accuracy,
        rollouts_to_threshold,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An arm whose seed `s` has learning-curve area `areas[s]` (a flat curve after step 0).
    fn arm(label: &str, areas: &[f64]) -> ArmSummary {
        ArmSummary::synthetic(label, areas)
    }

    fn judge(method: &[f64], baseline: &[f64]) -> Verdict {
        verdict(
            "process",
            "outcome",
            &[arm("process", method), arm("outcome", baseline)],
            1,
            None,
            8,
        )
        .unwrap()
    }

    #[test]
    fn a_clear_gain_holds() {
        let base = [0.10, 0.20, 0.15, 0.05, 0.30, 0.12, 0.18, 0.22];
        let method: Vec<f64> = base
            .iter()
            .zip([0.1, 0.12, 0.08, 0.1, 0.15, 0.09, 0.11, 0.1])
            .map(|(b, d)| b + d)
            .collect();
        let v = judge(&method, &base);
        assert_eq!(v.holds, Some(true));
        assert_eq!(v.primary.p_value, 1.0 / 256.0, "every seed better");
        assert!(
            v.interval_95.0 > 0.05 && v.interval_95.1 < 0.15,
            "{:?}",
            v.interval_95
        );
        assert!(v.detectable_effect.unwrap() < 0.05);
        assert_eq!(v.method, "process", "named, not by position");
    }

    #[test]
    fn no_gain_does_not_hold() {
        let base = [0.10, 0.20, 0.15, 0.05, 0.30, 0.12, 0.18, 0.22];
        let method: Vec<f64> = base
            .iter()
            .zip([0.02, -0.03, 0.01, -0.02, 0.0, 0.03, -0.01, -0.02])
            .map(|(b, d)| b + d)
            .collect();
        let v = judge(&method, &base);
        assert_eq!(v.holds, Some(false));
        assert!(v.primary.p_value > 0.3, "{}", v.primary.p_value);
        assert!(v.interval_95.0 < 0.0 && v.interval_95.1 > 0.0);
        // A loss is not a gain either.
        let worse: Vec<f64> = base.iter().map(|b| b - 0.1).collect();
        assert_eq!(judge(&worse, &base).holds, Some(false));
    }

    #[test]
    fn borderline_cases_fall_on_the_right_side_of_alpha() {
        // Five seeds all better: p = 1/32 = 0.031 <= 0.05.
        let v = judge(&[0.2, 0.3, 0.25, 0.4, 0.35], &[0.1, 0.25, 0.2, 0.3, 0.3]);
        assert_eq!((v.primary.p_value, v.holds), (1.0 / 32.0, Some(true)));
        // One of five a hair worse, and the smallest gain: p = 2/32 = 0.0625 > 0.05.
        let v = judge(&[0.2, 0.3, 0.25, 0.4, 0.29], &[0.1, 0.25, 0.2, 0.3, 0.3]);
        assert_eq!((v.primary.p_value, v.holds), (2.0 / 32.0, Some(false)));
    }

    #[test]
    fn too_few_seeds_are_not_judged_and_say_how_many_are_needed() {
        let v = judge(&[0.9, 0.9, 0.9, 0.9], &[0.1, 0.1, 0.1, 0.1]);
        assert_eq!(v.holds, None);
        assert_eq!(v.min_seeds, 5);
        assert_eq!(v.detectable_effect, None);
    }

    #[test]
    fn invalid_claims_are_refused() {
        let arms = [arm("process", &[0.2; 5]), arm("outcome", &[0.1; 5])];
        let e = verdict("process", "process", &arms, 1, None, 8).unwrap_err();
        assert!(e.contains("itself"), "{e}");
        let e = verdict("process", "outcome", &arms[..1], 1, None, 8).unwrap_err();
        assert!(e.contains("two arms"), "{e}");
        let e = verdict("process", "mixed", &arms, 1, None, 8).unwrap_err();
        assert!(e.contains("no arm `mixed`") && e.contains("outcome"), "{e}");
    }

    #[test]
    fn seeds_are_paired_by_seed_not_by_position() {
        let mut method = arm("process", &[0.5, 0.6, 0.7, 0.8, 0.9]);
        method.seeds = vec![5, 4, 3, 2, 1];
        let baseline = arm("outcome", &[0.4, 0.5, 0.6, 0.7, 0.8]);
        let v = verdict("process", "outcome", &[method, baseline], 1, Some(0.75), 8).unwrap();
        assert_eq!(v.primary.seeds, vec![5, 4, 3, 2, 1]);
        assert_eq!(
            v.primary
                .differences
                .iter()
                .map(|d| (d * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
            vec![-0.3, -0.1, 0.1, 0.3, 0.5]
        );
        let reach = v.rollouts_to_threshold.unwrap();
        assert_eq!(reach.method[..2], [None, None]);
        assert_eq!(reach.method[3], Some(8), "step 1 of 8 rollouts each");
    }
}
