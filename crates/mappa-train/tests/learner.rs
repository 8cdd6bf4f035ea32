//! The learner on a tiny model: the PPO-clip gradient against finite
//! differences, the direction of one update, micro-batch accumulation,
//! data-parallel updates, exact resume from a checkpoint, and corrupted
//! checkpoints.

use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use burn::module::{AutodiffModule, ModuleMapper, Param, ParamId};
use burn::optim::GradientsParams;
use burn::prelude::*;
use mappa_core::rng::RngStream;
use mappa_model::weights::{hf_tensors, load_transformer};
use mappa_model::{completion_logprobs, Transformer};
use mappa_train::checkpoint::{load_checkpoint, save_checkpoint, StreamState, TrainerState};
use mappa_train::loss::{ppo_clip_loss, LossInputs};
use mappa_train::params::param_ids;
use mappa_train::{AgentLearner, LossConfig, TrainConfig, TrainError, TrainSample};

type B = Autodiff<mappa_model::backend::Cpu>;

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen3-tiny")
}

fn model() -> Transformer<B> {
    load_transformer::<B>(&model_dir(), &Default::default()).unwrap()
}

fn tokens(rng: &mut RngStream, n: usize) -> Vec<u32> {
    (0..n).map(|_| 10 + rng.below(300) as u32).collect()
}

/// Samples with fixed advantages; old and reference log-probs from `learner`.
fn samples(learner: &AgentLearner<B>, seed: u64, advantages: &[f32]) -> Vec<TrainSample> {
    let mut rng = RngStream::from_u64(seed);
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = advantages
        .iter()
        .enumerate()
        .map(|(i, _)| (tokens(&mut rng, 4 + i), tokens(&mut rng, 3 + 2 * i)))
        .collect();
    let refs: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let old = learner.policy_logprobs(&refs).unwrap();
    let reference = learner.reference_logprobs(&refs).unwrap();
    pairs
        .into_iter()
        .zip(old)
        .zip(reference)
        .zip(advantages)
        .map(
            |((((prompt, completion), old_logprobs), ref_logprobs), &a)| TrainSample {
                mask: vec![true; completion.len()],
                advantages: vec![a; completion.len()],
                prompt,
                completion,
                old_logprobs,
                ref_logprobs,
                is_weights: Vec::new(),
                reward: a as f64,
            },
        )
        .collect()
}

fn config(lr: f64, total_steps: usize, micro: usize) -> TrainConfig {
    TrainConfig {
        lr,
        min_lr: lr / 10.0,
        warmup_fraction: 0.0,
        total_steps,
        micro_batch_size: micro,
        ..Default::default()
    }
}

/// Adds `h * direction` to the parameter `id`.
struct Nudge<'a> {
    id: ParamId,
    direction: &'a [f32],
    h: f32,
}

impl<Bk: Backend> ModuleMapper<Bk> for Nudge<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Bk, D>>) -> Param<Tensor<Bk, D>> {
        if param.id != self.id {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.shape();
        let delta =
            Tensor::<Bk, 1>::from_floats(self.direction, &tensor.device()).reshape(shape) * self.h;
        Param::from_mapped_value(id, tensor + delta, mapper)
    }
}

fn loss_value<Bk: mappa_model::ModelBackend>(
    model: &Transformer<Bk>,
    batch: &[TrainSample],
) -> (Tensor<Bk, 1>, f64) {
    let pairs: Vec<(&[u32], &[u32])> = batch
        .iter()
        .map(|s| (s.prompt.as_slice(), s.completion.as_slice()))
        .collect();
    let current = completion_logprobs(model, &pairs, 1.0).unwrap();
    let width = current.logprobs.dims()[1];
    let device = model.device();
    let grid = |f: &dyn Fn(&TrainSample, usize) -> f32| {
        let mut v = Vec::new();
        for s in batch {
            v.extend((0..width).map(|t| if t < s.completion.len() { f(s, t) } else { 0.0 }));
        }
        Tensor::<Bk, 2>::from_data(TensorData::new(v, [batch.len(), width]), &device)
    };
    let tokens: usize = batch.iter().map(|s| s.completion.len()).sum();
    let out = ppo_clip_loss(
        LossInputs {
            logprobs: current.logprobs,
            old_logprobs: grid(&|s, t| s.old_logprobs[t]),
            ref_logprobs: grid(&|s, t| s.ref_logprobs[t]),
            advantages: grid(&|s, t| s.advantages[t]),
            mask: grid(&|s, t| s.mask[t] as u8 as f32),
            is_weights: None,
        },
        &LossConfig::default(),
        tokens as f64,
    );
    let value = out.loss.clone().into_scalar().elem::<f64>();
    (out.loss, value)
}

