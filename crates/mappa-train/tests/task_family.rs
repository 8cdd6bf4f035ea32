//! A fifth task family, written in this one file: "echo" tasks (repeat a
//! word) with a grader of their own. Given to a manifest through
//! `DataSpec::new`, it drives the whole training loop (loading, rollout,
//! grading, the last agent's coach view, credit, update, evaluation,
//! records) with nothing else changed, which is what `docs/ARCHITECTURE.md`
//! promises for adding a family (plus one registration line, for manifests
//! to name it in TOML).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use burn::backend::Autodiff;
use mappa_agents::{TaskInput, Trajectory, Workflow};
use mappa_judge::{GroundTruth, KnownSolution};
use mappa_train::manifest::{DataSpec, Manifest};
use mappa_train::records::{read_jsonl, MetricsLine, TrajectoryLine};
use mappa_train::run::{run, RunOptions};
use mappa_train::tasks::{Graded, Grader, TaskFamily, TaskSet};
use mappa_train::TrainError;
use serde::{Deserialize, Serialize};
use serde_json::Value;

type B = Autodiff<mappa_model::backend::Cpu>;

/// Echo tasks: one per word.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Echo {
    words: Vec<String>,
    /// Counts the grader's calls (shared with the test).
    #[serde(skip)]
    graded: Arc<AtomicUsize>,
}

impl TaskFamily for Echo {
    fn settings(&self) -> Value {
        serde_json::to_value(self).unwrap()
    }

    fn clone_box(&self) -> Box<dyn TaskFamily> {
        Box::new(self.clone())
    }

    fn load(&self, _data_dir: &Path) -> Result<TaskSet, TrainError> {
        let tasks: Vec<TaskInput> = self
            .words
            .iter()
            .enumerate()
            .map(|(group, word)| TaskInput {
                id: format!("echo-{word}"),
                group,
                text: format!("Say {word}."),
                ground_truth: Some(word.clone()),
                // What a scripted coach checks actions against.
                solution: Some(KnownSolution {
                    task_kind: "echo".into(),
                    answer: Some(word.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect();
        Ok(TaskSet {
            train: tasks.clone(),
            eval: tasks,
            grader: Box::new(EchoGrader {
                calls: self.graded.clone(),
            }),
        })
    }

    fn metric(&self) -> &'static str {
        "Accuracy is the share of trajectories the echo grader passes."
    }

    fn describe(&self) -> String {
        format!("echo tasks (a test family; {} words)", self.words.len())
    }
}

/// Passes every trajectory that produced an action (the tiny random models
/// never say the word; a grader of its own is what this test shows).
struct EchoGrader {
    calls: Arc<AtomicUsize>,
}

impl Grader for EchoGrader {
    fn grade(
        &self,
        _workflow: &Workflow,
        task: &TaskInput,
        trajectory: &Trajectory,
    ) -> Result<Graded, TrainError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Graded {
            outcome: (!trajectory.actions.is_empty()) as u8 as f64,
            ground_truth: Some(GroundTruth::Answer(format!(
                "echo {}",
                task.ground_truth.as_deref().unwrap_or("")
            ))),
        })
    }
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

#[test]
fn a_family_in_one_file_trains_end_to_end() {
    let graded = Arc::new(AtomicUsize::new(0));
    let mut manifest = Manifest::load(&fixtures().join("manifests/tiny-arith.toml")).unwrap();
    manifest.data = DataSpec::new(
        "echo",
        Box::new(Echo {
            words: vec!["alpha".into(), "beta".into(), "gamma".into()],
            graded: graded.clone(),
        }),
    );
    manifest.rollout.steps = 2;
    manifest.train.total_steps = 2;
    manifest.eval.every = 1;
    let dir = mappa_env::sandbox::scratch_dir().unwrap();
    let run_dir = dir.path().join("run");
    let end = run::<B>(
        &manifest,
        &run_dir,
        &RunOptions::default(),
        &Default::default(),
    )
    .unwrap();

    // The family's grader decided every outcome: the random models pass it.
    let eval = end.final_eval.unwrap();
    assert_eq!((eval.step, eval.accuracy, eval.trajectories), (2, 1.0, 3));
    let metrics: Vec<MetricsLine> = read_jsonl(&run_dir.join("metrics.jsonl")).unwrap();
    assert!(metrics
        .iter()
        .filter_map(MetricsLine::as_train)
        .all(|t| t.train_accuracy == 1.0));
    let trajectories: Vec<TrajectoryLine> =
        read_jsonl(&run_dir.join("trajectories.jsonl")).unwrap();
    let r = &manifest.rollout;
    assert_eq!(
        trajectories.len(),
        r.steps * r.prompts_per_step * r.samples_per_prompt
    );
    assert!(trajectories.iter().all(|t| t.task_id.starts_with("echo-")));
    // Three evaluations of 3 tasks, and every training trajectory.
    assert_eq!(graded.load(Ordering::SeqCst), 3 * 3 + trajectories.len());
    // The lock records the family's settings under its kind.
    let data = serde_json::to_value(&manifest.data).unwrap();
    assert_eq!(data["kind"], "echo");
    assert_eq!(data["words"][1], "beta");
}
