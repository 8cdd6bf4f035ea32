//! `data.kind = "math_file"`: AIME/AMC problems from JSON-lines files
//! (`mappa_env::datasets`): a seeded sample of one file for training,
//! other files held out (checked disjoint); graded on the boxed answer.

use std::path::{Path, PathBuf};

use mappa_agents::TaskInput;
use mappa_env::datasets::{check_disjoint, MathDataset, MathProblem};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{settings_boilerplate, AnswerGrader, TaskFamily, TaskSet};
use crate::files::{check_file, rebase, FileRef};
use crate::TrainError;

/// A training file and held-out files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MathFile {
    /// The training file.
    pub path: PathBuf,
    /// Its expected sha256.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Problems sampled for training (all when absent).
    #[serde(default)]
    pub train_size: Option<usize>,
    /// Sampling seed.
    pub seed: u64,
    /// Evaluation files, checked disjoint from the training sample.
    #[serde(default)]
    pub eval: Vec<FileRef>,
}

fn data_err(e: impl std::fmt::Display) -> TrainError {
    TrainError::Config(format!("data: {e}"))
}

fn task(group: usize, p: &MathProblem) -> TaskInput {
    TaskInput {
        id: p.id.clone(),
        group,
        text: p.prompt.clone(),
        ground_truth: Some(p.answer.clone()),
        ..Default::default()
    }
}

impl TaskFamily for MathFile {
    settings_boilerplate!();

    fn rebase(&mut self, base: &Path) {
        rebase(&mut self.path, base);
        for f in &mut self.eval {
            rebase(&mut f.path, base);
        }
    }

    fn resolve(&self) -> Result<Value, TrainError> {
        let mut files = serde_json::Map::new();
        files.insert(
            "train".into(),
            check_file(&self.path, &self.sha256, "the training data")?.into(),
        );
        for f in &self.eval {
            files.insert(
                f.path.display().to_string(),
                check_file(&f.path, &f.sha256, "an eval set")?.into(),
            );
        }
        Ok(Value::Object(files))
    }

    fn missing(&self) -> Vec<(String, String)> {
        if self.path.exists() {
            return Vec::new();
        }
        vec![(
            format!("the training data {}", self.path.display()),
            "restore fixtures/bench/".into(),
        )]
    }

    fn load(&self, _data_dir: &Path) -> Result<TaskSet, TrainError> {
        let dataset = MathDataset::load(&self.path).map_err(data_err)?;
        let train = dataset
            .sample(
                self.train_size.unwrap_or(dataset.problems.len()),
                self.seed,
            )
            .map_err(data_err)?;
        let mut held_out = Vec::new();
        for f in &self.eval {
            let set = MathDataset::load(&f.path).map_err(data_err)?;
            check_disjoint(&train, &set.problems).map_err(data_err)?;
            held_out.extend(set.problems);
        }
        Ok(TaskSet {
            train: train.iter().enumerate().map(|(i, p)| task(i, p)).collect(),
            eval: held_out
                .iter()
                .enumerate()
                .map(|(i, p)| task(i, p))
                .collect(),
            grader: Box::new(AnswerGrader { fallbacks: false }),
        })
    }

    fn metric(&self) -> &'static str {
        "Accuracy is the rate of right final answers."
    }

    fn describe(&self) -> String {
        format!(
            "AIME/AMC problems from {} ({} held-out files)",
            self.path.display(),
            self.eval.len()
        )
    }
}
