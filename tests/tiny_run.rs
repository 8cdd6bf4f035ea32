//! End-to-end runs on the CPU backend.
//!
//! `tiny_run_is_deterministic_and_pinned` runs
//! `fixtures/manifests/tiny-arith-warm.toml`: the arith-compact workflow with
//! three 0.1M-parameter byte-level models, warm-started on a scripted
//! teacher's demonstrations (most of the test's time), then three RL steps of
//! 4 x 2 trajectories with the real Python tool in the sandbox, a scripted
//! coach and per-action process credit. It runs twice, side by side (the
//! second run reuses the first's cached warm start), and the two runs' raw
//! `metrics.jsonl` and `trajectories.jsonl` must be equal byte for byte. It
//! asserts that the Code Executor ran code in the tool with status `ok`, that
//! some training trajectory was a success (outcome 1), that some agent's
//! logged loss is not zero and that every agent got a gradient. Snapshots in
//! `snapshots/mappa-tests/`, floats rounded by [`stable`]:
//! `tiny_run_metrics` (every metrics line: accuracies, the tool-call rate,
//! per-agent losses, KL, gradient norms, rewards, advantages),
//! `tiny_run_trajectory_summaries` (per trajectory its outcome; per action
//! the role, turn, truncation, whether code ran and its tool status, the
//! coach's score, the reward and the mean advantage; not the sampled text)
//! and `tiny_run_lock` (the lock file without its volatile fields). Bit-exact
//! equality across CPU kinds is `crates/mappa-learner/tests/determinism.rs`'s business.
//!
//! `replay_from_the_coach_cache_needs_no_coach` runs the tiny-arith manifest
//! (untrained random fixture models, whose actions are cut-off random bytes:
//! machinery only) with a fake OpenAI-compatible judge, records a coach
//! cache, and replays the run from it with no coach reachable.
//! `warm_start_is_trained_once_and_reused` checks the warm-start cache.
//! `an_input_only_coach_reports_its_accuracy` runs the tiny-arith manifest
//! under the input-only scripted coach and checks its per-role accuracy in
//! the metrics.

use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use mappa_judge::cache::CacheMode;
use mappa_judge::config::Judge;
use mappa_tests::{fake_judge_config, fake_judge_reply, fixtures};
use mappa_train::lock::Lock;
use mappa_train::manifest::Manifest;
use mappa_train::run::{run, RunOptions};
use serde_json::Value;

type B = Autodiff<mappa_model::backend::Cpu>;

fn root() -> PathBuf {
    fixtures().join("..").canonicalize().unwrap()
}

fn manifest() -> Manifest {
    Manifest::load(&fixtures().join("manifests/tiny-arith.toml")).unwrap()
}

fn warm_manifest() -> Manifest {
    Manifest::load(&fixtures().join("manifests/tiny-arith-warm.toml")).unwrap()
}

fn scratch() -> tempfile::TempDir {
    mappa_env::sandbox::scratch_dir().unwrap()
}

/// Floats rounded to 5 significant digits (and below 1e-6 to 0: such values
/// are rounding noise around 0, as in a normalised mean), absolute paths under the
/// repository made relative. The snapshot pins what a reader checks (scores,
/// rewards, losses, accuracies); bit-exactness is checked as equality
/// between two runs here and, across CPU kinds, by `crates/mappa-learner/tests/determinism.rs`.
fn stable(value: Value, root: &str) -> Value {
    match value {
        Value::Number(n) if n.is_f64() => {
            let x = n.as_f64().unwrap();
            let scale = 10f64.powi(4 - x.abs().log10().floor().clamp(-300.0, 300.0) as i32);
            // `+ 0.0` turns -0.0 into 0.0: float noise must not flip a sign in the snapshot.
            let x = if x.abs() < 1e-6 {
                0.0
            } else {
                (x * scale).round() / scale + 0.0
            };
            serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
        }
        Value::String(s) => Value::String(s.replace(root, "<repo>")),
        Value::Array(items) => Value::Array(items.into_iter().map(|v| stable(v, root)).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, stable(v, root))).collect())
        }
        other => other,
    }
}

fn jsonl(path: &Path) -> Vec<Value> {
    let root = root().display().to_string();
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| stable(serde_json::from_str(l).unwrap(), &root))
        .collect()
}

fn run_in(dir: &Path, manifest: &Manifest, options: &RunOptions) -> (Vec<Value>, Vec<Value>) {
    run::<B>(manifest, dir, options, &Default::default()).unwrap();
    (
        jsonl(&dir.join("metrics.jsonl")),
        jsonl(&dir.join("trajectories.jsonl")),
    )
}

