//! Loading DSBench data-modelling tasks.
//!
//! Two files describe the tasks (schemas in `fixtures/bench/README.md`):
//! a JSON-lines task list (`dsbench_modeling_{train,eval}.json`: one
//! `{prompt, answer, metadata {task_id, task_type, data_type, train_file,
//! test_file, answer_dir, url}}` per line) and one JSON object keyed by task
//! id (`dsbench_modeling_cleaned_prompts.json`: `{cleaned_prompt, metric,
//! task_type, target_column, id_column}`).
//!
//! The metadata paths (`./data/DSBench/data/...`) are resolved against a
//! caller-supplied data root; the CSV files need not exist at load time
//! ([`TabularTask::check_files`] reports missing ones).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

use super::TabularError;

/// What kind of prediction a task asks for. Binary versus multi-class is not
/// recorded in the task files; it is a property of the answer key's label set
/// (see [`super::metrics::AnswerKey::n_classes`]), never of the predictions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TaskKind {
    /// Predict a class label (or a probability of the positive class).
    Classification,
    /// Predict a number.
    Regression,
    /// Predict a text span (one DSBench task, scored by Jaccard; not scored here).
    Extraction,
}

impl TaskKind {
    /// Parses `classification`, `regression` or `extraction`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "classification" => Some(Self::Classification),
            "regression" => Some(Self::Regression),
            "extraction" => Some(Self::Extraction),
            _ => None,
        }
    }

    /// The lower-case name used in the task files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Classification => "classification",
            Self::Regression => "regression",
            Self::Extraction => "extraction",
        }
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A task's official (Kaggle) metric, as named by the cleaned-prompt file.
/// Every name found in the DSBench files parses; only some are computed by
/// [`super::metrics::score_submission`] (see [`super::metrics::Scores::official`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// `accuracy`.
    Accuracy,
    /// `f1`: binary F1 of the positive class.
    F1,
    /// `f1_micro`: micro-averaged F1, equal to accuracy for single-label tasks.
    F1Micro,
    /// `roc_auc`.
    RocAuc,
    /// `normalized_gini`: 2 * AUC - 1.
    NormalizedGini,
    /// `log_loss`.
    LogLoss,
    /// `quadratic_weighted_kappa` or `qwk`.
    QuadraticWeightedKappa,
    /// `map_at_3`: mean average precision of three ranked guesses.
    MapAt3,
    /// `rmse`.
    Rmse,
    /// `rmsle`: RMSE of `ln(1 + x)`.
    Rmsle,
    /// `mae`.
    Mae,
    /// `medae`: median absolute error.
    MedAe,
    /// `smape`: symmetric mean absolute percentage error (0-200).
    Smape,
    /// `r2`: coefficient of determination.
    R2,
    /// `mcrmse`: mean column-wise RMSE over several targets.
    Mcrmse,
    /// `pearson` correlation.
    Pearson,
    /// `spearman` rank correlation.
    Spearman,
    /// `jaccard` word-set similarity (text extraction).
    Jaccard,
}

