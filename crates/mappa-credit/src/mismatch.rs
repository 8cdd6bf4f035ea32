//! The rollout-trainer mismatch: how far the log-probs the rollout policy
//! reported (an inference engine's, or mappa's own sampler's) are from the
//! trainer's own recomputation of the same tokens under the same weights.
//!
//! Per valid token `t`, with `d_t = log p_train(t) - log p_rollout(t)` and
//! the ratio `r_t = exp(d_t)`:
//! - `mean_abs` and `max_abs`: the mean and largest `|d_t|`;
//! - `kl`: the mean of Schulman's k3 estimator `r_t - 1 - d_t` (never
//!   negative), an unbiased per-token estimate of KL(rollout || train)
//!   because the tokens were sampled from the rollout policy; `d_t` is
//!   clamped to [-20, 20] there, so an engine's `-9999` (its `-inf`) gives
//!   a large finite value, not infinity;
//! - `out_of_band`: the share of tokens whose ratio lies outside
//!   [`MismatchBand`] (default 0.5 to 2).

use serde::{Deserialize, Serialize};

/// The ratios `p_train / p_rollout` counted as in band.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MismatchBand {
    /// The lowest ratio in band (default 0.5).
    pub low: f64,
    /// The highest ratio in band (default 2).
    pub high: f64,
}

impl Default for MismatchBand {
    fn default() -> Self {
        Self {
            low: 0.5,
            high: 2.0,
        }
    }
}

impl MismatchBand {
    /// Whether the band is `0 < low <= 1 <= high`, naming the field.
    pub fn validate(&self, field: &str) -> Result<(), String> {
        if !(self.low > 0.0 && self.low <= 1.0) {
            return Err(format!(
                "{field}.low: expected a ratio in (0, 1], got {}",
                self.low
            ));
        }
        if !(self.high >= 1.0 && self.high.is_finite()) {
            return Err(format!(
                "{field}.high: expected a finite ratio of at least 1, got {}",
                self.high
            ));
        }
        Ok(())
    }

    /// Whether the log-ratio `d` lies inside the band.
    pub fn contains(&self, d: f64) -> bool {
        d >= self.low.ln() && d <= self.high.ln()
    }
}

/// The mismatch over a set of tokens (one agent's step).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Mismatch {
    /// Valid tokens compared.
    pub tokens: usize,
    /// Mean of `|log p_train - log p_rollout|`.
    pub mean_abs: f64,
    /// Largest `|log p_train - log p_rollout|`.
    pub max_abs: f64,
    /// Mean per token of the k3 estimate of KL(rollout || train).
    pub kl: f64,
    /// Share of tokens whose ratio `p_train / p_rollout` is outside the band.
    pub out_of_band: f64,
}

/// Panics unless one action's trainer log-probs, rollout log-probs and
/// mask have one entry per token each.
pub(crate) fn assert_paired(train: &[f64], rollout: &[f64], mask: &[bool]) {
    assert!(
        train.len() == rollout.len() && train.len() == mask.len(),
        "one entry per token: {} trainer, {} rollout log-probs, {} mask entries",
        train.len(),
        rollout.len(),
        mask.len()
    );
}

/// Largest `|d|` the KL estimate uses (`exp(20)` is about 5e8).
const KL_CLAMP: f64 = 20.0;

/// Sums over tokens, added to one action at a time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MismatchTally {
    band: MismatchBand,
    tokens: usize,
    abs_sum: f64,
    max_abs: f64,
    kl_sum: f64,
    outside: usize,
}

impl MismatchTally {
    /// An empty tally counting ratios outside `band`.
    pub fn new(band: MismatchBand) -> Self {
        Self {
            band,
            ..Self::default()
        }
    }

    /// Adds one action's tokens where `mask` holds. The three slices have
    /// one entry per completion token.
    ///
    /// # Panics
    /// When their lengths differ (the caller pairs one action's values).
    pub fn add(&mut self, train: &[f64], rollout: &[f64], mask: &[bool]) {
        assert_paired(train, rollout, mask);
        for ((&p, &q), _) in train
            .iter()
            .zip(rollout)
            .zip(mask)
            .filter(|(_, &valid)| valid)
        {
            let d = p - q;
            let clamped = d.clamp(-KL_CLAMP, KL_CLAMP);
            self.tokens += 1;
            self.abs_sum += d.abs();
            self.max_abs = self.max_abs.max(d.abs());
            self.kl_sum += clamped.exp() - 1.0 - clamped;
            if !self.band.contains(d) {
                self.outside += 1;
            }
        }
    }

    /// The mismatch, or none when no valid token was added.
    pub fn finish(&self) -> Option<Mismatch> {
        (self.tokens > 0).then(|| {
            let n = self.tokens as f64;
            Mismatch {
                tokens: self.tokens,
                mean_abs: self.abs_sum / n,
                max_abs: self.max_abs,
                kl: self.kl_sum / n,
                out_of_band: self.outside as f64 / n,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_log_probs_have_no_mismatch_and_masked_tokens_do_not_count() {
        let mut tally = MismatchTally::new(MismatchBand::default());
        tally.add(
            &[-1.0, -2.0, -0.5],
            &[-1.0, -2.0, -9999.0],
            &[true, true, false],
        );
        let m = tally.finish().unwrap();
        assert_eq!(m.tokens, 2);
        assert_eq!(
            (m.mean_abs, m.max_abs, m.kl, m.out_of_band),
            (0.0, 0.0, 0.0, 0.0)
        );
        assert_eq!(MismatchTally::default().finish(), None);
    }

    #[test]
    fn a_known_mismatch_gives_its_figures() {
        let mut tally = MismatchTally::new(MismatchBand::default());
        // Ratios e^1 (outside 0.5-2), e^-0.5 (inside) and e^-9998 (outside;
        // an engine's -9999 for -inf, clamped in the KL estimate only).
        tally.add(&[-1.0, -1.5], &[-2.0, -1.0], &[true, true]);
        tally.add(&[-9999.0], &[-1.0], &[true]);
        let m = tally.finish().unwrap();
        assert_eq!(m.tokens, 3);
        assert!((m.mean_abs - (1.0 + 0.5 + 9998.0) / 3.0).abs() < 1e-9);
        assert_eq!(m.max_abs, 9998.0);
        let k3 = |d: f64| d.exp() - 1.0 - d;
        assert!((m.kl - (k3(1.0) + k3(-0.5) + k3(-20.0)) / 3.0).abs() < 1e-12);
        assert!((m.out_of_band - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn bands_are_checked() {
        let band = |low, high| MismatchBand { low, high }.validate("train.mismatch_band");
        assert!(band(0.5, 2.0).is_ok());
        assert!(band(0.0, 2.0).unwrap_err().contains("mismatch_band.low"));
        assert!(band(0.5, 0.9).unwrap_err().contains("mismatch_band.high"));
        assert!(MismatchBand::default().contains(2f64.ln()));
        assert!(!MismatchBand::default().contains(2.01f64.ln()));
    }
}
