//! Property tests of the credit maths: normalisation statistics, mask
//! independence, affine invariance, the return recursion and finiteness.

use std::collections::BTreeMap;

use mappa_credit::{
    advantages, normalise, shape, CorrectionLevel, CorrectionMode, CreditStrategy, KlConfig,
    KlEstimator, KlPlacement, NormScope, RolloutCorrection, SampleKey, ScoredAction,
    ScoredTrajectory, UniformSets,
};
use proptest::prelude::*;

const NORMALISING: [NormScope; 4] = [
    NormScope::PerAgentGlobal,
    NormScope::AllAgentsGlobal,
    NormScope::PerPromptGroup,
    NormScope::GroupMeanThenGlobal,
];

/// One sample: its key, per-token values and mask.
#[derive(Debug, Clone)]
struct Sample {
    key: SampleKey,
    values: Vec<f64>,
    mask: Vec<bool>,
}

fn sample(value: impl Strategy<Value = f64> + Clone) -> impl Strategy<Value = Sample> {
    (0..3usize, 0..2usize, 1..6usize).prop_flat_map(move |(agent, group, len)| {
        (
            prop::collection::vec(value.clone(), len),
            prop::collection::vec(any::<bool>(), len),
        )
            .prop_map(move |(values, mask)| Sample {
                key: SampleKey { agent, group },
                values,
                mask,
            })
    })
}

fn batch() -> impl Strategy<Value = Vec<Sample>> {
    prop::collection::vec(sample(-5.0..5.0f64), 1..10)
}

type Columns = (Vec<SampleKey>, Vec<Vec<f64>>, Vec<Vec<bool>>);

fn columns(samples: &[Sample]) -> Columns {
    (
        samples.iter().map(|s| s.key).collect(),
        samples.iter().map(|s| s.values.clone()).collect(),
        samples.iter().map(|s| s.mask.clone()).collect(),
    )
}

/// Sample i's token set under a normalising scope (the set the final
/// standardisation runs over).
fn set_of(scope: NormScope, key: SampleKey) -> (usize, usize) {
    match scope {
        NormScope::PerAgentGlobal | NormScope::GroupMeanThenGlobal => (key.agent, 0),
        NormScope::AllAgentsGlobal => (0, 0),
        NormScope::PerPromptGroup => (key.agent, key.group),
        NormScope::None => unreachable!("not a normalising scope"),
    }
}

/// The valid advantages of each of the scope's token sets.
fn sets(scope: NormScope, samples: &[Sample], adv: &[Vec<f64>]) -> Vec<Vec<f64>> {
    let mut sets: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for (s, a) in samples.iter().zip(adv) {
        let valid = a.iter().zip(&s.mask).filter(|(_, &m)| m).map(|(&x, _)| x);
        sets.entry(set_of(scope, s.key)).or_default().extend(valid);
    }
    sets.into_values().filter(|v| !v.is_empty()).collect()
}

fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    (mean, var.sqrt())
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * a.abs().max(b.abs()).max(1.0)
}

