//! The records a run writes, as types: one [`MetricsLine`] per line of
//! `metrics.jsonl` (and `eval.jsonl`), one [`TrajectoryLine`] per line of
//! `trajectories.jsonl`. The writer ([`crate::run`]) and every reader (the
//! reports, studies, `mappa inspect`) use these types, so a renamed field is
//! a compile error, not a silently empty report.
//!
//! Every line carries the schema version it was written with
//! ([`SCHEMA_VERSION`]). Lines without one were written before versions
//! existed (version 0, the same fields) and are still read; lines of a
//! newer version, or that do not match the fields, are refused with the
//! file, line and what was expected.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use mappa_env::sandbox::Status;
use mappa_env::tabular::FairSummary;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::learner::StepMetrics;
use crate::TrainError;

/// The version of the record layout this build writes; bump it when a
/// field changes meaning or goes away (and say in [`read_jsonl`]'s error
/// what changed).
pub const SCHEMA_VERSION: u32 = 1;

/// One line of `metrics.jsonl`: a training step or an evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum MetricsLine {
    /// A training step.
    Train(TrainLine),
    /// An evaluation on the held-out tasks.
    Eval(EvalLine),
}

impl MetricsLine {
    /// The training step the line belongs to.
    pub fn step(&self) -> usize {
        match self {
            MetricsLine::Train(t) => t.step,
            MetricsLine::Eval(e) => e.step,
        }
    }

    /// The evaluation, if this is one.
    pub fn as_eval(&self) -> Option<&EvalLine> {
        match self {
            MetricsLine::Eval(e) => Some(e),
            MetricsLine::Train(_) => None,
        }
    }

    /// The training step, if this is one.
    pub fn as_train(&self) -> Option<&TrainLine> {
        match self {
            MetricsLine::Train(t) => Some(t),
            MetricsLine::Eval(_) => None,
        }
    }
}

/// What one training step did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainLine {
    /// The record layout ([`SCHEMA_VERSION`]; 0 when absent).
    #[serde(default)]
    pub schema: u32,
    /// The step (0-based).
    pub step: usize,
    /// The share of the step's trajectories graded a success.
    pub train_accuracy: f64,
    /// The coach's mean score per role.
    pub coach_mean_score: BTreeMap<String, f64>,
    /// A simulated coach's accuracy per role: the share of the step's
    /// actions whose verdict (right or wrong) agreed with the truth (did
    /// the agent do its part right, given its input). Empty for coaches
    /// whose truth is unknown (LLM coaches).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub coach_accuracy: BTreeMap<String, f64>,
    /// A simulated coach's errors against the agents' per role, from the
    /// same audit: how often they fail on the same actions (absent for
    /// coaches whose truth is unknown, and in records written before it
    /// existed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub coach_errors: BTreeMap<String, mappa_judge::ErrorTable>,
    /// Actions that got the coach's fallback score, by reason (`format`: the
    /// coach answered without a score; `request-failed`: it never answered).
    /// Absent in records written before it existed.
    #[serde(default)]
    pub coach_fallbacks: BTreeMap<String, usize>,
    /// Whether every trajectory of the step failed, or every one succeeded:
    /// then outcome-only credit has nothing to compare (after normalisation
    /// its advantages are zero, and the step teaches only the KL term).
    /// None for a step with both outcomes, and in records written before it
    /// existed.
    #[serde(default)]
    pub uniform_outcome: Option<UniformOutcome>,
    /// The normalisation sets whose rewards were all equal, where
    /// `[credit] uniform` handles them other than by keeping them (absent
    /// under `keep`, and in records written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uniform_sets: Option<UniformSetsLine>,
    /// The share of tool-using agents' actions that ran code (`None`
    /// when the workflow has no tool).
    pub tool_call_rate: Option<f64>,
    /// Per agent (by role), the rollout-trainer mismatch over its valid
    /// tokens ([`mappa_credit::mismatch`]); empty where the rollout's
    /// log-probs do not compare with the trainer's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rollout_mismatch: BTreeMap<String, mappa_credit::Mismatch>,
    /// Per agent, what `[train] rollout_correction` did; empty when off.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rollout_correction: BTreeMap<String, crate::step::CorrectionLine>,
    /// Each agent's optimiser step.
    pub agents: Vec<StepMetrics>,
}

/// A step's normalisation sets and those whose rewards were all equal.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UniformSetsLine {
    /// How they were handled (`[credit] uniform`).
    pub handling: mappa_credit::UniformSets,
    /// Sets with a valid token (per the normalisation scope).
    pub sets: usize,
    /// Those whose samples' rewards were all equal.
    pub uniform: usize,
}

