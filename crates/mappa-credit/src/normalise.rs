//! Advantage normalisation over a rollout step (docs/METHOD.md section 5, step 4).
//!
//! Each sample (one action's completion) has a [`SampleKey`] (its agent and
//! prompt group), per-token returns and a mask. A [`NormScope`] says which
//! samples' valid tokens share a mean and standard deviation;
//! `A = (G - mean) / std` with the population std, or `A = G - mean` when the
//! std is below [`STD_EPSILON`], so advantages are always finite. Masked
//! tokens get advantage 0 and never enter a statistic.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::CreditError;

/// Below this standard deviation advantages are only centred, not scaled.
pub const STD_EPSILON: f64 = 1e-8;

/// Over which tokens advantages are normalised. Chosen in a manifest as
/// `scope = "..."`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormScope {
    /// Over all valid tokens of all samples of the same agent in the step;
    /// agents are never pooled (the paper).
    #[default]
    PerAgentGlobal,
    /// Over all valid tokens of all samples, all agents pooled. An ablation:
    /// pooling is known to cause gradient spikes when the agents' reward
    /// scales differ.
    AllAgentsGlobal,
    /// Over the valid tokens of the samples with the same (agent, prompt
    /// group): GRPO-like.
    PerPromptGroup,
    /// Subtract the (agent, prompt group) mean of the valid-token returns,
    /// then normalise per agent globally (REINFORCE++ with baseline).
    GroupMeanThenGlobal,
    /// The returns themselves (0 at masked tokens).
    None,
}

/// Which agent produced a sample, and for which prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SampleKey {
    /// The agent's index.
    pub agent: usize,
    /// The prompt group (the prompt the trajectory was sampled for).
    pub group: usize,
}

/// The advantages of a step's samples: one vector per sample, one value per
/// token, 0 at masked tokens.
///
/// `keys`, `returns` and `masks` have one entry per sample, and `returns[i]`
/// and `masks[i]` one per token. Errors on mismatched lengths or a
/// non-finite return at a valid token.
pub fn advantages(
    keys: &[SampleKey],
    returns: &[Vec<f64>],
    masks: &[Vec<bool>],
    scope: NormScope,
) -> Result<Vec<Vec<f64>>, CreditError> {
    validate_batch(keys, returns, masks)?;
    Ok(scoped(keys, returns, masks, scope, 0.0))
}

/// [`advantages`] with every divisor at least `floor`.
fn scoped(
    keys: &[SampleKey],
    returns: &[Vec<f64>],
    masks: &[Vec<bool>],
    scope: NormScope,
    floor: f64,
) -> Vec<Vec<f64>> {
    let per_agent = |i: usize| keys[i].agent;
    let per_agent_group = |i: usize| keys[i];
    match scope {
        NormScope::PerAgentGlobal => standardise(returns, masks, per_agent, floor),
        NormScope::AllAgentsGlobal => standardise(returns, masks, |_| (), floor),
        NormScope::PerPromptGroup => standardise(returns, masks, per_agent_group, floor),
        NormScope::GroupMeanThenGlobal => {
            let centred = centre(returns, masks, per_agent_group);
            standardise(&centred, masks, per_agent, floor)
        }
        NormScope::None => map_valid(returns, masks, |_, g| g),
    }
}

/// What normalisation does with a set of samples whose rewards are all
/// equal (every trajectory failed, or every one succeeded, under outcome
/// credit): its returns then differ only by the KL term, which
/// standardising blows up to unit variance. The set is the scope's: an
/// agent's samples of the step (`per_agent_global`, and `none`), all
/// samples (`all_agents_global`), or an agent's samples of one prompt
/// (`per_prompt_group`, `group_mean_then_global`). Chosen in a manifest as
/// `[credit] uniform = "keep"`, `"skip"` or `{ std_floor = 0.5 }`.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum UniformSets {
    /// Standardised like any other set.
    #[default]
    Keep,
    /// No policy-gradient step from it: its advantages are 0 and it enters
    /// no statistic, as dynamic-sampling filters drop such groups.
    Skip,
    /// Every set's advantages are divided by at least this standard
    /// deviation (in the returns' units), so that a set whose returns
    /// differ only by the KL term keeps small advantages.
    StdFloor(f64),
}

impl UniformSets {
    /// Whether this is the default (`keep`).
    pub fn is_keep(&self) -> bool {
        *self == UniformSets::Keep
    }

