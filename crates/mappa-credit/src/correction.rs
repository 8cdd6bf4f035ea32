//! Rollout correction: importance weights for the rollout-trainer mismatch
//! ([`crate::mismatch`]), `[train] rollout_correction`, off by default.
//!
//! The samples were drawn from the rollout policy (an inference engine's
//! numerics), while PPO's ratio takes the trainer's own log-probs as the
//! behaviour policy. The importance ratio between the two, per valid token
//! `t`, is `r_t = exp(log p_train(t) - log p_rollout(t))` (the trainer's
//! log-probs before the update; a constant, never differentiated), and per
//! action `r = exp(sum_t log r_t)` over its valid tokens (the product of
//! its tokens' ratios); log-ratios are clamped to [-20, 20] before `exp`.
//! Four corrections, as verl's rollout correction and slime's MIS define
//! them (docs/METHOD.md, "Rollout correction", names what was read):
//! - `token` + `truncate` (TIS): each token's loss term weighted by
//!   `min(r_t, threshold)`;
//! - `token` + `mask` (MIS): a token whose `r_t` lies outside
//!   `[threshold_low, threshold]` leaves the loss, its numerator and its
//!   token count; the others are weighted by `r_t`;
//! - `sequence` + `truncate`: every token of an action weighted by
//!   `min(r, threshold)`;
//! - `sequence` + `mask`: an action whose `r` lies outside the band leaves
//!   the loss whole; the others' tokens are weighted by `r`.
//!
//! `threshold_low` defaults to `1 / threshold` (verl's default). With equal
//! log-probs every ratio is 1 and every correction is the plain loss.

use serde::{Deserialize, Serialize};

/// Whether a correction weighs tokens one by one or an action as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CorrectionLevel {
    /// Per token.
    Token,
    /// Per action (the product of its tokens' ratios).
    Sequence,
}

/// What a correction does with a ratio.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CorrectionMode {
    /// Weigh by the ratio, capped at the threshold (TIS).
    Truncate,
    /// Drop what lies outside the band, weigh the rest by its ratio (MIS).
    Mask,
}

/// `[train] rollout_correction`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutCorrection {
    /// `token` or `sequence`.
    pub level: CorrectionLevel,
    /// `truncate` or `mask`.
    pub mode: CorrectionMode,
    /// The cap of `truncate`, the upper bound of `mask` (default 2).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// The lower bound of `mask` (default `1 / threshold`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_low: Option<f64>,
}

/// Largest `|log r|` turned into a weight (`exp(20)` is about 5e8).
const LOG_RATIO_CLAMP: f64 = 20.0;

fn default_threshold() -> f64 {
    2.0
}

/// One action's correction: a weight per token, and which tokens still count.
#[derive(Debug, Clone, PartialEq)]
pub struct Corrected {
    /// The weight of each token's loss term (1 where nothing changes).
    pub weights: Vec<f64>,
    /// The mask after the correction (a masked token is false).
    pub mask: Vec<bool>,
}

impl RolloutCorrection {
    /// The lower bound of `mask`.
    pub fn low(&self) -> f64 {
        self.threshold_low.unwrap_or(1.0 / self.threshold)
    }

    /// Whether the thresholds are usable, naming the field
    /// (`train.rollout_correction`).
    pub fn validate(&self, field: &str) -> Result<(), String> {
        if !(self.threshold.is_finite() && self.threshold >= 1.0) {
            return Err(format!(
                "{field}.threshold: expected a finite ratio of at least 1, got {}",
                self.threshold
            ));
        }
        if let Some(low) = self.threshold_low {
            if self.mode == CorrectionMode::Truncate {
                return Err(format!(
                    "{field}.threshold_low: only mode = \"mask\" has a lower bound \
                     (truncation caps from above)"
                ));
            }
            if !(low > 0.0 && low <= 1.0) {
                return Err(format!(
                    "{field}.threshold_low: expected a ratio in (0, 1], got {low}"
                ));
            }
        }
        Ok(())
    }

