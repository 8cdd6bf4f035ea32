//! `data.kind = "tabular"`: DSBench-layout data-analysis tasks from files
//! (`mappa_env::tabular::load_tasks`); graded on the `submission.csv` the
//! final agent writes, and the last agent's coach is shown its evaluation.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mappa_agents::{TaskInput, Trajectory, Workflow};
use mappa_env::tabular::{evaluate as evaluate_submission, TabularTask};
use mappa_judge::{GroundTruth, KnownSolution};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::{settings_boilerplate, Graded, Grader, TaskFamily, TaskSet};
use crate::files::{check_file, rebase, FileRef};
use crate::TrainError;

/// DSBench task lists and the data they point into.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tabular {
    /// The training task list (JSON lines).
    pub train: FileRef,
    /// The held-out task list.
    pub eval: FileRef,
    /// The cleaned-prompt file.
    pub cleaned_prompts: FileRef,
    /// The directory the task lists' data paths are relative to (train.csv,
    /// test.csv, answers/...): the DSBench data release, supplied by the user.
    pub data_root: PathBuf,
}

impl TaskFamily for Tabular {
    settings_boilerplate!();

    fn rebase(&mut self, base: &Path) {
        for f in [&mut self.train, &mut self.eval, &mut self.cleaned_prompts] {
            rebase(&mut f.path, base);
        }
        rebase(&mut self.data_root, base);
    }

    fn resolve(&self) -> Result<Value, TrainError> {
        if !self.data_root.is_dir() {
            return Err(TrainError::Config(format!(
                "{}: the tabular data root does not exist (the DSBench data release, supplied by you)",
                self.data_root.display()
            )));
        }
        Ok(json!({
            "train": check_file(&self.train.path, &self.train.sha256, "the training task list")?,
            "eval": check_file(&self.eval.path, &self.eval.sha256, "the held-out task list")?,
            "cleaned_prompts": check_file(&self.cleaned_prompts.path, &self.cleaned_prompts.sha256, "the cleaned prompts")?,
        }))
    }

    fn missing(&self) -> Vec<(String, String)> {
        if self.data_root.is_dir() {
            return Vec::new();
        }
        vec![(
            format!(
                "the DSBench data (train.csv, test.csv, answers/) under {}",
                self.data_root.display()
            ),
            "get them from the DSBench data release and lay them out as the task lists' paths say"
                .into(),
        )]
    }

    fn load(&self, _data_dir: &Path) -> Result<TaskSet, TrainError> {
        let load = |list: &Path| {
            mappa_env::tabular::load_tasks(list, &self.cleaned_prompts.path, &self.data_root)
                .map(|l| l.tasks)
                .map_err(|e| TrainError::Config(format!("data: {e}")))
        };
        Ok(task_set(load(&self.train.path)?, load(&self.eval.path)?))
    }

    fn metric(&self) -> &'static str {
        METRIC
    }

    fn describe(&self) -> String {
        format!(
            "DSBench data-analysis tasks from {}",
            self.train.path.display()
        )
    }
}

/// What success means for tasks graded on a submission.
pub(crate) const METRIC: &str =
    "For tabular tasks, accuracy is the rate of valid submissions (a scored submission.csv).";

/// Tabular tasks as the trainer holds them: agents' views and a grader
/// that knows each task's answers.
pub(crate) fn task_set(train: Vec<TabularTask>, eval: Vec<TabularTask>) -> TaskSet {
    let inputs = |tasks: &[TabularTask]| {
        tasks
            .iter()
            .enumerate()
            .map(|(i, t)| task_input(i, t))
            .collect()
    };
    TaskSet {
        train: inputs(&train),
        eval: inputs(&eval),
        grader: Box::new(SubmissionGrader {
            tasks: train
                .into_iter()
                .chain(eval)
                .map(|t| (t.id.clone(), t))
                .collect(),
        }),
    }
}

/// A tabular task as agents see it: the cleaned text and the data files;
/// the coach gets the raw text.
pub(crate) fn task_input(group: usize, task: &TabularTask) -> TaskInput {
    let dir = task
        .train_csv
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let sample = dir.join("sample_submission.csv");
    let mut inputs = vec![task.train_csv.clone(), task.test_csv.clone()];
    if sample.exists() {
        inputs.push(sample);
    }
    TaskInput {
        id: task.id.clone(),
        group,
        text: task.cleaned_prompt.clone(),
        coach_text: Some(task.raw_prompt.clone()),
        inputs,
        solution: Some(KnownSolution {
            task_kind: task.kind.name().to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Grades the `submission.csv` in the final agent's directory; the last
/// agent's coach is shown its evaluation.
struct SubmissionGrader {
    tasks: BTreeMap<String, TabularTask>,
}

impl Grader for SubmissionGrader {
    fn grade(
        &self,
        workflow: &Workflow,
        task: &TaskInput,
        trajectory: &Trajectory,
    ) -> Result<Graded, TrainError> {
        let tabular = self.tasks.get(&task.id).ok_or_else(|| {
            TrainError::Input(format!("grading {}: not a loaded tabular task", task.id))
        })?;
        let submission = trajectory
            .workdir
            .join(&workflow.final_answer_from)
            .join("submission.csv");
        let outcome = evaluate_submission(tabular, Some(&submission))
            .map_err(|e| TrainError::Input(format!("grading {}: {e}", task.id)))?;
        Ok(Graded {
            outcome: outcome.success as u8 as f64,
            ground_truth: Some(GroundTruth::Submission(Box::new(outcome))),
        })
    }
}