impl Metric {
    /// Parses a cleaned-prompt metric name; `None` for unknown names.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "accuracy" => Self::Accuracy,
            "f1" => Self::F1,
            "f1_micro" => Self::F1Micro,
            "roc_auc" => Self::RocAuc,
            "normalized_gini" => Self::NormalizedGini,
            "log_loss" => Self::LogLoss,
            "quadratic_weighted_kappa" | "qwk" => Self::QuadraticWeightedKappa,
            "map_at_3" => Self::MapAt3,
            "rmse" => Self::Rmse,
            "rmsle" => Self::Rmsle,
            "mae" => Self::Mae,
            "medae" => Self::MedAe,
            "smape" => Self::Smape,
            "r2" => Self::R2,
            "mcrmse" => Self::Mcrmse,
            "pearson" => Self::Pearson,
            "spearman" => Self::Spearman,
            "jaccard" => Self::Jaccard,
            _ => return None,
        })
    }

    /// The canonical name (`qwk` for both spellings of quadratic weighted kappa).
    pub fn name(self) -> &'static str {
        match self {
            Self::Accuracy => "accuracy",
            Self::F1 => "f1",
            Self::F1Micro => "f1_micro",
            Self::RocAuc => "roc_auc",
            Self::NormalizedGini => "normalized_gini",
            Self::LogLoss => "log_loss",
            Self::QuadraticWeightedKappa => "qwk",
            Self::MapAt3 => "map_at_3",
            Self::Rmse => "rmse",
            Self::Rmsle => "rmsle",
            Self::Mae => "mae",
            Self::MedAe => "medae",
            Self::Smape => "smape",
            Self::R2 => "r2",
            Self::Mcrmse => "mcrmse",
            Self::Pearson => "pearson",
            Self::Spearman => "spearman",
            Self::Jaccard => "jaccard",
        }
    }

    /// The kind of task the metric scores.
    pub fn kind(self) -> TaskKind {
        match self {
            Self::Accuracy
            | Self::F1
            | Self::F1Micro
            | Self::RocAuc
            | Self::NormalizedGini
            | Self::LogLoss
            | Self::QuadraticWeightedKappa
            | Self::MapAt3 => TaskKind::Classification,
            Self::Rmse
            | Self::Rmsle
            | Self::Mae
            | Self::MedAe
            | Self::Smape
            | Self::R2
            | Self::Mcrmse
            | Self::Pearson
            | Self::Spearman => TaskKind::Regression,
            Self::Jaccard => TaskKind::Extraction,
        }
    }

    /// Whether larger values are better.
    pub fn higher_is_better(self) -> bool {
        !matches!(
            self,
            Self::LogLoss
                | Self::Rmse
                | Self::Rmsle
                | Self::Mae
                | Self::MedAe
                | Self::Smape
                | Self::Mcrmse
        )
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One data-modelling task, with its CSV paths resolved against a data root.
#[derive(Debug, Clone, PartialEq)]
pub struct TabularTask {
    /// The task id (the Kaggle competition slug).
    pub id: String,
    /// The task kind: the cleaned prompt's `task_type`, checked against its metric.
    pub kind: TaskKind,
    /// The metadata's `data_type` (classification or regression). It is wrong
    /// for some DSBench tasks (string multi-class targets marked regression);
    /// kept for reference only, see [`TabularTask::metadata_disagrees`].
    pub metadata_kind: TaskKind,
    /// The official metric.
    pub metric: Metric,
    /// The target column(s); most tasks have one.
    pub target_columns: Vec<String>,
    /// The id column shared by test.csv, the answer file and submissions.
    pub id_column: String,
    /// The cleaned task text the agents see.
    pub cleaned_prompt: String,
    /// The raw Kaggle text (for the coach).
    pub raw_prompt: String,
    /// The competition URL, where given.
    pub url: Option<String>,
    /// The training CSV.
    pub train_csv: PathBuf,
    /// The test CSV (features only).
    pub test_csv: PathBuf,
    /// The answer CSV: `<answer_dir>/test_answer.csv`.
    pub answer_csv: PathBuf,
}

impl TabularTask {
    /// The single target column, or `None` for multi-target tasks.
    pub fn target_column(&self) -> Option<&str> {
        match self.target_columns.as_slice() {
            [one] => Some(one),
            _ => None,
        }
    }

    /// Whether the metadata's `data_type` differs from [`TabularTask::kind`].
    pub fn metadata_disagrees(&self) -> bool {
        self.kind != self.metadata_kind
    }

    /// Checks that the train, test and answer files exist; the error lists
    /// every missing path.
    pub fn check_files(&self) -> Result<(), TabularError> {
        let paths: Vec<PathBuf> = [&self.train_csv, &self.test_csv, &self.answer_csv]
            .into_iter()
            .filter(|p| !p.is_file())
            .cloned()
            .collect();
        if paths.is_empty() {
            Ok(())
        } else {
            Err(TabularError::MissingFiles {
                task: self.id.clone(),
                paths,
            })
        }
    }
}

/// A task-list entry that could not become a [`TabularTask`] for a reason
/// that does not make the whole file invalid.
#[derive(Debug, Clone, PartialEq)]
pub struct SkippedTask {
    /// The task id.
    pub id: String,
    /// The metadata's `data_type`.
    pub metadata_kind: TaskKind,
    /// Why it was skipped.
    pub reason: String,
}

/// The result of [`load_tasks`]: the tasks in file order and those skipped.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedTasks {
    /// Loaded tasks, in task-list order.
    pub tasks: Vec<TabularTask>,
    /// Entries skipped because the cleaned-prompt file has no entry for them
    /// (`liverpool-ion-switching` in the DSBench training list).
    pub skipped: Vec<SkippedTask>,
}

#[derive(Deserialize)]
struct RawEntry {
    prompt: String,
    metadata: RawMeta,
}

#[derive(Deserialize)]
struct RawMeta {
    task_id: String,
    task_type: String,
    data_type: String,
    train_file: String,
    test_file: String,
    answer_dir: String,
    #[serde(default)]
    url: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
struct RawCleaned {
    cleaned_prompt: String,
    metric: String,
    task_type: String,
    target_column: OneOrMany,
    id_column: String,
}

/// Loads the tasks of a JSON-lines task list, joined with the cleaned-prompt
/// file, resolving CSV paths against `data_root`.
///
/// Rules:
/// - the metadata `task_type` must be `data_modeling`;
/// - the kind is the cleaned prompt's `task_type`, which must agree with the
///   kind of its `metric` (e.g. `accuracy` is classification) or the load
///   fails; the metadata's `data_type` is kept as
///   [`TabularTask::metadata_kind`] but does not decide (it marks some string
///   multi-class targets as regression);
/// - an unknown metric or task type is an error naming the task and value;
/// - an entry with no cleaned prompt is returned in [`LoadedTasks::skipped`];
/// - a metadata path is joined to `data_root` after dropping a leading `./`;
///   the answer file is `<answer_dir>/test_answer.csv`.
pub fn load_tasks(
    jsonl: &Path,
    cleaned: &Path,
    data_root: &Path,
) -> Result<LoadedTasks, TabularError> {
    let cleaned_map = read_cleaned(cleaned)?;
    let text = read_text(jsonl)?;
    let mut seen = HashSet::new();
    let mut out = LoadedTasks {
        tasks: Vec::new(),
        skipped: Vec::new(),
    };
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let raw: RawEntry = serde_json::from_str(line).map_err(|e| TabularError::Json {
            path: jsonl.to_path_buf(),
            line: index + 1,
            message: e.to_string(),
        })?;
        let task = raw.metadata.task_id.clone();
        if !seen.insert(task.clone()) {
            return Err(TabularError::DuplicateTask {
                path: jsonl.to_path_buf(),
                task,
            });
        }
        let metadata_kind = metadata_kind(&raw.metadata)?;
        let Some(c) = cleaned_map.get(&task) else {
            out.skipped.push(SkippedTask {
                id: task,
                metadata_kind,
                reason: format!("no entry in `{}`", cleaned.display()),
            });
            continue;
        };
        out.tasks
            .push(joined_task(raw, metadata_kind, c, data_root)?);
    }
    Ok(out)
}

