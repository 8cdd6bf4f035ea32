//! The test a study's claim is decided by: paired per-seed differences
//! (method minus baseline; one seed gives both arms the same data order and
//! warm start), a one-sided exact sign-flip permutation test, a percentile
//! bootstrap interval for the mean difference, and the smallest mean
//! difference the test detects with a given power at the observed spread.
//!
//! Under the null hypothesis each difference is as likely positive as
//! negative (its distribution is symmetric around 0), so every assignment of
//! signs to the absolute differences is equally likely. The p-value is the
//! share of the `2^n` assignments whose sum is at least the observed sum:
//! exact, with no assumption of normality. Its smallest value is `2^-n`, so
//! the test can reject at level `alpha` only with at least
//! [`min_pairs`]`(alpha)` pairs (5 at 0.05).

use crate::rng::RngStream;

/// Up to this many pairs the test counts every sign assignment (exactly,
/// meeting in the middle: `2^(n/2)` sums per half); above, it draws
/// [`MONTE_CARLO_FLIPS`] of them.
pub const MAX_EXACT_PAIRS: usize = 30;

/// Sign assignments drawn when there are more than [`MAX_EXACT_PAIRS`] pairs.
pub const MONTE_CARLO_FLIPS: usize = 1 << 16;

/// Bootstrap resamples for the interval of the mean difference.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// Simulated studies per effect size when searching the detectable effect.
pub const POWER_SIMULATIONS: usize = 1_000;

/// Relative tolerance under which two sums count as equal (so float noise
/// cannot turn a tie into a strict inequality).
const TIE_TOLERANCE: f64 = 1e-12;

/// The smallest number of pairs with which a one-sided sign-flip test can
/// reach `alpha` (the smallest `n` with `2^-n <= alpha`).
pub fn min_pairs(alpha: f64) -> usize {
    let mut n = 0;
    while 0.5f64.powi(n as i32) > alpha {
        n += 1;
    }
    n
}

/// One-sided p-value of the sign-flip test that the differences are
/// centred above 0: the share of sign assignments whose sum reaches the
/// observed sum. Exact up to [`MAX_EXACT_PAIRS`] pairs; above, a Monte Carlo
/// estimate from `rng` with the add-one correction. 1 for no pairs.
pub fn sign_flip_p_value(differences: &[f64], rng: &mut RngStream) -> f64 {
    let n = differences.len();
    if n == 0 {
        return 1.0;
    }
    let observed: f64 = differences.iter().sum();
    let magnitudes: Vec<f64> = differences.iter().map(|d| d.abs()).collect();
    let scale: f64 = magnitudes.iter().sum::<f64>().max(f64::MIN_POSITIVE);
    let reaches = |sum: f64| sum >= observed - TIE_TOLERANCE * scale;
    if n <= MAX_EXACT_PAIRS {
        let (left, right) = magnitudes.split_at(n / 2);
        let count = pairs_reaching(&signed_sums(left), &signed_sums(right), reaches);
        count as f64 / (1u64 << n) as f64
    } else {
        let hits = (0..MONTE_CARLO_FLIPS)
            .filter(|_| {
                let sum: f64 = magnitudes
                    .iter()
                    .map(|m| if rng.next_u32() & 1 == 1 { -m } else { *m })
                    .sum();
                reaches(sum)
            })
            .count();
        (hits + 1) as f64 / (MONTE_CARLO_FLIPS + 1) as f64
    }
}

/// Every signed sum `±m_1 ± m_2 ...` of `magnitudes`, ascending.
fn signed_sums(magnitudes: &[f64]) -> Vec<f64> {
    let mut sums = vec![0.0];
    for m in magnitudes {
        sums = sums.iter().flat_map(|s| [s + m, s - m]).collect();
    }
    sums.sort_by(f64::total_cmp);
    sums
}

/// How many pairs `(a, b)` of the ascending lists have `reaches(a + b)`,
/// for a `reaches` that holds from some threshold upwards.
fn pairs_reaching(left: &[f64], right: &[f64], reaches: impl Fn(f64) -> bool) -> u64 {
    // As `a` grows, the smallest `b` that reaches can only move down.
    let mut first = right.len();
    let mut count = 0u64;
    for a in left {
        while first > 0 && reaches(a + right[first - 1]) {
            first -= 1;
        }
        count += (right.len() - first) as u64;
    }
    count
}

