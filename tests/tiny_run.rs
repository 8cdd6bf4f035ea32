//! The end-to-end run on the CPU backend, pinned by snapshots: the tiny
//! arith manifest (fixture models as all three agents, a scripted coach,
//! the real Python tool) for three steps. Trajectories (text), coach scores,
//! rewards, advantages, metrics and the lock file without its volatile
//! fields are snapshot in `snapshots/mappa-tests/`. The run is repeated to
//! show it is deterministic, and replayed from a coach cache with no coach
//! reachable.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use mappa_judge::cache::CacheMode;
use mappa_judge::openai::OpenAiConfig;
use mappa_tests::fixtures;
use mappa_train::manifest::{lock, Manifest};
use mappa_train::run::{run, RunOptions};
use serde_json::Value;

type B = Autodiff<mappa_model::backend::Cpu>;

fn root() -> PathBuf {
    fixtures().join("..").canonicalize().unwrap()
}

fn manifest() -> Manifest {
    Manifest::load(&fixtures().join("manifests/tiny-arith.toml")).unwrap()
}

fn scratch() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

/// Floats rounded to 5 significant digits (and below 1e-6 to 0: such values
/// are rounding noise around 0, as in a normalised mean), absolute paths under the
/// repository made relative. The snapshot pins what a reader checks (scores,
/// rewards, losses, accuracies); bit-exactness is checked as equality
/// between two runs here and, across CPU kinds, by `tests/determinism.rs`.
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

#[test]
fn tiny_run_is_deterministic_and_pinned() {
    let manifest = manifest();
    let (a, b) = (scratch(), scratch());
    let first = run_in(a.path(), &manifest, &RunOptions::default());
    let second = run_in(b.path(), &manifest, &RunOptions::default());
    assert_eq!(first, second, "the same manifest gives the same run");
    assert_eq!(first.1.len(), 3 * 2 * 2, "3 steps x 2 prompts x 2 samples");

    let mut lock = lock(&manifest, manifest.resolve().unwrap(), &root());
    let object = lock.as_object_mut().unwrap();
    object.remove("code");
    object.remove("machine");
    let lock = stable(lock, &root().display().to_string());

    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../snapshots/mappa-tests"
    ));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        insta::assert_json_snapshot!("tiny_run_metrics", first.0);
        insta::assert_json_snapshot!("tiny_run_trajectories", first.1);
        insta::assert_json_snapshot!("tiny_run_lock", lock);
    });
}

/// An OpenAI-compatible judge whose score depends only on the prompt's length.
fn fake_judge() -> String {
    mappa_judge::testing::serve(|request| {
        let length = request.body.to_string().len();
        mappa_judge::testing::Reply::content(&format!(
            "Judged.\nPROCESS_SCORE: {}\nANSWER_CORRECT: 0",
            length % 11
        ))
    })
}

#[test]
fn replay_from_the_coach_cache_needs_no_coach() {
    let dir = scratch();
    let mut manifest = manifest();
    manifest.coach.scripted = None;
    manifest.coach.cache = Some(dir.path().join("coach-cache.sqlite"));
    manifest.coach.cache_mode = CacheMode::ReadWrite;
    manifest.coach.openai = Some(OpenAiConfig {
        base_url: fake_judge(),
        model: "fake-judge".into(),
        api_key_env: None,
        timeout_s: 10.0,
        max_attempts: 2,
        initial_backoff_s: 0.01,
        max_backoff_s: 0.1,
        requests_per_minute: None,
        usd_per_million_prompt_tokens: 0.0,
        usd_per_million_completion_tokens: 0.0,
        seed: 0,
    });
    let (recorded_dir, replayed_dir) = (dir.path().join("recorded"), dir.path().join("replayed"));
    let recorded = run_in(&recorded_dir, &manifest, &RunOptions::default());
    // Nothing listens on port 9: every coach call must be a cache hit.
    manifest.coach.openai.as_mut().unwrap().base_url = "http://127.0.0.1:9/v1".into();
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