/// Reads the cleaned-prompt file: task id to its cleaned entry.
fn read_cleaned(cleaned: &Path) -> Result<BTreeMap<String, RawCleaned>, TabularError> {
    let cleaned_text = read_text(cleaned)?;
    serde_json::from_str(&cleaned_text).map_err(|e| TabularError::Json {
        path: cleaned.to_path_buf(),
        line: e.line(),
        message: e.to_string(),
    })
}

/// Checks a task-list entry's metadata (`task_type` must be `data_modeling`)
/// and returns its `data_type` (classification or regression).
fn metadata_kind(meta: &RawMeta) -> Result<TaskKind, TabularError> {
    if meta.task_type != "data_modeling" {
        return Err(TabularError::UnknownTaskType {
            task: meta.task_id.clone(),
            field: "metadata task_type",
            value: meta.task_type.clone(),
        });
    }
    match TaskKind::parse(&meta.data_type) {
        Some(k @ (TaskKind::Classification | TaskKind::Regression)) => Ok(k),
        _ => Err(TabularError::UnknownTaskType {
            task: meta.task_id.clone(),
            field: "metadata data_type",
            value: meta.data_type.clone(),
        }),
    }
}

/// The task of a task-list entry joined with its cleaned entry `c`: the
/// metric and kind come from `c` and must agree; paths are resolved against
/// `data_root`.
fn joined_task(
    raw: RawEntry,
    metadata_kind: TaskKind,
    c: &RawCleaned,
    data_root: &Path,
) -> Result<TabularTask, TabularError> {
    let meta = raw.metadata;
    let task = meta.task_id;
    let metric = Metric::parse(&c.metric).ok_or_else(|| TabularError::UnknownMetric {
        task: task.clone(),
        value: c.metric.clone(),
    })?;
    let kind = TaskKind::parse(&c.task_type).ok_or_else(|| TabularError::UnknownTaskType {
        task: task.clone(),
        field: "cleaned task_type",
        value: c.task_type.clone(),
    })?;
    if metric.kind() != kind {
        return Err(TabularError::KindConflict {
            task,
            task_type: c.task_type.clone(),
            metric: c.metric.clone(),
        });
    }
    let target_columns = match &c.target_column {
        OneOrMany::One(s) => vec![s.clone()],
        OneOrMany::Many(v) => v.clone(),
    };
    Ok(TabularTask {
        id: task,
        kind,
        metadata_kind,
        metric,
        target_columns,
        id_column: c.id_column.clone(),
        cleaned_prompt: c.cleaned_prompt.clone(),
        raw_prompt: raw.prompt,
        url: meta.url,
        train_csv: resolve(data_root, &meta.train_file),
        test_csv: resolve(data_root, &meta.test_file),
        answer_csv: resolve(data_root, &meta.answer_dir).join("test_answer.csv"),
    })
}

/// Joins a metadata path to the data root, dropping `.` components.
fn resolve(root: &Path, rel: &str) -> PathBuf {
    let mut out = root.to_path_buf();
    for comp in Path::new(rel).components() {
        match comp {
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn read_text(path: &Path) -> Result<String, TabularError> {
    std::fs::read_to_string(path).map_err(|source| TabularError::Io {
        path: path.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_drops_leading_dot() {
        assert_eq!(
            resolve(Path::new("/r"), "./data/x/train.csv"),
            PathBuf::from("/r/data/x/train.csv")
        );
    }

    #[test]
    fn metric_names_round_trip() {
        for name in ["accuracy", "roc_auc", "rmsle", "qwk", "jaccard", "map_at_3"] {
            assert_eq!(Metric::parse(name).unwrap().name(), name);
        }
        assert_eq!(
            Metric::parse("quadratic_weighted_kappa"),
            Some(Metric::QuadraticWeightedKappa)
        );
        assert_eq!(Metric::parse("auc"), None);
        assert!(!Metric::Rmse.higher_is_better());
        assert!(Metric::RocAuc.higher_is_better());
    }
}