/// The raw `metrics.jsonl` and `trajectories.jsonl` of a run, unrounded.
fn run_raw(dir: &Path, manifest: &Manifest) -> (String, String) {
    run::<B>(manifest, dir, &RunOptions::default(), &Default::default()).unwrap();
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    (read("metrics.jsonl"), read("trajectories.jsonl"))
}

fn lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What a reviewer can judge of a trajectory, without its sampled text: a
/// line with its outcome, then a line per action with who acted, whether the
/// text was cut off, whether code ran in the tool and how it ended, and the
/// coach's score with the reward and mean advantage it became. Floats
/// rounded by [`stable`].
fn summary(trajectory: &Value, repo: &str) -> String {
    let line = |value: Value| serde_json::to_string(&stable(value, repo)).unwrap();
    let mut text = line(serde_json::json!({
        "step": trajectory["step"],
        "task_id": trajectory["task_id"],
        "sample": trajectory["sample"],
        "outcome": trajectory["outcome"],
    }));
    for a in trajectory["actions"].as_array().unwrap() {
        text.push_str("\n  ");
        text.push_str(&line(serde_json::json!({
            "role": a["role"],
            "turn": a["turn"],
            "truncated": a["truncated"],
            "code_ran": a["code"].is_string(),
            "tool_status": a["tool_status"],
            "score": a["score"],
            "reward": a["reward"],
            "advantage_mean": a["advantage_mean"],
        })));
    }
    text
}

#[test]
fn tiny_run_is_deterministic_and_pinned() {
    let manifest = warm_manifest();
    // Both runs beside each other: the warm start (most of the time) is
    // trained by the first and reused from `.warm-start/` by the second.
    let runs = scratch();
    let first = run_raw(&runs.path().join("a"), &manifest);
    let second = run_raw(&runs.path().join("b"), &manifest);
    // Bit-exact: the files themselves, before any rounding.
    assert!(
        first == second,
        "the same manifest gives the same run, bit for bit"
    );

    let metrics = lines(&first.0);
    let trajectories = lines(&first.1);
    let rollout = &manifest.rollout;
    assert_eq!(
        trajectories.len(),
        rollout.steps * rollout.prompts_per_step * rollout.samples_per_prompt
    );
    let actions = || {
        trajectories
            .iter()
            .flat_map(|t| t["actions"].as_array().unwrap())
    };
    let tool_calls = actions()
        .filter(|a| {
            a["role"] == "code_executor" && a["code"].is_string() && a["tool_status"] == "ok"
        })
        .count();
    assert!(
        tool_calls > 0,
        "the Code Executor ran code in the Python tool"
    );
    let successes = trajectories.iter().filter(|t| t["outcome"] == 1.0).count();
    assert!(successes > 0, "some training trajectory solved its problem");
    let agent_lines = || {
        metrics
            .iter()
            .filter(|m| m["kind"] == "train")
            .flat_map(|m| m["agents"].as_array().unwrap())
    };
    // Float noise around a centred advantage is ~1e-7; the KL term is larger.
    assert!(
        agent_lines().any(|a| a["loss"].as_f64().unwrap().abs() > 1e-5),
        "some agent's loss is not zero"
    );
    for role in ["problem_solver", "code_executor", "verifier"] {
        assert!(
            agent_lines().any(|a| a["agent"] == role && a["grad_norm"].as_f64().unwrap() > 0.0),
            "{role} got a gradient"
        );
    }

    // In process the rollout's log-probs are the sampler's, on the same
    // weights as the trainer's but another computation: one token at a time
    // from the KV cache, the log-sum-exp in f64, against a full f32
    // recomputation. That explains differences of a few f32 roundings of
    // the logits (measured: at most 3e-6), never a token out of band.
    for line in metrics.iter().filter(|m| m["kind"] == "train") {
        let mismatch = line["rollout_mismatch"].as_object().unwrap();
        assert_eq!(mismatch.len(), 3, "every agent's mismatch: {line}");
        for (role, m) in mismatch {
            assert!(m["tokens"].as_u64().unwrap() > 0, "{role}: {m}");
            assert!(m["max_abs"].as_f64().unwrap() < 1e-4, "{role}: {m}");
            assert!(m["kl"].as_f64().unwrap() < 1e-8, "{role}: {m}");
            assert_eq!(m["out_of_band"], 0.0, "{role}: {m}");
        }
    }

    let repo = root().display().to_string();
    let metrics: Vec<Value> = metrics.into_iter().map(|m| stable(m, &repo)).collect();
    let summaries: Vec<String> = trajectories.iter().map(|t| summary(t, &repo)).collect();
    let lock = Lock::new(&manifest, manifest.resolve().unwrap(), &root());
    let mut lock = serde_json::to_value(lock).unwrap();
    let object = lock.as_object_mut().unwrap();
    object.remove("code");
    object.remove("machine");
    let lock = stable(lock, &repo);

    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../snapshots/mappa-tests"
    ));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        insta::assert_json_snapshot!("tiny_run_metrics", metrics);
        insta::assert_snapshot!("tiny_run_trajectory_summaries", summaries.join("\n"));
        insta::assert_json_snapshot!("tiny_run_lock", lock);
    });
}

