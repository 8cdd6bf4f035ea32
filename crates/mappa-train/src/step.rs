//! From a scored rollout step to per-agent training samples: credit
//! strategy -> rewards per action; policy and reference log-probs; KL
//! shaping and returns; normalisation over the configured scope; then one
//! list of [`TrainSample`]s per agent. Each agent's samples are only its own
//! actions.

use mappa_credit::{
    CreditConfig, KlPlacement, Mismatch, MismatchTally, SampleKey, ScoredAction, ScoredTrajectory,
};
use mappa_model::AutodiffModelBackend;

use crate::learner::{AgentLearner, TrainSample};
use crate::loss::LossConfig;
use crate::records::UniformSetsLine;
use crate::{TrainConfig, TrainError};

/// One action of a rollout, with its coach score: a view of the rollout's
/// record (the token ids are borrowed).
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutAction<'a> {
    /// Index of the agent (its learner) that acted.
    pub agent: usize,
    /// The full context the agent saw.
    pub prompt: &'a [u32],
    /// What it generated.
    pub completion: &'a [u32],
    /// Whether generation stopped at the token limit before EOS (masked out).
    pub truncated: bool,
    /// The coach's process score in [0, 10].
    pub score: f64,
    /// The rollout policy's log-prob of each completion token, where they
    /// compare with the trainer's (the same temperature); none otherwise.
    pub rollout_logprobs: Option<&'a [f32]>,
}

/// One trajectory of a rollout step.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutTrajectory<'a> {
    /// The prompt (task) it was sampled for.
    pub group: usize,
    /// The graded outcome (1/0, or a [0, 1] quality).
    pub outcome: f64,
    /// Its actions, in chain order.
    pub actions: Vec<RolloutAction<'a>>,
}

/// The PPO loss settings implied by the learner and credit configurations.
pub fn loss_config(train: &TrainConfig, credit: &CreditConfig) -> LossConfig {
    LossConfig {
        clip_low: train.clip_low,
        clip_high: train.clip_high,
        dual_clip: train.dual_clip,
        kl_in_loss: (credit.kl.placement == KlPlacement::Loss)
            .then_some((credit.kl.beta, credit.kl.estimator)),
    }
}

/// An action with its trajectory's prompt group and its reward.
type Rewarded<'r, 'a> = (&'r RolloutAction<'a>, usize, f64);

/// Every action's reward under the credit strategy, in flattened order.
fn rewards<'r, 'a>(
    n_agents: usize,
    trajectories: &'r [RolloutTrajectory<'a>],
    credit: &CreditConfig,
) -> Result<Vec<Rewarded<'r, 'a>>, TrainError> {
    let mut flat = Vec::new();
    for (t, trajectory) in trajectories.iter().enumerate() {
        let scored = ScoredTrajectory {
            group: trajectory.group,
            outcome: trajectory.outcome,
            actions: trajectory
                .actions
                .iter()
                .map(|a| ScoredAction {
                    agent: a.agent,
                    score: a.score,
                })
                .collect(),
        };
        for (action, reward) in trajectory.actions.iter().zip(credit.rewards(&scored)?) {
            if action.agent >= n_agents {
                return Err(TrainError::Input(format!(
                    "trajectory {t}: agent index {} but there are {n_agents} learners",
                    action.agent
                )));
            }
            flat.push((action, trajectory.group, reward));
        }
    }
    Ok(flat)
}

/// Per-token log-probs of every action under its agent's policy and
/// reference, one batch per agent.
#[allow(clippy::type_complexity)] // two lists of per-action log-probs: policy, reference
fn logprobs<B: AutodiffModelBackend>(
    learners: &[AgentLearner<B>],
    flat: &[Rewarded<'_, '_>],
) -> Result<(Vec<Vec<f32>>, Vec<Vec<f32>>), TrainError> {
    let mut old = vec![Vec::new(); flat.len()];
    let mut reference = vec![Vec::new(); flat.len()];
    for (agent, learner) in learners.iter().enumerate() {
        let mine: Vec<usize> = (0..flat.len())
            .filter(|&i| flat[i].0.agent == agent)
            .collect();
        if mine.is_empty() {
            continue;
        }
        let pairs: Vec<(&[u32], &[u32])> = mine
            .iter()
            .map(|&i| (flat[i].0.prompt, flat[i].0.completion))
            .collect();
        for (&i, (o, r)) in mine.iter().zip(
            learner
                .policy_logprobs(&pairs)?
                .into_iter()
                .zip(learner.reference_logprobs(&pairs)?),
        ) {
            old[i] = o;
            reference[i] = r;
        }
    }
    Ok((old, reference))
}

/// What credit assignment gave one action.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActionCredit {
    /// Its reward.
    pub reward: f64,
    /// Its mean advantage over valid tokens (0 when none is valid).
    pub advantage_mean: f64,
}

