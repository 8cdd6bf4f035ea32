//! `mappa run` on the tiny end-to-end manifest: a run killed with SIGKILL
//! mid-way and resumed ends with the same weights and metrics as one never
//! stopped; `mappa reproduce aime` says what it needs; `mappa reproduce`
//! of a single run with a `[claim]` continues the run from its last
//! checkpoint, then leads the report with the paired test of the base model
//! against the trained one and writes the claim's files.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

mod common;
use common::*;

fn manifest() -> PathBuf {
    workspace().join("fixtures/manifests/tiny-arith.toml")
}

fn weights(run: &Path) -> Vec<(String, Vec<u8>)> {
    ["problem_solver", "code_executor", "verifier"]
        .iter()
        .map(|r| {
            (
                r.to_string(),
                std::fs::read(
                    run.join("checkpoints/latest/agents")
                        .join(r)
                        .join("model.safetensors"),
                )
                .unwrap(),
            )
        })
        .collect()
}

fn checkpoint_step(run: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(run.join("checkpoints/latest/state.json")).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["step"].as_u64()
}

#[test]
fn a_run_killed_mid_way_resumes_to_identical_weights() {
    let straight = scratch();
    succeeds(
        mappa()
            .arg("run")
            .arg(manifest())
            .arg("--runs-dir")
            .arg(straight.path()),
    );
    let straight_run = run_dir(straight.path());
    assert!(straight_run.join("manifest.lock.json").exists());
    assert_eq!(checkpoint_step(&straight_run), Some(3));

    let killed = scratch();
    let mut child = mappa()
        .arg("run")
        .arg(manifest())
        .arg("--runs-dir")
        .arg(killed.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let run = loop {
        if let Ok(mut entries) = std::fs::read_dir(killed.path()) {
            if let Some(Ok(entry)) = entries.next() {
                if checkpoint_step(&entry.path()).is_some_and(|s| s >= 1) {
                    break entry.path();
                }
            }
        }
        assert!(Instant::now() < deadline, "no checkpoint appeared");
        std::thread::sleep(Duration::from_millis(5));
    };
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    let at_kill = checkpoint_step(&run).unwrap();
    assert!(
        at_kill < 3,
        "the run finished before it was killed (checkpoint at step {at_kill})"
    );
    succeeds(mappa().arg("run").arg(manifest()).arg("--resume").arg(&run));
    assert_eq!(checkpoint_step(&run), Some(3));
    assert!(
        weights(&straight_run) == weights(&run),
        "weights differ after kill -9 and resume"
    );
    let metrics = |dir: &Path| std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics(&straight_run), metrics(&run));
}

/// The tiny manifest's text with its relative paths made absolute, to be
/// written anywhere.
fn tiny_manifest_text() -> String {
    std::fs::read_to_string(manifest())
        .unwrap()
        .replace(
            "../../experiments",
            &workspace().join("experiments").display().to_string(),
        )
        .replace(
            "../models",
            &workspace().join("fixtures/models").display().to_string(),
        )
}

/// Fails naming the first of `needles` that `text` lacks.
fn assert_mentions(text: &str, needles: &[&str]) {
    for needle in needles {
        assert!(text.contains(needle), "missing {needle:?} in:\n{text}");
    }
}

#[test]
fn reproduce_aime_plans_and_names_what_is_missing() {
    let out = succeeds(
        mappa()
            .args(["reproduce", "aime", "--dry-run"])
            .env_remove("GEMINI_API_KEY"),
    );
    let plan = String::from_utf8_lossy(&out.stdout);
    assert_mentions(
        &plan,
        &[
            "training tasks",
            "512 (62 held out)",
            "128 (32 prompts x 2 samples each)",
            "coach calls",
            "estimated coach cost",
            "GEMINI_API_KEY",
            "Qwen3-4B-Thinking-2507",
            // The memory plan, from the architecture in experiments/model-configs/.
            "memory plan:",
            "base weights Qwen3-4B-Thinking-2507 (frozen, linear ones in bf16)",
            "log-prob pass, 1 sequences at a time",
            "generation of 4 sequences",
            "LoRA adapters (rank 32)",
            "update of a micro-batch of 1 at its peak (saved activations",
            "allocator reserve (20% of the above",
            "of 80.00 GiB",
            // Layer-by-layer recomputation and fused attention make it fit.
            "fits the declared [devices] memory",
        ],
    );
    let stderr = fails(
        mappa()
            .args(["reproduce", "aime"])
            .env_remove("GEMINI_API_KEY"),
    );
    assert_mentions(
        &stderr,
        &[
            "nothing was run",
            "cuda",
            "model weights",
            "GEMINI_API_KEY",
            "just reproduce arith",
        ],
    );
}

