//! The report of one run (`report.md` in its directory), written by
//! `mappa reproduce` for experiments that are a single run: held-out
//! accuracy before and after, what the coach said (how often its replies
//! parsed, its agreement with the graded outcome on the last agent, its
//! scores per role), and where the time went.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mappa_train::records::{read_jsonl, MetricsLine, TrajectoryLine};
use mappa_train::run::timing::TimingLine;

/// A score at or above this is the coach calling an action right (the
/// middle of the 0-10 scale).
pub const RIGHT_AT: f64 = 5.0;

/// How a coach's verdicts on one role's actions compare with the outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Agreement {
    /// Right by the coach, and the trajectory succeeded.
    right_succeeded: usize,
    /// Right by the coach, but the trajectory failed.
    right_failed: usize,
    /// Wrong by the coach, but the trajectory succeeded.
    wrong_succeeded: usize,
    /// Wrong by the coach, and the trajectory failed.
    wrong_failed: usize,
}

impl Agreement {
    fn total(&self) -> usize {
        self.right_succeeded + self.right_failed + self.wrong_succeeded + self.wrong_failed
    }

    fn rate(&self) -> Option<f64> {
        let n = self.total();
        (n > 0).then(|| (self.right_succeeded + self.wrong_failed) as f64 / n as f64)
    }
}

/// Per role: coached actions, those whose reply parsed, the score histogram
/// (rounded to integers 0-10, parsed replies only), the score sum.
#[derive(Debug, Default, Clone)]
struct RoleScores {
    actions: usize,
    parsed: usize,
    histogram: [usize; 11],
    sum: f64,
}

