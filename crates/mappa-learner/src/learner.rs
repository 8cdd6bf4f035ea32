//! One agent's learner: its own policy weights (or LoRA adapters on a
//! frozen base), a frozen reference (a copy of the starting weights, or
//! under LoRA the base itself), an AdamW optimiser and the LR schedule.
//! Each agent trains only on its own actions; a sample's prompt is the full
//! context the model saw.

use burn::module::AutodiffModule;
use burn::optim::adaptor::OptimizerAdaptor;
use burn::optim::{GradientsParams, Optimizer};
use burn::prelude::*;
use mappa_core::stats::mean_population_std;
use mappa_model::AutodiffModelBackend;
use mappa_model::{
    completion_logprobs, layerwise_gradients, CompletionLogprobs, LoraConfig, ModelBackend,
    Transformer,
};
use serde::{Deserialize, Serialize};

use crate::config::TrainConfig;
use crate::data_parallel::{check_devices, parallel_gradients};
use crate::loss::{ppo_clip_loss, LossConfig, LossInputs};
use crate::optim::FusedAdamW;
use crate::params::clip_global_grad_norm;
use crate::schedule::learning_rate;
use crate::LearnerError;

/// One action, ready for the policy update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainSample {
    /// The full context the agent saw (token ids).
    pub prompt: Vec<u32>,
    /// The agent's completion (token ids).
    pub completion: Vec<u32>,
    /// Per-token log-probs under the rollout policy.
    pub old_logprobs: Vec<f32>,
    /// Per-token log-probs under the frozen reference.
    pub ref_logprobs: Vec<f32>,
    /// Per-token advantages.
    pub advantages: Vec<f32>,
    /// Which tokens count (all false for a sample truncated before EOS).
    pub mask: Vec<bool>,
    /// Per-token importance weights of a rollout correction
    /// ([`mappa_credit::correction`]); empty: every token weighs 1, and the
    /// loss takes no product with them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub is_weights: Vec<f32>,
    /// The action's reward (for metrics).
    pub reward: f64,
}

/// What one optimiser step of one agent did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepMetrics {
    /// The agent.
    pub agent: String,
    /// The optimiser step (0-based) this update was.
    pub step: usize,
    /// Samples in the step.
    pub samples: usize,
    /// Valid tokens in the step.
    pub tokens: usize,
    /// The PPO loss (token-level mean).
    pub loss: f64,
    /// Mean per valid token of the k1 KL estimate, policy against reference, before the update.
    pub kl: f64,
    /// Fraction of valid tokens where the clip was active.
    pub clip_fraction: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate used.
    pub lr: f64,
    /// Mean sample reward.
    pub mean_reward: f64,
    /// Mean advantage over valid tokens.
    pub advantage_mean: f64,
    /// Standard deviation of advantages over valid tokens.
    pub advantage_std: f64,
    /// Mean completion length in tokens.
    pub response_length: f64,
    /// Whether the update was skipped (no valid token).
    pub skipped: bool,
}

/// Why a learner's policy is always there: it is taken only for the
/// duration of an optimiser step.
const HELD: &str = "the learner holds its policy between optimiser steps";

/// An agent's policy, reference and optimiser.
pub struct AgentLearner<B: AutodiffModelBackend> {
    name: String,
    /// `None` only while the optimiser holds it ([`Self::train_step`]).
    policy: Option<Transformer<B>>,
    reference: Transformer<B::InnerBackend>,
    optimizer: OptimizerAdaptor<FusedAdamW, Transformer<B>, B>,
    config: TrainConfig,
    step: usize,
    base_model: String,
    data_parallel: Vec<B::Device>,
}

