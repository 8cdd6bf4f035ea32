//! A tiny end-to-end run on the device (`fixtures/manifests/tiny-arith-warm.toml`:
//! three warm-started agents, the Python tool, a scripted coach), two
//! training steps, twice: the first must finish with finite metrics, the
//! second must write the same records bit for bit.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context};
use mappa_train::manifest::{BackendKind, Manifest};
use mappa_train::records::{read_jsonl, MetricsLine, TrainLine};
use mappa_train::run::RunOptions;
use serde_json::{json, Value};

use super::Outcome;
use crate::rundir::{execute, prepare_in, repo_root};

/// The manifest, from the repository (or the GPU bundle) root.
pub fn manifest_path() -> PathBuf {
    repo_root().join("fixtures/manifests/tiny-arith-warm.toml")
}

/// Training steps of each run.
const STEPS: usize = 2;

/// Runs the tiny manifest on `backend` in `dir` (its warm start cached
/// beside it, shared by both runs).
pub fn tiny_run(backend: BackendKind, dir: &Path) -> anyhow::Result<()> {
    let path = manifest_path();
    let mut manifest = Manifest::load(&path).with_context(|| format!("{}", path.display()))?;
    manifest.backend = backend;
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    }
    prepare_in(&manifest, dir)?;
    let options = RunOptions {
        max_steps: Some(STEPS),
        resume: false,
        coach_mode: None,
        progress: false,
    };
    execute(&manifest, dir, &options)
}

/// The run in `dir` finished its steps with finite losses.
pub fn check_finished(dir: &Path) -> anyhow::Result<Outcome> {
    let lines: Vec<MetricsLine> = read_jsonl(&dir.join("metrics.jsonl"))?;
    let trained: Vec<&TrainLine> = lines
        .iter()
        .filter_map(|l| match l {
            MetricsLine::Train(t) => Some(t),
            MetricsLine::Eval(_) => None,
        })
        .collect();
    let steps = trained.len();
    let losses: Vec<f64> = trained
        .iter()
        .flat_map(|t| t.agents.iter().map(|a| a.loss))
        .collect();
    let mut failures = Vec::new();
    if steps != STEPS {
        failures.push(format!("{steps} training steps recorded, not {STEPS}"));
    }
    if losses.is_empty() || losses.iter().any(|l| !l.is_finite()) {
        failures.push(format!("the agents' losses are not all finite: {losses:?}"));
    }
    Ok(Outcome::from_failures(
        failures,
        json!({"steps": steps, "losses": losses}),
        json!({"steps": STEPS, "losses": "finite"}),
        format!("{}", dir.display()),
    ))
}

/// The two runs wrote the same metrics and trajectories, byte for byte; or
/// the first line and field where they part.
pub fn check_same(a: &Path, b: &Path) -> anyhow::Result<Outcome> {
    let mut failures = Vec::new();
    for file in ["metrics.jsonl", "trajectories.jsonl"] {
        let (x, y) = (records(&a.join(file))?, records(&b.join(file))?);
        if let Some(place) = first_difference(&x, &y) {
            failures.push(format!("{file}: {place}"));
        }
    }
    Ok(Outcome::from_failures(
        failures,
        json!({"runs": [a.display().to_string(), b.display().to_string()]}),
        json!("identical records"),
        "metrics.jsonl and trajectories.jsonl of two runs of one manifest (the second reuses the first's warm start, so its training steps are compared, not the fine-tuning)".into(),
    ))
}

fn records(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| anyhow!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect()
}

/// Where two record lists first differ: the line, and the first field
/// (a JSON path) whose values differ.
fn first_difference(a: &[Value], b: &[Value]) -> Option<String> {
    if a.len() != b.len() {
        return Some(format!("{} lines against {}", a.len(), b.len()));
    }
    a.iter().zip(b).enumerate().find_map(|(i, (x, y))| {
        (x != y).then(|| format!("line {}, at {}", i + 1, first_path(x, y, String::new())))
    })
}

fn first_path(a: &Value, b: &Value, at: String) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x
            .iter()
            .find(|(k, v)| y.get(*k) != Some(v))
            .map_or(at.clone(), |(k, v)| {
                first_path(v, &y[k], format!("{at}.{k}"))
            }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .position(|(p, q)| p != q)
            .map_or(at.clone(), |i| {
                first_path(&x[i], &y[i], format!("{at}[{i}]"))
            }),
        _ => format!("{at} ({a} against {b})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_differing_field_is_named() {
        let a = vec![json!({"step": 1, "agents": [{"loss": 0.5}, {"loss": 0.25}]})];
        let b = vec![json!({"step": 1, "agents": [{"loss": 0.5}, {"loss": 0.3}]})];
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(
            first_difference(&a, &b).unwrap(),
            "line 1, at .agents[1].loss (0.25 against 0.3)"
        );
        assert_eq!(first_difference(&a, &[]).unwrap(), "1 lines against 0");
    }
}
