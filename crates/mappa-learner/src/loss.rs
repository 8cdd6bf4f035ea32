//! The PPO-clip policy loss of REINFORCE++ (docs/METHOD.md section 5), with an
//! optional dual clip and an optional KL term for the "KL in the loss"
//! ablation.

use burn::prelude::*;
use mappa_credit::shaping::KlEstimator;
use mappa_model::kernels::{self, ModelBackend};

/// Loss settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossConfig {
    /// `rho >= 1 - clip_low`.
    pub clip_low: f64,
    /// `rho <= 1 + clip_high`.
    pub clip_high: f64,
    /// Dual-clip constant `c > 1`, if any.
    pub dual_clip: Option<f64>,
    /// `(beta, estimator)` of a KL-to-reference term in the loss, if any.
    pub kl_in_loss: Option<(f64, KlEstimator)>,
}

impl Default for LossConfig {
    /// PPO's clip of 0.2 on both sides, no dual clip, no KL term in the
    /// loss: what the default [`crate::TrainConfig`] and credit settings
    /// give (`mappa_train::loss_config`).
    fn default() -> Self {
        Self {
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
            kl_in_loss: None,
        }
    }
}

/// Per-token inputs of the loss.
///
/// # Shapes
/// All `[batch, completion_width]`; `mask` is 1 on tokens that count, 0 elsewhere.
#[derive(Debug, Clone)]
pub struct LossInputs<B: Backend> {
    /// Log-probs under the policy being trained (differentiable).
    pub logprobs: Tensor<B, 2>,
    /// Log-probs under the rollout policy.
    pub old_logprobs: Tensor<B, 2>,
    /// Log-probs under the frozen reference (used only with `kl_in_loss`).
    pub ref_logprobs: Tensor<B, 2>,
    /// Advantages.
    pub advantages: Tensor<B, 2>,
    /// Valid-token mask.
    pub mask: Tensor<B, 2>,
    /// Per-token importance weights of a rollout correction (constants);
    /// none: every token weighs 1.
    pub is_weights: Option<Tensor<B, 2>>,
}

/// The loss and what it measured.
#[derive(Debug, Clone)]
pub struct LossOutput<B: Backend> {
    /// `-sum_t(mask * objective) / normaliser` (+ the KL term): a token-level
    /// mean when `normaliser` is the step's number of valid tokens.
    ///
    /// # Shapes
    /// `[1]`
    pub loss: Tensor<B, 1>,
    /// Valid tokens where the clipped term was the smaller one.
    pub clipped_tokens: f64,
    /// Sum over valid tokens of the KL estimate between policy and reference.
    pub kl_sum: f64,
}