    /// Checks the floor: finite and positive, and only where the scope
    /// divides by a standard deviation.
    pub fn validate(&self, scope: NormScope) -> Result<(), CreditError> {
        let UniformSets::StdFloor(floor) = *self else {
            return Ok(());
        };
        let expected = if scope == NormScope::None {
            "absent: scope = \"none\" divides by no standard deviation"
        } else {
            "finite and above 0"
        };
        if scope == NormScope::None || !(floor.is_finite() && floor > 0.0) {
            return Err(CreditError::InvalidParameter {
                name: "uniform.std_floor",
                value: floor,
                expected,
            });
        }
        Ok(())
    }
}

/// A step's advantages, and how many of its sets had equal rewards.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalised {
    /// One vector per sample, one value per token, 0 at masked tokens.
    pub advantages: Vec<Vec<f64>>,
    /// The sets (per [`UniformSets`]' definition) with a valid token.
    pub sets: usize,
    /// Those whose samples' rewards were all equal.
    pub uniform_sets: usize,
}

/// [`advantages`], with sets whose `rewards` (one per sample) are all equal
/// handled as `uniform` says, and counted.
pub fn normalise(
    keys: &[SampleKey],
    rewards: &[f64],
    returns: &[Vec<f64>],
    masks: &[Vec<bool>],
    scope: NormScope,
    uniform: UniformSets,
) -> Result<Normalised, CreditError> {
    validate_batch(keys, returns, masks)?;
    uniform.validate(scope)?;
    if rewards.len() != keys.len() {
        return Err(CreditError::LengthMismatch {
            what: "rewards (samples)".into(),
            expected: keys.len(),
            found: rewards.len(),
        });
    }
    if let Some((i, &value)) = rewards.iter().enumerate().find(|(_, r)| !r.is_finite()) {
        return Err(CreditError::NonFinite {
            what: format!("rewards[{i}]"),
            value,
        });
    }
    let set = |i: usize| match scope {
        NormScope::AllAgentsGlobal => (None, None),
        NormScope::PerAgentGlobal | NormScope::None => (Some(keys[i].agent), None),
        NormScope::PerPromptGroup | NormScope::GroupMeanThenGlobal => {
            (Some(keys[i].agent), Some(keys[i].group))
        }
    };
    let uniform_of = uniform_sets(rewards, masks, set);
    let floor = match uniform {
        UniformSets::StdFloor(floor) => floor,
        UniformSets::Keep | UniformSets::Skip => 0.0,
    };
    // Skipped sets are dropped before any statistic, as if masked.
    let kept: Vec<Vec<bool>>;
    let masks = if uniform == UniformSets::Skip {
        kept = (0..keys.len())
            .map(|i| match uniform_of.get(&set(i)) {
                Some(true) => vec![false; masks[i].len()],
                _ => masks[i].clone(),
            })
            .collect();
        &kept
    } else {
        masks
    };
    let advantages = scoped(keys, returns, masks, scope, floor);
    Ok(Normalised {
        advantages,
        sets: uniform_of.len(),
        uniform_sets: uniform_of.values().filter(|&&u| u).count(),
    })
}

/// Whether each set's samples with a valid token have equal rewards (the
/// sets without one are left out).
fn uniform_sets<K: Ord>(
    rewards: &[f64],
    masks: &[Vec<bool>],
    set: impl Fn(usize) -> K,
) -> BTreeMap<K, bool> {
    let mut first: BTreeMap<K, (f64, bool)> = BTreeMap::new();
    for (i, (&reward, mask)) in rewards.iter().zip(masks).enumerate() {
        if !mask.iter().any(|&m| m) {
            continue;
        }
        first
            .entry(set(i))
            .and_modify(|(r, equal)| *equal &= *r == reward)
            .or_insert((reward, true));
    }
    first
        .into_iter()
        .map(|(k, (_, equal))| (k, equal))
        .collect()
}

fn validate_batch(
    keys: &[SampleKey],
    returns: &[Vec<f64>],
    masks: &[Vec<bool>],
) -> Result<(), CreditError> {
    let mismatch = |what: String, expected: usize, found: usize| {
        Err(CreditError::LengthMismatch {
            what,
            expected,
            found,
        })
    };
    if returns.len() != keys.len() {
        return mismatch("returns (samples)".into(), keys.len(), returns.len());
    }
    if masks.len() != keys.len() {
        return mismatch("masks (samples)".into(), keys.len(), masks.len());
    }
    for (i, (g, m)) in returns.iter().zip(masks).enumerate() {
        if m.len() != g.len() {
            return mismatch(format!("masks[{i}] (tokens)"), g.len(), m.len());
        }
        if let Some((t, &value)) = valid(g, m).find(|(_, v)| !v.is_finite()) {
            return Err(CreditError::NonFinite {
                what: format!("returns[{i}][{t}]"),
                value,
            });
        }
    }
    Ok(())
}