/// Writes `run_dir/report.md` and returns its path. `last_role` is the
/// workflow's last agent, whose coach sees the graded outcome; `coach_note`
/// says how the coach was asked when that changes what its parse rate means.
pub fn write(run_dir: &Path, last_role: &str, coach_note: Option<&str>) -> anyhow::Result<PathBuf> {
    let metrics: Vec<MetricsLine> = read_jsonl(&run_dir.join("metrics.jsonl"))?;
    let trajectories: Vec<TrajectoryLine> = read_jsonl(&run_dir.join("trajectories.jsonl"))?;
    let timing_path = run_dir.join("timing.jsonl");
    let timing: Vec<TimingLine> = if timing_path.exists() {
        read_jsonl(&timing_path)?
    } else {
        Vec::new()
    };
    let text = render(
        run_dir,
        last_role,
        coach_note,
        &metrics,
        &trajectories,
        &timing,
    );
    let path = run_dir.join("report.md");
    mappa_core::fs::write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

fn render(
    run_dir: &Path,
    last_role: &str,
    coach_note: Option<&str>,
    metrics: &[MetricsLine],
    trajectories: &[TrajectoryLine],
    timing: &[TimingLine],
) -> String {
    let mut md = format!("# Run `{}`\n\n", run_dir.display());
    let evals: Vec<_> = metrics.iter().filter_map(MetricsLine::as_eval).collect();
    md.push_str("## Held-out accuracy\n\n| step | accuracy | trajectories |\n|---|---|---|\n");
    for e in &evals {
        let _ = writeln!(
            md,
            "| {} | {:.3} | {} |",
            e.step, e.accuracy, e.trajectories
        );
    }
    if let (Some(first), Some(last)) = (evals.first(), evals.last()) {
        let _ = writeln!(
            md,
            "\nBase {:.1}% -> final {:.1}% (step {}).",
            100.0 * first.accuracy,
            100.0 * last.accuracy,
            last.step
        );
    }

    let mut roles: BTreeMap<&str, RoleScores> = BTreeMap::new();
    let mut agreement = Agreement::default();
    for t in trajectories {
        let succeeded = t.outcome >= 1.0;
        for a in &t.actions {
            let r = roles.entry(a.role.as_str()).or_default();
            r.actions += 1;
            if a.coach_fallback {
                continue;
            }
            r.parsed += 1;
            r.sum += a.score;
            r.histogram[a.score.round().clamp(0.0, 10.0) as usize] += 1;
            if a.role == last_role {
                let right = a.score >= RIGHT_AT;
                match (right, succeeded) {
                    (true, true) => agreement.right_succeeded += 1,
                    (true, false) => agreement.right_failed += 1,
                    (false, true) => agreement.wrong_succeeded += 1,
                    (false, false) => agreement.wrong_failed += 1,
                }
            }
        }
    }
    let mut fallbacks: BTreeMap<String, usize> = BTreeMap::new();
    for line in metrics.iter().filter_map(MetricsLine::as_train) {
        for (reason, n) in &line.coach_fallbacks {
            *fallbacks.entry(reason.clone()).or_default() += n;
        }
    }
    md.push_str("\n## The coach\n\n");
    if let Some(note) = coach_note {
        let _ = writeln!(md, "{note}\n");
    }
    let (actions, parsed) = roles
        .values()
        .fold((0, 0), |(a, p), r| (a + r.actions, p + r.parsed));
    let _ = writeln!(
        md,
        "Replies that parsed to a score: {parsed} of {actions} coached actions ({}). Fallbacks by reason: {}.\n",
        percent(parsed, actions),
        if fallbacks.values().all(|&n| n == 0) {
            "none".to_string()
        } else {
            fallbacks
                .iter()
                .filter(|(_, &n)| n > 0)
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    md.push_str("| role | actions | parsed | mean score (parsed) | scores 0 1 2 3 4 5 6 7 8 9 10 |\n|---|---|---|---|---|\n");
    for (role, r) in &roles {
        let hist: Vec<String> = r.histogram.iter().map(usize::to_string).collect();
        let _ = writeln!(
            md,
            "| {role} | {} | {} | {} | {} |",
            r.actions,
            percent(r.parsed, r.actions),
            if r.parsed > 0 {
                format!("{:.2}", r.sum / r.parsed as f64)
            } else {
                "-".into()
            },
            hist.join(" ")
        );
    }
    let _ = writeln!(
        md,
        "\nAgreement with the graded outcome on the last agent ({last_role}; the coach's verdict is \"right\" at a score of {RIGHT_AT} or more; parsed replies only): {} of {} ({}). Right and succeeded {}, right but failed {}, wrong but succeeded {}, wrong and failed {}.",
        agreement.right_succeeded + agreement.wrong_failed,
        agreement.total(),
        agreement.rate().map_or("-".into(), |r| format!("{:.1}%", 100.0 * r)),
        agreement.right_succeeded,
        agreement.right_failed,
        agreement.wrong_succeeded,
        agreement.wrong_failed
    );

    md.push_str("\n## Where the time went\n\n");
    if timing.is_empty() {
        md.push_str("No `timing.jsonl` in this run.\n");
    } else {
        let sum = |phase: &str, f: &dyn Fn(&TimingLine) -> f64| -> f64 {
            timing.iter().filter(|t| t.phase == phase).map(f).sum()
        };
        let train_wall = sum("train", &|t| t.wall_s);
        let eval_wall = sum("eval", &|t| t.wall_s);
        let total = train_wall + eval_wall;
        let rows = [
            ("evaluation (all of it)", eval_wall),
            (
                "training: generation (rollout minus sandbox)",
                sum("train", &|t| t.rollout_s - t.sandbox_s),
            ),
            (
                "training: sandbox (programs)",
                sum("train", &|t| t.sandbox_s),
            ),
            (
                "training: coach of the last agent (alone)",
                sum("train", &|t| t.coach_last_s),
            ),
            (
                "training: credit and updates",
                sum("train", &|t| t.update_s),
            ),
        ];
        md.push_str("| phase | seconds | share |\n|---|---|---|\n");
        for (name, s) in rows {
            let _ = writeln!(
                md,
                "| {name} | {s:.0} | {:.0}% |",
                100.0 * s / total.max(1e-9)
            );
        }
        let _ = writeln!(
            md,
            "| total (evaluations and steps) | {total:.0} | 100% |\n\nThe coach also scored the agents before the last while the rollout went on ({:.0} s inside coach calls in all, overlapping generation). Steps: {}; evaluations: {}.",
            sum("train", &|t| t.coach_s),
            timing.iter().filter(|t| t.phase == "train").count(),
            timing.iter().filter(|t| t.phase == "eval").count()
        );
    }
    md
}

fn percent(part: usize, whole: usize) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(role: &str, score: f64, fallback: bool) -> serde_json::Value {
        serde_json::json!({
            "role": role, "turn": 0, "text": "", "truncated": false, "score": score,
            "rationale": "", "coach_fallback": fallback, "reward": 0.0, "advantage_mean": 0.0
        })
    }

    fn trajectory(outcome: f64, actions: Vec<serde_json::Value>) -> TrajectoryLine {
        serde_json::from_value(serde_json::json!({
            "step": 0, "task_id": "t", "sample": 0, "outcome": outcome, "actions": actions
        }))
        .unwrap()
    }

    #[test]
    fn the_report_counts_parses_agreement_and_time() {
        let metrics: Vec<MetricsLine> = [
            r#"{"kind":"eval","step":0,"accuracy":0.25,"trajectories":4}"#,
            r#"{"kind":"train","step":0,"train_accuracy":0.5,"coach_mean_score":{},"coach_fallbacks":{"format":1,"request-failed":0},"tool_call_rate":null,"agents":[]}"#,
            r#"{"kind":"eval","step":1,"accuracy":0.5,"trajectories":4}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
        let trajectories = [
            trajectory(
                1.0,
                vec![action("solver", 7.0, false), action("verifier", 8.0, false)],
            ),
            trajectory(
                0.0,
                vec![action("solver", 5.0, true), action("verifier", 6.0, false)],
            ),
            trajectory(
                0.0,
                vec![action("solver", 3.0, false), action("verifier", 5.0, true)],
            ),
        ];
        let timing = [
            TimingLine {
                phase: "eval".into(),
                wall_s: 10.0,
                ..TimingLine::default()
            },
            TimingLine {
                phase: "train".into(),
                wall_s: 30.0,
                rollout_s: 12.0,
                sandbox_s: 2.0,
                coach_s: 9.0,
                coach_last_s: 4.0,
                update_s: 14.0,
                ..TimingLine::default()
            },
        ];
        let note = Some("Replies began with a prefix.");
        let md = render(
            Path::new("r"),
            "verifier",
            note,
            &metrics,
            &trajectories,
            &timing,
        );
        assert!(md.contains("Base 25.0% -> final 50.0% (step 1)."), "{md}");
        assert!(
            md.contains("## The coach\n\nReplies began with a prefix.\n\nReplies that parsed"),
            "{md}"
        );
        assert!(
            md.contains(
                "parsed to a score: 4 of 6 coached actions (66.7%). Fallbacks by reason: format 1."
            ),
            "{md}"
        );
        // Verifier: 8 on a success (agrees), 6 on a failure (a "right" verdict that disagrees).
        assert!(
            md.contains("1 of 2 (50.0%). Right and succeeded 1, right but failed 1"),
            "{md}"
        );
        assert!(
            md.contains("| solver | 3 | 66.7% | 5.00 | 0 0 0 1 0 0 0 1 0 0 0 |"),
            "{md}"
        );
        assert!(
            md.contains("| training: generation (rollout minus sandbox) | 10 | 25% |"),
            "{md}"
        );
        assert!(
            md.contains("| total (evaluations and steps) | 40 | 100% |"),
            "{md}"
        );
    }

    #[test]
    fn agreement_counts_both_kinds_of_error() {
        let a = Agreement {
            right_succeeded: 3,
            right_failed: 1,
            wrong_succeeded: 2,
            wrong_failed: 4,
        };
        assert_eq!(a.total(), 10);
        assert_eq!(a.rate(), Some(0.7));
        assert_eq!(Agreement::default().rate(), None);
    }
}
