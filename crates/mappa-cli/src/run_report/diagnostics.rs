//! What the learning signal looked like, per role, early and late in a run:
//! how much the rewards and the actions' advantages spread within a step
//! (no spread, no signal), the KL to the reference, how often replies were
//! cut at the token limit (those are masked out of the update) and, under
//! the free-text coach, how often a reply could be read at all. The report
//! gives the first and the last third of the steps; `diagnostics.csv` has
//! every step.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use mappa_judge::scripted::free_text::{read_answer, read_plan, read_printed};
use mappa_train::records::{MetricsLine, TrajectoryLine};

/// One role's signal in one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub(super) struct RoleStep {
    /// Population std of the actions' rewards.
    pub reward_std: f64,
    /// Population std of the actions' mean advantages (over their valid tokens).
    pub advantage_std: f64,
    /// The learner's KL to its reference (k1, mean per valid token).
    pub kl: Option<f64>,
    /// Share of actions cut at the token limit.
    pub truncated: f64,
    /// Share of actions the free-text reading could read (None: another coach).
    pub readable: Option<f64>,
}

/// Whether the free-text coach can read an action of `role`: a plan with a
/// value, a program that printed an integer, a final integer answer.
fn readable(role: &str, text: &str, observation: Option<&str>) -> Option<bool> {
    match role {
        "problem_solver" => Some(read_plan(text).is_some()),
        "code_executor" => Some(read_printed(observation).is_some()),
        "verifier" => Some(read_answer(text).is_some()),
        _ => None,
    }
}

/// Population standard deviation (0 for fewer than two values).
fn spread(values: &[f64]) -> f64 {
    mappa_core::stats::mean_population_std(values).1
}

/// Every step's signal per role, keyed (step, role).
pub(super) fn per_step(
    metrics: &[MetricsLine],
    trajectories: &[TrajectoryLine],
    free_text: bool,
) -> BTreeMap<(usize, String), RoleStep> {
    #[derive(Default)]
    struct Acc {
        rewards: Vec<f64>,
        advantages: Vec<f64>,
        truncated: usize,
        readable: usize,
    }
    let mut acc: BTreeMap<(usize, String), Acc> = BTreeMap::new();
    for t in trajectories {
        for a in &t.actions {
            let e = acc.entry((t.step, a.role.clone())).or_default();
            e.rewards.push(a.reward);
            e.advantages.push(a.advantage_mean);
            e.truncated += usize::from(a.truncated);
            let read = readable(&a.role, &a.text, a.tool_observation.as_deref());
            e.readable += usize::from(read == Some(true));
        }
    }
    let kl: BTreeMap<(usize, String), f64> = metrics
        .iter()
        .filter_map(MetricsLine::as_train)
        .flat_map(|t| {
            t.agents
                .iter()
                .map(move |a| ((t.step, a.agent.clone()), a.kl))
        })
        .collect();
    acc.into_iter()
        .map(|(key, a)| {
            let n = a.rewards.len().max(1) as f64;
            let step = RoleStep {
                reward_std: spread(&a.rewards),
                advantage_std: spread(&a.advantages),
                kl: kl.get(&key).copied(),
                truncated: a.truncated as f64 / n,
                readable: free_text.then(|| a.readable as f64 / n),
            };
            (key, step)
        })
        .collect()
}

/// `diagnostics.csv`: one line per step and role.
pub(super) fn csv(steps: &BTreeMap<(usize, String), RoleStep>) -> String {
    let mut out = String::from("step,role,reward_std,advantage_std,kl,truncated,readable\n");
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.6}"));
    for ((step, role), s) in steps {
        let _ = writeln!(
            out,
            "{step},{role},{:.6},{:.6},{},{:.6},{}",
            s.reward_std,
            s.advantage_std,
            opt(s.kl),
            s.truncated,
            opt(s.readable)
        );
    }
    out
}