impl ActionCredit {
    /// The credit of a sample: its reward and the mean of its advantages
    /// where `mask` holds.
    fn of(reward: f64, advantages: &[f32], mask: &[bool]) -> Self {
        let valid: Vec<f64> = advantages
            .iter()
            .zip(mask)
            .filter(|(_, m)| **m)
            .map(|(x, _)| *x as f64)
            .collect();
        Self {
            reward,
            advantage_mean: valid.iter().sum::<f64>() / valid.len().max(1) as f64,
        }
    }
}

/// A step's training samples, one list per learner (indexed like the
/// learners), each action's credit, and its normalisation sets whose
/// rewards were all equal.
#[derive(Debug, Clone)]
pub struct CreditedStep {
    /// Each learner's samples.
    pub samples: Vec<Vec<TrainSample>>,
    /// Each trajectory's credit, one entry per action in action order
    /// (indexed like the trajectories given to [`build_samples`]).
    pub credit: Vec<Vec<ActionCredit>>,
    /// The normalisation sets with a valid token, and how many of them had
    /// equal rewards (`[credit] uniform`).
    pub uniform_sets: UniformSetsLine,
    /// Each learner's rollout-trainer mismatch over its valid tokens (none
    /// without rollout log-probs or valid tokens).
    pub mismatch: Vec<Option<Mismatch>>,
    /// Each learner's rollout correction, where one is set.
    pub correction: Vec<Option<CorrectionLine>>,
}

/// What a rollout correction did to one agent's step.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct CorrectionLine {
    /// Valid tokens before the correction.
    pub tokens: usize,
    /// Of those, the ones it masked out of the loss.
    pub masked: usize,
    /// Mean importance weight over the tokens still counted.
    pub mean_weight: f64,
    /// Largest importance weight.
    pub max_weight: f64,
}

/// Turn a step's trajectories into training samples, one list per learner
/// (indexed like `learners`): rewards, log-probs, KL shaping and returns,
/// then normalisation over the configured scope.
pub fn build_samples<B: AutodiffModelBackend>(
    learners: &[AgentLearner<B>],
    trajectories: &[RolloutTrajectory<'_>],
    credit: &CreditConfig,
) -> Result<CreditedStep, TrainError> {
    credit.validate()?;
    let flat = rewards(learners.len(), trajectories, credit)?;
    let (old, reference) = logprobs(learners, &flat)?;
    let masks: Vec<Vec<bool>> = flat
        .iter()
        .map(|(a, _, _)| vec![!a.truncated; a.completion.len()])
        .collect();
    // The policy's log-probs in f64, once: shaping, the mismatch and a
    // correction all read them so.
    let old64: Vec<Vec<f64>> = old.iter().map(|v| to64(v)).collect();
    let (advantages, uniform_sets) =
        normalised_advantages(credit, &flat, &old64, &reference, &masks)?;
    let rollout = rollout_logprobs(&flat, &old64)?;
    let mismatch = mismatch(learners, &flat, &old64, &rollout, &masks);
    let mut per_agent: Vec<Vec<TrainSample>> = vec![Vec::new(); learners.len()];
    let mut correction: Vec<Option<CorrectionLine>> = learners
        .iter()
        .map(|l| {
            l.config()
                .rollout_correction
                .map(|_| CorrectionLine::default())
        })
        .collect();
    let mut flat_credit = Vec::with_capacity(flat.len());
    for (i, ((((action, _, reward), mask), advantages), (old, reference))) in flat
        .into_iter()
        .zip(masks)
        .zip(advantages)
        .zip(old.into_iter().zip(reference))
        .enumerate()
    {
        let advantages: Vec<f32> = advantages.iter().map(|&a| a as f32).collect();
        flat_credit.push(ActionCredit::of(reward, &advantages, &mask));
        let (mask, is_weights) = correct(
            &learners[action.agent],
            correction[action.agent].as_mut(),
            mask,
            &old64[i],
            rollout[i].as_deref(),
        )?;
        per_agent[action.agent].push(TrainSample {
            prompt: action.prompt.to_vec(),
            completion: action.completion.to_vec(),
            old_logprobs: old,
            ref_logprobs: reference,
            advantages,
            mask,
            is_weights,
            reward,
        });
    }
    let mut flat_credit = flat_credit.into_iter();
    let credit = trajectories
        .iter()
        .map(|t| flat_credit.by_ref().take(t.actions.len()).collect())
        .collect();
    Ok(CreditedStep {
        samples: per_agent,
        credit,
        uniform_sets,
        mismatch,
        correction: correction
            .into_iter()
            .map(|c| c.map(CorrectionLine::finish))
            .collect(),
    })
}

/// Every action's per-token advantages: KL-shaped returns from the policy
/// and reference log-probs, normalised over the configured scope; and the
/// step's normalisation sets.
fn normalised_advantages(
    credit: &CreditConfig,
    flat: &[Rewarded<'_, '_>],
    old: &[Vec<f64>],
    reference: &[Vec<f32>],
    masks: &[Vec<bool>],
) -> Result<(Vec<Vec<f64>>, UniformSetsLine), TrainError> {
    let returns = flat
        .iter()
        .enumerate()
        .map(|(i, (_, _, reward))| {
            let shaped = credit.shape(*reward, &old[i], &to64(&reference[i]), &masks[i])?;
            Ok(shaped.returns)
        })
        .collect::<Result<Vec<_>, TrainError>>()?;
    let keys: Vec<SampleKey> = flat
        .iter()
        .map(|(a, group, _)| SampleKey {
            agent: a.agent,
            group: *group,
        })
        .collect();
    let rewards: Vec<f64> = flat.iter().map(|(_, _, reward)| *reward).collect();
    let normalised = credit.advantages(&keys, &rewards, &returns, masks)?;
    let uniform_sets = UniformSetsLine {
        handling: credit.uniform,
        sets: normalised.sets,
        uniform: normalised.uniform_sets,
    };
    Ok((normalised.advantages, uniform_sets))
}

/// Log-probs as f64.
fn to64(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| x as f64).collect()
}