/// PPO-clip: `L = -sum_t min(rho_t A_t, clip(rho_t, 1 - low, 1 + high) A_t) / normaliser`,
/// `rho_t = exp(logprob - old_logprob)`. With a dual clip `c`, tokens with
/// `A_t < 0` use `max(that minimum, c A_t)`. A rollout correction's weights
/// multiply each token's term (TIS: `w_t min(...)`). Dividing by the number of valid
/// tokens in the whole optimiser step (not in the micro-batch) makes
/// accumulated micro-batch gradients equal the full-batch gradient.
pub fn ppo_clip_loss<B: ModelBackend>(
    inputs: LossInputs<B>,
    config: &LossConfig,
    normaliser: f64,
) -> LossOutput<B> {
    let LossInputs {
        logprobs,
        old_logprobs,
        ref_logprobs,
        advantages,
        mask,
        is_weights,
    } = inputs;
    let ratio = (logprobs.clone() - old_logprobs).exp();
    let unclipped = ratio.clone() * advantages.clone();
    let clipped = ratio.clamp(1.0 - config.clip_low, 1.0 + config.clip_high) * advantages.clone();
    let clip_active = clipped.clone().lower(unclipped.clone()).float() * mask.clone();
    let mut objective = unclipped.min_pair(clipped);
    if let Some(c) = config.dual_clip {
        let floor = advantages.clone() * c;
        let dual = objective.clone().max_pair(floor);
        objective = objective.mask_where(advantages.lower_elem(0.0), dual);
    }
    if let Some(weights) = is_weights {
        objective = objective * weights;
    }
    let mut loss = kernels::sum(objective * mask.clone()).neg() / normaliser;
    let diff = logprobs - ref_logprobs;
    let kl = |d: Tensor<B, 2>, estimator: KlEstimator| match estimator {
        KlEstimator::K1 => d,
        KlEstimator::K2 => d.powi_scalar(2) * 0.5,
        KlEstimator::K3 => d.clone().neg().exp() - 1.0 + d,
    };
    let estimator = config.kl_in_loss.map_or(KlEstimator::K1, |(_, e)| e);
    let kl_tokens = kl(diff, estimator) * mask;
    let kl_sum = kernels::sum(kl_tokens.clone()).into_scalar().elem::<f64>();
    if let Some((beta, _)) = config.kl_in_loss {
        loss = loss + kernels::sum(kl_tokens) * (beta / normaliser);
    }
    LossOutput {
        loss,
        clipped_tokens: kernels::sum(clip_active).into_scalar().elem::<f64>(),
        kl_sum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Autodiff;
    use mappa_model::backend::Cpu;

    type B = Autodiff<Cpu>;

    fn t(rows: &[&[f32]]) -> Tensor<B, 2> {
        let width = rows[0].len();
        let data: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_data(
            TensorData::new(data, [rows.len(), width]),
            &Default::default(),
        )
    }

    fn inputs(logp: f32, old: f32, adv: f32) -> LossInputs<B> {
        LossInputs {
            logprobs: t(&[&[logp, -1.0]]),
            old_logprobs: t(&[&[old, -1.0]]),
            ref_logprobs: t(&[&[old, -1.0]]),
            advantages: t(&[&[adv, 5.0]]),
            mask: t(&[&[1.0, 0.0]]),
            is_weights: None,
        }
    }

    fn value(out: &LossOutput<B>) -> f64 {
        out.loss.clone().into_scalar().elem::<f64>()
    }

    #[test]
    fn ratio_one_gives_minus_the_mean_advantage_and_masks_apply() {
        let out = ppo_clip_loss(inputs(-0.5, -0.5, 2.0), &LossConfig::default(), 1.0);
        assert!((value(&out) + 2.0).abs() < 1e-6, "{}", value(&out));
        assert_eq!(out.clipped_tokens, 0.0);
    }

    #[test]
    fn importance_weights_scale_each_term_and_weights_of_one_change_no_bit() {
        let plain = ppo_clip_loss(inputs(-0.3, -0.5, 2.0), &LossConfig::default(), 1.0);
        let mut ones = inputs(-0.3, -0.5, 2.0);
        ones.is_weights = Some(t(&[&[1.0, 1.0]]));
        let ones = ppo_clip_loss(ones, &LossConfig::default(), 1.0);
        assert_eq!(value(&plain).to_bits(), value(&ones).to_bits());
        let mut half = inputs(-0.3, -0.5, 2.0);
        half.is_weights = Some(t(&[&[0.5, 7.0]]));
        let half = ppo_clip_loss(half, &LossConfig::default(), 1.0);
        assert!((value(&half) - 0.5 * value(&plain)).abs() < 1e-6);
        assert_eq!(half.clipped_tokens, plain.clipped_tokens);
    }

    #[test]
    fn clipping_caps_the_gain_of_positive_advantages() {
        // rho = e^0.5 > 1.2, A > 0: the objective is 1.2 * A.
        let out = ppo_clip_loss(inputs(0.0, -0.5, 1.0), &LossConfig::default(), 1.0);
        assert!((value(&out) + 1.2).abs() < 1e-6, "{}", value(&out));
        assert_eq!(out.clipped_tokens, 1.0);
    }

    #[test]
    fn dual_clip_bounds_negative_advantages() {
        // rho = e^2, A = -1: plain PPO gives -e^2; the dual clip with c = 3 gives -3.
        let plain = ppo_clip_loss(inputs(0.0, -2.0, -1.0), &LossConfig::default(), 1.0);
        assert!((value(&plain) - (2.0f64).exp()).abs() < 1e-4);
        let dual = ppo_clip_loss(
            inputs(0.0, -2.0, -1.0),
            &LossConfig {
                dual_clip: Some(3.0),
                ..LossConfig::default()
            },
            1.0,
        );
        assert!((value(&dual) - 3.0).abs() < 1e-5, "{}", value(&dual));
    }

    #[test]
    fn kl_in_the_loss_adds_beta_times_the_estimate() {
        let mut i = inputs(-0.5, -0.5, 0.0);
        i.ref_logprobs = t(&[&[-0.7, -1.0]]);
        let out = ppo_clip_loss(
            i,
            &LossConfig {
                kl_in_loss: Some((0.1, KlEstimator::K1)),
                ..LossConfig::default()
            },
            1.0,
        );
        assert!((out.kl_sum - 0.2).abs() < 1e-6);
        assert!((value(&out) - 0.02).abs() < 1e-6, "{}", value(&out));
    }
}
