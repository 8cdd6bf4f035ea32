//! `mappa reproduce arith --quick`, the CI profile of the CPU-scale study:
//! every arm and seed runs, the report is well-formed (every arm in its
//! tables, every plot written, the pre-registered verdict computed from the
//! per-seed numbers, and not judged with too few seeds), and running it
//! again gives the same numbers. The effect size is not checked
//! here: the quick profile is too small to show one.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

mod common;
use common::*;

/// Run the quick study of `experiments/NAME.toml` into `runs`; returns its directory.
fn quick_study(name: &str, runs: &Path) -> PathBuf {
    let out = Command::new(env!("CARGO_BIN_EXE_mappa"))
        .current_dir(workspace())
        .args(["reproduce", name, "--quick", "--jobs", "2", "--runs-dir"])
        .arg(runs)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert_eq!(report.file_name().unwrap(), "report.md");
    report.parent().unwrap().to_path_buf()
}

/// summary.json without what may differ between two calls.
fn numbers(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// Check a quick study's report and summary against each other; returns the summary.
fn check_report(dir: &Path, agents: &[&str]) -> Value {
    let summary = numbers(dir);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert_eq!(summary["profile"], "quick");
    assert!(report.contains("Quick profile"), "{report}");
    let seeds = summary["seeds"].as_u64().unwrap();
    let arms = summary["arms"].as_array().unwrap();
    assert!(arms.len() >= 2, "the method and the baseline at least");
    assert_eq!(arms[0]["label"], "process");
    assert_eq!(arms[1]["label"], "outcome");
    for arm in arms {
        let label = arm["label"].as_str().unwrap();
        assert_eq!(
            arm["finals"].as_array().unwrap().len() as u64,
            seeds,
            "{label}"
        );
        let steps = summary["steps"].as_u64().unwrap();
        assert_eq!(
            arm["curve"].as_array().unwrap().len() as u64,
            steps + 1,
            "{label}: an evaluation before training and after every step"
        );
        for agent in agents {
            assert_eq!(
                arm["reward"][agent].as_array().unwrap().len() as u64,
                steps,
                "{label} {agent}"
            );
        }
        let row = format!("| {label}");
        assert!(report.contains(&row), "{label} missing from the report");
    }
    // Each seed's learning-curve area is the mean of its curve after step 0.
    for arm in arms {
        let areas = arm["areas"].as_array().unwrap();
        for (curve, area) in arm["per_seed_curves"].as_array().unwrap().iter().zip(areas) {
            let after: Vec<f64> = curve
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p[0].as_f64().unwrap() > 0.0)
                .map(|p| p[1].as_f64().unwrap())
                .collect();
            let mean = after.iter().sum::<f64>() / after.len() as f64;
            assert!((mean - area.as_f64().unwrap()).abs() < 1e-12);
        }
    }
    // The verdict follows from the numbers: the paired differences are the
    // method's areas minus the baseline's, seed by seed; two seeds cannot
    // reach alpha, so the quick profile is not judged, and says so.
    let verdict = &summary["verdict"];
    assert_eq!(verdict["method"], "process");
    assert_eq!(verdict["baseline"], "outcome");
    let (m, b) = (&arms[0], &arms[1]);
    let diffs = verdict["primary"]["differences"].as_array().unwrap();
    assert_eq!(diffs.len() as u64, seeds);
    for (i, d) in diffs.iter().enumerate() {
        let expected = m["areas"][i].as_f64().unwrap() - b["areas"][i].as_f64().unwrap();
        assert!((d.as_f64().unwrap() - expected).abs() < 1e-12);
    }
    assert!(seeds < verdict["min_seeds"].as_u64().unwrap());
    assert!(verdict["holds"].is_null());
    assert!(
        report.contains("**Not judged:**") && report.contains("needs at least 5"),
        "{report}"
    );
    let mut plots = vec![
        "accuracy.svg".to_string(),
        format!("reward-{}.svg", agents[0]),
        format!("coach-score-{}.svg", agents[agents.len() - 1]),
    ];
    // The coach plot exists when the study has coach arms.
    let coach_arms = arms.iter().any(|a| a["group"] == "coach");
    assert_eq!(dir.join("coach.svg").exists(), coach_arms);
    if coach_arms {
        plots.push("coach.svg".to_string());
    }
    for plot in &plots {
        let svg = std::fs::read_to_string(dir.join(plot)).unwrap();
        assert!(svg.starts_with("<svg"), "{plot}");
        assert!(report.contains(plot.as_str()), "{plot} not linked");
    }
    // Every run's manifest and log are kept.
    let manifests = std::fs::read_dir(dir.join("manifests")).unwrap().count() as u64;
    assert_eq!(manifests, arms.len() as u64 * seeds);
    summary
}

