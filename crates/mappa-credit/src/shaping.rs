//! Per-token shaping of one sample (one action's completion): the KL penalty,
//! per-token rewards and discounted returns (docs/METHOD.md section 5, steps 1-3).
//!
//! The sequence reward goes on the last valid token; with
//! [`KlPlacement::Reward`] every valid token also gets `-beta * k_t`. Returns
//! are accumulated backwards over valid tokens only. Masked tokens (prompt,
//! padding, tool output) get KL 0, reward 0 and return 0, and their log-probs
//! are never read.

use serde::{Deserialize, Serialize};

use crate::CreditError;

/// Which per-token estimator of KL(pi_old || pi_ref) to use (Schulman,
/// "Approximating KL Divergence"). With `d = lp_old - lp_ref`:
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    /// `k1 = d` (unbiased, can be negative; the paper).
    #[default]
    K1,
    /// `k2 = d^2 / 2` (biased, non-negative).
    K2,
    /// `k3 = exp(-d) - 1 + d` (unbiased, non-negative).
    K3,
}

impl KlEstimator {
    /// The estimate for one token from its old-policy and reference log-probs.
    pub fn estimate(self, old_logprob: f64, ref_logprob: f64) -> f64 {
        let d = old_logprob - ref_logprob;
        match self {
            Self::K1 => d,
            Self::K2 => 0.5 * d * d,
            Self::K3 => (-d).exp_m1() + d,
        }
    }
}

/// Where the KL penalty acts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlPlacement {
    /// `-beta * k_t` is added to each valid token's reward (the paper).
    #[default]
    Reward,
    /// Not in the reward; [`Shaped::kl`] is for the trainer's loss.
    Loss,
}

/// The KL penalty. [`Default`]: beta 0.01, k1, in the reward (the paper).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KlConfig {
    /// The penalty's weight, finite and >= 0.
    pub beta: f64,
    /// The per-token estimator.
    pub estimator: KlEstimator,
    /// Reward or loss.
    pub placement: KlPlacement,
}

impl Default for KlConfig {
    fn default() -> Self {
        Self {
            beta: 0.01,
            estimator: KlEstimator::K1,
            placement: KlPlacement::Reward,
        }
    }
}

impl KlConfig {
    /// Checks that beta is finite and non-negative.
    pub fn validate(&self) -> Result<(), CreditError> {
        if self.beta.is_finite() && self.beta >= 0.0 {
            Ok(())
        } else {
            Err(CreditError::InvalidParameter {
                name: "kl.beta",
                value: self.beta,
                expected: "finite and >= 0",
            })
        }
    }
}

/// One sample's shaped per-token values; each vector has one entry per token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Shaped {
    /// The KL estimate `k_t` (unweighted; 0 at masked tokens).
    pub kl: Vec<f64>,
    /// The token rewards `r_t`.
    pub token_rewards: Vec<f64>,
    /// The returns `G_t = r_t + gamma * G_next`, next = the next valid token.
    pub returns: Vec<f64>,
}

/// Shapes one sample with sequence reward `reward`.
///
/// `old_logprobs`, `ref_logprobs` and `mask` have one entry per token; `mask`
/// is true at the tokens that are trained on. A sample with no valid token
/// gives all zeros. Errors on mismatched lengths, an invalid `kl` or `gamma`
/// (which must be in [0, 1]), or a non-finite reward or valid log-prob.
pub fn shape(
    reward: f64,
    old_logprobs: &[f64],
    ref_logprobs: &[f64],
    mask: &[bool],
    kl: &KlConfig,
    gamma: f64,
) -> Result<Shaped, CreditError> {
    kl.validate()?;
    check_gamma(gamma)?;
    check_finite("sequence reward".to_string(), reward)?;
    check_len("ref_logprobs", old_logprobs.len(), ref_logprobs.len())?;
    check_len("mask", old_logprobs.len(), mask.len())?;
    let kl_values = token_kl(old_logprobs, ref_logprobs, mask, kl.estimator)?;
    let token_rewards = token_rewards(reward, &kl_values, mask, kl);
    let returns = discounted_returns(&token_rewards, mask, gamma);
    Ok(Shaped {
        kl: kl_values,
        token_rewards,
        returns,
    })
}

