//! Credit assignment and REINFORCE++ advantage maths for MAPPA (docs/METHOD.md
//! sections 4 and 5), on plain `f64` slices.
//!
//! The trainer turns a rollout step into advantages in three stages, each a
//! module here:
//!
//! 1. [`strategy`]: a [`CreditStrategy`] gives every action of a
//!    [`ScoredTrajectory`] one scalar reward, clipped to [-10, 10].
//! 2. [`shaping`]: [`shape`] spreads one action's reward over its completion
//!    tokens, adds the KL penalty ([`KlConfig`]) and computes discounted returns.
//! 3. [`normalise`]: [`advantages`] standardises the returns of a step's
//!    samples over a [`NormScope`].
//!
//! [`CreditConfig`] bundles the choices; its [`Default`] is the paper's setup.
//!
//! Beside them, on the same plain numbers: [`mismatch`] measures how far the
//! rollout policy's log-probs are from the trainer's, and [`correction`]
//! turns that into importance weights (`[train] rollout_correction`).
//!
//! # The menu (what an experiment manifest picks)
//!
//! Strategies, `strategy = { kind = "..." }`:
//! - `process`: the coach's score / 10 for each action (MAPPA; the default).
//! - `outcome`: the outcome (1/0 or a [0, 1] quality) for every action of
//!   every agent (the paper's outcome-only baseline).
//! - `outcome_final_agent`: the outcome for the actions of the last agent in
//!   the chain only; every other action gets 0.
//! - `mixed`, with `alpha` in [0, 1]: `alpha * process + (1 - alpha) * outcome`.
//! - `discounted_outcome`, with `gamma` in (0, 1]: `gamma^(n-1-k) * outcome`
//!   for action k of n (temporal credit).
//! - `min_form`: the minimum process reward of this and all later actions
//!   (Cheng et al. 2025, "Stop Summation: Min-Form Credit Assignment Is All
//!   Process Reward Model Needs for Reasoning").
//!
//! Normalisation scopes, `scope = "..."`:
//! - `per_agent_global`: over all valid tokens of all of one agent's samples
//!   in the step; agents are never pooled (the paper; the default).
//! - `all_agents_global`: over all valid tokens of the step, all agents pooled
//!   (an ablation, known to cause gradient spikes when agents' reward scales
//!   differ).
//! - `per_prompt_group`: over the samples of one (agent, prompt group) pair
//!   (GRPO-like).
//! - `group_mean_then_global`: subtract the (agent, prompt group) mean, then
//!   normalise per agent globally (REINFORCE++ with baseline).
//! - `none`: the returns themselves.
//!
//! KL, `[kl]`: `beta` (default 0.01), `estimator = "k1" | "k2" | "k3"`
//! (default k1), `placement = "reward" | "loss"` (default reward, the paper).
//! Discount: `gamma` in [0, 1] (default 1).
//!
//! ```
//! use mappa_credit::{CreditConfig, CreditStrategy, NormScope};
//!
//! let config: CreditConfig = serde_json::from_str(
//!     r#"{ "strategy": { "kind": "mixed", "alpha": 0.5 }, "scope": "per_prompt_group" }"#,
//! )
//! .unwrap();
//! assert_eq!(config.strategy, CreditStrategy::Mixed { alpha: 0.5 });
//! assert_eq!(config.scope, NormScope::PerPromptGroup);
//! assert_eq!(config.gamma, 1.0);
//! ```

#![warn(missing_docs)]

pub mod correction;
pub mod mismatch;
pub mod normalise;
pub mod shaping;
pub mod strategy;

use serde::{Deserialize, Serialize};

pub use correction::{Corrected, CorrectionLevel, CorrectionMode, RolloutCorrection};
pub use mismatch::{Mismatch, MismatchBand, MismatchTally};
pub use normalise::{advantages, normalise, NormScope, Normalised, SampleKey, UniformSets};
pub use shaping::{shape, KlConfig, KlEstimator, KlPlacement, Shaped};
pub use strategy::{CreditStrategy, ScoredAction, ScoredTrajectory};