#[test]
fn a_run_whose_memory_plan_does_not_fit_its_devices_is_refused() {
    let dir = scratch();
    let text = tiny_manifest_text();
    let tight = dir.path().join("tight.toml");
    std::fs::write(&tight, format!("{text}\n[devices]\nmemory_gib = 0.001\n")).unwrap();
    let runs = dir.path().join("runs");
    let stderr = fails(mappa().arg("run").arg(&tight).arg("--runs-dir").arg(&runs));
    assert_mentions(
        &stderr,
        &[
            "memory plan",
            "the memory plan does not fit",
            "the largest item is",
            "LoRA adapters on a frozen base",
            "nothing was run",
        ],
    );
    // Refused before anything was written.
    assert!(!runs.exists(), "a refused run left {}", runs.display());
}

#[test]
fn agents_placed_on_devices_train_data_parallel_and_reproduce() {
    // On the CPU backend every device index is the one CPU: the solver's
    // update runs on two worker threads whose gradients burn's collective
    // sums, and the verifier lives on "device 1".
    let dir = scratch();
    let placed = dir.path().join("placed.toml");
    std::fs::write(
        &placed,
        format!(
            "{}\n[devices]\nmemory_gib = 64\ncount = 2\n\n[devices.agents]\nproblem_solver = [0, 1]\nverifier = [1]\n",
            tiny_manifest_text().replace("micro_batch_size = 4", "micro_batch_size = 1")
        ),
    )
    .unwrap();
    let metrics = |runs: &Path| {
        let out = succeeds(mappa().arg("run").arg(&placed).arg("--runs-dir").arg(runs));
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        let run = run_dir(runs);
        assert_eq!(checkpoint_step(&run), Some(3));
        (std::fs::read(run.join("metrics.jsonl")).unwrap(), stderr)
    };
    let (first, stderr) = metrics(&dir.path().join("first"));
    assert_mentions(
        &stderr,
        &[
            "device 0:",
            "device 1:",
            "problem_solver: weights (fully trained) (replica)",
        ],
    );
    let (again, _) = metrics(&dir.path().join("again"));
    assert!(first == again, "a data-parallel run repeats byte for byte");
}