fn one_token_shaped_return(reward: f64) -> Vec<f64> {
    let kl = KlConfig {
        beta: 0.0,
        ..KlConfig::default()
    };
    shape(reward, &[-1.0], &[-0.5], &[true], &kl, 1.0)
        .unwrap()
        .returns
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn normalised_sets_have_mean_zero_and_std_one(samples in batch()) {
        let (keys, returns, masks) = columns(&samples);
        for scope in NORMALISING {
            let adv = advantages(&keys, &returns, &masks, scope).unwrap();
            for set in sets(scope, &samples, &adv) {
                let (mean, std) = mean_std(&set);
                prop_assert!(close(mean, 0.0, 1e-9), "{scope:?}: mean {mean} of {set:?}");
                // A set whose std was ~0 is only centred, so its std stays ~0.
                prop_assert!(
                    close(std, 1.0, 1e-9) || std < 1e-8,
                    "{scope:?}: std {std} of {set:?}"
                );
            }
        }
    }

    #[test]
    fn masked_returns_never_change_advantages(
        samples in batch(),
        noise in prop::collection::vec(-1e6..1e6f64, 50),
    ) {
        let (keys, returns, masks) = columns(&samples);
        let mut noisy = returns.clone();
        let mut next = noise.iter().cycle();
        for (g, m) in noisy.iter_mut().zip(&masks) {
            for (x, _) in g.iter_mut().zip(m).filter(|(_, &ok)| !ok) {
                *x = *next.next().unwrap();
            }
        }
        for scope in NORMALISING.into_iter().chain([NormScope::None]) {
            let clean = advantages(&keys, &returns, &masks, scope).unwrap();
            let dirty = advantages(&keys, &noisy, &masks, scope).unwrap();
            prop_assert_eq!(&clean, &dirty);
            let masked = clean.iter().flatten().zip(masks.iter().flatten());
            prop_assert!(masked.filter(|(_, &m)| !m).all(|(&a, _)| a == 0.0));
        }
    }

    #[test]
    fn masked_logprobs_never_change_shaping(
        reward in -10.0..10.0f64,
        tokens in prop::collection::vec((-3.0..0.0f64, -3.0..0.0f64, any::<bool>(), -50.0..50.0f64), 1..12),
        gamma in 0.0..=1.0f64,
        estimator in prop_oneof![Just(KlEstimator::K1), Just(KlEstimator::K2), Just(KlEstimator::K3)],
    ) {
        let kl = KlConfig { beta: 0.1, estimator, placement: KlPlacement::Reward };
        let old: Vec<f64> = tokens.iter().map(|t| t.0).collect();
        let reference: Vec<f64> = tokens.iter().map(|t| t.1).collect();
        let mask: Vec<bool> = tokens.iter().map(|t| t.2).collect();
        let perturb = |values: &[f64]| -> Vec<f64> {
            values.iter().zip(&tokens).map(|(&v, t)| if t.2 { v } else { v + t.3 }).collect()
        };
        let clean = shape(reward, &old, &reference, &mask, &kl, gamma).unwrap();
        let dirty = shape(reward, &perturb(&old), &perturb(&reference), &mask, &kl, gamma).unwrap();
        prop_assert_eq!(clean, dirty);
    }

    #[test]
    fn one_token_per_agent_global_is_the_standardised_reward(
        rewarded in prop::collection::vec((0..3usize, 0..2usize, -10.0..10.0f64), 1..12),
    ) {
        let keys: Vec<SampleKey> =
            rewarded.iter().map(|&(agent, group, _)| SampleKey { agent, group }).collect();
        let returns: Vec<Vec<f64>> =
            rewarded.iter().map(|r| one_token_shaped_return(r.2)).collect();
        let masks = vec![vec![true]; keys.len()];
        let adv = advantages(&keys, &returns, &masks, NormScope::PerAgentGlobal).unwrap();
        for (i, &(agent, _, reward)) in rewarded.iter().enumerate() {
            let same_agent: Vec<f64> =
                rewarded.iter().filter(|r| r.0 == agent).map(|r| r.2).collect();
            let (mean, std) = mean_std(&same_agent);
            let want = if std < 1e-8 { reward - mean } else { (reward - mean) / std };
            prop_assert!(close(adv[i][0], want, 1e-9), "{} vs {}", adv[i][0], want);
        }
    }

    #[test]
    fn normalising_scopes_are_affine_invariant(
        samples in prop::collection::vec(sample(Just(0.0)), 1..10),
        // Rewards on a quarter grid, so a set's std is 0 or clearly not.
        steps in prop::collection::vec(-20..20i32, 10),
        a in 0.1..10.0f64,
        b in -10.0..10.0f64,
    ) {
        let kl = KlConfig { beta: 0.0, ..KlConfig::default() };
        let (keys, _, masks) = columns(&samples);
        let returns_for = |scale: f64, shift: f64| -> Vec<Vec<f64>> {
            samples.iter().zip(&steps).map(|(s, &k)| {
                let reward = scale * (f64::from(k) / 4.0) + shift;
                let old = vec![-1.0; s.mask.len()];
                shape(reward, &old, &old, &s.mask, &kl, 1.0).unwrap().returns
            }).collect()
        };
        let plain = returns_for(1.0, 0.0);
        let moved = returns_for(a, b);
        for scope in NORMALISING {
            let want = advantages(&keys, &plain, &masks, scope).unwrap();
            let got = advantages(&keys, &moved, &masks, scope).unwrap();
            for (x, y) in want.iter().flatten().zip(got.iter().flatten()) {
                prop_assert!(close(*x, *y, 1e-9), "{scope:?}: {want:?} vs {got:?}");
            }
        }
    }

    #[test]
    fn outcome_gives_every_action_the_same_reward(
        outcome in -20.0..20.0f64,
        actions in prop::collection::vec((0..4usize, 0.0..=10.0f64), 1..8),
    ) {
        let t = ScoredTrajectory {
            group: 0,
            outcome,
            actions: actions.into_iter().map(|(agent, score)| ScoredAction { agent, score }).collect(),
        };
        let rewards = CreditStrategy::Outcome.rewards(&t).unwrap();
        prop_assert_eq!(rewards.len(), t.actions.len());
        prop_assert!(rewards.iter().all(|&r| r == outcome.clamp(-10.0, 10.0)));
    }

    #[test]
    fn returns_follow_the_recursion_over_valid_tokens(
        reward in -10.0..10.0f64,
        tokens in prop::collection::vec((-3.0..0.0f64, -3.0..0.0f64, any::<bool>()), 0..12),
        gamma in 0.0..=1.0f64,
        beta in 0.0..1.0f64,
    ) {
        let kl = KlConfig { beta, ..KlConfig::default() };
        let old: Vec<f64> = tokens.iter().map(|t| t.0).collect();
        let reference: Vec<f64> = tokens.iter().map(|t| t.1).collect();
        let mask: Vec<bool> = tokens.iter().map(|t| t.2).collect();
        let s = shape(reward, &old, &reference, &mask, &kl, gamma).unwrap();
        let valid: Vec<usize> = (0..mask.len()).filter(|&t| mask[t]).collect();
        for (k, &t) in valid.iter().enumerate() {
            let later = valid.get(k + 1).map_or(0.0, |&u| s.returns[u]);
            prop_assert!(close(s.returns[t], s.token_rewards[t] + gamma * later, 1e-12));
        }
        if let Some(&last) = valid.last() {
            prop_assert!(close(s.token_rewards[last], reward - beta * (old[last] - reference[last]), 1e-12));
        }
        for t in (0..mask.len()).filter(|&t| !mask[t]) {
            prop_assert_eq!((s.kl[t], s.token_rewards[t], s.returns[t]), (0.0, 0.0, 0.0));
        }
    }

    #[test]
    fn zero_variance_batches_give_finite_advantages(
        samples in prop::collection::vec(sample(Just(0.0)), 1..10),
        constant in -1e3..1e3f64,
    ) {
        let (keys, _, masks) = columns(&samples);
        let returns: Vec<Vec<f64>> = masks.iter().map(|m| vec![constant; m.len()]).collect();
        for scope in NORMALISING {
            let adv = advantages(&keys, &returns, &masks, scope).unwrap();
            prop_assert!(adv.iter().flatten().all(|a| a.is_finite() && a.abs() < 1e-9), "{scope:?}: {adv:?}");
        }
    }

    #[test]
    fn strategy_rewards_are_one_per_action_and_clipped(
        outcome in -20.0..20.0f64,
        actions in prop::collection::vec((0..4usize, 0.0..=10.0f64), 1..8),
        alpha in 0.0..=1.0f64,
        gamma in 0.01..=1.0f64,
    ) {
        let t = ScoredTrajectory {
            group: 1,
            outcome,
            actions: actions.into_iter().map(|(agent, score)| ScoredAction { agent, score }).collect(),
        };
        let process = CreditStrategy::Process.rewards(&t).unwrap();
        let strategies = [
            CreditStrategy::Process,
            CreditStrategy::Outcome,
            CreditStrategy::OutcomeFinalAgent,
            CreditStrategy::Mixed { alpha },
            CreditStrategy::DiscountedOutcome { gamma },
            CreditStrategy::MinForm,
        ];
        for strategy in strategies {
            let rewards = strategy.rewards(&t).unwrap();
            prop_assert_eq!(rewards.len(), t.actions.len());
            prop_assert!(rewards.iter().all(|r| (-10.0..=10.0).contains(r)));
        }
        let min_form = CreditStrategy::MinForm.rewards(&t).unwrap();
        prop_assert!(min_form.iter().zip(&process).all(|(m, p)| m <= p));
        prop_assert!(min_form.windows(2).all(|w| w[0] <= w[1]));
    }
}