/// A training step whose trajectories all ended the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UniformOutcome {
    /// Every trajectory failed.
    AllFailed,
    /// Every trajectory succeeded.
    AllSucceeded,
}

impl UniformOutcome {
    /// The step's uniform outcome, if its `outcomes` (1 success, 0 failure) are all equal.
    pub fn of(outcomes: impl IntoIterator<Item = f64>) -> Option<Self> {
        let (mut any_success, mut any_failure) = (false, false);
        for outcome in outcomes {
            if outcome > 0.5 {
                any_success = true;
            } else {
                any_failure = true;
            }
        }
        match (any_success, any_failure) {
            (true, false) => Some(UniformOutcome::AllSucceeded),
            (false, true) => Some(UniformOutcome::AllFailed),
            _ => None,
        }
    }
}

impl TrainLine {
    /// One agent's optimiser step, by role.
    pub fn agent(&self, role: &str) -> Option<&StepMetrics> {
        self.agents.iter().find(|a| a.agent == role)
    }
}

/// One evaluation on the held-out tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalLine {
    /// The record layout ([`SCHEMA_VERSION`]; 0 when absent).
    #[serde(default)]
    pub schema: u32,
    /// The training step the weights had reached.
    pub step: usize,
    /// The share of trajectories graded a success (the task family's
    /// metric: right answers, or valid submissions).
    pub accuracy: f64,
    /// Trajectories evaluated.
    pub trajectories: usize,
    /// DSBench's fair metrics, for tasks graded on a submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tabular: Option<FairSummary>,
    /// The checkpoint evaluated (`mappa eval --run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// The served policy evaluated (`mappa eval --endpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

/// One trajectory of a training step, with its coach scores and credit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryLine {
    /// The record layout ([`SCHEMA_VERSION`]; 0 when absent).
    #[serde(default)]
    pub schema: u32,
    /// The training step.
    pub step: usize,
    /// The task's id.
    pub task_id: String,
    /// Which sample of the task.
    pub sample: usize,
    /// The graded outcome.
    pub outcome: f64,
    /// Every action, in order.
    pub actions: Vec<ActionLine>,
}

/// One action of a recorded trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionLine {
    /// The agent's role.
    pub role: String,
    /// The action's number within the agent's turn.
    pub turn: usize,
    /// What the agent wrote.
    pub text: String,
    /// Generation hit the token limit.
    pub truncated: bool,
    /// The Python it ran.
    pub code: Option<String>,
    /// The tool output it was shown.
    pub tool_observation: Option<String>,
    /// The sandbox status.
    pub tool_status: Option<Status>,
    /// The coach's score in [0, 10].
    pub score: f64,
    /// The coach's rationale.
    pub rationale: String,
    /// Whether the coach's fallback score was used.
    pub coach_fallback: bool,
    /// The reward credit assignment gave the action.
    pub reward: f64,
    /// The mean advantage over its valid tokens.
    pub advantage_mean: f64,
}

/// One held-out trajectory of an evaluation (`eval-trajectories.jsonl`):
/// what each agent wrote and the graded outcome, so that evaluations can be
/// compared task by task (a paired test over problems) and their failures
/// read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalTrajectoryLine {
    /// The record layout ([`SCHEMA_VERSION`]; 0 when absent).
    #[serde(default)]
    pub schema: u32,
    /// The training step the weights had reached.
    pub step: usize,
    /// The task's id.
    pub task_id: String,
    /// Which sample of the task.
    pub sample: usize,
    /// The task's text, as the agents saw it (before the workflow's suffix).
    #[serde(default)]
    pub task: String,
    /// The reference answer, where the task has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The graded outcome.
    pub outcome: f64,
    /// Every action, in order.
    pub actions: Vec<EvalActionLine>,
}

/// One action of an evaluated trajectory (no coach, no credit).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalActionLine {
    /// The agent's role.
    pub role: String,
    /// The action's number within the agent's turn.
    pub turn: usize,
    /// The last message the agent was given (its prompt, or its tool's
    /// output on a later turn).
    #[serde(default)]
    pub input: String,
    /// What the agent wrote.
    pub text: String,
    /// Generation hit the token limit.
    pub truncated: bool,
    /// The Python it ran.
    pub code: Option<String>,
    /// The tool output it was shown.
    pub tool_observation: Option<String>,
}