#[test]
fn ppo_clip_gradient_matches_finite_differences() {
    let learner = AgentLearner::new("solver", model(), config(1e-3, 10, 4)).unwrap();
    let mut batch = samples(&learner, 1, &[1.0, -0.7, 0.4]);
    // Move the old log-probs a little so that ratios differ from 1 but stay inside the clip.
    let mut rng = RngStream::from_u64(9);
    for s in &mut batch {
        for lp in &mut s.old_logprobs {
            *lp += 0.05 * (rng.uniform() as f32 - 0.5);
        }
    }
    let policy = learner.policy().clone();
    let (loss, _) = loss_value(&policy, &batch);
    let grads = GradientsParams::from_grads(loss.backward(), &policy);
    // The final norm's weight: a small, well-conditioned parameter.
    let id = *param_ids(&policy).last().unwrap();
    let grad: Vec<f32> = grads
        .get::<mappa_model::backend::Cpu, 1>(id)
        .expect("a gradient")
        .into_data()
        .into_vec()
        .unwrap();
    let direction: Vec<f32> = (0..grad.len())
        .map(|i| if i % 3 == 0 { 1.0 } else { -0.5 })
        .collect();
    let analytic: f64 = grad
        .iter()
        .zip(&direction)
        .map(|(g, d)| (*g as f64) * (*d as f64))
        .sum();

    let inner = policy.valid();
    let h = 1e-2f32;
    let plus = inner.clone().map(&mut Nudge {
        id,
        direction: &direction,
        h,
    });
    let minus = inner.map(&mut Nudge {
        id,
        direction: &direction,
        h: -h,
    });
    let numeric = (loss_value(&plus, &batch).1 - loss_value(&minus, &batch).1) / (2.0 * h as f64);
    assert!(
        analytic.abs() > 1e-5,
        "a vanishing gradient proves nothing: {analytic}"
    );
    assert!(
        (analytic - numeric).abs() <= 0.02 * analytic.abs() + 1e-5,
        "analytic {analytic} vs finite differences {numeric}"
    );
}

fn mean_logprob(learner: &AgentLearner<B>, s: &TrainSample) -> f64 {
    let lp = learner
        .policy_logprobs(&[(s.prompt.as_slice(), s.completion.as_slice())])
        .unwrap();
    lp[0].iter().map(|&x| x as f64).sum::<f64>() / lp[0].len() as f64
}

#[test]
fn one_step_raises_positive_and_lowers_negative_advantage_tokens() {
    let mut learner = AgentLearner::new("solver", model(), config(1e-3, 10, 4)).unwrap();
    let batch = samples(&learner, 2, &[1.0, -1.0]);
    let before: Vec<f64> = batch.iter().map(|s| mean_logprob(&learner, s)).collect();
    let metrics = learner.train_step(&batch, &LossConfig::default()).unwrap();
    let after: Vec<f64> = batch.iter().map(|s| mean_logprob(&learner, s)).collect();
    assert!(
        after[0] > before[0],
        "positive advantage: {} -> {}",
        before[0],
        after[0]
    );
    assert!(
        after[1] < before[1],
        "negative advantage: {} -> {}",
        before[1],
        after[1]
    );
    assert_eq!(metrics.step, 0);
    assert_eq!(learner.step(), 1);
    assert!(metrics.grad_norm > 0.0 && metrics.lr == 1e-3);
    assert_eq!(
        metrics.clip_fraction, 0.0,
        "ratios are 1 on the first micro-batch of an on-policy step"
    );
    assert!(
        metrics.kl.abs() < 1e-6,
        "policy equals reference before the first update"
    );
}