impl<B: AutodiffModelBackend> AgentLearner<B> {
    /// A learner whose reference is a frozen copy of `policy`, or, when
    /// `policy` carries LoRA adapters, its base without them (the same
    /// weights, not a copy). `config.lora` and the policy's adapters must
    /// agree; both compute attention as `config.attention` says.
    pub fn new(
        name: impl Into<String>,
        policy: Transformer<B>,
        config: TrainConfig,
    ) -> Result<Self, LearnerError> {
        let name = name.into();
        config.validate().map_err(LearnerError::Config)?;
        if policy.lora_config() != config.lora.as_ref().map(LoraConfig::canonical).as_ref() {
            return Err(LearnerError::Config(format!(
                "agent {name}: train.lora is {:?} but the policy's adapters are {:?} (add them with Transformer::with_lora)",
                config.lora,
                policy.lora_config()
            )));
        }
        let policy = policy.with_attention(config.attention);
        let reference = match policy.lora_config() {
            Some(_) => policy.valid().without_adapters(),
            None => policy.valid(),
        };
        let optimizer = FusedAdamW {
            beta_1: config.beta1 as f32,
            beta_2: config.beta2 as f32,
            epsilon: config.epsilon as f32,
            weight_decay: config.weight_decay as f32,
        }
        .init();
        Ok(Self {
            name,
            policy: Some(policy),
            reference,
            optimizer,
            config,
            step: 0,
            base_model: String::new(),
            data_parallel: Vec::new(),
        })
    }

    /// Names the checkpoint the policy started from (written as the base
    /// of saved LoRA adapters, `base_model_name_or_path`).
    pub fn with_base_model(mut self, base_model: impl Into<String>) -> Self {
        self.base_model = base_model.into();
        self
    }

    /// Runs each update data-parallel on `devices` (the first holding the
    /// policy): micro-batches are spread over replicas and their gradients
    /// summed by burn's collective all-reduce ([`crate::data_parallel`]).
    pub fn with_data_parallel(mut self, devices: Vec<B::Device>) -> Result<Self, LearnerError> {
        check_devices::<B>(&self.name, &self.policy().device(), &devices)?;
        self.data_parallel = devices;
        Ok(self)
    }

