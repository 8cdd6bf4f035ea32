//! Hyper-parameters of a learner, as they appear in an experiment manifest.

use mappa_credit::{MismatchBand, RolloutCorrection};
use mappa_model::{AttentionKind, LoraConfig, Transformer};
use serde::{Deserialize, Serialize};

/// Optimiser, schedule and loss settings of one agent's learner.
///
/// Defaults are the paper's (docs/METHOD.md section 5): Adam (0.9, 0.95), lr 1e-6
/// decaying by cosine to 1e-7 after a 3% linear warm-up, no weight decay,
/// gradient-norm clip 1.0, PPO clip 0.2, token-level mean.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// Peak learning rate.
    pub lr: f64,
    /// Learning rate at the end of the cosine decay.
    pub min_lr: f64,
    /// Fraction of `total_steps` spent in linear warm-up.
    pub warmup_fraction: f64,
    /// Optimiser steps of the whole run (sets the schedule's length).
    pub total_steps: usize,
    /// Adam beta1.
    pub beta1: f64,
    /// Adam beta2.
    pub beta2: f64,
    /// Adam epsilon.
    pub epsilon: f64,
    /// Decoupled (AdamW) weight decay.
    pub weight_decay: f64,
    /// Global gradient-norm clip (none: no clipping).
    pub grad_clip: Option<f64>,
    /// PPO ratio clip below 1: `rho >= 1 - clip_low`.
    pub clip_low: f64,
    /// PPO ratio clip above 1: `rho <= 1 + clip_high`.
    pub clip_high: f64,
    /// Dual-clip constant `c > 1` (Ye et al. 2020): for negative advantages the
    /// objective is at least `c * A`. None: off (the paper).
    pub dual_clip: Option<f64>,
    /// Samples per forward/backward pass; gradients accumulate over the step.
    pub micro_batch_size: usize,
    /// Temperature of the log-probs (the rollout's sampling temperature).
    pub logprob_temperature: f64,
    /// Most sequences per log-prob pass without a gradient (the rollout
    /// policy's and the reference's log-probs of a step's actions); none:
    /// all of an agent's actions in one batch. Bounds that pass's memory; a
    /// bound changes the last bits, so results differ from unbounded runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprob_batch_size: Option<usize>,
    /// LoRA adapters on a frozen base (`[train.lora]`); none: full fine-tuning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraConfig>,
    /// Recompute activations one decoder layer at a time in the update
    /// ([`mappa_model::layerwise_gradients`]): `true` for every agent, or
    /// the roles that do. The update then holds one layer's activations and
    /// a hidden state per layer instead of every layer's, for one more
    /// forward pass; the gradients are the same bits, so no result changes.
    #[serde(skip_serializing_if = "Recompute::is_off")]
    pub recompute_layers: Recompute,
    /// How the agents' models compute attention, in rollouts, log-prob
    /// passes and updates: `dense` (the default) or `fused` (no score
    /// matrix held; other last bits, so other results).
    #[serde(skip_serializing_if = "is_dense")]
    pub attention: AttentionKind,
    /// How the frozen base's linear weights are stored under LoRA: `f32`
    /// (the default) or `bf16` (half the memory; each product widens its
    /// weight to f32; the rounding changes results).
    #[serde(skip_serializing_if = "is_f32")]
    pub base_dtype: BaseDtype,
    /// The ratios `p_train / p_rollout` a token may have and still count
    /// as matched in the rollout-trainer mismatch's `out_of_band` share
    /// (`[train.mismatch_band]`, default 0.5 to 2); changes only metrics.
    #[serde(skip_serializing_if = "is_default_band")]
    pub mismatch_band: MismatchBand,
    /// Importance weights for the rollout-trainer mismatch
    /// (`[train.rollout_correction]`, [`mappa_credit::correction`]); none:
    /// off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout_correction: Option<RolloutCorrection>,
}

fn is_default_band(band: &MismatchBand) -> bool {
    *band == MismatchBand::default()
}

/// The storage of a frozen base's linear weights (`train.base_dtype`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BaseDtype {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16.
    Bf16,
}

fn is_f32(dtype: &BaseDtype) -> bool {
    *dtype == BaseDtype::F32
}