#[test]
fn micro_batches_accumulate_to_the_full_batch_update() {
    let advantages = [0.8, -0.3, 0.5, -1.0];
    let mut whole = AgentLearner::new("a", model(), config(1e-3, 10, 4)).unwrap();
    let mut pieces = AgentLearner::new("a", model(), config(1e-3, 10, 1)).unwrap();
    let batch = samples(&whole, 3, &advantages);
    let m1 = whole.train_step(&batch, &LossConfig::default()).unwrap();
    let m2 = pieces.train_step(&batch, &LossConfig::default()).unwrap();
    assert!(
        (m1.loss - m2.loss).abs() < 1e-6,
        "{} vs {}",
        m1.loss,
        m2.loss
    );
    assert!(
        (m1.grad_norm - m2.grad_norm).abs() < 1e-4 * m1.grad_norm,
        "{} vs {}",
        m1.grad_norm,
        m2.grad_norm
    );
    for ((name, _, a), (_, _, b)) in hf_tensors(whole.policy())
        .iter()
        .zip(hf_tensors(pieces.policy()).iter())
    {
        let diff = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0f32, f32::max);
        assert!(diff < 1e-5, "{name}: {diff}");
    }
}

#[test]
fn recomputing_layer_by_layer_takes_the_same_steps_bit_for_bit() {
    let advantages = [0.8, -0.3, 0.5, -1.0];
    let mut plain = AgentLearner::new("solver", model(), config(1e-3, 10, 2)).unwrap();
    let recomputing = TrainConfig {
        recompute_layers: mappa_train::config::Recompute::Roles(vec!["solver".into()]),
        ..config(1e-3, 10, 2)
    };
    let mut layered = AgentLearner::new("solver", model(), recomputing).unwrap();
    for step in 0..2 {
        let batch = samples(&plain, 30 + step, &advantages);
        let a = plain.train_step(&batch, &LossConfig::default()).unwrap();
        let b = layered.train_step(&batch, &LossConfig::default()).unwrap();
        assert_eq!(a, b);
    }
    assert_eq!(hf_tensors(plain.policy()), hf_tensors(layered.policy()));
}

/// A learner whose updates run data-parallel on the CPU's one device twice
/// over (two worker threads, gradients summed by burn's collective).
fn data_parallel(config: TrainConfig) -> AgentLearner<B> {
    let device = Default::default();
    AgentLearner::new("solver", model(), config)
        .unwrap()
        .with_data_parallel(vec![device, device])
        .unwrap()
}

fn max_difference(a: &AgentLearner<B>, b: &AgentLearner<B>) -> f32 {
    hf_tensors(a.policy())
        .iter()
        .zip(hf_tensors(b.policy()).iter())
        .flat_map(|((_, _, x), (_, _, y))| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0f32, f32::max)
}

#[test]
fn data_parallel_updates_match_one_device_and_repeat_bit_for_bit() {
    // Two micro-batches: one per worker, summed in the same order as on one
    // device, so the same bits.
    let advantages = [0.8, -0.3, 0.5, -1.0];
    let mut single = AgentLearner::new("solver", model(), config(1e-3, 10, 2)).unwrap();
    let mut parallel = data_parallel(config(1e-3, 10, 2));
    for step in 0..2 {
        let batch = samples(&single, 40 + step, &advantages);
        let a = single.train_step(&batch, &LossConfig::default()).unwrap();
        let b = parallel.train_step(&batch, &LossConfig::default()).unwrap();
        assert_eq!(a, b, "step {step}");
    }
    assert_eq!(hf_tensors(single.policy()), hf_tensors(parallel.policy()));

    // Five micro-batches: worker 0 sums 0, 2, 4 and worker 1 sums 1, 3, so
    // the grouping differs from one device's by rounding only, and a
    // repeat gives the same bits.
    let advantages = [0.8, -0.3, 0.5, -1.0, 0.2];
    let mut single = AgentLearner::new("solver", model(), config(1e-3, 10, 1)).unwrap();
    let mut first = data_parallel(config(1e-3, 10, 1));
    let mut again = data_parallel(config(1e-3, 10, 1));
    for step in 0..2 {
        let batch = samples(&single, 50 + step, &advantages);
        let a = single.train_step(&batch, &LossConfig::default()).unwrap();
        let b = first.train_step(&batch, &LossConfig::default()).unwrap();
        let c = again.train_step(&batch, &LossConfig::default()).unwrap();
        assert_eq!(b, c, "step {step}: a repeat gives the same metrics");
        assert!((a.loss - b.loss).abs() < 1e-6, "{} vs {}", a.loss, b.loss);
        assert!(
            (a.grad_norm - b.grad_norm).abs() < 1e-4 * a.grad_norm,
            "{} vs {}",
            a.grad_norm,
            b.grad_norm
        );
    }
    assert_eq!(hf_tensors(first.policy()), hf_tensors(again.policy()));
    let diff = max_difference(&single, &first);
    assert!(diff < 1e-5, "data-parallel vs one device: {diff}");
}

