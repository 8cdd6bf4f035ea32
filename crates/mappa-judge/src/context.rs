//! What the coach reads about one action, and what it returns.

use mappa_env::tabular::Outcome;
use serde::{Deserialize, Serialize};

/// File lists shown to the coach for data tasks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileLists {
    /// Files the agent could use when it acted (task data, files passed to it).
    #[serde(default)]
    pub available: Vec<String>,
    /// Files saved by earlier agents of the trajectory and by this action.
    #[serde(default)]
    pub saved: Vec<String>,
}

/// What a generated (synthetic) task knows about its solution; read only by
/// scripted coaches, never shown to an LLM coach.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KnownSolution {
    /// Task type, for per-type bias (`"math"`, `"classification"`, `"regression"`).
    pub task_kind: String,
    /// The final answer, when the task has one.
    #[serde(default)]
    pub answer: Option<String>,
    /// Intermediate values a good action states or computes (solution steps).
    #[serde(default)]
    pub checkpoints: Vec<String>,
    /// Files this agent must save for the next one (for data tasks).
    #[serde(default)]
    pub required_files: Vec<String>,
    /// Achieved quality relative to the known optimum, in [0, 1] (for the
    /// agent whose output is scored on the task metric).
    #[serde(default)]
    pub quality: Option<f64>,
    /// The right plan for the problem (a Python expression): what a solver
    /// re-derives from the problem statement; read by the input-only
    /// scripted coach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

/// What the last agent's coach may be shown as the ground truth. In JSON a
/// string is an answer and an object a graded submission.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GroundTruth {
    /// The reference answer (MathChat).
    Answer(String),
    /// The graded submission (DSBench): its scores, or why it failed.
    Submission(Box<Outcome>),
}

impl GroundTruth {
    /// The text the coach prompt shows: the answer, or the submission's
    /// evaluation as JSON.
    pub fn render(&self) -> String {
        match self {
            GroundTruth::Answer(answer) => answer.clone(),
            GroundTruth::Submission(outcome) => {
                serde_json::to_string(outcome).expect("an outcome serialises")
            }
        }
    }
}

impl From<&str> for GroundTruth {
    fn from(answer: &str) -> Self {
        GroundTruth::Answer(answer.to_string())
    }
}

/// One action in context: everything the coach may read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ActionContext {
    /// An identifier for messages (trajectory, agent, turn), e.g. `"t3/verifier/1"`.
    #[serde(default)]
    pub id: String,
    /// The task text the coach sees (the raw text, for DSBench).
    pub task: String,
    /// The agent's role id (`problem_solver`, `code_executor`, `verifier`,
    /// `data_engineer`, `modeler`, `analyst`): it selects the rubric.
    pub role: String,
    /// The agent's full input (its rendered prompt or conversation).
    pub agent_input: String,
    /// The agent's output.
    pub output: String,
    /// The last tool observation (code output), if any.
    #[serde(default)]
    pub tool_observation: Option<String>,
    /// File lists, for data tasks.
    #[serde(default)]
    pub files: Option<FileLists>,
    /// The ground truth (MathChat: the reference answer; DSBench: the graded
    /// submission). Shown only to the last agent's coach, and only when
    /// `coach_sees_ground_truth` is on.
    #[serde(default)]
    pub ground_truth: Option<GroundTruth>,
    /// Whether this is the last agent of the chain.
    #[serde(default)]
    pub is_last_agent: bool,
    /// For scripted coaches on generated tasks.
    #[serde(default)]
    pub solution: Option<KnownSolution>,
}

/// The coach's verdict on one action.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionScore {
    /// The process score in [0, 10].
    pub score: f64,
    /// The coach's short analysis.
    pub rationale: String,
    /// Whether the configured fallback score was used.
    pub fallback: bool,
    /// Why, when `fallback`: `"format"` (no score after the re-prompt: the
    /// coach's answer) or `"request-failed after N attempts: ..."` (no
    /// answer at all; never cached).
    #[serde(default)]
    pub fallback_reason: Option<String>,
    /// `ANSWER_CORRECT`, when the coach was asked for it.
    #[serde(default)]
    pub answer_correct: Option<bool>,
    /// The coach's raw reply (the re-prompt's reply after a format failure).
    pub raw_response: String,
    /// Which coach scored it (scripted coaches say `scripted` in their name).
    pub coach: String,
    /// sha256 of the rubric template (empty for scripted coaches).
    #[serde(default)]
    pub template_sha256: String,
    /// Whether the score came from the cache.
    #[serde(default)]
    pub cached: bool,
    /// A simulated coach's verdict against the truth, where the truth is
    /// known (LLM coaches: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<Audit>,
}