/// One sample's mask and importance weights under its learner's rollout
/// correction (`line` is where one is set; unchanged and none otherwise),
/// the correction's counts added to `line`.
fn correct<B: AutodiffModelBackend>(
    learner: &AgentLearner<B>,
    line: Option<&mut CorrectionLine>,
    mask: Vec<bool>,
    old: &[f64],
    rollout: Option<&[f64]>,
) -> Result<(Vec<bool>, Vec<f32>), TrainError> {
    let (Some(line), Some(setting)) = (line, learner.config().rollout_correction) else {
        return Ok((mask, Vec::new()));
    };
    let rollout = rollout.ok_or_else(|| {
        TrainError::Config(format!(
            "train.rollout_correction: the {} agent's actions carry no rollout log-probs to \
             correct against (see docs/engines.md, \"Rollout log-probs and the mismatch\")",
            learner.name()
        ))
    })?;
    let corrected = setting.apply(old, rollout, &mask);
    line.add(&mask, &corrected.mask, &corrected.weights);
    let weights = corrected.weights.iter().map(|&w| w as f32).collect();
    Ok((corrected.mask, weights))
}

/// Each action's rollout log-probs as f64, checked against its length.
fn rollout_logprobs(
    flat: &[Rewarded<'_, '_>],
    old: &[Vec<f64>],
) -> Result<Vec<Option<Vec<f64>>>, TrainError> {
    flat.iter()
        .zip(old)
        .enumerate()
        .map(|(i, ((action, _, _), old))| match action.rollout_logprobs {
            Some(r) if r.len() != old.len() => Err(TrainError::Input(format!(
                "action {i}: {} rollout log-probs for {} completion tokens",
                r.len(),
                old.len()
            ))),
            Some(r) => Ok(Some(to64(r))),
            None => Ok(None),
        })
        .collect()
}

/// Each learner's rollout-trainer mismatch over its actions' valid tokens.
fn mismatch<B: AutodiffModelBackend>(
    learners: &[AgentLearner<B>],
    flat: &[Rewarded<'_, '_>],
    old: &[Vec<f64>],
    rollout: &[Option<Vec<f64>>],
    masks: &[Vec<bool>],
) -> Vec<Option<Mismatch>> {
    let mut tallies: Vec<MismatchTally> = learners
        .iter()
        .map(|l| MismatchTally::new(l.config().mismatch_band))
        .collect();
    for (i, (action, _, _)) in flat.iter().enumerate() {
        if let Some(rollout) = &rollout[i] {
            tallies[action.agent].add(&old[i], rollout, &masks[i]);
        }
    }
    tallies.iter().map(MismatchTally::finish).collect()
}

impl CorrectionLine {
    /// Adds one action: its mask before and after, and its weights.
    fn add(&mut self, before: &[bool], after: &[bool], weights: &[f64]) {
        for ((&b, &a), &w) in before.iter().zip(after).zip(weights) {
            self.tokens += usize::from(b);
            self.masked += usize::from(b && !a);
            if a {
                // Summed here, divided in `finish`.
                self.mean_weight += w;
                self.max_weight = self.max_weight.max(w);
            }
        }
    }

    fn finish(mut self) -> Self {
        let kept = self.tokens - self.masked;
        self.mean_weight /= kept.max(1) as f64;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_loss_is_what_the_default_settings_give() {
        let from_settings = loss_config(&TrainConfig::default(), &CreditConfig::default());
        assert_eq!(LossConfig::default(), from_settings);
    }
}