#[test]
fn manifest_errors_name_the_key_or_file() {
    let dir = scratch();
    let text = std::fs::read_to_string(manifest()).unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        tiny_manifest_text().replace("seed = 11", "seed = 11\nsneed = 3"),
    )
    .unwrap();
    let out = mappa().arg("run").arg(&bad).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("sneed") && stderr.contains("bad.toml"),
        "{stderr}"
    );
    let missing = dir.path().join("missing.toml");
    std::fs::write(
        &missing,
        text.replace("../models/qwen3-tiny", "../models/nope")
            .replace(
                "../../experiments",
                &workspace().join("experiments").display().to_string(),
            ),
    )
    .unwrap();
    let out = mappa().arg("run").arg(&missing).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("nope") && stderr.contains("does not exist"),
        "{stderr}"
    );
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn ablate_report_inspect_and_eval_work_on_a_tiny_manifest() {
    let runs = scratch();
    succeeds(
        mappa()
            .arg("ablate")
            .arg(manifest())
            .args(["--credit", "process,outcome", "--seeds", "1", "--runs-dir"])
            .arg(runs.path()),
    );
    let study = runs.path().join("tiny-arith-ablate-study");
    let text = std::fs::read_to_string(study.join("report.md")).unwrap();
    assert!(
        text.contains("an ablation")
            && text.contains("| process | ")
            && text.contains("| outcome | ")
            && text.contains("no claim"),
        "{text}"
    );
    assert!(
        text.contains("scripted coach") && text.contains("simulated"),
        "the report says the coach is simulated: {text}"
    );
    let svg = std::fs::read_to_string(study.join("accuracy.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));
    let run_dirs: Vec<std::path::PathBuf> = std::fs::read_dir(&study)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("manifest.lock.json").exists())
        .collect();
    assert_eq!(run_dirs.len(), 2, "{run_dirs:?}");
    let report = runs.path().join("report");
    succeeds(
        mappa()
            .arg("report")
            .args(&run_dirs)
            .arg("--out")
            .arg(&report),
    );
    for plot in [
        "accuracy.svg",
        "reward.svg",
        "tool_call_rate.svg",
        "response_length.svg",
    ] {
        let svg = std::fs::read_to_string(report.join(plot)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{plot}"
        );
    }
    let run = run_dirs
        .iter()
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("tiny-arith-ablate-process")
        })
        .unwrap()
        .clone();
    let out = mappa()
        .arg("inspect")
        .arg(&run)
        .args(["--trajectory", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && text.contains("=== problem_solver")
            && text.contains("--- coach: [scripted coach"),
        "{text}"
    );
    let out = mappa()
        .arg("inspect")
        .arg(&run)
        .args(["--trajectory", "999"])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("out of range"));
    let out = succeeds(mappa().arg("eval").arg(manifest()).arg("--run").arg(&run));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["kind"], "eval");
    assert_eq!(line["step"], 3, "the checkpoint after three steps");
    assert!(run.join("eval.jsonl").exists());
}

#[test]
fn the_dsbench_pipeline_runs_end_to_end_on_generated_tasks() {
    let runs = scratch();
    succeeds(
        mappa()
            .arg("run")
            .arg(workspace().join("fixtures/manifests/tiny-tabular.toml"))
            .arg("--runs-dir")
            .arg(runs.path()),
    );
    let run = run_dir(runs.path());
    let metrics = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let eval: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    assert_eq!(
        eval["tabular"]["n"], 2,
        "fair DSBench metrics over the held-out tasks: {eval}"
    );
    let trajectories = std::fs::read_to_string(run.join("trajectories.jsonl")).unwrap();
    let first: serde_json::Value =
        serde_json::from_str(trajectories.lines().next().unwrap()).unwrap();
    assert_eq!(first["actions"][0]["role"], "data_engineer");
    assert!(
        first["actions"][0]["rationale"]
            .as_str()
            .unwrap()
            .contains("required files missing"),
        "{first}"
    );
    let out = mappa()
        .args(["reproduce", "dsbench", "--dry-run"])
        .output()
        .unwrap();
    let plan = String::from_utf8_lossy(&out.stdout);
    assert!(
        plan.contains("63 (8 held out)") && plan.contains("DSBench data"),
        "{plan}"
    );
}

/// A served "model" for `mappa eval --remote-url`: prints 7 from Python and boxes it.
fn served_model() -> String {
    mappa_judge::testing::serve(|request| {
        let content = if request.message(0).contains("Code Executor") {
            "```python\nprint(7)\n```"
        } else {
            "\\boxed{7}"
        };
        mappa_judge::testing::Reply::content(content)
    })
}

#[test]
fn eval_runs_a_served_model_through_the_pipeline() {
    let out = scratch();
    let result = mappa()
        .arg("eval")
        .arg(manifest())
        .args([
            "--remote-url",
            &served_model(),
            "--remote-model",
            "served-7",
            "--out",
        ])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(
        result.status.success(),
        "{}",
        String::from_utf8_lossy(&result.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&result.stdout).unwrap();
    assert_eq!(line["policy"], "remote:served-7");
    assert_eq!(line["trajectories"], 3);
    assert!(out.path().join("eval.jsonl").exists());
}

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