/// A simulated coach's verdict on an action against the truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Audit {
    /// Whether the coach judged the action right.
    pub judged_right: bool,
    /// Whether the agent did its own part right, given its input.
    pub truly_right: bool,
}

impl Audit {
    /// Whether the verdict agrees with the truth.
    pub fn agrees(&self) -> bool {
        self.judged_right == self.truly_right
    }
}

/// Audited actions of one role, counted by whether the agent was wrong and
/// whether the coach was: how often they fail together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorTable {
    /// Audited actions.
    pub actions: usize,
    /// Of which the agent did its part wrong.
    pub agent_wrong: usize,
    /// Of which the coach's verdict disagreed with the truth.
    pub coach_wrong: usize,
    /// Of which both.
    pub both: usize,
}

impl ErrorTable {
    /// Count one audited action.
    pub fn add(&mut self, audit: Audit) {
        let (agent, coach) = (!audit.truly_right, !audit.agrees());
        self.actions += 1;
        self.agent_wrong += usize::from(agent);
        self.coach_wrong += usize::from(coach);
        self.both += usize::from(agent && coach);
    }

    /// The sum of two tables.
    pub fn merged(self, other: Self) -> Self {
        Self {
            actions: self.actions + other.actions,
            agent_wrong: self.agent_wrong + other.agent_wrong,
            coach_wrong: self.coach_wrong + other.coach_wrong,
            both: self.both + other.both,
        }
    }

    /// The coach's accuracy: the share of actions it judged as the truth has it.
    pub fn coach_accuracy(&self) -> Option<f64> {
        (self.actions > 0).then(|| 1.0 - self.coach_wrong as f64 / self.actions as f64)
    }

    /// The phi coefficient (Pearson's correlation of the two 0/1
    /// variables) between the coach being wrong and the agent being wrong;
    /// `None` when either never or always happens.
    pub fn phi(&self) -> Option<f64> {
        let n = self.actions as f64;
        let (a, c, both) = (
            self.agent_wrong as f64,
            self.coach_wrong as f64,
            self.both as f64,
        );
        let spread = a * (n - a) * c * (n - c);
        (spread > 0.0).then(|| (n * both - a * c) / spread.sqrt())
    }
}

/// Why an action got the fallback score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FallbackKind {
    /// The coach answered, but without a score even after the re-prompt
    /// (its answer, cached like any other).
    Format,
    /// Every request failed: the coach never answered (never cached).
    RequestFailed,
}

impl FallbackKind {
    /// Both kinds, in report order.
    pub const ALL: [FallbackKind; 2] = [FallbackKind::Format, FallbackKind::RequestFailed];

    /// The name used in metrics and reports (`format`, `request-failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            FallbackKind::Format => "format",
            FallbackKind::RequestFailed => "request-failed",
        }
    }
}

impl ActionScore {
    /// Why the fallback score was used; `None` for a real score.
    pub fn fallback_kind(&self) -> Option<FallbackKind> {
        if !self.fallback {
            return None;
        }
        let reason = self.fallback_reason.as_deref().unwrap_or("");
        Some(if reason.starts_with("request-failed") {
            FallbackKind::RequestFailed
        } else {
            FallbackKind::Format
        })
    }

    /// Whether the fallback score stands in for a coach that never answered
    /// (its requests failed), rather than for a malformed answer.
    pub fn request_failed(&self) -> bool {
        self.fallback_kind() == Some(FallbackKind::RequestFailed)
    }

    /// The reward the trainer uses: `score / 10`, in [0, 1].
    pub fn reward(&self) -> f64 {
        self.score / 10.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: &[(bool, bool, usize)]) -> ErrorTable {
        let mut t = ErrorTable::default();
        for &(judged_right, truly_right, n) in rows {
            for _ in 0..n {
                t.add(Audit {
                    judged_right,
                    truly_right,
                });
            }
        }
        t
    }

    #[test]
    fn phi_is_the_correlation_of_coach_and_agent_errors() {
        // The coach errs exactly on the agent's wrong actions: phi = 1.
        let together = table(&[(true, true, 30), (true, false, 10)]);
        assert_eq!(
            (together.agent_wrong, together.coach_wrong, together.both),
            (10, 10, 10)
        );
        assert!((together.phi().unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(together.coach_accuracy(), Some(0.75));
        // Errors at the same rate on right and wrong actions: phi = 0.
        let independent = table(&[
            (true, true, 18),
            (false, true, 2),
            (false, false, 18),
            (true, false, 2),
        ]);
        assert!(independent.phi().unwrap().abs() < 1e-12);
        // A coach that never errs has no correlation to report.
        assert_eq!(table(&[(true, true, 3), (false, false, 3)]).phi(), None);
        let sum = together.merged(independent);
        assert_eq!(sum.actions, 80);
        assert_eq!(sum.both, 12);
    }
}
