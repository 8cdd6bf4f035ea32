//! The paired test of a run's claim that training improved held-out
//! accuracy: the same problems, solved (1) or not (0) before and after,
//! compared by McNemar's exact test. Only the discordant problems count:
//! `gained` (wrong before, right after) and `lost` (right before, wrong
//! after). Under the null hypothesis a discordant problem is as likely to
//! be a gain as a loss, so `gained ~ Binomial(gained + lost, 1/2)`, and the
//! one-sided p-value is its upper tail.
//!
//! Also here: Wilson score intervals for an accuracy, a percentile
//! bootstrap interval (resampling problems) for the paired difference of
//! accuracies, and the power of the test for a planned number of problems,
//! computed exactly from the multinomial of (gained, lost, unchanged), so
//! that a registration can state the gain it detects.

use crate::rng::RngStream;

/// Resamples of problems for the bootstrap interval of a paired difference.
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// `ln k!` for `k` in `0..=n`.
fn ln_factorials(n: u64) -> Vec<f64> {
    let mut table = Vec::with_capacity(n as usize + 1);
    let mut sum = 0.0;
    table.push(0.0);
    for i in 1..=n {
        sum += (i as f64).ln();
        table.push(sum);
    }
    table
}

/// `ln C(n, k)` from a table of `ln k!` reaching `n`.
fn ln_choose(table: &[f64], n: u64, k: u64) -> f64 {
    table[n as usize] - table[k as usize] - table[(n - k) as usize]
}

/// `P(X >= k)` for `X ~ Binomial(n, p)`, from a table of `ln k!` reaching `n`.
fn upper_tail(table: &[f64], k: u64, n: u64, p: f64) -> f64 {
    match (k, p) {
        (0, _) => 1.0,
        _ if k > n || p <= 0.0 => 0.0,
        _ if p >= 1.0 => 1.0,
        _ => {
            let (lp, lq) = (p.ln(), (1.0 - p).ln());
            let tail: f64 = (k..=n)
                .map(|i| (ln_choose(table, n, i) + i as f64 * lp + (n - i) as f64 * lq).exp())
                .sum();
            tail.min(1.0)
        }
    }
}

/// `P(X >= k)` for `X ~ Binomial(n, p)`.
pub fn binomial_upper_tail(k: u64, n: u64, p: f64) -> f64 {
    upper_tail(&ln_factorials(n), k, n, p)
}

/// One-sided p-value of McNemar's exact test that accuracy went up:
/// `P(X >= gained)` for `X ~ Binomial(gained + lost, 1/2)`; 1 when no
/// problem changed.
pub fn exact_one_sided_p(gained: u64, lost: u64) -> f64 {
    binomial_upper_tail(gained, gained + lost, 0.5)
}

/// The smallest number of gains out of `discordant` that the one-sided test
/// rejects at `alpha` (`discordant + 1` when none does).
pub fn critical_gains(discordant: u64, alpha: f64) -> u64 {
    critical(&ln_factorials(discordant), discordant, alpha)
}

/// [`critical_gains`] from a table of `ln k!` reaching `discordant`: the
/// tail summed from the top down.
fn critical(table: &[f64], discordant: u64, alpha: f64) -> u64 {
    let half = -(discordant as f64) * std::f64::consts::LN_2;
    let mut tail = 0.0;
    let mut k = discordant + 1;
    while k > 0 {
        let next = tail + (ln_choose(table, discordant, k - 1) + half).exp();
        if next > alpha {
            break;
        }
        tail = next;
        k -= 1;
    }
    k
}

/// The probability that the one-sided test rejects at `alpha` on `n`
/// problems when each is a gain with probability `p_gain` and a loss with
/// probability `p_loss` (independently): exact, summing over the number of
/// discordant problems.
pub fn power(n: u64, p_gain: f64, p_loss: f64, alpha: f64) -> f64 {
    let p_discordant = p_gain + p_loss;
    if p_discordant <= 0.0 {
        return 0.0;
    }
    let table = ln_factorials(n);
    let share = p_gain / p_discordant;
    let ln_rest = (1.0 - p_discordant).max(f64::MIN_POSITIVE).ln();
    (1..=n)
        .map(|d| {
            let p_d =
                (ln_choose(&table, n, d) + d as f64 * p_discordant.ln() + (n - d) as f64 * ln_rest)
                    .exp();
            p_d * upper_tail(&table, critical(&table, d, alpha), d, share)
        })
        .sum::<f64>()
        .min(1.0)
}

