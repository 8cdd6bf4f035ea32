//! Credit-assignment strategies: which scalar reward each action of a scored
//! trajectory gets.
//!
//! A [`ScoredTrajectory`] is one multi-agent chain sampled for one prompt: its
//! actions in chain order, each with the coach's 0-10 process score, and the
//! trajectory's outcome. A [`CreditStrategy`] turns it into one reward per
//! action; rewards are finally clipped to [-[`REWARD_CLIP`], [`REWARD_CLIP`]]
//! (docs/METHOD.md section 5).
//!
//! To add a strategy, add a variant here and its arm in `rewards` (and in
//! `name`, and `validate` if it has parameters): one type in one place.

use serde::{Deserialize, Serialize};

use crate::CreditError;

/// The top of the coach's process-score scale.
pub const MAX_SCORE: f64 = 10.0;

/// Rewards are clipped to [-REWARD_CLIP, REWARD_CLIP].
pub const REWARD_CLIP: f64 = 10.0;

/// One agent action with the coach's process score.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ScoredAction {
    /// The acting agent's index.
    pub agent: usize,
    /// The coach's process score, in [0, 10].
    pub score: f64,
}

/// One sampled multi-agent trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredTrajectory {
    /// The prompt the trajectory was sampled for.
    pub group: usize,
    /// The outcome: 1.0 / 0.0 for a checked final answer, or a [0, 1] quality.
    pub outcome: f64,
    /// The actions, in chain order.
    pub actions: Vec<ScoredAction>,
}

/// How the reward of each action is computed. Chosen in a manifest as
/// `strategy = { kind = "...", ... }`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CreditStrategy {
    /// The coach's score / 10 for each action (MAPPA).
    #[default]
    Process,
    /// The outcome for every action of every agent (the paper's outcome-only
    /// baseline, docs/METHOD.md section 4).
    Outcome,
    /// The outcome for the actions of the last agent in the chain (the agent
    /// of the last action); 0 for every other action.
    OutcomeFinalAgent,
    /// `alpha * process + (1 - alpha) * outcome`.
    Mixed {
        /// The weight of the process reward, in [0, 1].
        alpha: f64,
    },
    /// The outcome discounted by the number of later actions:
    /// `gamma^(n-1-k) * outcome` for action k of n (a temporal-credit baseline
    /// common in multi-turn RL).
    DiscountedOutcome {
        /// The per-action discount, in (0, 1].
        gamma: f64,
    },
    /// The minimum process reward (score / 10) of this action and all later
    /// ones: min-form credit assignment, from Cheng et al. 2025, "Stop
    /// Summation: Min-Form Credit Assignment Is All Process Reward Model Needs
    /// for Reasoning".
    MinForm,
}

impl CreditStrategy {
    /// One reward per action of `t`, in chain order, clipped to [-10, 10].
    ///
    /// Errors on an invalid parameter, an empty trajectory, a score that is not
    /// a finite number in [0, 10], or a non-finite outcome.
    pub fn rewards(&self, t: &ScoredTrajectory) -> Result<Vec<f64>, CreditError> {
        self.validate()?;
        validate_trajectory(t)?;
        let n = t.actions.len();
        let process = || t.actions.iter().map(|a| a.score / MAX_SCORE);
        let rewards: Vec<f64> = match *self {
            Self::Process => process().collect(),
            Self::Outcome => vec![t.outcome; n],
            Self::OutcomeFinalAgent => {
                let last = t.actions[n - 1].agent;
                t.actions
                    .iter()
                    .map(|a| if a.agent == last { t.outcome } else { 0.0 })
                    .collect()
            }
            Self::Mixed { alpha } => process()
                .map(|p| alpha * p + (1.0 - alpha) * t.outcome)
                .collect(),
            Self::DiscountedOutcome { gamma } => (0..n)
                .map(|k| gamma.powf((n - 1 - k) as f64) * t.outcome)
                .collect(),
            Self::MinForm => suffix_min(process().collect()),
        };
        Ok(rewards.into_iter().map(clip_reward).collect())
    }