impl BaseDtype {
    /// A loaded starting model stored as this says: a bf16 base is frozen
    /// (adapters are added afterwards, per role).
    pub fn store<B: burn::prelude::Backend>(
        self,
        model: Transformer<B>,
    ) -> mappa_model::Result<Transformer<B>> {
        match self {
            BaseDtype::F32 => Ok(model),
            BaseDtype::Bf16 => burn::module::Module::no_grad(model).with_frozen_bf16_base(),
        }
    }
}

fn is_dense(kind: &AttentionKind) -> bool {
    *kind == AttentionKind::Dense
}

/// Which agents recompute activations layer by layer (`train.recompute_layers`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Recompute {
    /// Every agent (`true`) or none (`false`).
    All(bool),
    /// The agents with these roles.
    Roles(Vec<String>),
}

impl Default for Recompute {
    fn default() -> Self {
        Recompute::All(false)
    }
}

impl Recompute {
    /// Whether the agent `role` recomputes.
    pub fn applies_to(&self, role: &str) -> bool {
        match self {
            Recompute::All(on) => *on,
            Recompute::Roles(roles) => roles.iter().any(|r| r == role),
        }
    }

    fn is_off(&self) -> bool {
        matches!(self, Recompute::All(false))
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            lr: 1e-6,
            min_lr: 1e-7,
            warmup_fraction: 0.03,
            total_steps: 100,
            beta1: 0.9,
            beta2: 0.95,
            epsilon: 1e-8,
            weight_decay: 0.0,
            grad_clip: Some(1.0),
            clip_low: 0.2,
            clip_high: 0.2,
            dual_clip: None,
            micro_batch_size: 4,
            logprob_temperature: 1.0,
            logprob_batch_size: None,
            lora: None,
            recompute_layers: Recompute::default(),
            attention: AttentionKind::Dense,
            base_dtype: BaseDtype::F32,
            mismatch_band: MismatchBand::default(),
            rollout_correction: None,
        }
    }
}

impl TrainConfig {
    /// Check ranges; the error names the field and what was expected.
    /// Numbers must be finite (TOML spells `inf` and `nan`): "a positive
    /// number" excludes infinity.
    pub fn validate(&self) -> Result<(), String> {
        const POSITIVE: &str = "a positive number";
        const FRACTION: &str = "a number in [0, 1)";
        let positive = |x: f64| x.is_finite() && x > 0.0;
        let checks = [
            (positive(self.lr), "lr", POSITIVE),
            (
                self.min_lr >= 0.0 && self.min_lr <= self.lr,
                "min_lr",
                "a number in [0, lr]",
            ),
            (
                (0.0..1.0).contains(&self.warmup_fraction),
                "warmup_fraction",
                FRACTION,
            ),
            (self.total_steps > 0, "total_steps", "at least 1"),
            ((0.0..1.0).contains(&self.beta1), "beta1", FRACTION),
            ((0.0..1.0).contains(&self.beta2), "beta2", FRACTION),
            (positive(self.epsilon), "epsilon", POSITIVE),
            (
                self.weight_decay.is_finite() && self.weight_decay >= 0.0,
                "weight_decay",
                "a finite number >= 0",
            ),
            (self.grad_clip.is_none_or(positive), "grad_clip", POSITIVE),
            ((0.0..1.0).contains(&self.clip_low), "clip_low", FRACTION),
            (
                self.clip_high.is_finite() && self.clip_high >= 0.0,
                "clip_high",
                "a finite number >= 0",
            ),
            (
                self.dual_clip.is_none_or(|c| c.is_finite() && c > 1.0),
                "dual_clip",
                "a finite number > 1",
            ),
            (self.micro_batch_size > 0, "micro_batch_size", "at least 1"),
            (
                self.logprob_batch_size.is_none_or(|b| b > 0),
                "logprob_batch_size",
                "at least 1",
            ),
            (
                positive(self.logprob_temperature),
                "logprob_temperature",
                POSITIVE,
            ),
        ];
        if let Some((_, field, expected)) = checks.iter().find(|(ok, ..)| !ok) {
            return Err(format!("{field}: expected {expected}"));
        }
        if self.base_dtype == BaseDtype::Bf16 && self.lora.is_none() {
            return Err(
                "base_dtype = \"bf16\": only a frozen base is stored in bf16; add [train.lora]"
                    .into(),
            );
        }
        if let Some(lora) = &self.lora {
            lora.validate().map_err(|e| format!("lora.{e}"))?;
        }
        self.mismatch_band.validate("mismatch_band")?;
        if let Some(correction) = &self.rollout_correction {
            correction.validate("rollout_correction")?;
        }
        Ok(())
    }
}
