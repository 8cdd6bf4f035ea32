//! The free-text coach against labels made by reading the actions
//! (`fixtures/smol-learn/`): 288 actions of SmolLM2-135M-Instruct agents in
//! the mathchat-smol workflow on validation problems (the base model and a
//! checkpoint of an exploratory run, each greedy and sampled at 0.7), each
//! labelled right or wrong by the rubric in the fixture's README. The
//! coach registered in `experiments/smol-learn.toml` must agree with the
//! labels on at least 80% of each role's actions (issue 64), and its reading
//! alone (its verdicts before its simulated slips) on at least 90%.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mappa_judge::config::CoachConfig;
use mappa_judge::ActionContext;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Each line of a JSON-lines fixture.
fn lines<T: serde::de::DeserializeOwned>(path: &Path) -> Vec<T> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

#[derive(serde::Deserialize)]
struct Label {
    id: String,
    right: bool,
}

/// The `[coach]` table of the registered manifest.
fn registered_coach() -> CoachConfig {
    let text = std::fs::read_to_string(root().join("experiments/smol-learn.toml")).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    manifest["coach"].clone().try_into().unwrap()
}

/// Per role: (actions, the coach's verdict agrees, its reading agrees).
fn agreement() -> BTreeMap<String, (usize, usize, usize)> {
    let dir = root().join("fixtures/smol-learn");
    let actions: Vec<ActionContext> = lines(&dir.join("actions.jsonl"));
    let labels: Vec<Label> = lines(&dir.join("labels.jsonl"));
    assert_eq!(actions.len(), labels.len(), "one label per action");
    let coach = registered_coach().build().unwrap();
    let scores = coach.score_batch(&actions).unwrap();
    let mut by_role: BTreeMap<String, (usize, usize, usize)> = BTreeMap::new();
    for ((action, label), score) in actions.iter().zip(&labels).zip(&scores) {
        assert_eq!(action.id, label.id, "labels in the actions' order");
        let audit = score.audit.expect("a scripted coach audits its verdicts");
        let verdict = score.score >= 5.0;
        assert_eq!(verdict, audit.judged_right, "{}: {score:?}", action.id);
        let e = by_role.entry(action.role.clone()).or_default();
        e.0 += 1;
        e.1 += usize::from(verdict == label.right);
        e.2 += usize::from(audit.truly_right == label.right);
    }
    by_role
}

#[test]
fn the_registered_coach_agrees_with_the_labels_per_role() {
    let by_role = agreement();
    assert_eq!(
        by_role.keys().collect::<Vec<_>>(),
        ["code_executor", "problem_solver", "verifier"]
    );
    for (role, (n, coach, reading)) in &by_role {
        let (coach, reading) = (*coach as f64 / *n as f64, *reading as f64 / *n as f64);
        eprintln!(
            "{role}: {n} actions; the coach agrees on {coach:.3}, its reading on {reading:.3}"
        );
        assert!(
            coach >= 0.8,
            "{role}: the coach agrees with the labels on {coach:.3}"
        );
        assert!(
            reading >= 0.9,
            "{role}: the reading agrees with the labels on {reading:.3}"
        );
    }
}