#[test]
fn arith_quick_study_writes_a_well_formed_report_and_reproduces() {
    let runs = scratch();
    let agents = ["problem_solver", "code_executor", "verifier"];
    let summary = check_report(&quick_study("arith", &runs.path().join("first")), &agents);
    // Again, from scratch elsewhere: the same numbers.
    let again = quick_study("arith", &runs.path().join("second"));
    assert_eq!(numbers(&again), summary);
}

#[test]
fn tabular_quick_study_writes_a_well_formed_report() {
    let runs = scratch();
    let dir = quick_study("tabular", runs.path());
    check_report(&dir, &["data_engineer", "modeler", "analyst"]);
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    assert!(report.contains("valid submissions"), "{report}");
}

/// The five-agent chain (issue 16, item 5): the teacher, the relays' coach
/// and the study run end to end, with every agent trained and reported.
#[test]
fn arith_chain_quick_study_writes_a_well_formed_report() {
    let runs = scratch();
    let dir = quick_study("arith-chain", runs.path());
    let agents = [
        "problem_solver",
        "plan_checker",
        "code_executor",
        "output_reader",
        "verifier",
    ];
    check_report(&dir, &agents);
}

/// The factorial study (issue 54, item 3): every cell, arm and seed runs;
/// the per-seed CSV has a row per run; the script recomputes every p-value
/// from it without mappa and agrees; and a stopped study (a run deleted)
/// continues where it stopped, with the same result.
#[test]
fn arith_factorial_quick_study_reports_every_cell_recomputes_and_resumes() {
    let runs = scratch();
    let dir = quick_study("arith-factorial", runs.path());
    let report = std::fs::read_to_string(dir.join("report.md")).unwrap();
    for needle in [
        "Quick profile",
        "## Result",
        "3-low",
        "3-mid",
        "5-low",
        "5-mid",
        "process, independent coach",
        "## The coach",
        "gain_at_low_start",
    ] {
        assert!(
            report.contains(needle),
            "{needle} missing from the report:\n{report}"
        );
    }
    let csv = std::fs::read_to_string(dir.join("per_seed.csv")).unwrap();
    // 2 seeds x (4 cells x 2 arms + 1 coach arm), and the header.
    assert_eq!(csv.lines().count(), 1 + 2 * 9, "{csv}");
    assert!(dir.join("interaction.svg").exists());
    let recompute = Command::new("python3")
        .arg(dir.join("recompute.py"))
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&recompute.stdout);
    assert!(
        recompute.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&recompute.stderr)
    );
    assert!(printed.contains("cost_of_task_tied_errors"), "{printed}");
    let results = |dir: &Path| -> Value {
        let text = std::fs::read_to_string(dir.join("contrasts.json")).unwrap();
        serde_json::from_str::<Value>(&text).unwrap()["results"].clone()
    };
    let first = results(&dir);
    let stopped = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .contains("-5_mid-outcome-s2")
        })
        .expect("the 5-mid outcome run of seed 2");
    std::fs::remove_dir_all(&stopped).unwrap();
    let resumed = quick_study("arith-factorial", runs.path());
    assert_eq!(resumed, dir);
    assert!(stopped.exists(), "the deleted run ran again");
    assert_eq!(results(&resumed), first);
}
