//! A study's numbers: per arm and seed the learning-curve area and the
//! final held-out accuracy (with their means and standard deviations), the
//! held-out curves per seed and averaged, the rollouts each arm needed to
//! reach the reference arm's final accuracy, per-agent reward and
//! coach-score curves; and, for a study that makes a claim, the verdict of
//! the pre-registered analysis ([`super::verdict`]).

use std::collections::BTreeMap;

use mappa_train::records::{TrainLine, UniformOutcome};
use serde::Serialize;

use super::verdict::{verdict, Verdict};
use super::{ArmGroup, StudyData};
use crate::plot::Point;
use crate::report::RunData;
use mappa_core::stats::mean_sample_std;
use mappa_judge::ErrorTable;

/// One arm's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct ArmSummary {
    /// The arm's label.
    pub label: String,
    /// `credit` or `coach`.
    pub group: &'static str,
    /// The seed of each run, in the order of the per-seed lists below.
    pub seeds: Vec<u64>,
    /// Learning-curve area per seed: the mean held-out accuracy over the
    /// evaluations after step 0 (the primary endpoint).
    pub areas: Vec<f64>,
    /// Mean of `areas`.
    pub area_mean: f64,
    /// Standard deviation of `areas`.
    pub area_std: f64,
    /// Final held-out accuracy per seed.
    pub finals: Vec<f64>,
    /// Mean of `finals`.
    pub mean: f64,
    /// Standard deviation of `finals`.
    pub std: f64,
    /// Held-out accuracy before training, mean over seeds.
    pub start: f64,
    /// Held-out accuracy over training steps, mean over seeds.
    pub curve: Vec<Point>,
    /// Held-out accuracy over training steps, per seed: (step, accuracy).
    pub per_seed_curves: Vec<Vec<(f64, f64)>>,
    /// Training trajectories until the mean curve first reached the
    /// baseline's final mean accuracy (None: never).
    pub rollouts_to_baseline_final: Option<u64>,
    /// The share of training steps (over every seed) in which every
    /// trajectory failed: outcome-only credit learns nothing from them but
    /// the KL term.
    pub all_failed_steps: f64,
    /// The share of training steps in which every trajectory succeeded.
    pub all_succeeded_steps: f64,
    /// Under `[credit] uniform = "skip"` or a floor: the share of
    /// normalisation sets (over every step and seed) whose rewards were all
    /// equal (None where no step recorded them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uniform_sets: Option<f64>,
    /// A simulated coach's accuracy per role over every training step and
    /// seed (the mean of the steps' `coach_accuracy`; empty when unknown).
    pub coach_accuracy: BTreeMap<String, f64>,
    /// A simulated coach's errors against the agents' per role, summed over
    /// every training step and seed (empty when unknown, and for runs
    /// recorded before steps kept them).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub coach_errors: BTreeMap<String, ErrorTable>,
    /// Per agent: mean training reward per step, mean over seeds.
    pub reward: BTreeMap<String, Vec<Point>>,
    /// Per agent: mean coach score per step (0-10), mean over seeds.
    pub coach_score: BTreeMap<String, Vec<Point>>,
}

/// (step, value) per seed, averaged over seeds at the steps every seed has.
fn average(per_seed: &[Vec<(f64, f64)>]) -> Vec<Point> {
    let Some(first) = per_seed.first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter_map(|&(step, _)| {
            let values: Vec<f64> = per_seed
                .iter()
                .map(|s| s.iter().find(|p| p.0 == step).map(|p| p.1))
                .collect::<Option<_>>()?;
            let (mean, std) = mean_sample_std(&values);
            Some(Point { step, mean, std })
        })
        .collect()
}

pub(super) fn eval_series(run: &RunData) -> Vec<(f64, f64)> {
    run.eval_series(|m| Some(m.accuracy))
}

/// The learning-curve area of one run: mean held-out accuracy over the
/// evaluations after step 0 (0 when there are none).
pub(super) fn area(curve: &[(f64, f64)]) -> f64 {
    let after: Vec<f64> = curve.iter().filter(|p| p.0 > 0.0).map(|p| p.1).collect();
    after.iter().sum::<f64>() / after.len().max(1) as f64
}

/// The seed a run was made with (from its lock file).
fn run_seed(run: &RunData) -> Option<u64> {
    run.lock.seed()
}