#[test]
fn a_failing_data_parallel_worker_fails_the_step_and_the_next_step_runs() {
    let advantages = [0.8, -0.3, 0.5];
    let mut learner = data_parallel(config(1e-3, 10, 1));
    let mut batch = samples(&learner, 60, &advantages);
    // Only worker 1's micro-batch is bad: worker 0 must not wait for it.
    batch[1].completion[0] = 1_000_000;
    let err = learner
        .train_step(&batch, &LossConfig::default())
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let batch = samples(&learner, 61, &advantages);
    learner.train_step(&batch, &LossConfig::default()).unwrap();
}

#[test]
fn a_panicking_data_parallel_worker_reports_its_message_and_the_next_step_runs() {
    use mappa_train::data_parallel::parallel_gradients;
    let device = Default::default();
    let policy = model();
    let devices = [device, device];
    let chunks = [0usize, 1, 2];
    let err = parallel_gradients(&policy, &devices, &chunks, |_, &chunk| {
        assert!(chunk != 1, "micro-batch {chunk} is poisoned");
        Ok((GradientsParams::new(), chunk))
    })
    .expect_err("the step fails");
    let message = err.to_string();
    assert!(
        message.contains("worker 1") && message.contains("micro-batch 1 is poisoned"),
        "{message}"
    );
    // Nobody was left registered: the next step runs, its sides in order.
    let (_, sides) = parallel_gradients(&policy, &devices, &chunks, |_, &chunk| {
        Ok((GradientsParams::new(), chunk))
    })
    .unwrap();
    assert_eq!(sides, chunks);
}

#[test]
fn data_parallel_devices_are_checked() {
    let device = Default::default();
    let refused = |devices: Vec<_>| {
        AgentLearner::new("solver", model(), config(1e-3, 10, 1))
            .unwrap()
            .with_data_parallel(devices)
            .err()
            .expect("refused")
            .to_string()
    };
    assert!(refused(vec![device]).contains("at least two devices"));
    let three = refused(vec![device, device, device]);
    assert!(three.contains("must be on distinct devices"), "{three}");
}

#[test]
fn truncated_samples_are_masked_out() {
    let mut learner = AgentLearner::new("a", model(), config(1e-3, 10, 4)).unwrap();
    let mut batch = samples(&learner, 4, &[1.0]);
    batch[0].mask.iter_mut().for_each(|m| *m = false);
    let before = hf_tensors(learner.policy());
    let metrics = learner.train_step(&batch, &LossConfig::default()).unwrap();
    assert!(metrics.skipped);
    assert_eq!(
        before,
        hf_tensors(learner.policy()),
        "nothing to learn from a truncated sample"
    );
}

/// A rollout correction's masked token leaves both the loss's numerator
/// (its advantage no longer matters) and its token count; weights of one
/// change no bit of the update.
#[test]
fn a_masked_token_counts_in_neither_numerator_nor_denominator() {
    let fresh = || AgentLearner::new("a", model(), config(1e-3, 10, 4)).unwrap();
    let step = |batch: &[TrainSample]| {
        let mut learner = fresh();
        let metrics = learner.train_step(batch, &LossConfig::default()).unwrap();
        (metrics, hf_tensors(learner.policy()))
    };
    let mut batch = samples(&fresh(), 5, &[1.0, -0.5]);
    let (plain_metrics, plain) = step(&batch);
    batch[1].is_weights = vec![1.0; batch[1].completion.len()];
    let (_, ones) = step(&batch);
    assert_eq!(plain, ones, "weights of one change the update");
    batch[1].mask[2] = false;
    let (masked_metrics, masked) = step(&batch);
    assert_eq!(masked_metrics.tokens, plain_metrics.tokens - 1);
    batch[1].advantages[2] = 40.0;
    batch[1].is_weights[2] = 9.0;
    let (again_metrics, again) = step(&batch);
    assert_eq!(
        masked, again,
        "a masked token's advantage or weight moved the update"
    );
    assert_eq!(masked_metrics.loss.to_bits(), again_metrics.loss.to_bits());
    assert_ne!(masked, plain);
}