/// A percentile bootstrap interval at `level` (e.g. 0.95) for the mean of
/// `values`, from [`BOOTSTRAP_RESAMPLES`] resamples drawn from `rng`.
/// `(NaN, NaN)` for no values.
pub fn bootstrap_mean_interval(values: &[f64], level: f64, rng: &mut RngStream) -> (f64, f64) {
    if values.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = values.len();
    let mut means: Vec<f64> = (0..BOOTSTRAP_RESAMPLES)
        .map(|_| {
            (0..n)
                .map(|_| values[rng.below(n as u64) as usize])
                .sum::<f64>()
                / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let tail = (1.0 - level) / 2.0;
    let at = |q: f64| means[(q * (BOOTSTRAP_RESAMPLES - 1) as f64).round() as usize];
    (at(tail), at(1.0 - tail))
}

/// The smallest mean difference that `n` pairs detect with probability
/// `power` at level `alpha`, when the differences spread with standard
/// deviation `spread` around it (normal, simulated from `rng`:
/// [`POWER_SIMULATIONS`] studies per effect size, the same draws for every
/// effect size). `None` when `n` pairs cannot reach `alpha` at all.
pub fn detectable_effect(
    n: usize,
    spread: f64,
    alpha: f64,
    power: f64,
    rng: &mut RngStream,
) -> Option<f64> {
    if n < min_pairs(alpha) {
        return None;
    }
    if spread <= 0.0 {
        return Some(0.0);
    }
    let noise: Vec<Vec<f64>> = (0..POWER_SIMULATIONS)
        .map(|_| (0..n).map(|_| rng.normal() * spread).collect())
        .collect();
    let mut flips = rng.clone();
    let mut power_at = |effect: f64| {
        let rejected = noise
            .iter()
            .filter(|z| {
                let diffs: Vec<f64> = z.iter().map(|e| effect + e).collect();
                sign_flip_p_value(&diffs, &mut flips) <= alpha
            })
            .count();
        rejected as f64 / POWER_SIMULATIONS as f64
    };
    let (mut lo, mut hi) = (0.0, spread);
    while power_at(hi) < power {
        lo = hi;
        hi *= 2.0;
        if hi > 1e6 * spread {
            return None;
        }
    }
    for _ in 0..16 {
        let mid = 0.5 * (lo + hi);
        if power_at(mid) >= power {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rng() -> RngStream {
        RngStream::from_u64(7)
    }

    #[test]
    fn five_pairs_are_needed_at_five_percent() {
        assert_eq!(min_pairs(0.05), 5);
        assert_eq!(min_pairs(0.5), 1);
        assert_eq!(min_pairs(0.01), 7);
    }

    #[test]
    fn the_exact_p_value_counts_sign_assignments() {
        // All positive: only the observed assignment reaches the sum.
        assert_eq!(sign_flip_p_value(&[0.1; 5], &mut rng()), 1.0 / 32.0);
        // All negative: every assignment reaches it.
        assert_eq!(sign_flip_p_value(&[-0.1; 4], &mut rng()), 1.0);
        // Zeros are ties: p = 1.
        assert_eq!(sign_flip_p_value(&[0.0; 6], &mut rng()), 1.0);
        // [3, -1]: sums 2 (observed), 4, -4, -2 -> two of four reach 2.
        assert_eq!(sign_flip_p_value(&[3.0, -1.0], &mut rng()), 0.5);
        // Float noise in a tie does not break it: 0.1 + 0.2 vs 0.3.
        // Sums of ±0.1 ±0.2 ±0.3: 0.6, 0.4, 0.2, 0 (twice) reach the observed 0.
        let p = sign_flip_p_value(&[0.1, 0.2, -0.3], &mut rng());
        assert_eq!(p, 5.0 / 8.0, "ties count as reaching");
    }

    #[test]
    fn meeting_in_the_middle_counts_what_enumeration_counts() {
        let mut draw = rng();
        for n in 1..=12 {
            let diffs: Vec<f64> = (0..n)
                .map(|_| (draw.uniform() - 0.3).round() * draw.uniform())
                .collect();
            let observed: f64 = diffs.iter().sum();
            let brute = (0..1u64 << n)
                .filter(|signs| {
                    let sum: f64 = diffs
                        .iter()
                        .enumerate()
                        .map(|(i, d)| {
                            if signs >> i & 1 == 1 {
                                -d.abs()
                            } else {
                                d.abs()
                            }
                        })
                        .sum();
                    sum >= observed - 1e-12 * diffs.iter().map(|d| d.abs()).sum::<f64>()
                })
                .count() as f64
                / (1u64 << n) as f64;
            assert_eq!(sign_flip_p_value(&diffs, &mut rng()), brute, "{diffs:?}");
        }
    }

    #[test]
    fn many_pairs_use_a_seeded_monte_carlo_estimate() {
        let diffs: Vec<f64> = (0..40)
            .map(|i| if i % 3 == 0 { -0.05 } else { 0.1 })
            .collect();
        let a = sign_flip_p_value(&diffs, &mut rng());
        assert_eq!(a, sign_flip_p_value(&diffs, &mut rng()), "seeded");
        assert!(a > 0.0 && a < 0.001, "{a}");
    }

    #[test]
    fn the_interval_brackets_the_mean() {
        let values = [0.1, 0.2, 0.15, 0.05, 0.3, 0.12, 0.18, 0.22];
        let (lo, hi) = bootstrap_mean_interval(&values, 0.95, &mut rng());
        let mean = values.iter().sum::<f64>() / 8.0;
        assert!(lo < mean && mean < hi && lo > 0.05 && hi < 0.3, "{lo} {hi}");
        assert_eq!(
            bootstrap_mean_interval(&[0.4], 0.95, &mut rng()),
            (0.4, 0.4)
        );
    }

    #[test]
    fn the_detectable_effect_shrinks_with_more_pairs() {
        assert_eq!(detectable_effect(4, 0.1, 0.05, 0.8, &mut rng()), None);
        let eight = detectable_effect(8, 0.1, 0.05, 0.8, &mut rng()).unwrap();
        let sixteen = detectable_effect(16, 0.1, 0.05, 0.8, &mut rng()).unwrap();
        // A t-test would need about (1.9 + 0.9) * 0.1 / sqrt(n): 0.10 and 0.07.
        assert!(eight > 0.07 && eight < 0.15, "{eight}");
        assert!(sixteen < eight && sixteen > 0.05, "{sixteen}");
        assert_eq!(detectable_effect(8, 0.0, 0.05, 0.8, &mut rng()), Some(0.0));
    }
}