/// The mean and population standard deviation of one token set.
#[derive(Debug, Clone, Copy)]
struct SetStats {
    mean: f64,
    std: f64,
}

impl SetStats {
    /// Two-pass statistics of a non-empty set.
    fn of(values: &[f64]) -> Self {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        Self {
            mean,
            std: variance.sqrt(),
        }
    }

    /// `(value - mean) / max(std, floor)`, or `value - mean` where that
    /// divisor is below [`STD_EPSILON`].
    fn standardise(&self, value: f64, floor: f64) -> f64 {
        let divisor = self.std.max(floor);
        if divisor < STD_EPSILON {
            value - self.mean
        } else {
            (value - self.mean) / divisor
        }
    }
}

/// The valid (index, value) pairs of one sample.
fn valid<'a>(values: &'a [f64], mask: &'a [bool]) -> impl Iterator<Item = (usize, &'a f64)> {
    values.iter().enumerate().filter(|&(t, _)| mask[t])
}

/// Statistics of the valid tokens, per set; `set(i)` names sample i's set.
fn set_stats<K: Ord>(
    values: &[Vec<f64>],
    masks: &[Vec<bool>],
    set: &impl Fn(usize) -> K,
) -> BTreeMap<K, SetStats> {
    let mut members: BTreeMap<K, Vec<f64>> = BTreeMap::new();
    for (i, (v, m)) in values.iter().zip(masks).enumerate() {
        members
            .entry(set(i))
            .or_default()
            .extend(valid(v, m).map(|(_, &x)| x));
    }
    members
        .into_iter()
        .filter(|(_, xs)| !xs.is_empty())
        .map(|(k, xs)| (k, SetStats::of(&xs)))
        .collect()
}

/// `f(sample, value)` at valid tokens, 0 at masked ones.
fn map_valid(
    values: &[Vec<f64>],
    masks: &[Vec<bool>],
    f: impl Fn(usize, f64) -> f64,
) -> Vec<Vec<f64>> {
    values
        .iter()
        .zip(masks)
        .enumerate()
        .map(|(i, (v, m))| {
            v.iter()
                .zip(m)
                .map(|(&x, &ok)| if ok { f(i, x) } else { 0.0 })
                .collect()
        })
        .collect()
}

/// `(G - mean) / max(std, floor)` per set (only centred where that is ~0).
fn standardise<K: Ord>(
    values: &[Vec<f64>],
    masks: &[Vec<bool>],
    set: impl Fn(usize) -> K,
    floor: f64,
) -> Vec<Vec<f64>> {
    let stats = set_stats(values, masks, &set);
    map_valid(values, masks, |i, x| stats[&set(i)].standardise(x, floor))
}

