//! Training for mappa: one REINFORCE++ learner per agent, each with its own
//! weights, frozen reference and optimiser (docs/METHOD.md section 5).
//!
//! - The learner itself is `mappa-learner`'s, re-exported here under its
//!   own module names: [`config`], [`schedule`], [`loss`], [`params`],
//!   [`optim`], [`learner`] ([`AgentLearner`]) and [`data_parallel`].
//! - [`policy`]: the burn model as a `mappa_agents::Policy`.
//! - [`engine`]: rollouts by an inference engine (vLLM's API), with each
//!   agent's LoRA adapter hot-loaded after every update.
//! - [`step`]: from scored trajectories to per-agent samples through
//!   `mappa-credit` (strategy, KL shaping, returns, normalisation scope).
//! - [`manifest`]: experiment manifests, their resolution and lock file.
//! - [`run`]: the training loop of a manifest, with evaluation, metrics,
//!   checkpoints and exact resume.
//! - [`sft`]: supervised fine-tuning on demonstrations (warm starts).
//! - [`warm_start`]: scripted-teacher demonstrations and SFT before RL, cached.
//! - [`checkpoint`]: per-agent weights (HF safetensors), optimiser state,
//!   schedule position, RNG streams and counters, with a sha256 index; a
//!   resumed run is bit-identical on the CPU backend.
//!
//! Everything is generic over `B: AutodiffBackend`; the concrete backend is
//! chosen by the caller.

#![warn(missing_docs)]

pub mod checkpoint;
pub mod engine;
pub mod files;
pub mod lock;
pub mod machine;
pub mod manifest;
pub mod memory;
pub mod policy;
pub mod progress;
pub mod records;
pub mod run;
pub mod sft;
pub mod step;
pub mod tasks;
pub mod warm_start;

pub use mappa_learner::{config, data_parallel, learner, loss, optim, params, schedule};
pub use mappa_learner::{
    AgentLearner, LearnerError, LossConfig, StepMetrics, TrainConfig, TrainSample,
};
pub use policy::ModelPolicy;
pub use step::{build_samples, loss_config, RolloutAction, RolloutTrajectory};

/// Errors of training.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Bad hyper-parameters.
    #[error("training configuration: {0}")]
    Config(String),
    /// A learner's update failed.
    #[error(transparent)]
    Learner(#[from] LearnerError),
    /// Inconsistent samples.
    #[error("training input: {0}")]
    Input(String),
    /// The model failed.
    #[error("model: {0}")]
    Model(#[from] mappa_model::ModelError),
    /// A model directory could not be used.
    #[error("model {path}: {source}")]
    ModelAt {
        /// The model directory.
        path: String,
        /// The failure.
        #[source]
        source: mappa_model::ModelError,
    },
    /// A workflow or rollout failed.
    #[error(transparent)]
    Agent(#[from] mappa_agents::AgentError),
    /// The coach, its configuration or its cache failed.
    #[error("coach: {0}")]
    Coach(#[from] mappa_judge::CoachError),
    /// Credit assignment refused its input.
    #[error("credit: {0}")]
    Credit(#[from] mappa_credit::CreditError),
    /// The sandbox could not be set up.
    #[error(transparent)]
    Sandbox(#[from] mappa_env::sandbox::SandboxError),
    /// A non-finite loss or gradient.
    #[error("non-finite values: {0}")]
    NonFinite(String),
    /// A checkpoint problem; names the file.
    #[error("checkpoint {path}: {message}")]
    Checkpoint {
        /// The file or directory.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The inference engine of `[rollout.engine]` failed or refused.
    #[error("inference engine: {0}")]
    Engine(String),
    /// A file utility failed (names the file).
    #[error(transparent)]
    Core(#[from] mappa_core::CoreError),
    /// A line of a run's records (`metrics.jsonl`, `trajectories.jsonl`) is not what this mappa reads.
    #[error("{path}:{line}: {message}")]
    Record {
        /// The file.
        path: String,
        /// The 1-based line.
        line: usize,
        /// What was expected.
        message: String,
    },
}

impl TrainError {
    /// A model failure on the model directory `path`.
    pub fn model_at(path: &std::path::Path, source: mappa_model::ModelError) -> Self {
        TrainError::ModelAt {
            path: path.display().to_string(),
            source,
        }
    }

    /// An I/O failure on `path`.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        TrainError::Io {
            path: path.display().to_string(),
            source,
        }
    }
}