/// Why a credit computation was refused. Every variant names the offending value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CreditError {
    /// A trajectory without actions.
    #[error("trajectory of prompt group {group} has no actions")]
    EmptyTrajectory {
        /// The trajectory's prompt group.
        group: usize,
    },
    /// A process score that is not a finite number in [0, 10].
    #[error(
        "trajectory of prompt group {group}, action {action}: process score {score} is not a finite number in [0, 10]"
    )]
    InvalidScore {
        /// The trajectory's prompt group.
        group: usize,
        /// The action's index in the chain.
        action: usize,
        /// The score.
        score: f64,
    },
    /// A non-finite outcome.
    #[error("trajectory of prompt group {group}: outcome {outcome} is not finite")]
    InvalidOutcome {
        /// The trajectory's prompt group.
        group: usize,
        /// The outcome.
        outcome: f64,
    },
    /// A configuration parameter out of its range.
    #[error("{name} = {value} is invalid: it must be {expected}")]
    InvalidParameter {
        /// The parameter, e.g. `mixed.alpha`.
        name: &'static str,
        /// Its value.
        value: f64,
        /// The allowed range, in words.
        expected: &'static str,
    },
    /// Inputs that should have matching lengths do not.
    #[error("length mismatch: {what} has length {found}, expected {expected}")]
    LengthMismatch {
        /// The input whose length is wrong, e.g. `mask` or `returns[3]`.
        what: String,
        /// The length it should have.
        expected: usize,
        /// The length it has.
        found: usize,
    },
    /// A NaN or infinite input at a valid position.
    #[error("{what} = {value} is not finite")]
    NonFinite {
        /// The input and position, e.g. `old_logprobs[2]`.
        what: String,
        /// The value.
        value: f64,
    },
}

/// The credit-assignment choices of an experiment, as read from a manifest.
///
/// Missing fields take their defaults; [`Default`] is the paper's setup:
/// process rewards, k1 KL in the reward with beta 0.01, gamma 1, per-agent
/// global normalisation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CreditConfig {
    /// Which reward each action gets.
    pub strategy: CreditStrategy,
    /// The KL penalty.
    pub kl: KlConfig,
    /// The per-token discount for returns, in [0, 1].
    pub gamma: f64,
    /// Over which tokens advantages are normalised.
    pub scope: NormScope,
    /// What normalisation does with a set whose rewards are all equal.
    #[serde(skip_serializing_if = "UniformSets::is_keep")]
    pub uniform: UniformSets,
}

impl Default for CreditConfig {
    fn default() -> Self {
        Self {
            strategy: CreditStrategy::Process,
            kl: KlConfig::default(),
            gamma: 1.0,
            scope: NormScope::PerAgentGlobal,
            uniform: UniformSets::Keep,
        }
    }
}

impl CreditConfig {
    /// Checks every parameter, so a bad manifest fails when it is read.
    pub fn validate(&self) -> Result<(), CreditError> {
        self.strategy.validate()?;
        self.kl.validate()?;
        self.uniform.validate(self.scope)?;
        shaping::check_gamma(self.gamma)
    }

    /// One reward per action of `t`: [`CreditStrategy::rewards`] with this strategy.
    pub fn rewards(&self, t: &ScoredTrajectory) -> Result<Vec<f64>, CreditError> {
        self.strategy.rewards(t)
    }

    /// One sample's per-token KL, rewards and returns: [`shape`] with this KL and gamma.
    pub fn shape(
        &self,
        reward: f64,
        old_logprobs: &[f64],
        ref_logprobs: &[f64],
        mask: &[bool],
    ) -> Result<Shaped, CreditError> {
        shape(
            reward,
            old_logprobs,
            ref_logprobs,
            mask,
            &self.kl,
            self.gamma,
        )
    }