/// Per agent: (step, value) of the train lines.
fn agent_series(
    run: &RunData,
    value: impl Fn(&TrainLine, &str) -> Option<f64>,
) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for m in run.train_steps() {
        for agent in &m.agents {
            if let Some(v) = value(m, &agent.agent) {
                out.entry(agent.agent.clone())
                    .or_default()
                    .push((m.step as f64, v));
            }
        }
    }
    out
}

/// Per agent, averaged over seeds.
fn agent_average(per_seed: &[BTreeMap<String, Vec<(f64, f64)>>]) -> BTreeMap<String, Vec<Point>> {
    let agents: Vec<String> = per_seed
        .first()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    agents
        .into_iter()
        .map(|agent| {
            let series: Vec<Vec<(f64, f64)>> = per_seed
                .iter()
                .map(|m| m.get(&agent).cloned().unwrap_or_default())
                .collect();
            let curve = average(&series);
            (agent, curve)
        })
        .collect()
}

/// Trailing mean over `window` points (plots of noisy per-step values).
pub fn smooth(curve: &[Point], window: usize) -> Vec<(f64, f64)> {
    (0..curve.len())
        .map(|i| {
            let from = i.saturating_sub(window.saturating_sub(1));
            let part = &curve[from..=i];
            (
                curve[i].step,
                part.iter().map(|p| p.mean).sum::<f64>() / part.len() as f64,
            )
        })
        .collect()
}

/// What an arm's training steps recorded, summed over its runs.
#[derive(Default)]
pub(super) struct StepTally {
    /// Training steps.
    pub steps: usize,
    /// Of which every trajectory failed.
    pub all_failed: usize,
    /// Of which every trajectory succeeded.
    pub all_succeeded: usize,
    /// (normalisation sets, those with equal rewards), where recorded.
    pub sets: Option<(usize, usize)>,
    /// Per role: (sum of the steps' coach accuracy, steps).
    pub accuracy: BTreeMap<String, (f64, usize)>,
    /// Per role: the coach's errors against the agents'.
    pub errors: BTreeMap<String, ErrorTable>,
}

impl StepTally {
    /// The tally of every training step of `runs`.
    pub(super) fn of<'r>(runs: impl IntoIterator<Item = &'r RunData>) -> Self {
        let mut t = Self::default();
        for step in runs.into_iter().flat_map(RunData::train_steps) {
            t.steps += 1;
            match step.uniform_outcome {
                Some(UniformOutcome::AllFailed) => t.all_failed += 1,
                Some(UniformOutcome::AllSucceeded) => t.all_succeeded += 1,
                None => {}
            }
            if let Some(line) = step.uniform_sets {
                let (all, uniform) = t.sets.get_or_insert((0, 0));
                *all += line.sets;
                *uniform += line.uniform;
            }
            for (role, a) in &step.coach_accuracy {
                let e = t.accuracy.entry(role.clone()).or_default();
                e.0 += a;
                e.1 += 1;
            }
            for (role, table) in &step.coach_errors {
                let e = t.errors.entry(role.clone()).or_default();
                *e = e.merged(*table);
            }
        }
        t
    }

    /// `n` as a share of the steps.
    pub(super) fn share(&self, n: usize) -> f64 {
        n as f64 / self.steps.max(1) as f64
    }

    /// The share of normalisation sets with equal rewards, where recorded.
    pub(super) fn uniform_share(&self) -> Option<f64> {
        self.sets
            .map(|(all, uniform)| uniform as f64 / all.max(1) as f64)
    }
}

/// One arm's numbers over its seeds.
fn summarise_arm(data: &StudyData, index: usize) -> ArmSummary {
    let arm = &data.arms[index];
    let runs: Vec<&RunData> = data
        .runs
        .iter()
        .filter(|(a, _)| *a == index)
        .map(|(_, r)| r)
        .collect();
    let evals: Vec<Vec<(f64, f64)>> = runs.iter().map(|r| eval_series(r)).collect();
    let finals: Vec<f64> = evals.iter().filter_map(|e| e.last().map(|p| p.1)).collect();
    let starts: Vec<f64> = evals
        .iter()
        .filter_map(|e| e.first().map(|p| p.1))
        .collect();
    let (mean, std) = mean_sample_std(&finals);
    let areas: Vec<f64> = evals.iter().map(|e| area(e)).collect();
    let (area_mean, area_std) = mean_sample_std(&areas);
    let seeds: Vec<u64> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| run_seed(r).unwrap_or(i as u64))
        .collect();
    let tally = StepTally::of(runs.iter().copied());
    let rewards: Vec<_> = runs
        .iter()
        .map(|r| agent_series(r, |m, a| Some(m.agent(a)?.mean_reward)))
        .collect();
    let scores: Vec<_> = runs
        .iter()
        .map(|r| agent_series(r, |m, a| m.coach_mean_score.get(a).copied()))
        .collect();
    ArmSummary {
        label: arm.label.clone(),
        group: match arm.group {
            ArmGroup::Credit => "credit",
            ArmGroup::Coach(_) => "coach",
        },
        seeds,
        areas,
        area_mean,
        area_std,
        finals,
        mean,
        std,
        start: mean_sample_std(&starts).0,
        curve: average(&evals),
        per_seed_curves: evals,
        rollouts_to_baseline_final: None,
        all_failed_steps: tally.share(tally.all_failed),
        all_succeeded_steps: tally.share(tally.all_succeeded),
        uniform_sets: tally.uniform_share(),
        coach_accuracy: tally
            .accuracy
            .into_iter()
            .map(|(role, (sum, n))| (role, sum / n as f64))
            .collect(),
        coach_errors: tally.errors,
        reward: agent_average(&rewards),
        coach_score: agent_average(&scores),
    }
}

