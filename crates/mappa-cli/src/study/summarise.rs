//! A study's numbers: per arm the final held-out accuracy per seed (mean
//! and standard deviation), accuracy curves over training, the rollouts
//! each arm needed to reach the reference arm's final accuracy, per-agent
//! reward and coach-score curves; and the verdict on the method against the
//! baseline, for a study that makes a claim.

use std::collections::BTreeMap;

use mappa_train::records::TrainLine;
use serde::Serialize;

use super::{ArmGroup, StudyData};
use crate::plot::Point;
use crate::report::RunData;
use mappa_core::stats::mean_sample_std;

/// One arm's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct ArmSummary {
    /// The arm's label.
    pub label: String,
    /// `credit` or `coach`.
    pub group: &'static str,
    /// Final held-out accuracy per seed.
    pub finals: Vec<f64>,
    /// Mean of `finals`.
    pub mean: f64,
    /// Standard deviation of `finals`.
    pub std: f64,
    /// Held-out accuracy before training, mean over seeds.
    pub start: f64,
    /// Held-out accuracy over training steps.
    pub curve: Vec<Point>,
    /// Training trajectories until the mean curve first reached the
    /// baseline's final mean accuracy (None: never).
    pub rollouts_to_baseline_final: Option<u64>,
    /// Per agent: mean training reward per step, mean over seeds.
    pub reward: BTreeMap<String, Vec<Point>>,
    /// Per agent: mean coach score per step (0-10), mean over seeds.
    pub coach_score: BTreeMap<String, Vec<Point>>,
}

/// The verdict on the method against the baseline.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// The method arm's label.
    pub method: String,
    /// The baseline arm's label.
    pub baseline: String,
    /// Method minus baseline mean final accuracy.
    pub difference: f64,
    /// Twice the larger seed-to-seed standard deviation.
    pub threshold: f64,
    /// None when there are too few seeds to judge.
    pub holds: Option<bool>,
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

fn eval_series(run: &RunData) -> Vec<(f64, f64)> {
    run.eval_series(|m| Some(m.accuracy))
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
            ArmGroup::Coach => "coach",
        },
        finals,
        mean,
        std,
        start: mean_sample_std(&starts).0,
        curve: average(&evals),
        rollouts_to_baseline_final: None,
        reward: agent_average(&rewards),
        coach_score: agent_average(&scores),
    }
}

/// Every arm's numbers, and the verdict when the study makes a claim. The
/// rollouts each arm needed are counted to the reference arm's final mean
/// (the baseline; the first arm of an ablation).
pub fn summarise(data: &StudyData) -> (Vec<ArmSummary>, Option<Verdict>) {
    let mut arms: Vec<ArmSummary> = (0..data.arms.len())
        .map(|i| summarise_arm(data, i))
        .collect();
    let claim = data.question.arms(data.arms);
    let reference = claim.map_or(0, |(_, baseline)| baseline);
    let target = arms.get(reference).map_or(f64::INFINITY, |b| b.mean);
    let per_step =
        (data.base.rollout.prompts_per_step * data.base.rollout.samples_per_prompt) as u64;
    for arm in &mut arms {
        arm.rollouts_to_baseline_final = arm
            .curve
            .iter()
            .find(|p| p.mean >= target - 1e-12)
            .map(|p| p.step as u64 * per_step);
    }
    let verdict = claim.map(|(m, b)| {
        let (m, b) = (&arms[m], &arms[b]);
        let threshold = 2.0 * m.std.max(b.std);
        let difference = m.mean - b.mean;
        Verdict {
            method: m.label.clone(),
            baseline: b.label.clone(),
            difference,
            threshold,
            holds: (data.seeds >= 2).then_some(difference > threshold),
        }
    });
    (arms, verdict)
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