fn run_steps(learner: &mut AgentLearner<B>, from: usize, to: usize) {
    for step in from..to {
        let batch = samples(learner, 100 + step as u64, &[1.0, -0.5, 0.25]);
        learner.train_step(&batch, &LossConfig::default()).unwrap();
    }
}

fn state() -> TrainerState {
    let mut stream = RngStream::from_u64(5);
    stream.next_u64();
    let mut state = TrainerState {
        step: 2,
        dataset_cursor: 17,
        ..Default::default()
    };
    state
        .rng_streams
        .insert("rollout".into(), StreamState::from(stream.state()));
    state
}

#[test]
fn resuming_from_a_checkpoint_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let total = 4;
    let mut straight = AgentLearner::new("solver", model(), config(1e-3, total, 2)).unwrap();
    run_steps(&mut straight, 0, total);

    let mut first = AgentLearner::new("solver", model(), config(1e-3, total, 2)).unwrap();
    run_steps(&mut first, 0, 2);
    let ck = dir.path().join("step-2");
    save_checkpoint(&ck, &[&first], &state()).unwrap();
    drop(first);

    let mut resumed = vec![AgentLearner::new("solver", model(), config(1e-3, total, 2)).unwrap()];
    let restored = load_checkpoint(&ck, &mut resumed).unwrap();
    assert_eq!(restored, state());
    let rng = restored.rng_streams["rollout"].to_rng_state().unwrap();
    assert_eq!(RngStream::from_state(rng).next_u64(), {
        let mut s = RngStream::from_u64(5);
        s.next_u64();
        s.next_u64()
    });
    assert_eq!(resumed[0].step(), 2);
    run_steps(&mut resumed[0], 2, total);
    assert_eq!(
        hf_tensors(straight.policy()),
        hf_tensors(resumed[0].policy()),
        "weights differ after resume"
    );
}

fn corrupt(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() / 2;
    bytes[i] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn corrupted_or_missing_checkpoint_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let learner = AgentLearner::new("verifier", model(), config(1e-3, 4, 2)).unwrap();
    let ck = dir.path().join("ck");
    save_checkpoint(&ck, &[&learner], &TrainerState::default()).unwrap();
    let fresh = || vec![AgentLearner::new("verifier", model(), config(1e-3, 4, 2)).unwrap()];

    corrupt(&ck.join("agents/verifier/optimizer.bin"));
    match load_checkpoint(&ck, &mut fresh()) {
        Err(TrainError::Checkpoint { path, message }) => {
            assert!(path.ends_with("agents/verifier/optimizer.bin"), "{path}");
            assert!(message.contains("does not match"), "{message}");
        }
        other => panic!("expected a checkpoint error, got {:?}", other.map(|_| ())),
    }
    save_checkpoint(&ck, &[&learner], &TrainerState::default()).unwrap();
    std::fs::remove_file(ck.join("agents/verifier/model.safetensors")).unwrap();
    let err = load_checkpoint(&ck, &mut fresh()).unwrap_err().to_string();
    assert!(
        err.contains("model.safetensors") && err.contains("missing"),
        "{err}"
    );
    let mut other = vec![AgentLearner::new("solver", model(), config(1e-3, 4, 2)).unwrap()];
    save_checkpoint(&ck, &[&learner], &TrainerState::default()).unwrap();
    let err = load_checkpoint(&ck, &mut other).unwrap_err().to_string();
    assert!(err.contains("solver"), "{err}");
}

/// An action with random ids (leaked: a rollout action borrows its ids).
fn action(
    agent: usize,
    seed: u64,
    truncated: bool,
    score: f64,
) -> mappa_train::RolloutAction<'static> {
    let mut rng = RngStream::from_u64(seed);
    mappa_train::RolloutAction {
        agent,
        prompt: tokens(&mut rng, 5).leak(),
        completion: tokens(&mut rng, 4).leak(),
        truncated,
        score,
        rollout_logprobs: None,
    }
}