/// Checks that the per-token discount is in [0, 1].
pub(crate) fn check_gamma(gamma: f64) -> Result<(), CreditError> {
    if (0.0..=1.0).contains(&gamma) {
        Ok(())
    } else {
        Err(CreditError::InvalidParameter {
            name: "gamma",
            value: gamma,
            expected: "in [0, 1]",
        })
    }
}

/// Checks an input's length against old_logprobs' length.
fn check_len(what: &str, expected: usize, found: usize) -> Result<(), CreditError> {
    if expected == found {
        Ok(())
    } else {
        Err(CreditError::LengthMismatch {
            what: what.to_string(),
            expected,
            found,
        })
    }
}

fn check_finite(what: String, value: f64) -> Result<(), CreditError> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(CreditError::NonFinite { what, value })
    }
}

/// `k_t` at valid tokens, 0 at masked ones.
fn token_kl(
    old_logprobs: &[f64],
    ref_logprobs: &[f64],
    mask: &[bool],
    estimator: KlEstimator,
) -> Result<Vec<f64>, CreditError> {
    (0..mask.len())
        .map(|t| {
            if !mask[t] {
                return Ok(0.0);
            }
            check_finite(format!("old_logprobs[{t}]"), old_logprobs[t])?;
            check_finite(format!("ref_logprobs[{t}]"), ref_logprobs[t])?;
            Ok(estimator.estimate(old_logprobs[t], ref_logprobs[t]))
        })
        .collect()
}

/// `r_t`: the KL penalty (if in the reward) at valid tokens, plus the sequence
/// reward on the last valid token.
fn token_rewards(reward: f64, kl_values: &[f64], mask: &[bool], kl: &KlConfig) -> Vec<f64> {
    let mut rewards: Vec<f64> = kl_values
        .iter()
        .map(|k| match kl.placement {
            KlPlacement::Reward => -kl.beta * k,
            KlPlacement::Loss => 0.0,
        })
        .collect();
    if let Some(last) = mask.iter().rposition(|&valid| valid) {
        rewards[last] += reward;
    }
    rewards
}

