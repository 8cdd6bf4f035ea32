//! `mappa reproduce` of a single run with a `[claim]`: it continues the run
//! from its last checkpoint, then leads the report with the paired test of
//! the base model against the trained one and writes the claim's files.

mod common;

use common::{fixture_manifest, mappa, scratch, succeeds};

#[test]
fn reproduce_continues_a_run_and_tests_its_claim() {
    let dir = scratch();
    let experiments = dir.path().join("experiments");
    std::fs::create_dir_all(&experiments).unwrap();
    let manifest = experiments.join("claim-tiny.toml");
    let text =
        fixture_manifest("tiny-arith").replace("name = \"tiny-arith\"", "name = \"claim-tiny\"");
    std::fs::write(
        &manifest,
        format!("{text}\n[claim]\nconfirmatory = true\nloss_rate = 0.05\n"),
    )
    .unwrap();
    let runs = dir.path().join("runs");
    // Stopped after one of three steps, as a killed run would be.
    succeeds(
        mappa()
            .arg("run")
            .arg(&manifest)
            .args(["--max-steps", "1", "--runs-dir"])
            .arg(&runs),
    );
    let out = succeeds(
        mappa()
            .current_dir(dir.path())
            .args(["reproduce", "claim-tiny", "--runs-dir"])
            .arg(&runs),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("continuing the run in"), "{stderr}");
    let run = common::run_dir(&runs);
    let report = std::fs::read_to_string(run.join("report.md")).unwrap();
    let lead = report
        .find("## The claim: did training raise held-out accuracy?")
        .unwrap();
    assert!(
        lead < report.find("## Held-out accuracy").unwrap(),
        "{report}"
    );
    for needle in [
        "Confirmatory (registered before the run)",
        "The base model (step 0) and the trained model (step 3) on the same 3 held-out problems",
        "One-sided p = ",
        "Power, as registered: with 3 held-out problems, no gain is detected",
        "No registration found:",
        "## Diagnostics: the learning signal",
        "## Where the time went",
    ] {
        assert!(report.contains(needle), "missing {needle:?} in:\n{report}");
    }
    for file in [
        "per_problem.csv",
        "claim.json",
        "recompute.py",
        "diagnostics.csv",
    ] {
        assert!(run.join(file).exists(), "{file}");
    }
    let evals = std::fs::read_to_string(run.join("eval-trajectories.jsonl")).unwrap();
    let steps: Vec<u64> = evals
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(steps, [0, 0, 0, 2, 2, 2, 3, 3, 3]);
}