    /// A step's advantages: [`normalise`] with this scope and handling of
    /// uniform sets; `rewards` has one reward per sample.
    pub fn advantages(
        &self,
        keys: &[SampleKey],
        rewards: &[f64],
        returns: &[Vec<f64>],
        masks: &[Vec<bool>],
    ) -> Result<Normalised, CreditError> {
        normalise(keys, rewards, returns, masks, self.scope, self.uniform)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_papers_setup() {
        let c = CreditConfig::default();
        assert_eq!(c.strategy, CreditStrategy::Process);
        assert_eq!(c.kl.beta, 0.01);
        assert_eq!(c.kl.estimator, KlEstimator::K1);
        assert_eq!(c.kl.placement, KlPlacement::Reward);
        assert_eq!(c.gamma, 1.0);
        assert_eq!(c.scope, NormScope::PerAgentGlobal);
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn reads_a_toml_manifest() {
        let c: CreditConfig = toml::from_str(
            r#"
            strategy = { kind = "mixed", alpha = 0.25 }
            scope = "group_mean_then_global"
            gamma = 0.9
            [kl]
            beta = 0.05
            estimator = "k3"
            placement = "loss"
            "#,
        )
        .unwrap();
        assert_eq!(
            c,
            CreditConfig {
                strategy: CreditStrategy::Mixed { alpha: 0.25 },
                kl: KlConfig {
                    beta: 0.05,
                    estimator: KlEstimator::K3,
                    placement: KlPlacement::Loss,
                },
                gamma: 0.9,
                scope: NormScope::GroupMeanThenGlobal,
                uniform: UniformSets::Keep,
            }
        );
    }

    #[test]
    fn uniform_sets_read_from_a_manifest_and_keep_is_not_written() {
        let read = |text: &str| toml::from_str::<CreditConfig>(text).map(|c| c.uniform);
        assert_eq!(read("").unwrap(), UniformSets::Keep);
        assert_eq!(read("uniform = \"skip\"").unwrap(), UniformSets::Skip);
        assert_eq!(
            read("uniform = { std_floor = 0.5 }").unwrap(),
            UniformSets::StdFloor(0.5)
        );
        assert!(read("uniform = \"drop\"").is_err());
        // Keep (the default) leaves the serialised config, and so run ids,
        // as they were before the option existed.
        let text = serde_json::to_string(&CreditConfig::default()).unwrap();
        assert!(!text.contains("uniform"), "{text}");
        let skip = CreditConfig {
            uniform: UniformSets::Skip,
            ..CreditConfig::default()
        };
        assert!(serde_json::to_string(&skip)
            .unwrap()
            .contains(r#""uniform":"skip""#));
        // A floor must be positive, and needs a scope that divides.
        for (floor, scope) in [(0.0, NormScope::PerAgentGlobal), (0.5, NormScope::None)] {
            let bad = CreditConfig {
                uniform: UniformSets::StdFloor(floor),
                scope,
                ..CreditConfig::default()
            };
            let message = bad.validate().unwrap_err().to_string();
            assert!(message.contains("uniform.std_floor"), "{message}");
        }
    }

    #[test]
    fn json_round_trip() {
        let c = CreditConfig {
            strategy: CreditStrategy::DiscountedOutcome { gamma: 0.5 },
            scope: NormScope::None,
            ..CreditConfig::default()
        };
        let text = serde_json::to_string(&c).unwrap();
        assert!(text.contains(r#""kind":"discounted_outcome""#), "{text}");
        assert!(text.contains(r#""scope":"none""#), "{text}");
        assert_eq!(serde_json::from_str::<CreditConfig>(&text).unwrap(), c);
    }

    #[test]
    fn rejects_unknown_fields_and_kinds() {
        assert!(toml::from_str::<CreditConfig>("scop = \"none\"").is_err());
        assert!(toml::from_str::<CreditConfig>("strategy = { kind = \"vibes\" }").is_err());
    }

    #[test]
    fn validate_names_the_bad_value() {
        let c = CreditConfig {
            gamma: 1.5,
            ..CreditConfig::default()
        };
        let message = c.validate().unwrap_err().to_string();
        assert!(message.contains("gamma = 1.5"), "{message}");
    }
}
