//! One REINFORCE++ learner per agent, each with its own weights, frozen
//! reference and optimiser (docs/METHOD.md section 5): the update, without
//! the rollouts, the coach or the run around it (those are `mappa-train`'s).
//!
//! - [`config`]: the learner's hyper-parameters (the paper's by default).
//! - [`schedule`]: linear warm-up then cosine decay of the learning rate.
//! - [`loss`]: PPO-clip with optional dual clip and KL-in-loss.
//! - [`params`]: global gradient-norm clipping and parameter ids.
//! - [`optim`]: AdamW as burn computes it, one fused pass per parameter on
//!   the CPU backend.
//! - [`learner`]: [`AgentLearner`]: log-probs under policy and reference, and
//!   one optimiser step in micro-batches.
//! - [`data_parallel`]: an agent's micro-batches on several devices, their
//!   gradients summed by burn's collective all-reduce.
//!
//! Everything is generic over `B: AutodiffBackend`; the concrete backend is
//! chosen by the caller. The crate's dependencies stop at the model: the
//! determinism test (`tests/determinism.rs`), which trains through this
//! crate, is cross-built for 64-bit ARM in CI.

pub mod config;
pub mod data_parallel;
pub mod learner;
pub mod loss;
pub mod optim;
pub mod params;
pub mod schedule;

pub use config::TrainConfig;
pub use learner::{AgentLearner, StepMetrics, TrainSample};
pub use loss::LossConfig;

/// Errors of a learner's update.
#[derive(Debug, thiserror::Error)]
pub enum LearnerError {
    /// Bad hyper-parameters or devices.
    #[error("training configuration: {0}")]
    Config(String),
    /// Inconsistent samples.
    #[error("training input: {0}")]
    Input(String),
    /// The model failed.
    #[error("model: {0}")]
    Model(#[from] mappa_model::ModelError),
    /// A non-finite loss or gradient.
    #[error("non-finite values: {0}")]
    NonFinite(String),
    /// A data-parallel update failed while running (names the worker or
    /// the collective operation).
    #[error("data-parallel update: {0}")]
    DataParallel(String),
}
