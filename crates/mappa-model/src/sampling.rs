//! Choosing the next token from a row of logits: greedy, or sampling with
//! temperature, top-k and top-p, drawn from a seeded [`RngStream`].
//!
//! The log-prob reported for a chosen token is its log-probability under the
//! temperature-scaled distribution *before* top-k/top-p truncation,
//! `log_softmax(logits / T)[token]` (T = 1 for greedy). That is the quantity
//! the trainer recomputes by teacher forcing with the same temperature, so the
//! PPO ratio starts at exactly 1 up to float rounding.

use mappa_core::RngStream;
use serde::{Deserialize, Serialize};

/// The smallest non-zero temperature accepted: below it, `logits / T` can overflow f32.
pub const MIN_TEMPERATURE: f32 = 1e-3;

/// How the next token is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SamplingConfig {
    /// Softmax temperature; `0.0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (`0` disables).
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (`1.0` disables).
    pub top_p: f32,
}

impl SamplingConfig {
    /// Argmax decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
        }
    }

    /// Plain sampling at `temperature`.
    pub fn with_temperature(temperature: f32) -> Self {
        Self {
            temperature,
            top_k: 0,
            top_p: 1.0,
        }
    }

    /// Whether this config decodes greedily.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The temperature that scales logits for log-probs (1 for greedy).
    pub fn logprob_temperature(&self) -> f32 {
        if self.is_greedy() {
            1.0
        } else {
            self.temperature
        }
    }

    /// Checks the values are usable.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(format!(
                "temperature {} must be finite and >= 0",
                self.temperature
            ));
        }
        if self.temperature > 0.0 && self.temperature < MIN_TEMPERATURE {
            return Err(format!(
                "temperature {} is below {MIN_TEMPERATURE}: scaled logits would overflow; use 0 for greedy decoding",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top_p {} must be in (0, 1]", self.top_p));
        }
        Ok(())
    }
}

/// A chosen token and its log-probability.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Choice {
    /// The token id.
    pub token: u32,
    /// `log_softmax(logits / T)[token]`.
    pub logprob: f32,
}

