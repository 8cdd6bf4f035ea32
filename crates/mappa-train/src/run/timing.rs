//! Where a run's time goes: one line per evaluation and training step in
//! `timing.jsonl`, beside the metrics but apart from them (times differ
//! between runs and machines; the metrics must not).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The wall-clock time of one evaluation or training step, by phase.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TimingLine {
    /// `eval` or `train`.
    pub phase: String,
    /// The step (an evaluation's is the step it was taken before).
    pub step: usize,
    /// The whole step, in seconds.
    pub wall_s: f64,
    /// Rolling out every agent: generation and the programs' runs.
    pub rollout_s: f64,
    /// Of the rollout, waiting for the sandbox's programs.
    pub sandbox_s: f64,
    /// Inside coach calls. The agents before the last are scored while the
    /// next one generates, so this overlaps `rollout_s`; the last agent's
    /// coaching (after grading) does not.
    pub coach_s: f64,
    /// Of `coach_s`, the last agent's coaching, which runs alone.
    pub coach_last_s: f64,
    /// Credit assignment and every agent's update.
    pub update_s: f64,
}

/// Seconds, as a timing line stores them.
pub(super) fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}