/// Append `rows` to a JSON-lines file (created when absent), synced to disk.
pub fn append_jsonl<T: Serialize>(path: &Path, rows: &[T]) -> Result<(), TrainError> {
    let io = |e: std::io::Error| TrainError::io(path, e);
    let mut text = String::new();
    for row in rows {
        text.push_str(&serde_json::to_string(row).expect("records serialise"));
        text.push('\n');
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    file.write_all(text.as_bytes()).map_err(io)?;
    file.sync_data().map_err(io)
}

/// Read every line of a JSON-lines file of records. A line of a newer
/// schema, or one that does not parse as `T`, is an error naming the file
/// and line.
pub fn read_jsonl<T: DeserializeOwned>(path: &Path) -> Result<Vec<T>, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let bad = |line: usize, message: String| TrainError::Record {
        path: path.display().to_string(),
        line,
        message,
    };
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            #[derive(Deserialize)]
            struct Version {
                #[serde(default)]
                schema: u32,
            }
            let version: Version =
                serde_json::from_str(l).map_err(|e| bad(i + 1, e.to_string()))?;
            if version.schema > SCHEMA_VERSION {
                return Err(bad(
                    i + 1,
                    format!(
                        "written with record schema {}, this mappa reads up to {SCHEMA_VERSION}: use a newer mappa",
                        version.schema
                    ),
                ));
            }
            serde_json::from_str(l).map_err(|e| {
                bad(
                    i + 1,
                    format!("not a record of schema {} ({e})", version.schema),
                )
            })
        })
        .collect()
}

/// Keep only the lines of a JSON-lines file whose `step` is below `step`
/// (a resumed run rewrites what followed its checkpoint); atomic.
pub fn truncate_jsonl(path: &Path, step: usize) -> Result<(), TrainError> {
    #[derive(Deserialize)]
    struct Step {
        step: usize,
    }
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let kept: String = text
        .lines()
        .filter(|l| serde_json::from_str::<Step>(l).is_ok_and(|s| s.step < step))
        .map(|l| format!("{l}\n"))
        .collect();
    Ok(mappa_core::fs::write_atomic(path, kept.as_bytes())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(step: usize) -> MetricsLine {
        MetricsLine::Eval(EvalLine {
            schema: SCHEMA_VERSION,
            step,
            accuracy: 0.25,
            trajectories: 4,
            tabular: None,
            checkpoint: None,
            policy: None,
        })
    }

    #[test]
    fn uniform_outcomes_are_named() {
        assert_eq!(
            UniformOutcome::of([0.0, 0.0]),
            Some(UniformOutcome::AllFailed)
        );
        assert_eq!(
            UniformOutcome::of([1.0, 1.0]),
            Some(UniformOutcome::AllSucceeded)
        );
        assert_eq!(UniformOutcome::of([1.0, 0.0]), None);
        assert_eq!(UniformOutcome::of([]), None);
        let json = serde_json::to_string(&UniformOutcome::AllFailed).unwrap();
        assert_eq!(json, "\"all-failed\"");
    }

    #[test]
    fn lines_round_trip_and_resume_truncates_by_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        append_jsonl(&path, &[eval(0), eval(2)]).unwrap();
        append_jsonl(&path, &[eval(4)]).unwrap();
        let lines: Vec<MetricsLine> = read_jsonl(&path).unwrap();
        assert_eq!(lines, vec![eval(0), eval(2), eval(4)]);
        truncate_jsonl(&path, 3).unwrap();
        let lines: Vec<MetricsLine> = read_jsonl(&path).unwrap();
        assert_eq!(
            lines.iter().map(MetricsLine::step).collect::<Vec<_>>(),
            [0, 2]
        );
    }

    #[test]
    fn old_lines_are_read_and_newer_or_foreign_ones_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        // Written before schema versions: read as version 0.
        std::fs::write(
            &path,
            "{\"step\":0,\"kind\":\"eval\",\"accuracy\":0.5,\"trajectories\":2}\n",
        )
        .unwrap();
        let lines: Vec<MetricsLine> = read_jsonl(&path).unwrap();
        assert_eq!(lines[0].as_eval().unwrap().schema, 0);

        std::fs::write(&path, "{\"step\":0,\"kind\":\"eval\",\"schema\":99}\n").unwrap();
        let e = read_jsonl::<MetricsLine>(&path).unwrap_err().to_string();
        assert!(
            e.contains("metrics.jsonl:1") && e.contains("schema 99"),
            "{e}"
        );

        std::fs::write(&path, "\n{\"step\":0,\"kind\":\"eval\",\"acc\":1}\n").unwrap();
        let e = read_jsonl::<MetricsLine>(&path).unwrap_err().to_string();
        assert!(
            e.contains("metrics.jsonl:2") && e.contains("accuracy"),
            "{e}"
        );
    }
}