/// `G - mean` per set.
fn centre<K: Ord>(
    values: &[Vec<f64>],
    masks: &[Vec<bool>],
    set: impl Fn(usize) -> K,
) -> Vec<Vec<f64>> {
    let stats = set_stats(values, masks, &set);
    map_valid(values, masks, |i, x| x - stats[&set(i)].mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(agent: usize, group: usize) -> SampleKey {
        SampleKey { agent, group }
    }

    fn assert_close(got: &[Vec<f64>], want: &[Vec<f64>]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.len(), w.len(), "{got:?} vs {want:?}");
            for (a, b) in g.iter().zip(w) {
                assert!((a - b).abs() < 1e-12, "{got:?} vs {want:?}");
            }
        }
    }

    /// Agent 0: returns 1 and 3 (group 0), 5 (group 1). Agent 1: 10 and 20
    /// (group 0). One token each, plus one masked token of return 100.
    fn batch() -> (Vec<SampleKey>, Vec<Vec<f64>>, Vec<Vec<bool>>) {
        let keys = vec![key(0, 0), key(0, 0), key(0, 1), key(1, 0), key(1, 0)];
        let returns = [1.0, 3.0, 5.0, 10.0, 20.0]
            .iter()
            .map(|&g| vec![g, 100.0])
            .collect();
        let masks = vec![vec![true, false]; 5];
        (keys, returns, masks)
    }

    fn run(scope: NormScope) -> Vec<Vec<f64>> {
        let (keys, returns, masks) = batch();
        advantages(&keys, &returns, &masks, scope).unwrap()
    }

    fn column(values: &[f64]) -> Vec<Vec<f64>> {
        values.iter().map(|&a| vec![a, 0.0]).collect()
    }

    #[test]
    fn per_agent_global() {
        // Agent 0: mean 3, std sqrt(8/3). Agent 1: mean 15, std 5.
        let s = (8.0f64 / 3.0).sqrt();
        assert_close(
            &run(NormScope::PerAgentGlobal),
            &column(&[-2.0 / s, 0.0, 2.0 / s, -1.0, 1.0]),
        );
    }

    #[test]
    fn all_agents_global() {
        // Mean 7.8, population std sqrt(46.16).
        let s = 46.16f64.sqrt();
        let want: Vec<f64> = [1.0, 3.0, 5.0, 10.0, 20.0]
            .iter()
            .map(|g| (g - 7.8) / s)
            .collect();
        assert_close(&run(NormScope::AllAgentsGlobal), &column(&want));
    }

    #[test]
    fn per_prompt_group() {
        // (0, 1) has one sample: std 0, so only centred.
        assert_close(
            &run(NormScope::PerPromptGroup),
            &column(&[-1.0, 1.0, 0.0, -1.0, 1.0]),
        );
    }

    #[test]
    fn group_mean_then_global() {
        // Centred: agent 0 -> -1, 1, 0 (std sqrt(2/3)); agent 1 -> -5, 5 (std 5).
        let s = (2.0f64 / 3.0).sqrt();
        assert_close(
            &run(NormScope::GroupMeanThenGlobal),
            &column(&[-1.0 / s, 1.0 / s, 0.0, -1.0, 1.0]),
        );
    }

    #[test]
    fn no_normalisation_keeps_returns_and_zeroes_masked_tokens() {
        assert_close(&run(NormScope::None), &column(&[1.0, 3.0, 5.0, 10.0, 20.0]));
    }

    #[test]
    fn constant_returns_give_zero_advantages() {
        let keys = vec![key(0, 0); 3];
        let returns = vec![vec![0.7; 2]; 3];
        let masks = vec![vec![true; 2]; 3];
        for scope in [
            NormScope::PerAgentGlobal,
            NormScope::AllAgentsGlobal,
            NormScope::PerPromptGroup,
            NormScope::GroupMeanThenGlobal,
        ] {
            let a = advantages(&keys, &returns, &masks, scope).unwrap();
            assert!(
                a.iter().flatten().all(|x| x.abs() < 1e-12),
                "{scope:?}: {a:?}"
            );
        }
    }

    #[test]
    fn fully_masked_samples_and_empty_batches() {
        let keys = vec![key(0, 0), key(1, 0)];
        let returns = vec![vec![1.0, 2.0], vec![f64::NAN]];
        let masks = vec![vec![true, true], vec![false]];
        let a = advantages(&keys, &returns, &masks, NormScope::PerAgentGlobal).unwrap();
        assert_close(&a, &[vec![-1.0, 1.0], vec![0.0]]);
        assert!(advantages(&[], &[], &[], NormScope::AllAgentsGlobal)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn errors_name_lengths_and_values() {
        let (keys, returns, masks) = batch();
        let message = |r: Result<Vec<Vec<f64>>, CreditError>| r.unwrap_err().to_string();
        assert_eq!(
            message(advantages(&keys[..4], &returns, &masks, NormScope::None)),
            "length mismatch: returns (samples) has length 5, expected 4"
        );
        assert_eq!(
            message(advantages(&keys, &returns, &masks[..3], NormScope::None)),
            "length mismatch: masks (samples) has length 3, expected 5"
        );
        let mut short = masks.clone();
        short[2] = vec![true];
        assert_eq!(
            message(advantages(&keys, &returns, &short, NormScope::None)),
            "length mismatch: masks[2] (tokens) has length 1, expected 2"
        );
        let mut bad = returns.clone();
        bad[3][0] = f64::INFINITY;
        assert_eq!(
            message(advantages(&keys, &bad, &masks, NormScope::None)),
            "returns[3][0] = inf is not finite"
        );
    }

    #[test]
    fn scope_names_in_manifests() {
        let s: NormScope = serde_json::from_str("\"per_agent_global\"").unwrap();
        assert_eq!(s, NormScope::PerAgentGlobal);
        let s: NormScope = serde_json::from_str("\"group_mean_then_global\"").unwrap();
        assert_eq!(s, NormScope::GroupMeanThenGlobal);
        assert_eq!(serde_json::to_string(&NormScope::None).unwrap(), "\"none\"");
    }
}
