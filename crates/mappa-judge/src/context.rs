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