/// The smallest gain in accuracy (`p_gain - p_loss`, a fraction) that `n`
/// problems detect with probability `target` at `alpha`, when training
/// breaks a share `p_loss` of the problems: found by bisection on
/// `p_gain` to within 0.001. `None` when even `p_gain = 1 - p_loss` falls
/// short.
pub fn detectable_gain(n: u64, p_loss: f64, alpha: f64, target: f64) -> Option<f64> {
    let top = 1.0 - p_loss;
    if power(n, top, p_loss, alpha) < target {
        return None;
    }
    let (mut lo, mut hi) = (0.0, top);
    while hi - lo > 0.001 {
        let mid = 0.5 * (lo + hi);
        if power(n, mid, p_loss, alpha) >= target {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi - p_loss)
}

/// The Wilson score interval for `k` successes in `n` at the normal
/// quantile `z` (1.96 for 95%); `(0, 1)` for no trials.
pub fn wilson_interval(k: u64, n: u64, z: f64) -> (f64, f64) {
    if n == 0 {
        return (0.0, 1.0);
    }
    let (k, n) = (k as f64, n as f64);
    let p = k / n;
    let z2 = z * z;
    let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
    let half = z / (1.0 + z2 / n) * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

/// A percentile bootstrap interval at `level` for the paired difference of
/// accuracies (after minus before), resampling problems: `pairs` holds each
/// problem's (before, after) outcome.
pub fn paired_difference_interval(
    pairs: &[(bool, bool)],
    level: f64,
    rng: &mut RngStream,
) -> (f64, f64) {
    let differences: Vec<f64> = pairs
        .iter()
        .map(|&(before, after)| f64::from(u8::from(after)) - f64::from(u8::from(before)))
        .collect();
    crate::paired::bootstrap_mean_interval(&differences, level, rng)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exact_p_value_is_the_binomial_tail() {
        // 8 gains, 2 losses: P(X >= 8 | 10, 1/2) = (45 + 10 + 1) / 1024.
        assert!((exact_one_sided_p(8, 2) - 56.0 / 1024.0).abs() < 1e-12);
        assert_eq!(exact_one_sided_p(0, 0), 1.0);
        assert!((exact_one_sided_p(0, 5) - 1.0).abs() < 1e-12);
        assert!((exact_one_sided_p(5, 0) - 1.0 / 32.0).abs() < 1e-12);
    }

    #[test]
    fn critical_gains_is_the_first_rejected_count() {
        // 10 discordant at 0.05: P(X >= 9) = 11/1024 <= 0.05 < P(X >= 8) = 56/1024.
        assert_eq!(critical_gains(10, 0.05), 9);
        assert_eq!(critical_gains(4, 0.05), 5); // never: 1/16 > 0.05
    }

    #[test]
    fn power_grows_with_the_gain_and_the_problems() {
        let small = power(200, 0.10, 0.05, 0.05);
        let larger_gain = power(200, 0.15, 0.05, 0.05);
        let more_problems = power(400, 0.10, 0.05, 0.05);
        assert!(
            small < larger_gain && small < more_problems,
            "{small} {larger_gain} {more_problems}"
        );
        assert_eq!(power(100, 0.0, 0.0, 0.05), 0.0);
        // With no effect the test keeps its level.
        assert!(power(300, 0.05, 0.05, 0.05) <= 0.05);
    }

    #[test]
    fn power_agrees_with_a_simulation() {
        let (n, p_gain, p_loss, alpha) = (150u64, 0.12, 0.05, 0.05);
        let mut rng = RngStream::from_u64(11);
        let trials = 4000;
        let rejected = (0..trials)
            .filter(|_| {
                let (mut g, mut l) = (0, 0);
                for _ in 0..n {
                    let u = rng.uniform();
                    if u < p_gain {
                        g += 1;
                    } else if u < p_gain + p_loss {
                        l += 1;
                    }
                }
                exact_one_sided_p(g, l) <= alpha
            })
            .count();
        let simulated = rejected as f64 / trials as f64;
        let exact = power(n, p_gain, p_loss, alpha);
        assert!((simulated - exact).abs() < 0.03, "{simulated} {exact}");
    }

    #[test]
    fn the_detectable_gain_has_the_asked_power() {
        let gain = detectable_gain(300, 0.04, 0.05, 0.8).unwrap();
        assert!(power(300, gain + 0.04, 0.04, 0.05) >= 0.8);
        assert!(power(300, gain + 0.04 - 0.005, 0.04, 0.05) < 0.8);
        assert!(gain > 0.0 && gain < 0.15, "{gain}");
        assert_eq!(detectable_gain(3, 0.5, 0.05, 0.8), None);
    }

    #[test]
    fn wilson_intervals_hold_the_estimate_and_stay_in_range() {
        let (lo, hi) = wilson_interval(30, 100, 1.96);
        assert!(lo < 0.3 && 0.3 < hi && (lo - 0.219).abs() < 0.002 && (hi - 0.396).abs() < 0.002);
        assert_eq!(wilson_interval(0, 0, 1.96), (0.0, 1.0));
        let (lo, hi) = wilson_interval(0, 20, 1.96);
        assert!(lo == 0.0 && hi > 0.0 && hi < 0.2);
    }

    #[test]
    fn the_paired_interval_is_centred_on_the_difference() {
        let pairs: Vec<(bool, bool)> = (0..200)
            .map(|i| (i % 4 == 0, i % 4 == 0 || i % 5 == 0))
            .collect();
        let (lo, hi) = paired_difference_interval(&pairs, 0.95, &mut RngStream::from_u64(2));
        let observed = pairs.iter().filter(|p| p.1 && !p.0).count() as f64 / 200.0;
        assert!(
            lo < observed && observed < hi && lo > 0.0,
            "{lo} {observed} {hi}"
        );
    }
}