#[test]
fn a_rollout_step_becomes_per_agent_samples_normalised_per_agent() {
    use mappa_credit::CreditConfig;
    use mappa_train::{build_samples, RolloutTrajectory};
    let learners = vec![
        AgentLearner::new("solver", model(), config(1e-3, 4, 2)).unwrap(),
        AgentLearner::new("verifier", model(), config(1e-3, 4, 2)).unwrap(),
    ];
    let trajectories = vec![
        RolloutTrajectory {
            group: 0,
            outcome: 1.0,
            actions: vec![action(0, 1, false, 8.0), action(1, 2, false, 9.0)],
        },
        RolloutTrajectory {
            group: 0,
            outcome: 0.0,
            actions: vec![action(0, 3, false, 3.0), action(1, 4, true, 2.0)],
        },
        RolloutTrajectory {
            group: 1,
            outcome: 0.0,
            actions: vec![action(0, 5, false, 5.0), action(1, 6, false, 1.0)],
        },
    ];
    let samples = build_samples(&learners, &trajectories, &CreditConfig::default())
        .unwrap()
        .samples;
    assert_eq!(samples.len(), 2);
    assert_eq!(samples[0].len(), 3);
    assert_eq!(samples[1].len(), 3);
    assert_eq!(samples[0][0].reward, 0.8);
    assert!(
        samples[1][1].mask.iter().all(|m| !m),
        "the truncated action is masked out"
    );
    assert!(samples[1][1].advantages.iter().all(|&a| a == 0.0));
    for agent in &samples {
        let valid: Vec<f64> = agent
            .iter()
            .flat_map(|s| {
                s.advantages
                    .iter()
                    .zip(&s.mask)
                    .filter(|(_, m)| **m)
                    .map(|(a, _)| *a as f64)
            })
            .collect();
        let mean = valid.iter().sum::<f64>() / valid.len() as f64;
        assert!(
            mean.abs() < 1e-5,
            "per-agent advantages have mean 0: {mean}"
        );
        assert!(agent[0].advantages[0] != 0.0);
    }
    // Higher coach score, higher advantage (the solver's 8 against its 3).
    assert!(samples[0][0].advantages[0] > samples[0][1].advantages[0]);
    let mut learners = learners;
    let loss = mappa_train::loss_config(learners[1].config(), &CreditConfig::default());
    let metrics = learners[1].train_step(&samples[1], &loss).unwrap();
    assert_eq!(metrics.tokens, 8);
}

#[test]
fn supervised_finetuning_learns_a_fixed_completion() {
    use mappa_train::sft::{supervised_finetune, SftConfig};
    let mut rng = RngStream::from_u64(77);
    let demos: Vec<(Vec<u32>, Vec<u32>)> = (0..8)
        .map(|_| (tokens(&mut rng, 5), vec![42, 43, 44, 45]))
        .collect();
    let config = SftConfig {
        epochs: 12,
        batch_size: 4,
        lr: 3e-3,
        grad_clip: 1.0,
        seed: 1,
    };
    let mut epochs = 0;
    let (tuned, losses) =
        supervised_finetune(model(), &demos, &config, &mut |_, _| epochs += 1).unwrap();
    assert_eq!(epochs, 12);
    assert!(losses.last().unwrap() < &(losses[0] * 0.3), "{losses:?}");
    // Greedy decoding now writes the demonstrated completion for a new prompt.
    let prompt = tokens(&mut rng, 5);
    let out = mappa_model::generate(
        &tuned.valid(),
        None,
        &[prompt],
        &mut [RngStream::from_u64(0)],
        &mappa_model::GenerationConfig::greedy(4),
    )
    .unwrap();
    assert_eq!(out[0].token_ids, vec![42, 43, 44, 45]);
}

fn lora_learner(lr: f64, total: usize) -> AgentLearner<B> {
    let lora = mappa_model::LoraConfig::new(4, 8.0);
    let policy = model()
        .with_lora(&lora, &mut RngStream::from_u64(9))
        .unwrap();
    let config = TrainConfig {
        lora: Some(lora),
        ..config(lr, total, 2)
    };
    AgentLearner::new("solver", policy, config)
        .unwrap()
        .with_base_model("fixtures/models/qwen3-tiny")
}

