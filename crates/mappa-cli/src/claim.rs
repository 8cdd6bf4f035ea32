//! A single run's claim (`[claim]`): training raised held-out accuracy
//! above the base model's. The run's first evaluation (step 0: the base
//! model) and its last (the trained model) are paired problem by problem
//! from `eval-trajectories.jsonl` and compared with McNemar's exact
//! one-sided test (`mappa_core::mcnemar`). `mappa reproduce` writes, beside
//! the run's `report.md` (whose first section this is):
//!
//! - `per_problem.csv`: each held-out problem's outcome before and after;
//! - `claim.json`: the counts, accuracies with 95% Wilson intervals, the
//!   paired difference with a 95% bootstrap interval, the p-value, the
//!   registered power statement and, for a confirmatory claim, the verdict
//!   and the registering commit;
//! - `recompute.py`: the p-value again from `per_problem.csv`, with
//!   Python's standard library only;
//! - `learning-curve.svg`: held-out accuracy at every evaluation.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{anyhow, bail};
use mappa_core::mcnemar;
use mappa_core::rng::SeedTree;
use mappa_train::manifest::{Claim, Manifest};
use mappa_train::records::{read_jsonl, EvalTrajectoryLine, MetricsLine};
use serde::Serialize;

use crate::plot::{chart, Point, Style};
use crate::study::registration::Registration;

/// The script that recomputes the p-value, written beside the CSV.
const RECOMPUTE: &str = include_str!("claim/recompute.py");

/// The normal quantile of the 95% intervals.
const Z95: f64 = 1.959_963_984_540_054;

/// What the registration says the held-out set can detect.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PowerStatement {
    /// Held-out problems.
    pub problems: usize,
    /// The power asked for.
    pub power: f64,
    /// The assumed share of problems that training breaks.
    pub loss_rate: f64,
    /// The smallest gain in accuracy (a fraction) detected with that
    /// power; `None` when no gain is.
    pub detectable_gain: Option<f64>,
}

impl PowerStatement {
    /// The statement for `problems` held-out problems under `claim`.
    pub fn of(claim: &Claim, problems: usize) -> Self {
        Self {
            problems,
            power: claim.power,
            loss_rate: claim.loss_rate,
            detectable_gain: mcnemar::detectable_gain(
                problems as u64,
                claim.loss_rate,
                claim.alpha,
                claim.power,
            ),
        }
    }

    /// One sentence.
    pub fn sentence(&self, alpha: f64) -> String {
        match self.detectable_gain {
            Some(g) => format!(
                "with {} held-out problems, McNemar's exact one-sided test at alpha = {alpha} detects a gain of {:.1} points of accuracy with {:.0}% power, when training turns {:.1}% of the problems from right to wrong",
                self.problems,
                100.0 * g,
                100.0 * self.power,
                100.0 * self.loss_rate
            ),
            None => format!(
                "with {} held-out problems, no gain is detected with {:.0}% power at alpha = {alpha}",
                self.problems,
                100.0 * self.power
            ),
        }
    }
}

/// The claim's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClaimResult {
    /// The base model's evaluation step (0).
    pub base_step: usize,
    /// The trained model's evaluation step (the last).
    pub trained_step: usize,
    /// Problems evaluated both times.
    pub problems: usize,
    /// Right before training.
    pub base_right: usize,
    /// Right after training.
    pub trained_right: usize,
    /// Wrong before, right after.
    pub gained: usize,
    /// Right before, wrong after.
    pub lost: usize,
    /// Accuracy before, with its 95% Wilson interval.
    pub base_accuracy: (f64, f64, f64),
    /// Accuracy after, with its 95% Wilson interval.
    pub trained_accuracy: (f64, f64, f64),
    /// After minus before, with its 95% bootstrap interval over problems.
    pub difference: (f64, f64, f64),
    /// McNemar's exact one-sided p-value.
    pub p_value: f64,
    /// The test's level.
    pub alpha: f64,
    /// What the held-out set detects, as registered.
    pub power: PowerStatement,
    /// Confirmatory claims only: whether the test rejects at `alpha`.
    pub verdict: Option<bool>,
    /// The registering commit (confirmatory claims), or why none was found.
    pub registration: Option<Result<Registration, String>>,
}

/// Each (task, sample)'s outcome at each evaluated step.
type Outcomes = BTreeMap<usize, BTreeMap<(String, usize), bool>>;

/// Read `eval-trajectories.jsonl` into outcomes by step.
fn outcomes(run_dir: &Path) -> anyhow::Result<Outcomes> {
    let path = run_dir.join("eval-trajectories.jsonl");
    let rows: Vec<EvalTrajectoryLine> = read_jsonl(&path)?;
    let mut by_step: Outcomes = BTreeMap::new();
    for r in rows {
        by_step
            .entry(r.step)
            .or_default()
            .insert((r.task_id, r.sample), r.outcome >= 1.0);
    }
    Ok(by_step)
}