/// Every arm's numbers, and the verdict when the study makes a claim (an
/// error when the claim is invalid: see [`verdict`]). The rollouts each arm
/// needed are counted to the reference arm's final mean (the baseline; the
/// first arm of an ablation).
pub fn summarise(data: &StudyData) -> anyhow::Result<(Vec<ArmSummary>, Option<Verdict>)> {
    let mut arms: Vec<ArmSummary> = (0..data.arms.len())
        .map(|i| summarise_arm(data, i))
        .collect();
    let claim = match data.question {
        super::Question::Claim { method, baseline } => Some((method, baseline)),
        super::Question::Ablation => None,
    };
    let reference = claim.map_or(arms.first().map(|a| a.label.clone()), |(_, b)| {
        Some(b.clone())
    });
    let target = reference
        .and_then(|r| arms.iter().find(|a| a.label == r))
        .map_or(f64::INFINITY, |b| b.mean);
    let per_step =
        (data.base.rollout.prompts_per_step * data.base.rollout.samples_per_prompt) as u64;
    for arm in &mut arms {
        arm.rollouts_to_baseline_final = arm
            .curve
            .iter()
            .find(|p| p.mean >= target - 1e-12)
            .map(|p| p.step as u64 * per_step);
    }
    let verdict = claim
        .map(|(method, baseline)| {
            verdict(
                method,
                baseline,
                &arms,
                data.base.seed,
                data.study.and_then(|s| s.threshold),
                per_step,
            )
        })
        .transpose()
        .map_err(|e| anyhow::anyhow!("{}: {e}", data.name))?;
    Ok((arms, verdict))
}

#[cfg(test)]
impl ArmSummary {
    /// An arm for tests of the verdict: seed `s + 1` has held-out accuracy
    /// 0 at step 0, then `areas[s]` at step 1 (its area and final).
    pub(crate) fn synthetic(label: &str, areas: &[f64]) -> Self {
        let (area_mean, area_std) = mean_sample_std(areas);
        Self {
            label: label.into(),
            group: "credit",
            seeds: (1..=areas.len() as u64).collect(),
            areas: areas.to_vec(),
            area_mean,
            area_std,
            finals: areas.to_vec(),
            mean: area_mean,
            std: area_std,
            start: 0.0,
            curve: Vec::new(),
            per_seed_curves: areas.iter().map(|a| vec![(0.0, 0.0), (1.0, *a)]).collect(),
            rollouts_to_baseline_final: None,
            all_failed_steps: 0.0,
            all_succeeded_steps: 0.0,
            uniform_sets: None,
            coach_accuracy: BTreeMap::new(),
            coach_errors: BTreeMap::new(),
            reward: BTreeMap::new(),
            coach_score: BTreeMap::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curves_average_over_seeds_and_smooth() {
        let curve = average(&[vec![(0.0, 0.1), (5.0, 0.3)], vec![(0.0, 0.3)]]);
        assert_eq!(curve.len(), 1, "only steps every seed has");
        assert!((curve[0].mean - 0.2).abs() < 1e-12);
        let smoothed = smooth(
            &[0.0, 1.0, 2.0].map(|mean| Point {
                step: mean,
                mean,
                std: 0.0,
            }),
            2,
        );
        assert_eq!(smoothed, vec![(0.0, 0.0), (1.0, 0.5), (2.0, 1.5)]);
    }
}
