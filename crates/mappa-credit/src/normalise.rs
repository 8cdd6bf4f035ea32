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
    let per_agent = |i: usize| keys[i].agent;
    let per_agent_group = |i: usize| keys[i];
    Ok(match scope {
        NormScope::PerAgentGlobal => standardise(returns, masks, per_agent),
        NormScope::AllAgentsGlobal => standardise(returns, masks, |_| ()),
        NormScope::PerPromptGroup => standardise(returns, masks, per_agent_group),
        NormScope::GroupMeanThenGlobal => {
            let centred = centre(returns, masks, per_agent_group);
            standardise(&centred, masks, per_agent)
        }
        NormScope::None => map_valid(returns, masks, |_, g| g),
    })
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

    fn standardise(&self, value: f64) -> f64 {
        if self.std < STD_EPSILON {
            value - self.mean
        } else {
            (value - self.mean) / self.std
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

/// `(G - mean) / std` per set (only centred where the std is ~0).
fn standardise<K: Ord>(
    values: &[Vec<f64>],
    masks: &[Vec<bool>],
    set: impl Fn(usize) -> K,
) -> Vec<Vec<f64>> {
    let stats = set_stats(values, masks, &set);
    map_valid(values, masks, |i, x| stats[&set(i)].standardise(x))
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