    /// A short name for reports, with parameters, e.g. `mixed(alpha=0.5)`.
    pub fn name(&self) -> String {
        match self {
            Self::Process => "process".to_string(),
            Self::Outcome => "outcome".to_string(),
            Self::OutcomeFinalAgent => "outcome_final_agent".to_string(),
            Self::Mixed { alpha } => format!("mixed(alpha={alpha})"),
            Self::DiscountedOutcome { gamma } => format!("discounted_outcome(gamma={gamma})"),
            Self::MinForm => "min_form".to_string(),
        }
    }

    /// Checks the strategy's parameters.
    pub fn validate(&self) -> Result<(), CreditError> {
        match *self {
            Self::Mixed { alpha } if !(0.0..=1.0).contains(&alpha) => {
                Err(CreditError::InvalidParameter {
                    name: "mixed.alpha",
                    value: alpha,
                    expected: "in [0, 1]",
                })
            }
            Self::DiscountedOutcome { gamma } if !(gamma > 0.0 && gamma <= 1.0) => {
                Err(CreditError::InvalidParameter {
                    name: "discounted_outcome.gamma",
                    value: gamma,
                    expected: "in (0, 1]",
                })
            }
            _ => Ok(()),
        }
    }
}

/// Checks that `t` has actions, finite scores in [0, 10] and a finite outcome.
fn validate_trajectory(t: &ScoredTrajectory) -> Result<(), CreditError> {
    if t.actions.is_empty() {
        return Err(CreditError::EmptyTrajectory { group: t.group });
    }
    if let Some((action, a)) = t
        .actions
        .iter()
        .enumerate()
        .find(|(_, a)| !(0.0..=MAX_SCORE).contains(&a.score))
    {
        return Err(CreditError::InvalidScore {
            group: t.group,
            action,
            score: a.score,
        });
    }
    if !t.outcome.is_finite() {
        return Err(CreditError::InvalidOutcome {
            group: t.group,
            outcome: t.outcome,
        });
    }
    Ok(())
}

/// Replaces each value by the minimum of it and all later values.
fn suffix_min(mut values: Vec<f64>) -> Vec<f64> {
    let mut running = f64::INFINITY;
    for v in values.iter_mut().rev() {
        running = running.min(*v);
        *v = running;
    }
    values
}

