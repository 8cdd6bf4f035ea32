//! Training steps on the device against the CPU: the learner's own update
//! (REINFORCE++'s clipped loss, AdamW) of a full or LoRA model, with
//! recomputed layers, fused attention, a bf16 base or data-parallel
//! replicas; and the same step twice on the device, which must give the
//! same bits.

use burn::tensor::backend::DeviceOps;
use mappa_benches::memory::samples_of;
use mappa_model::{AttentionKind, AutodiffModelBackend, LoraConfig, Transformer};
use mappa_train::config::{BaseDtype, Recompute};
use mappa_train::{AgentLearner, LossConfig, StepMetrics, TrainConfig};
use serde_json::json;

use super::compare::{self, Named, Tolerance};
use super::parity::{tokens, Source};
use super::Outcome;

/// A training-step variant: what `TrainConfig` and the learner are given.
#[derive(Debug, Clone, Copy, Default)]
pub struct Variant {
    /// LoRA adapters (rank 8) instead of full fine-tuning.
    pub lora: bool,
    /// `train.recompute_layers`.
    pub recompute: bool,
    /// `train.attention = "fused"`.
    pub fused: bool,
    /// `train.base_dtype = "bf16"` (with LoRA).
    pub bf16: bool,
    /// Data-parallel over two devices (or the one device twice).
    pub data_parallel: bool,
}

impl Variant {
    /// The tolerances its numbers are held to.
    pub fn tolerance(self) -> Tolerance {
        if self.bf16 {
            compare::BF16
        } else {
            compare::F32
        }
    }
}

/// Sequences, prompt and completion tokens of the checked update.
const BATCH: usize = 4;
const PROMPT: usize = 12;
const COMPLETION: usize = 12;

fn lora() -> LoraConfig {
    LoraConfig::new(8, 16.0)
}

fn train_config(variant: Variant) -> TrainConfig {
    TrainConfig {
        lr: 1e-3,
        micro_batch_size: if variant.data_parallel {
            BATCH / 2
        } else {
            BATCH
        },
        lora: variant.lora.then(lora),
        recompute_layers: Recompute::All(variant.recompute),
        attention: if variant.fused {
            AttentionKind::Fused
        } else {
            AttentionKind::Dense
        },
        base_dtype: if variant.bf16 {
            BaseDtype::Bf16
        } else {
            BaseDtype::F32
        },
        ..Default::default()
    }
}

/// A learner for `variant` on `device`.
fn learner<B: AutodiffModelBackend>(
    source: &Source,
    variant: Variant,
    device: &B::Device,
) -> anyhow::Result<AgentLearner<B>> {
    let config = train_config(variant);
    let mut policy: Transformer<B> = config.base_dtype.store(source.build(device)?)?;
    if variant.lora {
        policy = policy.with_lora(&lora(), &mut mappa_core::RngStream::from_u64(5))?;
    }
    let learner = AgentLearner::new("doctor", policy, config)?;
    if !variant.data_parallel {
        return Ok(learner);
    }
    let devices = match B::device_count(device.id().type_id) {
        0 | 1 => vec![device.clone(), device.clone()],
        _ => mappa_train::data_parallel::devices_of_box::<B>(device, 2)?,
    };
    Ok(learner.with_data_parallel(devices)?)
}

/// The token pairs of the checked update.
fn pairs(vocab: usize) -> Vec<(Vec<u32>, Vec<u32>)> {
    tokens(vocab, BATCH, PROMPT + COMPLETION, 31)
        .into_iter()
        .map(|row| (row[..PROMPT].to_vec(), row[PROMPT..].to_vec()))
        .collect()
}

fn borrowed(pairs: &[(Vec<u32>, Vec<u32>)]) -> Vec<(&[u32], &[u32])> {
    pairs
        .iter()
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect()
}

/// What one learner's update gave: its metrics, its trainable parameters'
/// change, and the log-probs of the same pairs after it.
struct Stepped {
    metrics: StepMetrics,
    deltas: Named,
    after: Named,
    logprobs: Vec<f32>,
}

/// One update with advantages +1, +1, -1, +1 (not centred: at ratio 1 the
/// clipped surrogate is minus their mean, not zero), the old and reference
/// log-probs the learner's own (as in a run).
fn step<B: AutodiffModelBackend>(learner: &mut AgentLearner<B>) -> anyhow::Result<Stepped> {
    let pairs = pairs(learner.policy().config().vocab_size);
    let samples = samples_of(
        learner,
        pairs.clone(),
        |i| if i % 4 == 2 { -1.0 } else { 1.0 },
    )?;
    let before = compare::parameters(learner.policy());
    let loss = LossConfig {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: None,
        kl_in_loss: None,
    };
    let metrics = learner.train_step(&samples, &loss)?;
    let after = compare::parameters(learner.policy());
    let deltas = after
        .iter()
        .zip(&before)
        .map(|((name, a), (_, b))| (name.clone(), a.iter().zip(b).map(|(x, y)| x - y).collect()))
        .collect();
    let logprobs = learner.policy_logprobs(&borrowed(&pairs))?.concat();
    Ok(Stepped {
        metrics,
        deltas,
        after,
        logprobs,
    })
}