/// One problem's outcome before and after training, keyed (task, sample).
type PairedProblem = ((String, usize), bool, bool);

/// The first and last evaluations' steps, and their problems paired.
type Paired = (usize, usize, Vec<PairedProblem>);

/// The first and last evaluations, paired by problem.
fn paired(by_step: &Outcomes, run_dir: &Path) -> anyhow::Result<Paired> {
    let (Some((&first, before)), Some((&last, after))) =
        (by_step.first_key_value(), by_step.last_key_value())
    else {
        bail!(
            "{}: no evaluated trajectories (eval-trajectories.jsonl): the claim needs the base and the trained model's evaluations",
            run_dir.display()
        );
    };
    if first == last {
        bail!(
            "{}: only step {first} was evaluated: the claim compares the first evaluation with the last, after training",
            run_dir.display()
        );
    }
    if before.len() != after.len() || before.keys().any(|k| !after.contains_key(k)) {
        bail!(
            "{}: steps {first} and {last} evaluated different problems ({} and {}): the paired test needs the same ones",
            run_dir.display(),
            before.len(),
            after.len()
        );
    }
    let pairs = before
        .iter()
        .map(|(k, &b)| (k.clone(), b, after[k]))
        .collect();
    Ok((first, last, pairs))
}

/// The claim's analysis of the run in `run_dir`.
pub fn analyse(
    run_dir: &Path,
    claim: &Claim,
    registration: Option<Result<Registration, String>>,
) -> anyhow::Result<ClaimResult> {
    let by_step = outcomes(run_dir)?;
    let (base_step, trained_step, pairs) = paired(&by_step, run_dir)?;
    let n = pairs.len();
    let count = |f: &dyn Fn(bool, bool) -> bool| pairs.iter().filter(|(_, b, a)| f(*b, *a)).count();
    let base_right = count(&|b, _| b);
    let trained_right = count(&|_, a| a);
    let gained = count(&|b, a| !b && a);
    let lost = count(&|b, a| b && !a);
    let accuracy = |k: usize| {
        let (lo, hi) = mcnemar::wilson_interval(k as u64, n as u64, Z95);
        (k as f64 / n.max(1) as f64, lo, hi)
    };
    let flags: Vec<(bool, bool)> = pairs.iter().map(|(_, b, a)| (*b, *a)).collect();
    let mut rng = SeedTree::new(0).stream("claim/bootstrap");
    let (lo, hi) = mcnemar::paired_difference_interval(&flags, 0.95, &mut rng);
    let p_value = mcnemar::exact_one_sided_p(gained as u64, lost as u64);
    Ok(ClaimResult {
        base_step,
        trained_step,
        problems: n,
        base_right,
        trained_right,
        gained,
        lost,
        base_accuracy: accuracy(base_right),
        trained_accuracy: accuracy(trained_right),
        difference: (
            (trained_right as f64 - base_right as f64) / n.max(1) as f64,
            lo,
            hi,
        ),
        p_value,
        alpha: claim.alpha,
        power: PowerStatement::of(claim, n),
        verdict: claim.confirmatory.then_some(p_value <= claim.alpha),
        registration,
    })
}

/// Write the claim's files into `run_dir` and return its report section.
pub fn write(
    run_dir: &Path,
    manifest: &Manifest,
    claim: &Claim,
    registration: Option<Result<Registration, String>>,
) -> anyhow::Result<String> {
    let result = analyse(run_dir, claim, registration)?;
    let by_step = outcomes(run_dir)?;
    let (_, _, pairs) = paired(&by_step, run_dir)?;
    let mut csv = String::from("task_id,sample,base,trained\n");
    for ((task, sample), before, after) in &pairs {
        let _ = writeln!(
            csv,
            "{task},{sample},{},{}",
            u8::from(*before),
            u8::from(*after)
        );
    }
    let atomic = |name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        Ok(mappa_core::fs::write_atomic(&run_dir.join(name), bytes)?)
    };
    atomic("per_problem.csv", csv.as_bytes())?;
    atomic("recompute.py", RECOMPUTE.as_bytes())?;
    let json = serde_json::to_string_pretty(&result).map_err(|e| anyhow!("claim.json: {e}"))?;
    atomic("claim.json", json.as_bytes())?;
    learning_curve(run_dir, &by_step)?;
    Ok(section(manifest, claim, &result))
}