#[test]
fn a_lora_learner_updates_only_its_adapters_against_the_base_as_reference() {
    let mut learner = lora_learner(1e-2, 4);
    let base = hf_tensors(&model());
    // The reference is the base itself (no adapters), not a copy of the policy.
    assert!(learner.reference().lora_config().is_none());
    let batch = samples(&learner, 3, &[1.0, -1.0, 0.5]);
    // B = 0 at the start: the policy is the base, bit for bit.
    for s in &batch {
        assert_eq!(s.old_logprobs, s.ref_logprobs);
    }
    let adapters_before = learner.policy().adapter_tensors();
    let metrics = learner.train_step(&batch, &LossConfig::default()).unwrap();
    assert!(metrics.grad_norm > 0.0);
    assert_eq!(
        hf_tensors(learner.policy()),
        base,
        "a frozen base weight moved"
    );
    assert_ne!(
        learner.policy().adapter_tensors(),
        adapters_before,
        "the adapters did not move"
    );
    // The update changed the policy's log-probs, not the reference's.
    // (The same batch as `samples` used: padding changes the last bits.)
    let pairs: Vec<(&[u32], &[u32])> = batch
        .iter()
        .map(|s| (s.prompt.as_slice(), s.completion.as_slice()))
        .collect();
    assert_ne!(
        learner.policy_logprobs(&pairs).unwrap()[0],
        batch[0].old_logprobs
    );
    assert_eq!(
        learner.reference_logprobs(&pairs).unwrap()[0],
        batch[0].ref_logprobs
    );
    // Without adapters in train.lora, a LoRA policy is refused (and vice versa).
    let err = AgentLearner::new("solver", learner.policy().clone(), config(1e-3, 4, 2))
        .err()
        .unwrap()
        .to_string();
    assert!(err.contains("train.lora"), "{err}");
}

#[test]
fn resuming_a_lora_learner_is_bit_identical() {
    let dir = tempfile::tempdir().unwrap();
    let total = 4;
    let mut straight = lora_learner(1e-3, total);
    run_steps(&mut straight, 0, total);
    let mut first = lora_learner(1e-3, total);
    run_steps(&mut first, 0, 2);
    let ck = dir.path().join("step-2");
    save_checkpoint(&ck, &[&first], &state()).unwrap();
    // Only the adapters are stored, in PEFT's layout.
    let agent = ck.join("agents/solver");
    assert!(agent.join("adapter_model.safetensors").exists());
    assert!(!agent.join("model.safetensors").exists());
    let peft: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(agent.join("adapter_config.json")).unwrap())
            .unwrap();
    assert_eq!(
        peft["base_model_name_or_path"],
        "fixtures/models/qwen3-tiny"
    );
    let mut resumed = vec![lora_learner(1e-3, total)];
    load_checkpoint(&ck, &mut resumed).unwrap();
    run_steps(&mut resumed[0], 2, total);
    assert_eq!(
        straight.policy().adapter_tensors(),
        resumed[0].policy().adapter_tensors(),
        "adapters differ after resume"
    );
}

#[test]
fn bounded_log_prob_batches_are_the_unbounded_calls_on_each_chunk() {
    let learner = AgentLearner::new("solver", model(), config(1e-3, 4, 2)).unwrap();
    let batch = samples(&learner, 8, &[1.0, -0.5, 0.25]);
    let pairs: Vec<(&[u32], &[u32])> = batch
        .iter()
        .map(|s| (s.prompt.as_slice(), s.completion.as_slice()))
        .collect();
    let bounded = AgentLearner::new(
        "solver",
        learner.policy().clone(),
        TrainConfig {
            logprob_batch_size: Some(2),
            ..config(1e-3, 4, 2)
        },
    )
    .unwrap();
    let mut expected = learner.policy_logprobs(&pairs[..2]).unwrap();
    expected.extend(learner.policy_logprobs(&pairs[2..]).unwrap());
    assert_eq!(bounded.policy_logprobs(&pairs).unwrap(), expected);
    let mut expected = learner.reference_logprobs(&pairs[..2]).unwrap();
    expected.extend(learner.reference_logprobs(&pairs[2..]).unwrap());
    assert_eq!(bounded.reference_logprobs(&pairs).unwrap(), expected);
}