/// One update of `variant` on the device against the same on the CPU.
pub fn check<D: AutodiffModelBackend, R: AutodiffModelBackend>(
    source: &Source,
    variant: Variant,
    device: &D::Device,
    reference: &R::Device,
) -> anyhow::Result<Outcome> {
    let tol = variant.tolerance();
    let d = step(&mut learner::<D>(source, variant, device)?)?;
    let r = step(&mut learner::<R>(
        source,
        Variant {
            data_parallel: false,
            ..variant
        },
        reference,
    )?)?;
    let loss = compare::rel(d.metrics.loss, r.metrics.loss);
    let grad_norm = compare::rel(d.metrics.grad_norm, r.metrics.grad_norm);
    let logprobs = compare::max_abs(&d.logprobs, &r.logprobs);
    let (update, first) = compare::first_over(&d.deltas, &r.deltas, tol.gradient);
    let mut failures = Vec::new();
    if loss > tol.loss || grad_norm > tol.grad_norm {
        failures.push(format!(
            "loss differs by {loss:.2e}, gradient norm by {grad_norm:.2e}"
        ));
    }
    if logprobs > tol.logprobs {
        failures.push(format!(
            "log-probs after the update differ by {logprobs:.2e}"
        ));
    }
    // AdamW's first step moves each weight by about lr times the sign of
    // its gradient: near-zero gradients may flip sign between backends, so
    // the update's distance is reported but the verdict rests on the
    // log-probs it leads to.
    let mut detail = format!(
        "{} trained tensors; the CPU's loss {:.6}, gradient norm {:.6}",
        d.deltas
            .iter()
            .filter(|(_, v)| v.iter().any(|x| *x != 0.0))
            .count(),
        r.metrics.loss,
        r.metrics.grad_norm
    );
    if let (false, Some(name)) = (failures.is_empty(), &first) {
        detail.push_str(&format!(
            "; the first parameter whose update differs: {name}"
        ));
    }
    Ok(Outcome::from_failures(
        failures,
        json!({
            "loss_rel": loss,
            "grad_norm_rel": grad_norm,
            "logprobs_after_max_abs": logprobs,
            "update_worst_rel_l2": update,
        }),
        serde_json::to_value(tol)?,
        detail,
    ))
}

/// The model after one update of `variant` on `device` (its inference
/// view).
pub fn trained<D: AutodiffModelBackend>(
    source: &Source,
    variant: Variant,
    device: &D::Device,
) -> anyhow::Result<Transformer<D::InnerBackend>> {
    let mut learner = learner::<D>(source, variant, device)?;
    step(&mut learner)?;
    Ok(burn::module::AutodiffModule::valid(learner.policy()))
}

/// The same update twice on the device, from fresh learners: every
/// parameter, the metrics and the log-probs after it must have the same
/// bits.
pub fn determinism<D: AutodiffModelBackend>(
    source: &Source,
    variant: Variant,
    device: &D::Device,
) -> anyhow::Result<Outcome> {
    let a = step(&mut learner::<D>(source, variant, device)?)?;
    let b = step(&mut learner::<D>(source, variant, device)?)?;
    let same_metrics = a.metrics.loss.to_bits() == b.metrics.loss.to_bits()
        && a.metrics.grad_norm.to_bits() == b.metrics.grad_norm.to_bits();
    let first = compare::first_unequal(&a.after, &b.after);
    let logprobs_equal = a
        .logprobs
        .iter()
        .zip(&b.logprobs)
        .all(|(x, y)| x.to_bits() == y.to_bits());
    let mut failures = Vec::new();
    if !same_metrics {
        failures.push(format!(
            "the loss or gradient norm differs: {} / {} against {} / {}",
            a.metrics.loss, a.metrics.grad_norm, b.metrics.loss, b.metrics.grad_norm
        ));
    }
    if let Some(name) = &first {
        failures.push(format!("the first parameter that differs: {name}"));
    }
    if !logprobs_equal {
        failures.push("the log-probs after the update differ".into());
    }
    Ok(Outcome::from_failures(
        failures,
        json!({
            "metrics_equal": same_metrics,
            "parameters_equal": first.is_none(),
            "logprobs_equal": logprobs_equal,
        }),
        json!("identical bits"),
        "two fresh learners, the same update".into(),
    ))
}