/// `G_t = r_t + gamma * G_t'`, t' the next valid token; 0 at masked tokens.
fn discounted_returns(rewards: &[f64], mask: &[bool], gamma: f64) -> Vec<f64> {
    let mut returns = vec![0.0; rewards.len()];
    let mut later = 0.0;
    for t in (0..rewards.len()).rev().filter(|&t| mask[t]) {
        later = rewards[t] + gamma * later;
        returns[t] = later;
    }
    returns
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    const OLD: [f64; 4] = [-1.0, -0.5, -2.0, -0.1];
    const REF: [f64; 4] = [-1.5, -0.5, -1.0, -0.3];

    #[test]
    fn estimators() {
        let d: f64 = 0.5;
        assert_close(&[KlEstimator::K1.estimate(-1.0, -1.5)], &[d]);
        assert_close(&[KlEstimator::K2.estimate(-1.0, -1.5)], &[0.125]);
        assert_close(
            &[KlEstimator::K3.estimate(-1.0, -1.5)],
            &[(-d).exp() - 1.0 + d],
        );
        for e in [KlEstimator::K1, KlEstimator::K2, KlEstimator::K3] {
            assert_eq!(e.estimate(-0.7, -0.7), 0.0);
        }
        assert!(KlEstimator::K3.estimate(-2.0, -1.0) > 0.0);
    }

    #[test]
    fn papers_shaping_with_gamma_one() {
        let s = shape(2.0, &OLD, &REF, &[true; 4], &KlConfig::default(), 1.0).unwrap();
        assert_close(&s.kl, &[0.5, 0.0, -1.0, 0.2]);
        assert_close(&s.token_rewards, &[-0.005, 0.0, 0.01, 2.0 - 0.002]);
        assert_close(&s.returns, &[2.003, 2.008, 2.008, 1.998]);
    }

    #[test]
    fn masked_tokens_are_skipped() {
        let mask = [true, false, true, false];
        let s = shape(1.0, &OLD, &REF, &mask, &KlConfig::default(), 0.5).unwrap();
        assert_close(&s.kl, &[0.5, 0.0, -1.0, 0.0]);
        // The reward lands on token 2, the last valid one.
        assert_close(&s.token_rewards, &[-0.005, 0.0, 1.01, 0.0]);
        // G_0 = r_0 + 0.5 * G_2: token 1 is skipped, not discounted over.
        assert_close(&s.returns, &[-0.005 + 0.5 * 1.01, 0.0, 1.01, 0.0]);
    }

    #[test]
    fn masked_logprobs_are_never_read() {
        let mask = [true, false, true, true];
        let mut old = OLD;
        old[1] = f64::NAN;
        let a = shape(1.0, &old, &REF, &mask, &KlConfig::default(), 1.0).unwrap();
        let b = shape(1.0, &OLD, &REF, &mask, &KlConfig::default(), 1.0).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn kl_in_the_loss_leaves_rewards_alone() {
        let kl = KlConfig {
            placement: KlPlacement::Loss,
            estimator: KlEstimator::K2,
            ..KlConfig::default()
        };
        let s = shape(1.0, &OLD, &REF, &[true; 4], &kl, 1.0).unwrap();
        assert_close(&s.kl, &[0.125, 0.0, 0.5, 0.02]);
        assert_close(&s.token_rewards, &[0.0, 0.0, 0.0, 1.0]);
        assert_close(&s.returns, &[1.0; 4]);
    }

    #[test]
    fn no_valid_token_gives_zeros() {
        let s = shape(1.0, &OLD, &REF, &[false; 4], &KlConfig::default(), 1.0).unwrap();
        assert_eq!(s.kl, vec![0.0; 4]);
        assert_eq!(s.token_rewards, vec![0.0; 4]);
        assert_eq!(s.returns, vec![0.0; 4]);
        let empty = shape(1.0, &[], &[], &[], &KlConfig::default(), 1.0).unwrap();
        assert!(empty.returns.is_empty());
    }

    #[test]
    fn length_mismatches_name_the_lengths() {
        let err = shape(1.0, &OLD, &REF[..3], &[true; 4], &KlConfig::default(), 1.0)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "length mismatch: ref_logprobs has length 3, expected 4"
        );
        let err = shape(1.0, &OLD, &REF, &[true; 5], &KlConfig::default(), 1.0).unwrap_err();
        assert!(matches!(
            err,
            CreditError::LengthMismatch {
                expected: 4,
                found: 5,
                ..
            }
        ));
    }

    #[test]
    fn bad_parameters_and_values_are_errors() {
        let mask = [true; 4];
        let kl = KlConfig::default();
        let message = |r: Result<Shaped, CreditError>| r.unwrap_err().to_string();
        assert!(message(shape(1.0, &OLD, &REF, &mask, &kl, 1.2)).contains("gamma = 1.2"));
        let bad_beta = KlConfig { beta: -1.0, ..kl };
        assert!(message(shape(1.0, &OLD, &REF, &mask, &bad_beta, 1.0)).contains("kl.beta = -1"));
        assert!(message(shape(f64::NAN, &OLD, &REF, &mask, &kl, 1.0)).contains("sequence reward"));
        let mut old = OLD;
        old[2] = f64::NEG_INFINITY;
        assert_eq!(
            message(shape(1.0, &old, &REF, &mask, &kl, 1.0)),
            "old_logprobs[2] = -inf is not finite"
        );
    }
}