/// The report's section: each of `roles`' signal averaged over the first
/// and the last third of the steps.
pub(super) fn section(steps: &BTreeMap<(usize, String), RoleStep>, roles: &[String]) -> String {
    let mut md = String::from("\n## Diagnostics: the learning signal\n\n");
    let all: Vec<usize> = steps.keys().map(|(s, _)| *s).collect();
    let (Some(&first), Some(&last)) = (all.iter().min(), all.iter().max()) else {
        md.push_str("No training steps recorded.\n");
        return md;
    };
    let third = ((last - first + 1) / 3).max(1);
    let early = first..first + third;
    let late = last + 1 - third..last + 1;
    md.push_str(&format!(
        "Per role, averaged over steps {}-{} (early) and {}-{} (late): the spread (std) within a step of the actions' rewards and of their mean advantages, the KL to the reference, the share of replies cut at the token limit (masked out of the update) and, under the free-text coach, the share it could read. Every step: `diagnostics.csv`.\n\n",
        early.start, early.end - 1, late.start, late.end - 1
    ));
    md.push_str("| role | reward std | advantage std | KL | truncated | readable |\n|---|---|---|---|---|---|\n");
    for role in roles {
        let mean = |range: &std::ops::Range<usize>, f: &dyn Fn(&RoleStep) -> Option<f64>| {
            let v: Vec<f64> = range
                .clone()
                .filter_map(|s| steps.get(&(s, role.clone())).and_then(f))
                .collect();
            (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
        };
        let cell = |f: &dyn Fn(&RoleStep) -> Option<f64>, pct: bool| {
            let show = |v: Option<f64>| match (v, pct) {
                (Some(v), true) => format!("{:.0}%", 100.0 * v),
                (Some(v), false) => format!("{v:.3}"),
                (None, _) => "-".into(),
            };
            format!("{} -> {}", show(mean(&early, f)), show(mean(&late, f)))
        };
        let _ = writeln!(
            md,
            "| {role} | {} | {} | {} | {} | {} |",
            cell(&|s| Some(s.reward_std), false),
            cell(&|s| Some(s.advantage_std), false),
            cell(&|s| s.kl, false),
            cell(&|s| Some(s.truncated), true),
            cell(&|s| s.readable, true),
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trajectory(step: usize, solver: (&str, f64, f64), truncated: bool) -> TrajectoryLine {
        let (text, reward, advantage) = solver;
        serde_json::from_value(serde_json::json!({
            "step": step, "task_id": "t", "sample": 0, "outcome": 0.0,
            "actions": [{"role": "problem_solver", "turn": 0, "text": text, "truncated": truncated,
                "score": 0.0, "rationale": "", "coach_fallback": false,
                "reward": reward, "advantage_mean": advantage}]
        }))
        .unwrap()
    }

    #[test]
    fn spreads_truncation_and_readability_are_per_step_and_role() {
        let trajectories = [
            trajectory(0, ("Plan: 3 + 4", 1.0, 1.0), false),
            trajectory(0, ("Plan:", 0.0, -1.0), true),
            trajectory(1, ("Plan: 2 * 5", 1.0, 0.0), false),
            trajectory(1, ("Plan: 2 * 6", 1.0, 0.0), false),
        ];
        let metrics: Vec<MetricsLine> = Vec::new();
        let steps = per_step(&metrics, &trajectories, true);
        let first = &steps[&(0, "problem_solver".to_string())];
        assert_eq!((first.reward_std, first.advantage_std), (0.5, 1.0));
        assert_eq!((first.truncated, first.readable), (0.5, Some(0.5)));
        let second = &steps[&(1, "problem_solver".to_string())];
        assert_eq!((second.reward_std, second.readable), (0.0, Some(1.0)));
        assert_eq!(
            per_step(&metrics, &trajectories, false)[&(0, "problem_solver".to_string())].readable,
            None
        );
        let md = section(&steps, &["problem_solver".to_string()]);
        assert!(md.contains("steps 0-0 (early) and 1-1 (late)"), "{md}");
        assert!(md.contains("| problem_solver | 0.500 -> 0.000 | 1.000 -> 0.000 | - -> - | 50% -> 0% | 50% -> 100% |"), "{md}");
        assert!(csv(&steps).starts_with("step,role,reward_std,advantage_std,kl,truncated,readable\n0,problem_solver,0.500000,1.000000,,0.500000,0.500000\n"));
    }
}