fn clip_reward(r: f64) -> f64 {
    r.clamp(-REWARD_CLIP, REWARD_CLIP)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Agents 0, 1, 2, 1 with scores 8, 4, 6, 10; outcome 1.
    fn chain() -> ScoredTrajectory {
        ScoredTrajectory {
            group: 7,
            outcome: 1.0,
            actions: [(0, 8.0), (1, 4.0), (2, 6.0), (1, 10.0)]
                .into_iter()
                .map(|(agent, score)| ScoredAction { agent, score })
                .collect(),
        }
    }

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn process_is_score_over_ten() {
        let r = CreditStrategy::Process.rewards(&chain()).unwrap();
        assert_close(&r, &[0.8, 0.4, 0.6, 1.0]);
    }

    #[test]
    fn outcome_goes_to_every_action() {
        let mut t = chain();
        t.outcome = 0.0;
        assert_eq!(CreditStrategy::Outcome.rewards(&t).unwrap(), vec![0.0; 4]);
        t.outcome = 1.0;
        assert_eq!(CreditStrategy::Outcome.rewards(&t).unwrap(), vec![1.0; 4]);
    }

    #[test]
    fn outcome_final_agent_rewards_every_action_of_the_last_agent() {
        let r = CreditStrategy::OutcomeFinalAgent.rewards(&chain()).unwrap();
        assert_eq!(r, vec![0.0, 1.0, 0.0, 1.0]);
    }

    #[test]
    fn mixed_interpolates() {
        let mut t = chain();
        t.outcome = 0.0;
        let r = CreditStrategy::Mixed { alpha: 0.25 }.rewards(&t).unwrap();
        assert_close(&r, &[0.2, 0.1, 0.15, 0.25]);
        let ends = [
            (1.0, CreditStrategy::Process),
            (0.0, CreditStrategy::Outcome),
        ];
        for (alpha, same) in ends {
            assert_eq!(
                CreditStrategy::Mixed { alpha }.rewards(&chain()).unwrap(),
                same.rewards(&chain()).unwrap()
            );
        }
    }

    #[test]
    fn discounted_outcome_counts_later_actions() {
        let r = CreditStrategy::DiscountedOutcome { gamma: 0.5 }
            .rewards(&chain())
            .unwrap();
        assert_close(&r, &[0.125, 0.25, 0.5, 1.0]);
    }

    #[test]
    fn min_form_takes_the_minimum_of_the_suffix() {
        let r = CreditStrategy::MinForm.rewards(&chain()).unwrap();
        assert_close(&r, &[0.4, 0.4, 0.6, 1.0]);
    }

    #[test]
    fn rewards_are_clipped() {
        let mut t = chain();
        t.outcome = 50.0;
        assert_eq!(CreditStrategy::Outcome.rewards(&t).unwrap(), vec![10.0; 4]);
        t.outcome = -50.0;
        assert_eq!(CreditStrategy::Outcome.rewards(&t).unwrap(), vec![-10.0; 4]);
    }

    #[test]
    fn bad_scores_name_group_action_and_value() {
        for bad in [10.5, -0.1, f64::NAN, f64::INFINITY] {
            let mut t = chain();
            t.actions[2].score = bad;
            let err = CreditStrategy::Outcome.rewards(&t).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    "trajectory of prompt group 7, action 2: process score {bad} is not a finite number in [0, 10]"
                )
            );
        }
    }

    #[test]
    fn empty_trajectory_and_bad_outcome_are_errors() {
        let mut t = chain();
        t.outcome = f64::NAN;
        assert!(matches!(
            CreditStrategy::Process.rewards(&t),
            Err(CreditError::InvalidOutcome { group: 7, .. })
        ));
        t.actions.clear();
        assert_eq!(
            CreditStrategy::Process.rewards(&t),
            Err(CreditError::EmptyTrajectory { group: 7 })
        );
    }

    #[test]
    fn bad_parameters_name_the_value() {
        let cases = [
            (CreditStrategy::Mixed { alpha: 1.5 }, "mixed.alpha = 1.5"),
            (CreditStrategy::Mixed { alpha: -0.1 }, "mixed.alpha = -0.1"),
            (
                CreditStrategy::DiscountedOutcome { gamma: 0.0 },
                "discounted_outcome.gamma = 0",
            ),
            (
                CreditStrategy::DiscountedOutcome { gamma: f64::NAN },
                "discounted_outcome.gamma = NaN",
            ),
        ];
        for (strategy, needle) in cases {
            let message = strategy.rewards(&chain()).unwrap_err().to_string();
            assert!(message.contains(needle), "{message}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(CreditStrategy::Process.name(), "process");
        assert_eq!(
            CreditStrategy::Mixed { alpha: 0.5 }.name(),
            "mixed(alpha=0.5)"
        );
        assert_eq!(
            CreditStrategy::DiscountedOutcome { gamma: 0.9 }.name(),
            "discounted_outcome(gamma=0.9)"
        );
        assert_eq!(CreditStrategy::MinForm.name(), "min_form");
    }

    #[test]
    fn manifest_form() {
        let s: CreditStrategy = serde_json::from_str(r#"{"kind":"outcome_final_agent"}"#).unwrap();
        assert_eq!(s, CreditStrategy::OutcomeFinalAgent);
        let s: CreditStrategy = serde_json::from_str(r#"{"kind":"min_form"}"#).unwrap();
        assert_eq!(s, CreditStrategy::MinForm);
    }
}