/// `learning-curve.svg`: held-out accuracy at every evaluation.
fn learning_curve(run_dir: &Path, by_step: &Outcomes) -> anyhow::Result<()> {
    let points: Vec<Point> = by_step
        .iter()
        .map(|(&step, outcomes)| {
            let right = outcomes.values().filter(|&&r| r).count();
            Point::at(
                step as f64,
                100.0 * right as f64 / outcomes.len().max(1) as f64,
            )
        })
        .collect();
    let metrics = run_dir.join("metrics.jsonl");
    let train: Vec<Point> = if metrics.exists() {
        read_jsonl::<MetricsLine>(&metrics)?
            .iter()
            .filter_map(MetricsLine::as_train)
            .map(|t| Point::at(t.step as f64, 100.0 * t.train_accuracy))
            .collect()
    } else {
        Vec::new()
    };
    chart(
        &run_dir.join("learning-curve.svg"),
        "Held-out accuracy (greedy) and training-rollout accuracy",
        "accuracy (%)",
        &[
            ("held-out".to_string(), points),
            ("training rollouts".to_string(), train),
        ],
        Style::Markers,
    )
}

/// A p-value as a person reads it: four decimals, or two significant
/// digits in scientific notation below 0.001 (where four decimals say 0).
fn p_text(p: f64) -> String {
    if p >= 1e-3 {
        format!("{p:.4}")
    } else {
        format!("{p:.1e}")
    }
}

/// The report's section on the claim.
fn section(manifest: &Manifest, claim: &Claim, r: &ClaimResult) -> String {
    let mut md = String::from("## The claim: did training raise held-out accuracy?\n\n");
    let kind = if claim.confirmatory {
        "Confirmatory (registered before the run)"
    } else {
        "Exploratory (not registered: no verdict)"
    };
    let _ = writeln!(
        md,
        "{kind}. The base model (step {}) and the trained model (step {}) on the same {} held-out problems of `{}`, paired problem by problem; McNemar's exact one-sided test at alpha = {}.\n",
        r.base_step, r.trained_step, r.problems, manifest.name, r.alpha
    );
    let pct = |(v, lo, hi): (f64, f64, f64)| {
        format!(
            "{:.1}% (95% interval {:.1} to {:.1})",
            100.0 * v,
            100.0 * lo,
            100.0 * hi
        )
    };
    let _ = writeln!(md, "| | held-out accuracy |\n|---|---|");
    let _ = writeln!(
        md,
        "| base model (step {}) | {} |",
        r.base_step,
        pct(r.base_accuracy)
    );
    let _ = writeln!(
        md,
        "| trained (step {}) | {} |",
        r.trained_step,
        pct(r.trained_accuracy)
    );
    let (d, lo, hi) = r.difference;
    let _ = writeln!(
        md,
        "| difference | {:+.1} points (95% bootstrap interval {:+.1} to {:+.1}) |\n",
        100.0 * d,
        100.0 * lo,
        100.0 * hi
    );
    let _ = writeln!(
        md,
        "Problems gained (wrong before, right after): {}; lost (right before, wrong after): {}. One-sided p = {}.",
        r.gained,
        r.lost,
        p_text(r.p_value)
    );
    match r.verdict {
        Some(true) => {
            md.push_str("\n**Verdict: training raised held-out accuracy** (p <= alpha).\n")
        }
        Some(false) => {
            md.push_str("\n**Verdict: no gain shown** (p > alpha): the test does not reject.\n")
        }
        None => {}
    }
    let _ = writeln!(md, "\nPower, as registered: {}.", r.power.sentence(r.alpha));
    md.push_str(&registration_lines(r.registration.as_ref()));
    md.push_str("\n![held-out accuracy](learning-curve.svg)\n\nFiles: `per_problem.csv` (each problem before and after), `claim.json`, `recompute.py` (`python3 recompute.py per_problem.csv` gives the p-value again).\n\n");
    md
}

