//! `mappa doctor --backend cpu`: the checks a GPU node runs, the CPU
//! against itself, so that they do not rot while no GPU is at hand.

use serde_json::Value;

mod common;
use common::*;

fn lines(dir: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("checks.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every check but the memory plan's passes, each with one JSON line of
/// its measured values beside its tolerance; the environment names the
/// versions and the machine.
#[test]
fn the_cpu_passes_its_checks_against_itself() {
    let scratch = scratch();
    let out = scratch.path().join("doctor");
    let run = succeeds(
        mappa()
            .args(["doctor", "--backend", "cpu", "--out"])
            .arg(&out)
            .args([
                "--only",
                "parity,step,data-parallel,determinism,throughput,tiny-run",
            ]),
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    let checks = lines(&out);
    let names: Vec<&str> = checks
        .iter()
        .map(|l| l["check"].as_str().unwrap())
        .collect();
    for expected in [
        "parity-random-qwen3",
        "parity-llama-tiny",
        "parity-qwen2-tiny",
        "parity-qwen3-tiny",
        "step-full",
        "step-lora",
        "step-recompute",
        "step-fused",
        "step-bf16",
        "data-parallel",
        "determinism-step",
        "throughput-1m",
        "tiny-run",
        "determinism-run",
    ] {
        assert!(names.contains(&expected), "no {expected} in {names:?}");
        assert!(stdout.contains(&format!("PASS {expected} ")), "{stdout}");
    }
    for line in &checks {
        assert_eq!(line["status"], "PASS", "{line}");
        assert!(!line["tolerance"].is_null(), "{line}");
    }
    let parity = &checks[0]["measured"];
    assert_eq!(
        parity["logits_rel_max"], 0.0,
        "the CPU against itself: {parity}"
    );
    let speed = checks
        .iter()
        .find(|l| l["check"] == "throughput-1m")
        .unwrap();
    let rows = speed["measured"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows
        .iter()
        .all(|r| r["tokens_per_s"].as_f64().unwrap() > 0.0));
    let env: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("environment.json")).unwrap())
            .unwrap();
    assert_eq!(env["burn"], mappa_cli::doctor::BURN_VERSION);
    assert_eq!(env["backend"], "cpu");
    assert!(std::fs::read_to_string(out.join("summary.md"))
        .unwrap()
        .contains(&format!("{} passed, 0 failed", checks.len())));
}

/// A memory check measures in a process of its own and holds the plan to
/// its bound; its verdict follows from the numbers it wrote, and a failure
/// makes the exit code 1. The plan covers the peak (the side a run dies
/// of); at this small model's size it may be more than 20% over it, since
/// the allocator reserve's fixed part is a third of its tensors.
#[test]
fn memory_checks_measure_in_a_child_and_judge_the_plan() {
    let scratch = scratch();
    let out = scratch.path().join("doctor");
    let run = mappa()
        .args(["doctor", "--backend", "cpu", "--out"])
        .arg(&out)
        .args(["--only", "memory-logprob-16,memory-full-1"])
        .output()
        .unwrap();
    let checks = lines(&out);
    assert_eq!(checks.len(), 2);
    let mut failed = false;
    for line in &checks {
        let m = &line["measured"];
        let (measured, plan) = (
            m["measured_bytes"].as_f64().unwrap(),
            m["predicted_bytes"].as_f64().unwrap(),
        );
        assert!(measured > 1e6 && plan > 1e6, "{line}");
        assert!(plan >= measured, "the plan is under the peak: {line}");
        let within = plan <= 1.2 * measured;
        assert_eq!(line["status"] == "PASS", within, "{line}");
        failed |= !within;
    }
    assert_eq!(run.status.success(), !failed);
}
