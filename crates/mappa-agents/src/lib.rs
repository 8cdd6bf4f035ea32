//! Multi-agent workflows and the rollout engine (no tensor library).
//!
//! - [`workflow`]: declarative workflows read from `experiments/workflows/`:
//!   roles, prompts, tools, action limits, stop conditions, visibility,
//!   required and passed files.
//! - [`policy`]: the [`Policy`] trait (a batch of chat prompts in, completions
//!   with token ids and log-probs out) and a scripted policy for tests.
//! - [`remote`]: a served model (vLLM, SGLang, ...) as an evaluation-only policy.
//! - [`rollout`]: runs a workflow over tasks: batched generation per agent
//!   and turn, the Python tool in the sandbox, file hand-offs.
//! - [`trajectory`]: what a rollout records, and the coach's view of it.

#![warn(missing_docs)]

pub mod policy;
pub mod remote;
pub mod rollout;
pub mod trajectory;
pub mod workflow;

pub use policy::{Message, Policy, PolicyOutput, PolicyRequest, ReplyFormat, ScriptedPolicy};
pub use remote::RemotePolicy;
pub use rollout::RolloutEngine;
pub use trajectory::{action_contexts, ActionRecord, TaskInput, Trajectory};
pub use workflow::{AgentSpec, Tool, Workflow};

/// Errors of workflows and rollouts.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A malformed workflow.
    #[error("workflow: {0}")]
    Workflow(String),
    /// A policy failed.
    #[error("policy: {0}")]
    Policy(String),
    /// The sandbox failed to run code (a failing program is an observation, not an error).
    #[error("sandbox: {0}")]
    Sandbox(#[from] mappa_env::sandbox::SandboxError),
}
