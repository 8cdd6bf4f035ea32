//! DSBench data-modelling (Kaggle-style tabular) tasks.
//!
//! - [`tasks`]: loading the DSBench task files (a JSON-lines task list plus
//!   the cleaned-prompt object) and resolving their CSV paths against a data
//!   root laid out as the metadata paths.
//! - [`metrics`]: scoring a `submission.csv` against the answer file,
//!   **joined by id** (never by row order), and averaging outcomes into
//!   success rates and "fair" metrics that count failures at fallbacks.
//! - [`generate`]: a seeded generator of tasks in the same layout, with known
//!   achievable scores, for tests and CPU-scale experiments.
//!
//! The task type comes from the task files, never from the target values
//! (docs/METHOD.md section 8, pitfall 6); see [`tasks::load_tasks`] for how the metadata's
//! `data_type` and the cleaned prompt's `task_type` and `metric` are combined.

pub mod generate;
pub mod metrics;
pub mod tasks;

use std::path::PathBuf;

pub use generate::{generate_task, write_index, GeneratedTask, LinearModel, SpecKind, TaskSpec};
pub use metrics::{
    evaluate, score_against, score_submission, AnswerKey, FairSummary, Outcome, Scores,
};
pub use tasks::{load_tasks, LoadedTasks, Metric, SkippedTask, TabularTask, TaskKind};

/// Errors raised while loading, scoring or generating tabular tasks. Every
/// variant names the file (and where relevant the task, line, column or
/// value) it concerns.
#[derive(Debug, thiserror::Error)]
pub enum TabularError {
    /// A file could not be read.
    #[error("`{}`: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("cannot write: {0}")]
    Write(#[from] mappa_core::CoreError),
    /// A task file is not valid JSON or lacks a field.
    #[error("`{}`: line {line}: {message}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// 1-based line (1 for the single-object cleaned-prompt file).
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The same task id appears twice in a task list.
    #[error("`{}`: task `{task}` appears more than once", path.display())]
    DuplicateTask {
        /// The task list.
        path: PathBuf,
        /// The repeated task id.
        task: String,
    },
    /// The cleaned-prompt `metric` string is not one this module knows.
    #[error("task `{task}`: unknown metric `{value}`")]
    UnknownMetric {
        /// The task id.
        task: String,
        /// The metric string as found.
        value: String,
    },
    /// A task type string (`data_type`, `task_type`) is not known.
    #[error("task `{task}`: unknown {field} `{value}`")]
    UnknownTaskType {
        /// The task id.
        task: String,
        /// Which field held it.
        field: &'static str,
        /// The value as found.
        value: String,
    },
    /// The cleaned prompt's task type contradicts its metric.
    #[error("task `{task}`: task_type `{task_type}` contradicts metric `{metric}`")]
    KindConflict {
        /// The task id.
        task: String,
        /// The cleaned prompt's task type.
        task_type: String,
        /// The metric name.
        metric: String,
    },
    /// Files a task refers to do not exist.
    #[error("task `{task}`: missing files: {}", list_paths(paths))]
    MissingFiles {
        /// The task id.
        task: String,
        /// The missing paths.
        paths: Vec<PathBuf>,
    },
    /// A CSV file is malformed (ragged rows, bad quoting, invalid UTF-8, no header).
    #[error("`{}`: malformed CSV: {message}", path.display())]
    Csv {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A required column is absent from a CSV header.
    #[error("`{}`: missing column `{column}` (columns: {})", path.display(), available.join(", "))]
    MissingColumn {
        /// The file.
        path: PathBuf,
        /// The column looked for.
        column: String,
        /// The header's columns.
        available: Vec<String>,
    },
    /// An id appears on more than one row of a CSV file.
    #[error("`{}`: duplicate id `{id}` in column `{column}` (lines {first_line} and {line})", path.display())]
    DuplicateId {
        /// The file.
        path: PathBuf,
        /// The id column.
        column: String,
        /// The repeated id.
        id: String,
        /// Line of the first occurrence.
        first_line: u64,
        /// Line of the repeat.
        line: u64,
    },
    /// The submission lacks ids that the answer file has.
    #[error("`{}`: {count} answer ids missing from the submission, e.g. {}", path.display(), examples.join(", "))]
    MissingIds {
        /// The submission file.
        path: PathBuf,
        /// How many answer ids are missing.
        count: usize,
        /// Up to five of them, in answer-file order.
        examples: Vec<String>,
    },
    /// A value that must be a finite number is not.
    #[error("`{}`: line {line}, column `{column}`: cannot parse `{value}` as a finite number", path.display())]
    UnparseableValue {
        /// The file.
        path: PathBuf,
        /// 1-based line in the file (the header is line 1).
        line: u64,
        /// The column.
        column: String,
        /// The value as written.
        value: String,
    },
    /// A negative value where the task's metric (RMSLE) forbids one.
    #[error("`{}`: line {line}, column `{column}`: negative value `{value}` under an RMSLE metric", path.display())]
    NegativeValue {
        /// The file.
        path: PathBuf,
        /// 1-based line in the file.
        line: u64,
        /// The column.
        column: String,
        /// The value as written.
        value: String,
    },
    /// The answer file has no rows.
    #[error("`{}`: no rows", path.display())]
    EmptyAnswer {
        /// The answer file.
        path: PathBuf,
    },
    /// The task cannot be scored by this module (e.g. several target columns).
    #[error("task `{task}`: cannot score: {reason}")]
    Unsupported {
        /// The task id.
        task: String,
        /// Why.
        reason: String,
    },
    /// A generator spec is invalid.
    #[error("task spec `{task}`: {reason}")]
    InvalidSpec {
        /// The spec's task id.
        task: String,
        /// What is wrong.
        reason: String,
    },
}

fn list_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("`{}`", p.display()))
        .collect::<Vec<_>>()
        .join(", ")
}