    /// The correction of one action from its trainer and rollout log-probs
    /// and its mask (one entry per completion token each).
    ///
    /// # Panics
    /// When the lengths differ.
    pub fn apply(&self, train: &[f64], rollout: &[f64], mask: &[bool]) -> Corrected {
        crate::mismatch::assert_paired(train, rollout, mask);
        let log_ratio: Vec<f64> = match self.level {
            CorrectionLevel::Token => train.iter().zip(rollout).map(|(p, q)| p - q).collect(),
            CorrectionLevel::Sequence => {
                let sum: f64 = train
                    .iter()
                    .zip(rollout)
                    .zip(mask)
                    .filter(|(_, &m)| m)
                    .map(|((p, q), _)| p - q)
                    .sum();
                vec![sum; mask.len()]
            }
        };
        let (low, high) = (self.low().ln(), self.threshold.ln());
        let mut kept = mask.to_vec();
        let weights = log_ratio
            .iter()
            .zip(&mut kept)
            .map(|(&d, kept)| {
                let d = d.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP);
                match self.mode {
                    CorrectionMode::Truncate => d.min(high).exp(),
                    CorrectionMode::Mask => {
                        *kept &= (low..=high).contains(&d);
                        if *kept {
                            d.exp()
                        } else {
                            0.0
                        }
                    }
                }
            })
            .collect();
        Corrected {
            weights,
            mask: kept,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn correction(level: CorrectionLevel, mode: CorrectionMode) -> RolloutCorrection {
        RolloutCorrection {
            level,
            mode,
            threshold: 2.0,
            threshold_low: None,
        }
    }

    #[test]
    fn each_variant_on_a_known_action() {
        use CorrectionLevel::*;
        use CorrectionMode::*;
        // Ratios e^1 (above 2), e^-0.5 (inside), e^-1 (below 1/2), masked e^3.
        let train = [-1.0, -1.5, -2.0, 0.0];
        let rollout = [-2.0, -1.0, -1.0, -3.0];
        let mask = [true, true, true, false];
        let token_tis = correction(Token, Truncate).apply(&train, &rollout, &mask);
        assert_eq!(token_tis.mask, mask);
        let expect = [2.0, (-0.5f64).exp(), (-1.0f64).exp(), 2.0];
        for (w, e) in token_tis.weights.iter().zip(expect) {
            assert!((w - e).abs() < 1e-12, "{w} vs {e}");
        }
        let token_mis = correction(Token, Mask).apply(&train, &rollout, &mask);
        assert_eq!(token_mis.mask, [false, true, false, false]);
        assert_eq!(token_mis.weights, [0.0, (-0.5f64).exp(), 0.0, 0.0]);
        // The action's log-ratio over valid tokens: 1 - 0.5 - 1 = -0.5.
        let seq_tis = correction(Sequence, Truncate).apply(&train, &rollout, &mask);
        assert!(seq_tis
            .weights
            .iter()
            .all(|w| (w - (-0.5f64).exp()).abs() < 1e-12));
        let seq_mis = correction(Sequence, Mask).apply(&train, &rollout, &mask);
        assert_eq!(seq_mis.mask, mask, "e^-0.5 lies inside [1/2, 2]");
        assert!(seq_mis.weights[..3]
            .iter()
            .all(|w| (w - (-0.5f64).exp()).abs() < 1e-12));
        let far = correction(Sequence, Mask).apply(&[-5.0], &[-1.0], &[true]);
        assert_eq!(far.mask, [false]);
        // An engine's -9999 (its -inf) gives a finite weight.
        let inf = correction(Token, Truncate).apply(&[-1.0], &[-9999.0], &[true]);
        assert_eq!(inf.weights, [2.0]);
    }

    #[test]
    fn thresholds_are_checked_by_name() {
        let mut c = correction(CorrectionLevel::Token, CorrectionMode::Truncate);
        assert!(c.validate("train.rollout_correction").is_ok());
        c.threshold = 0.5;
        assert!(c
            .validate("train.rollout_correction")
            .unwrap_err()
            .contains("rollout_correction.threshold"));
        c.threshold = 2.0;
        c.threshold_low = Some(0.25);
        assert!(c
            .validate("x")
            .unwrap_err()
            .contains("only mode = \"mask\""));
        c.mode = CorrectionMode::Mask;
        assert!(c.validate("x").is_ok());
        assert_eq!(c.low(), 0.25);
        c.threshold_low = Some(1.5);
        assert!(c.validate("x").unwrap_err().contains("threshold_low"));
    }
}
