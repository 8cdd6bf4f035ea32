//! What a rollout records: every action with what is needed to train on it
//! (ids, old log-probs) and to audit it (messages, text, code, tool output,
//! files), and the coach's view of it.

use std::path::PathBuf;

use mappa_env::sandbox::Status;
use mappa_judge::{ActionContext, FileLists, GroundTruth, KnownSolution};
use serde::{Deserialize, Serialize};

use crate::policy::Message;
use crate::workflow::Workflow;

/// A task as the rollout engine receives it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskInput {
    /// Identifier (file-name safe).
    pub id: String,
    /// The prompt group: trajectories of the same task share it.
    pub group: usize,
    /// The text agents see (before the workflow's suffix).
    pub text: String,
    /// The text the coach sees, when it differs (DSBench: the raw Kaggle text).
    #[serde(default)]
    pub coach_text: Option<String>,
    /// Data files copied into the first agent's directory.
    #[serde(default)]
    pub inputs: Vec<PathBuf>,
    /// The reference answer or metrics (for the last agent's coach).
    #[serde(default)]
    pub ground_truth: Option<String>,
    /// The known solution of a generated task (for scripted coaches).
    #[serde(default)]
    pub solution: Option<KnownSolution>,
}

/// One action of one agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActionRecord {
    /// Index of the agent in the workflow.
    pub agent: usize,
    /// Its role.
    pub role: String,
    /// 0-based action number within the agent's turn.
    pub turn: usize,
    /// The agent's full input.
    pub messages: Vec<Message>,
    /// What it wrote.
    pub text: String,
    /// The prompt's token ids (empty for untokenised policies).
    pub prompt_ids: Vec<u32>,
    /// The completion's token ids.
    pub completion_ids: Vec<u32>,
    /// Per-token log-probs at generation time.
    pub old_logprobs: Vec<f32>,
    /// Generation hit the token limit before EOS.
    pub truncated: bool,
    /// The Python it ran, if any.
    pub code: Option<String>,
    /// The tool output shown to the agent, if code ran.
    pub tool_observation: Option<String>,
    /// The sandbox status, if code ran.
    pub tool_status: Option<Status>,
    /// Files in the agent's directory when the action started.
    pub files_available: Vec<String>,
    /// Files saved by earlier agents and by this agent up to this action.
    pub files_saved: Vec<String>,
}

/// One run of the workflow on one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// The task's id.
    pub task_id: String,
    /// The prompt group.
    pub group: usize,
    /// Which sample of the task this is.
    pub sample: usize,
    /// Every action, in order.
    pub actions: Vec<ActionRecord>,
    /// The last message of the workflow's final-answer agent.
    pub final_output: Option<String>,
    /// The trajectory's working directory.
    pub workdir: PathBuf,
}

impl Trajectory {
    /// The coach's view of every action, in order (docs/METHOD.md section 3).
    pub fn coach_contexts(&self, workflow: &Workflow, task: &TaskInput) -> Vec<ActionContext> {
        action_contexts(workflow, task, self.sample, &self.actions)
    }
}

/// The coach's view of some actions of one trajectory (sample `sample` of
/// `task`): what [`Trajectory::coach_contexts`] gives for a whole trajectory,
/// usable while the trajectory is still running.
pub fn action_contexts(
    workflow: &Workflow,
    task: &TaskInput,
    sample: usize,
    actions: &[ActionRecord],
) -> Vec<ActionContext> {
    let last_agent = workflow.agents.len() - 1;
    let data_task = workflow.hands_off_files();
    actions
        .iter()
        .map(|a| ActionContext {
            id: format!("{}/s{}/{}/{}", task.id, sample, a.role, a.turn),
            task: task
                .coach_text
                .clone()
                .unwrap_or_else(|| workflow.task_text(&task.text)),
            role: a.role.clone(),
            agent_input: a
                .messages
                .iter()
                .map(|m| format!("[{}]\n{}", m.role, m.content))
                .collect::<Vec<_>>()
                .join("\n\n"),
            output: a.text.clone(),
            tool_observation: a.tool_observation.clone(),
            files: data_task.then(|| FileLists {
                available: a.files_available.clone(),
                saved: a.files_saved.clone(),
            }),
            ground_truth: task.ground_truth.as_deref().map(GroundTruth::from),
            is_last_agent: a.agent == last_agent,
            solution: task.solution.clone().map(|mut s| {
                s.required_files = workflow.agents[a.agent].required_files.clone();
                s
            }),
        })
        .collect()
}