/// The report's lines on the registration: the commit, and anything that
/// changed after it.
fn registration_lines(registration: Option<&Result<Registration, String>>) -> String {
    let mut md = String::new();
    match registration {
        Some(Ok(reg)) => {
            let _ = writeln!(
                md,
                "\nRegistered by commit `{}` ({}), which holds the manifest and the analysis ({}).",
                reg.commit,
                reg.date,
                reg.files.join(", ")
            );
            if !reg.analysis_changed_since.is_empty() {
                let _ = writeln!(
                    md,
                    "\n**The analysis code changed after the registration**: {}.",
                    reg.analysis_changed_since.join("; ")
                );
            }
            if !reg.modified.is_empty() {
                let _ = writeln!(
                    md,
                    "\n**Uncommitted changes to registered files when the run started**: {}.",
                    reg.modified.join(", ")
                );
            }
        }
        Some(Err(why)) => {
            let _ = writeln!(md, "\nNo registration found: {why}.");
        }
        None => {}
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_p_values_are_not_printed_as_zero() {
        assert_eq!(p_text(0.0312), "0.0312");
        assert_eq!(p_text(3.4e-21), "3.4e-21");
    }

    /// An evaluation line of `eval-trajectories.jsonl`.
    fn line(step: usize, task: usize, right: bool) -> String {
        serde_json::json!({
            "schema": 1, "step": step, "task_id": format!("t{task}"), "sample": 0, "task": "",
            "outcome": if right { 1.0 } else { 0.0 }, "actions": []
        })
        .to_string()
    }

    /// A run directory whose 40 problems go: 10 right both times, 12
    /// gained, 3 lost, 15 wrong both times (and a middle evaluation).
    fn run_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for task in 0..40 {
            let (before, after) = match task {
                0..=9 => (true, true),
                10..=21 => (false, true),
                22..=24 => (true, false),
                _ => (false, false),
            };
            text.push_str(&line(0, task, before));
            text.push('\n');
            text.push_str(&line(5, task, task % 2 == 0));
            text.push('\n');
            text.push_str(&line(10, task, after));
            text.push('\n');
        }
        std::fs::write(dir.path().join("eval-trajectories.jsonl"), text).unwrap();
        dir
    }

    fn claim(confirmatory: bool) -> Claim {
        Claim {
            confirmatory,
            alpha: 0.05,
            power: 0.8,
            loss_rate: 0.05,
        }
    }

    #[test]
    fn the_first_and_last_evaluations_are_paired_and_tested() {
        let dir = run_dir();
        let r = analyse(dir.path(), &claim(true), None).unwrap();
        assert_eq!((r.base_step, r.trained_step, r.problems), (0, 10, 40));
        assert_eq!(
            (r.base_right, r.trained_right, r.gained, r.lost),
            (13, 22, 12, 3)
        );
        assert!((r.p_value - mcnemar::exact_one_sided_p(12, 3)).abs() < 1e-15);
        assert_eq!(r.verdict, Some(true));
        assert!((r.difference.0 - 9.0 / 40.0).abs() < 1e-12);
        assert!(r.difference.1 < r.difference.0 && r.difference.0 < r.difference.2);
        assert!(r.base_accuracy.1 < 13.0 / 40.0 && 13.0 / 40.0 < r.base_accuracy.2);
        assert_eq!(
            analyse(dir.path(), &claim(false), None).unwrap().verdict,
            None
        );
    }

    #[test]
    fn evaluations_that_cannot_be_paired_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("eval-trajectories.jsonl");
        std::fs::write(&path, format!("{}\n", line(0, 1, true))).unwrap();
        let err = analyse(dir.path(), &claim(true), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("only step 0 was evaluated"), "{err}");
        std::fs::write(
            &path,
            format!("{}\n{}\n", line(0, 1, true), line(4, 2, true)),
        )
        .unwrap();
        let err = analyse(dir.path(), &claim(true), None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("different problems"), "{err}");
    }

    #[test]
    fn the_files_are_written_and_recompute_py_agrees() {
        let dir = run_dir();
        let manifest = Manifest::load(
            &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/manifests/tiny-arith.toml"),
        )
        .unwrap();
        let md = write(
            dir.path(),
            &manifest,
            &claim(true),
            Some(Err("not a checkout".into())),
        )
        .unwrap();
        assert!(md.contains("Problems gained (wrong before, right after): 12; lost (right before, wrong after): 3."), "{md}");
        assert!(
            md.contains("**Verdict: training raised held-out accuracy**"),
            "{md}"
        );
        assert!(
            md.contains("No registration found: not a checkout."),
            "{md}"
        );
        for file in [
            "per_problem.csv",
            "claim.json",
            "recompute.py",
            "learning-curve.svg",
        ] {
            assert!(dir.path().join(file).exists(), "{file}");
        }
        let csv = std::fs::read_to_string(dir.path().join("per_problem.csv")).unwrap();
        assert!(
            csv.starts_with("task_id,sample,base,trained\nt0,0,1,1\n"),
            "{csv}"
        );
        let Ok(out) = std::process::Command::new("python3")
            .arg(dir.path().join("recompute.py"))
            .arg(dir.path().join("per_problem.csv"))
            .output()
        else {
            eprintln!("python3 is not installed: recompute.py not checked");
            return;
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let printed: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("one-sided p: "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            (printed - mcnemar::exact_one_sided_p(12, 3)).abs() < 1e-6,
            "{text}"
        );
        assert!(text.contains("gained: 12, lost: 3"), "{text}");
    }
}