    /// The checkpoint the policy started from, when the caller named it.
    pub fn base_model(&self) -> &str {
        &self.base_model
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The policy being trained.
    pub fn policy(&self) -> &Transformer<B> {
        self.policy.as_ref().expect(HELD)
    }

    /// The frozen reference.
    pub fn reference(&self) -> &Transformer<B::InnerBackend> {
        &self.reference
    }

    /// Settings.
    pub fn config(&self) -> &TrainConfig {
        &self.config
    }

    /// Optimiser steps taken (the schedule's position).
    pub fn step(&self) -> usize {
        self.step
    }

    /// The policy, the optimiser and the step count, to be overwritten
    /// together when a checkpoint is restored (`mappa_train::checkpoint`).
    pub fn parts_mut(
        &mut self,
    ) -> (
        &mut Transformer<B>,
        &mut OptimizerAdaptor<FusedAdamW, Transformer<B>, B>,
        &mut usize,
    ) {
        let policy = self.policy.as_mut().expect(HELD);
        (policy, &mut self.optimizer, &mut self.step)
    }

    /// The optimiser, whose state a checkpoint saves.
    pub fn optimizer(&self) -> &OptimizerAdaptor<FusedAdamW, Transformer<B>, B> {
        &self.optimizer
    }

    /// Teacher-forced log-probs of `(prompt, completion)` pairs under the
    /// current policy (no gradient): the "old" log-probs of a fresh rollout.
    /// In batches of at most `logprob_batch_size` pairs.
    pub fn policy_logprobs(
        &self,
        pairs: &[(&[u32], &[u32])],
    ) -> Result<Vec<Vec<f32>>, LearnerError> {
        self.batched_logprobs(&self.policy().valid(), pairs)
    }

    /// Teacher-forced log-probs under the frozen reference, batched the same way.
    pub fn reference_logprobs(
        &self,
        pairs: &[(&[u32], &[u32])],
    ) -> Result<Vec<Vec<f32>>, LearnerError> {
        self.batched_logprobs(&self.reference, pairs)
    }

    fn batched_logprobs(
        &self,
        model: &Transformer<B::InnerBackend>,
        pairs: &[(&[u32], &[u32])],
    ) -> Result<Vec<Vec<f32>>, LearnerError> {
        let chunk = self.config.logprob_batch_size.unwrap_or(pairs.len()).max(1);
        let mut out = Vec::with_capacity(pairs.len());
        for pairs in pairs.chunks(chunk) {
            out.extend(logprobs(model, pairs, self.config.logprob_temperature)?);
        }
        Ok(out)
    }

    /// Every sample's per-token vectors must match its completion.
    fn check_lengths(&self, samples: &[TrainSample]) -> Result<(), LearnerError> {
        for (i, s) in samples.iter().enumerate() {
            let n = s.completion.len();
            let lengths = [
                s.old_logprobs.len(),
                s.ref_logprobs.len(),
                s.advantages.len(),
                s.mask.len(),
            ];
            if lengths.iter().any(|&l| l != n)
                || !(s.is_weights.is_empty() || s.is_weights.len() == n)
            {
                return Err(LearnerError::Input(format!(
                    "agent {} sample {i}: completion has {n} tokens but old/ref log-probs, advantages, mask and importance weights have {}/{}/{}/{}/{}",
                    self.name, lengths[0], lengths[1], lengths[2], lengths[3], s.is_weights.len()
                )));
            }
        }
        Ok(())
    }

    /// The step's metrics known before the update: sizes, rewards, advantages.
    fn sample_metrics(&self, samples: &[TrainSample], lr: f64) -> StepMetrics {
        let tokens: usize = samples
            .iter()
            .map(|s| s.mask.iter().filter(|m| **m).count())
            .sum();
        let valid_advantages: Vec<f64> = samples
            .iter()
            .flat_map(|s| {
                s.advantages
                    .iter()
                    .zip(&s.mask)
                    .filter(|(_, m)| **m)
                    .map(|(a, _)| *a as f64)
            })
            .collect();
        let (advantage_mean, advantage_std) = mean_population_std(&valid_advantages);
        StepMetrics {
            agent: self.name.clone(),
            step: self.step,
            samples: samples.len(),
            tokens,
            loss: 0.0,
            kl: 0.0,
            clip_fraction: 0.0,
            grad_norm: 0.0,
            lr,
            mean_reward: samples.iter().map(|s| s.reward).sum::<f64>()
                / samples.len().max(1) as f64,
            advantage_mean,
            advantage_std,
            response_length: samples.iter().map(|s| s.completion.len()).sum::<usize>() as f64
                / samples.len().max(1) as f64,
            skipped: tokens == 0,
        }
    }

    /// One optimiser step on `samples` (all of this agent's actions in the
    /// rollout step), in micro-batches with gradient accumulation.
    pub fn train_step(
        &mut self,
        samples: &[TrainSample],
        loss_config: &LossConfig,
    ) -> Result<StepMetrics, LearnerError> {
        self.check_lengths(samples)?;
        B::run_step(|| self.train_step_checked(samples, loss_config))
    }

    /// [`train_step`](Self::train_step) on samples whose lengths are checked.
    fn train_step_checked(
        &mut self,
        samples: &[TrainSample],
        loss_config: &LossConfig,
    ) -> Result<StepMetrics, LearnerError> {
        let lr = learning_rate(&self.config, self.step);
        let mut metrics = self.sample_metrics(samples, lr);
        let tokens = metrics.tokens;
        if tokens == 0 {
            self.step += 1;
            return Ok(metrics);
        }
        let chunks: Vec<&[TrainSample]> = samples.chunks(self.config.micro_batch_size).collect();
        let devices = match self.data_parallel.as_slice() {
            [] => vec![self.policy().device()],
            devices => devices.to_vec(),
        };
        let (mut grads, sums) =
            parallel_gradients(self.policy(), &devices, &chunks, |policy, chunk| {
                micro_batch_gradients(&self.name, policy, &self.config, chunk, loss_config, tokens)
            })?;
        // Summed over micro-batches in order here, made fractions below.
        for sum in sums {
            metrics.loss += sum.loss;
            metrics.clip_fraction += sum.clipped_tokens;
            metrics.kl += sum.kl;
        }
        metrics.grad_norm = match self.config.grad_clip {
            Some(max) => clip_global_grad_norm(self.policy(), &mut grads, max),
            None => crate::params::global_grad_norm(self.policy(), &grads),
        };
        if !metrics.grad_norm.is_finite() {
            return Err(LearnerError::NonFinite(format!(
                "agent {} step {}: the gradient norm is {}",
                self.name, self.step, metrics.grad_norm
            )));
        }
        metrics.clip_fraction /= tokens as f64;
        metrics.kl /= tokens as f64;
        // Handed over, not cloned: the optimiser updates weights held
        // nowhere else (not shared with the reference) in place.
        let policy = self.policy.take().expect(HELD);
        self.policy = Some(self.optimizer.step(lr, policy, grads));
        self.step += 1;
        Ok(metrics)
    }
}

/// What one micro-batch adds to a step's metrics.
struct MicroBatchSums {
    loss: f64,
    clipped_tokens: f64,
    kl: f64,
}

/// The loss of one micro-batch of `role`'s samples (normalised by the
/// step's `tokens`) and its gradients on `policy`.
fn micro_batch_gradients<B: AutodiffModelBackend>(
    role: &str,
    policy: &Transformer<B>,
    config: &TrainConfig,
    chunk: &[TrainSample],
    loss_config: &LossConfig,
    tokens: usize,
) -> Result<(GradientsParams, MicroBatchSums), LearnerError> {
    let device = policy.device();
    let pairs: Vec<(&[u32], &[u32])> = chunk
        .iter()
        .map(|s| (s.prompt.as_slice(), s.completion.as_slice()))
        .collect();
    let temperature = config.logprob_temperature as f32;
    let grid = |width: usize, f: &dyn Fn(&TrainSample, usize) -> f32| -> Tensor<B, 2> {
        let mut values = Vec::with_capacity(chunk.len() * width);
        for s in chunk {
            values.extend((0..width).map(|t| if t < s.completion.len() { f(s, t) } else { 0.0 }));
        }
        Tensor::from_data(TensorData::new(values, [chunk.len(), width]), &device)
    };
    let loss_of = |current: CompletionLogprobs<B>| {
        let width = current.logprobs.dims()[1];
        let out = ppo_clip_loss(
            LossInputs {
                logprobs: current.logprobs,
                old_logprobs: grid(width, &|s, t| s.old_logprobs[t]),
                ref_logprobs: grid(width, &|s, t| s.ref_logprobs[t]),
                advantages: grid(width, &|s, t| s.advantages[t]),
                mask: grid(width, &|s, t| if s.mask[t] { 1.0 } else { 0.0 }),
                is_weights: chunk
                    .iter()
                    .any(|s| !s.is_weights.is_empty())
                    .then(|| grid(width, &|s, t| s.is_weights.get(t).copied().unwrap_or(1.0))),
            },
            loss_config,
            tokens as f64,
        );
        let loss = out.loss.clone();
        (loss, out)
    };
    let (grads, out) = if config.recompute_layers.applies_to(role) {
        layerwise_gradients(policy, &pairs, temperature, loss_of)?
    } else {
        let (loss, out) = loss_of(completion_logprobs(policy, &pairs, temperature)?);
        (GradientsParams::from_grads(loss.backward(), policy), out)
    };
    let sums = MicroBatchSums {
        loss: out.loss.into_scalar().elem::<f64>(),
        clipped_tokens: out.clipped_tokens,
        kl: out.kl_sum,
    };
    Ok((grads, sums))
}

fn logprobs<B: ModelBackend>(
    model: &Transformer<B>,
    pairs: &[(&[u32], &[u32])],
    temperature: f64,
) -> Result<Vec<Vec<f32>>, LearnerError> {
    completion_logprobs(model, pairs, temperature as f32)
        .map(|l| l.to_vecs())
        .map_err(LearnerError::from)
}