/// Chooses the next token from `logits` (one row, length = vocabulary size).
pub fn choose(logits: &[f32], config: &SamplingConfig, rng: &mut RngStream) -> Choice {
    let t = config.logprob_temperature();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    // log-sum-exp of the scaled logits, in f64 for a stable sum.
    let scaled_max = (max / t) as f64;
    let sum: f64 = logits
        .iter()
        .map(|&l| ((l / t) as f64 - scaled_max).exp())
        .sum();
    let log_z = scaled_max + sum.ln();
    let logprob = |token: usize| ((logits[token] / t) as f64 - log_z) as f32;

    if config.is_greedy() {
        // First maximum wins ties, as torch.argmax does.
        let token = logits
            .iter()
            .enumerate()
            .fold(0, |best, (i, &l)| if l > logits[best] { i } else { best });
        return Choice {
            token: token as u32,
            logprob: logprob(token),
        };
    }

    let probs: Vec<f64> = logits
        .iter()
        .map(|&l| ((l / t) as f64 - log_z).exp())
        .collect();
    let truncate = config.top_k > 0 || config.top_p < 1.0;
    let candidates: Vec<usize> = if truncate {
        let mut order: Vec<usize> = (0..probs.len()).collect();
        // Descending probability; ties by index, for determinism.
        order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
        if config.top_k > 0 {
            order.truncate(config.top_k);
        }
        if config.top_p < 1.0 {
            // As HF and vLLM: the nucleus is taken within the top-k set, renormalised.
            let mass: f64 = order.iter().map(|&i| probs[i]).sum();
            let mut cumulative = 0.0;
            let keep = order
                .iter()
                .position(|&i| {
                    cumulative += probs[i] / mass;
                    cumulative >= config.top_p as f64
                })
                .map_or(order.len(), |p| p + 1);
            order.truncate(keep);
        }
        order
    } else {
        (0..probs.len()).collect()
    };
    let total: f64 = candidates.iter().map(|&i| probs[i]).sum();
    let target = rng.uniform() * total;
    let mut cumulative = 0.0;
    let mut token = *candidates.last().expect("at least one candidate");
    for &i in &candidates {
        cumulative += probs[i];
        if cumulative > target {
            token = i;
            break;
        }
    }
    Choice {
        token: token as u32,
        logprob: logprob(token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn greedy_picks_first_max_and_reports_logprob() {
        let logits = [1.0, 3.0, 3.0, -2.0];
        let c = choose(
            &logits,
            &SamplingConfig::greedy(),
            &mut RngStream::from_u64(0),
        );
        assert_eq!(c.token, 1);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((c.logprob as f64 - (3.0 - z.ln())).abs() < 1e-6);
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits = [0.5, 0.1, 2.0, 1.9];
        let config = SamplingConfig {
            temperature: 1.0,
            top_k: 1,
            top_p: 1.0,
        };
        let mut rng = RngStream::from_u64(9);
        for _ in 0..50 {
            assert_eq!(choose(&logits, &config, &mut rng).token, 2);
        }
    }

    #[test]
    fn top_p_excludes_the_tail() {
        // probabilities ~ [0.64, 0.24, 0.09, 0.03]
        let logits = [3.0, 2.0, 1.0, 0.0];
        let config = SamplingConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.8,
        };
        let mut rng = RngStream::from_u64(2);
        for _ in 0..500 {
            assert!(choose(&logits, &config, &mut rng).token < 2);
        }
    }

    #[test]
    fn top_p_is_taken_within_the_renormalised_top_k() {
        // p ~ [0.45, 0.45, 0.1 spread over the tail]; top-2 holds 0.9 of the mass.
        let mut logits = vec![3.0f32, 3.0];
        logits.extend(std::iter::repeat_n(-1.0, 20));
        let config = SamplingConfig {
            temperature: 1.0,
            top_k: 2,
            top_p: 0.5,
        };
        // Within the renormalised top-2 each has 0.5: the nucleus is the first alone.
        let mut rng = RngStream::from_u64(4);
        for _ in 0..200 {
            assert_eq!(choose(&logits, &config, &mut rng).token, 0);
        }
    }

    #[test]
    fn tiny_temperatures_are_refused() {
        assert!(SamplingConfig::with_temperature(1e-6).validate().is_err());
        assert!(SamplingConfig::with_temperature(0.0).validate().is_ok());
        assert!(SamplingConfig::with_temperature(0.6).validate().is_ok());
    }

    #[test]
    fn frequencies_follow_the_distribution() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln()]; // p = 1/6, 2/6, 3/6
        let mut rng = RngStream::from_u64(5);
        let mut counts = [0usize; 3];
        let n = 30_000;
        for _ in 0..n {
            counts[choose(&logits, &SamplingConfig::with_temperature(1.0), &mut rng).token
                as usize] += 1;
        }
        for (i, expected) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
            let f = counts[i] as f64 / n as f64;
            assert!((f - expected).abs() < 0.01, "token {i}: {f} vs {expected}");
        }
    }

    proptest! {
        #[test]
        fn same_seed_same_choices(seed in any::<u64>(), logits in prop::collection::vec(-5.0f32..5.0, 2..40),
                                  t in 0.1f32..2.0, k in 0usize..10, p in 0.05f32..1.0) {
            let config = SamplingConfig { temperature: t, top_k: k, top_p: p };
            let mut a = RngStream::from_u64(seed);
            let mut b = RngStream::from_u64(seed);
            for _ in 0..5 {
                let x = choose(&logits, &config, &mut a);
                let y = choose(&logits, &config, &mut b);
                prop_assert_eq!(x, y);
                prop_assert!(x.logprob <= 0.0 && x.logprob.is_finite());
                prop_assert!((x.token as usize) < logits.len());
            }
        }
    }
}