/// The set whose rewards decide uniformity under `scope` (see
/// [`UniformSets`]).
fn uniform_set_of(scope: NormScope, key: SampleKey) -> (usize, usize) {
    match scope {
        NormScope::PerAgentGlobal | NormScope::None => (key.agent, usize::MAX),
        NormScope::AllAgentsGlobal => (usize::MAX, usize::MAX),
        NormScope::PerPromptGroup | NormScope::GroupMeanThenGlobal => (key.agent, key.group),
    }
}

/// Which sets (with a valid token) have equal rewards.
fn uniform_sets(
    scope: NormScope,
    samples: &[Sample],
    rewards: &[f64],
) -> BTreeMap<(usize, usize), bool> {
    let mut seen: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
    for (s, &r) in samples.iter().zip(rewards) {
        if s.mask.iter().any(|&m| m) {
            seen.entry(uniform_set_of(scope, s.key))
                .or_default()
                .push(r);
        }
    }
    seen.into_iter()
        .map(|(k, rs)| (k, rs.iter().all(|&r| r == rs[0])))
        .collect()
}

/// A batch with a 0/1 reward per sample, so that sets of equal rewards are
/// common.
fn rewarded_batch() -> impl Strategy<Value = (Vec<Sample>, Vec<f64>)> {
    batch().prop_flat_map(|samples| {
        let n = samples.len();
        (
            Just(samples),
            prop::collection::vec(prop::bool::ANY.prop_map(f64::from), n),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn keep_is_plain_normalisation_and_counts_the_uniform_sets(
        (samples, rewards) in rewarded_batch(),
    ) {
        let (keys, returns, masks) = columns(&samples);
        for scope in NORMALISING.into_iter().chain([NormScope::None]) {
            let kept = normalise(&keys, &rewards, &returns, &masks, scope, UniformSets::Keep)
                .unwrap();
            prop_assert_eq!(&kept.advantages, &advantages(&keys, &returns, &masks, scope).unwrap());
            let expected = uniform_sets(scope, &samples, &rewards);
            prop_assert_eq!(kept.sets, expected.len());
            prop_assert_eq!(kept.uniform_sets, expected.values().filter(|&&u| u).count());
        }
    }

    #[test]
    fn skip_zeroes_uniform_sets_and_leaves_them_out_of_every_statistic(
        (samples, rewards) in rewarded_batch(),
    ) {
        let (keys, returns, masks) = columns(&samples);
        for scope in NORMALISING.into_iter().chain([NormScope::None]) {
            let skipped = normalise(&keys, &rewards, &returns, &masks, scope, UniformSets::Skip)
                .unwrap()
                .advantages;
            let uniform = uniform_sets(scope, &samples, &rewards);
            let is_uniform = |s: &Sample| uniform.get(&uniform_set_of(scope, s.key)) == Some(&true);
            // The same as normalising the batch without those samples.
            let without: Vec<Vec<bool>> = samples
                .iter()
                .map(|s| if is_uniform(s) { vec![false; s.mask.len()] } else { s.mask.clone() })
                .collect();
            prop_assert_eq!(&skipped, &advantages(&keys, &returns, &without, scope).unwrap());
            for (s, a) in samples.iter().zip(&skipped) {
                if is_uniform(s) {
                    prop_assert!(a.iter().all(|&x| x == 0.0), "{scope:?}: {a:?}");
                }
            }
        }
    }

    #[test]
    fn a_std_floor_bounds_the_divisor_and_changes_nothing_above_it(
        (samples, rewards) in rewarded_batch(),
        floor in 0.05..3.0f64,
    ) {
        let (keys, returns, masks) = columns(&samples);
        for scope in [NormScope::PerAgentGlobal, NormScope::AllAgentsGlobal, NormScope::PerPromptGroup] {
            let floored = normalise(&keys, &rewards, &returns, &masks, scope, UniformSets::StdFloor(floor))
                .unwrap()
                .advantages;
            // Each standardising set's statistics from the returns.
            let mut members: BTreeMap<(usize, usize), Vec<f64>> = BTreeMap::new();
            for s in &samples {
                let valid = s.values.iter().zip(&s.mask).filter(|(_, &m)| m).map(|(&x, _)| x);
                members.entry(set_of(scope, s.key)).or_default().extend(valid);
            }
            for (s, a) in samples.iter().zip(&floored) {
                let Some(set) = members.get(&set_of(scope, s.key)).filter(|v| !v.is_empty()) else {
                    continue;
                };
                let (mean, std) = mean_std(set);
                for ((&g, &m), &x) in s.values.iter().zip(&s.mask).zip(a) {
                    if m {
                        let want = (g - mean) / std.max(floor);
                        prop_assert!(close(x, want, 1e-9), "{scope:?}: {x} against {want}");
                    }
                }
            }
        }
    }
}

fn corrections() -> impl Strategy<Value = RolloutCorrection> {
    (
        prop_oneof![
            Just(CorrectionLevel::Token),
            Just(CorrectionLevel::Sequence)
        ],
        prop_oneof![Just(CorrectionMode::Truncate), Just(CorrectionMode::Mask)],
        1.0..5.0f64,
        prop::option::of(0.05..1.0f64),
    )
        .prop_map(|(level, mode, threshold, low)| RolloutCorrection {
            level,
            mode,
            threshold,
            threshold_low: low.filter(|_| mode == CorrectionMode::Mask),
        })
}

/// One action's trainer and rollout log-probs and its mask.
fn action() -> impl Strategy<Value = (Vec<f64>, Vec<f64>, Vec<bool>)> {
    (1..12usize).prop_flat_map(|len| {
        (
            prop::collection::vec(-12.0..0.0f64, len),
            prop::collection::vec(-12.0..0.0f64, len),
            prop::collection::vec(any::<bool>(), len),
        )
    })
}

proptest! {
    // Rollout correction (`mappa_credit::correction`).

    #[test]
    fn with_equal_log_probs_every_correction_is_the_plain_loss(
        correction in corrections(),
        (train, _, mask) in action(),
    ) {
        // Tokens outside the mask weigh nothing in the loss, whatever their weight.
        let out = correction.apply(&train, &train, &mask);
        prop_assert_eq!(&out.mask, &mask);
        for (&w, _) in out.weights.iter().zip(&mask).filter(|(_, &m)| m) {
            prop_assert_eq!(w, 1.0);
        }
    }

    #[test]
    fn truncation_never_weighs_a_token_above_the_threshold(
        correction in corrections(),
        (train, rollout, mask) in action(),
    ) {
        let out = correction.apply(&train, &rollout, &mask);
        if correction.mode == CorrectionMode::Truncate {
            prop_assert_eq!(&out.mask, &mask, "truncation masks nothing");
            for &w in &out.weights {
                prop_assert!(w > 0.0 && w <= correction.threshold * (1.0 + 1e-12), "{w}");
            }
        }
    }

    #[test]
    fn masking_only_removes_tokens_and_keeps_those_inside_the_band(
        correction in corrections(),
        (train, rollout, mask) in action(),
    ) {
        let out = correction.apply(&train, &rollout, &mask);
        let band = correction.low() * (1.0 - 1e-12)..=correction.threshold * (1.0 + 1e-12);
        for (t, ((&was, &kept), &weight)) in mask.iter().zip(&out.mask).zip(&out.weights).enumerate() {
            prop_assert!(!kept || was, "token {t} was added to the loss");
            if correction.mode == CorrectionMode::Mask {
                if kept {
                    prop_assert!(band.contains(&weight), "kept weight {weight}");
                } else if was {
                    prop_assert_eq!(weight, 0.0);
                }
            }
        }
        if correction.level == CorrectionLevel::Sequence {
            // An action is kept or dropped whole.
            let kept: Vec<bool> = (0..mask.len()).filter(|&t| mask[t]).map(|t| out.mask[t]).collect();
            prop_assert!(kept.iter().all(|&k| k) || kept.iter().all(|&k| !k));
        }
    }
}