/// An OpenAI-compatible judge whose score depends only on the prompt's length.
fn fake_judge() -> String {
    mappa_judge::testing::serve(fake_judge_reply)
}

#[test]
fn replay_from_the_coach_cache_needs_no_coach() {
    let dir = scratch();
    let mut manifest = manifest();
    manifest.coach.cache = Some(dir.path().join("coach-cache.sqlite"));
    manifest.coach.cache_mode = CacheMode::ReadWrite;
    manifest.coach.judge = fake_judge_config(fake_judge());
    let (recorded_dir, replayed_dir) = (dir.path().join("recorded"), dir.path().join("replayed"));
    let recorded = run_in(&recorded_dir, &manifest, &RunOptions::default());
    // Nothing listens on port 9: every coach call must be a cache hit.
    manifest.coach.judge = fake_judge_config("http://127.0.0.1:9/v1".into());
    let replayed = run_in(
        &replayed_dir,
        &manifest,
        &RunOptions {
            coach_mode: Some(CacheMode::Replay),
            ..Default::default()
        },
    );
    assert_eq!(recorded, replayed);
    assert!(
        recorded
            .1
            .iter()
            .any(|t| t["actions"][0]["score"].as_f64() != Some(5.0)),
        "scores came from the judge"
    );
}

#[test]
fn warm_start_is_trained_once_and_reused() {
    let mut manifest = Manifest::load(&root().join("experiments/arith.toml"))
        .unwrap()
        .with_overrides(&toml::from_str("data = { train = 6, eval = 2 }").unwrap())
        .unwrap();
    let warm = manifest.warm_start.as_mut().unwrap();
    warm.demonstrations = 6;
    warm.sft.epochs = 1;
    manifest.rollout.steps = 1;
    manifest.rollout.prompts_per_step = 2;
    manifest.rollout.samples_per_prompt = 1;
    manifest.rollout.max_new_tokens = 12;
    manifest.train.total_steps = 1;
    let runs = scratch();
    let first = run_in(&runs.path().join("a"), &manifest, &RunOptions::default());
    let cache: Vec<PathBuf> = std::fs::read_dir(runs.path().join(".warm-start"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(cache.len(), 1, "{cache:?}");
    let done = cache[0].join("done.json");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&done).unwrap()).unwrap();
    assert_eq!(report["verifier"]["demonstrations"], 6);
    let stamp = std::fs::metadata(&done).unwrap().modified().unwrap();
    let second = run_in(&runs.path().join("b"), &manifest, &RunOptions::default());
    assert_eq!(
        std::fs::metadata(&done).unwrap().modified().unwrap(),
        stamp,
        "the cached warm start was reused"
    );
    assert_eq!(first, second);
    assert!(cache[0].join("verifier/model.safetensors").exists());
}

#[test]
fn an_input_only_coach_reports_its_accuracy() {
    let dir = scratch();
    let mut manifest = manifest();
    let Judge::Scripted(scripted) = &mut manifest.coach.judge else {
        panic!("tiny-arith has a scripted coach");
    };
    scripted.view = mappa_judge::scripted::View::InputOnly;
    scripted.slip_rate = 0.2;
    let (metrics, trajectories) = run_in(dir.path(), &manifest, &RunOptions::default());
    let train: Vec<&Value> = metrics.iter().filter(|m| m["kind"] == "train").collect();
    assert_eq!(train.len(), 3);
    for line in train {
        let accuracy = line["coach_accuracy"].as_object().unwrap();
        assert_eq!(accuracy.len(), 3, "{line}");
        assert!(accuracy
            .values()
            .all(|a| (0.0..=1.0).contains(&a.as_f64().unwrap())));
    }
    let rationale = trajectories[0]["actions"][0]["rationale"].as_str().unwrap();
    assert!(
        rationale.starts_with("[scripted coach: input-only, medium]"),
        "{rationale}"
    );
}
