//! A seeded generator of tabular tasks in the DSBench layout, with known
//! achievable scores.
//!
//! [`generate_task`] writes, under a directory `dir`:
//! - `dir/<task>/train.csv`: `row_id`, features, `target`;
//! - `dir/<task>/test.csv`: `row_id` and features;
//! - `dir/<task>/sample_submission.csv`: `row_id` and a constant `target`;
//! - `dir/<task>/prompt.txt`: the cleaned task text;
//! - `dir/answers/<task>/test_answer.csv`: `row_id`, `target`.
//!
//! [`write_index`] adds a task list and cleaned-prompt file so that
//! [`super::load_tasks`] loads generated suites like DSBench.
//!
//! Features: `f0..f{n-1}` standard normal (written with 4 decimals), a
//! categorical `color` (one of [`CATEGORIES`]) with an effect on the target,
//! and a distractor `aux` (weight 0) with about 5% missing (empty) values, so
//! that preprocessing matters but the optimum stays exact. Ids are distinct
//! random integers in `100000..1000000`, so rows are not in id order.
//!
//! The target comes from a [`LinearModel`] (drawn from the seed):
//! - regression: `y = b + w·x + e[color] + noise * N(0, 1)`; the Bayes-optimal
//!   RMSE is `noise`, reached by the noiseless model;
//! - classification with `K` classes: the clean label is
//!   `argmax_k (b_k + w_k·x + e_k[color])`, then with probability `noise` it is
//!   replaced by a uniformly drawn other class; the Bayes-optimal accuracy is
//!   `1 - noise` (needs `noise < (K - 1) / K`), reached by the noiseless model.
//!
//! Generated tasks use accuracy (classification) or RMSE (regression) as
//! their metric; [`GeneratedTask::optimal_score`] is in that metric's units.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mappa_core::fs::write_atomic;
use mappa_core::{RngStream, SeedTree};

use super::tasks::{Metric, TabularTask, TaskKind};
use super::TabularError;

/// The levels of the categorical feature `color`.
pub const CATEGORIES: [&str; 4] = ["red", "green", "blue", "yellow"];

/// Probability that a value of the distractor `aux` is left empty.
pub const AUX_MISSING_RATE: f64 = 0.05;

/// What a generated task asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecKind {
    /// Two labels, `0` and `1` (positive `1`).
    Binary,
    /// `classes` (3 to 26) string labels `class_a`, `class_b`, ...
    Multiclass {
        /// Number of classes.
        classes: usize,
    },
    /// A real-valued target.
    Regression,
}

/// The shape of a generated task.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSpec {
    /// Task id (also the directory name).
    pub id: String,
    /// Classification or regression.
    pub kind: SpecKind,
    /// Training rows (at least 1).
    pub n_train: usize,
    /// Test rows (at least 1).
    pub n_test: usize,
    /// Numeric features with non-zero weight (at least 1).
    pub n_features: usize,
    /// Regression: noise standard deviation (>= 0). Classification: label
    /// noise rate in `[0, (K - 1) / K)`.
    pub noise: f64,
}

/// The model that generated a task's targets (without noise).
#[derive(Debug, Clone, PartialEq)]
pub struct LinearModel {
    /// One bias per output (1 for regression, `K` for classification).
    pub bias: Vec<f64>,
    /// Per output, one weight per numeric feature.
    pub weights: Vec<Vec<f64>>,
    /// Per output, one effect per level of [`CATEGORIES`].
    pub category_effects: Vec<Vec<f64>>,
    /// Class labels (classification); empty for regression.
    pub labels: Vec<String>,
}

impl LinearModel {
    /// The outputs for numeric features `x` and a `color` level; `None` for an
    /// unknown level or a wrong number of features.
    pub fn outputs(&self, x: &[f64], color: &str) -> Option<Vec<f64>> {
        let c = CATEGORIES.iter().position(|l| *l == color)?;
        if x.len() != self.weights.first().map_or(0, Vec::len) {
            return None;
        }
        Some(
            (0..self.bias.len())
                .map(|k| {
                    let dot: f64 = self.weights[k].iter().zip(x).map(|(w, v)| w * v).sum();
                    self.bias[k] + dot + self.category_effects[k][c]
                })
                .collect(),
        )
    }

    /// The noiseless prediction as written in a submission: the value
    /// (regression) or the arg-max label (classification).
    pub fn predict(&self, x: &[f64], color: &str) -> Option<String> {
        let out = self.outputs(x, color)?;
        if self.labels.is_empty() {
            return Some(format!("{}", out[0]));
        }
        let best = (0..out.len()).max_by(|&a, &b| out[a].total_cmp(&out[b]))?;
        Some(self.labels[best].clone())
    }
}

/// A generated task with its generating model and achievable score.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedTask {
    /// The task, with paths into the generated directory.
    pub task: TabularTask,
    /// The spec it was generated from.
    pub spec: TaskSpec,
    /// The model without noise (the Bayes-optimal predictor).
    pub model: LinearModel,
    /// The expected score of the optimal predictor in the task's metric:
    /// `noise` (RMSE) or `1 - noise` (accuracy).
    pub optimal_score: f64,
}

fn invalid(spec: &TaskSpec, reason: impl Into<String>) -> TabularError {
    TabularError::InvalidSpec {
        task: spec.id.clone(),
        reason: reason.into(),
    }
}

fn validate(spec: &TaskSpec) -> Result<usize, TabularError> {
    if spec.id.is_empty()
        || !spec
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(invalid(spec, "id must be non-empty [A-Za-z0-9_-]"));
    }
    if spec.n_train == 0 || spec.n_test == 0 || spec.n_features == 0 {
        return Err(invalid(spec, "n_train, n_test and n_features must be >= 1"));
    }
    if spec.n_train + spec.n_test > 400_000 {
        return Err(invalid(spec, "at most 400000 rows"));
    }
    if !spec.noise.is_finite() || spec.noise < 0.0 {
        return Err(invalid(spec, "noise must be finite and >= 0"));
    }
    let classes = match spec.kind {
        SpecKind::Regression => return Ok(0),
        SpecKind::Binary => 2,
        SpecKind::Multiclass { classes } if (3..=26).contains(&classes) => classes,
        SpecKind::Multiclass { classes } => {
            return Err(invalid(spec, format!("{classes} classes; need 3 to 26")))
        }
    };
    let limit = (classes - 1) as f64 / classes as f64;
    if spec.noise >= limit {
        return Err(invalid(
            spec,
            format!("label noise {} must be below {limit}", spec.noise),
        ));
    }
    Ok(classes)
}

/// A number written with 4 decimals and read back, so generated values equal
/// what a reader of the CSV gets.
fn rounded(x: f64, text: &mut String) -> f64 {
    *text = format!("{x:.4}");
    text.parse().unwrap_or(x)
}

/// Generates one task under `dir` (see the module docs for the layout and the
/// model); deterministic in `(spec, seed)`.
pub fn generate_task(
    dir: &Path,
    spec: &TaskSpec,
    seed: u64,
) -> Result<GeneratedTask, TabularError> {
    let classes = validate(spec)?;
    let tree = SeedTree::new(seed);
    let stream = |part: &str| tree.stream(&format!("tabular/{}/{part}", spec.id));
    let model = draw_model(spec, classes, &mut stream("model"));
    let ids = draw_ids(spec, &mut stream("ids"));
    let mut row_rng = stream("rows");
    let mut noise_rng = stream("noise");
    let tables = write_rows(spec, classes, &model, &ids, &mut row_rng, &mut noise_rng);
    let (task, prompt, optimal_score) = describe_task(dir, spec, &model);
    write_task_files(dir, spec, &task, &prompt, &tables)?;
    Ok(GeneratedTask {
        task,
        spec: spec.clone(),
        model,
        optimal_score,
    })
}

/// Draws the generating model from the `model` stream: biases, then per
/// output the feature weights, then per output the category effects (this
/// order is part of the seed's meaning).
fn draw_model(spec: &TaskSpec, classes: usize, model_rng: &mut RngStream) -> LinearModel {
    let outputs = classes.max(1);
    let scale = if classes == 0 { 1.0 } else { 1.5 };
    let mut draw =
        |n: usize, s: f64| -> Vec<f64> { (0..n).map(|_| s * model_rng.normal()).collect() };
    let bias = draw(outputs, if classes == 0 { 2.0 } else { 0.5 });
    let weights = (0..outputs).map(|_| draw(spec.n_features, scale)).collect();
    let category_effects = (0..outputs)
        .map(|_| draw(CATEGORIES.len(), scale))
        .collect();
    let labels: Vec<String> = match spec.kind {
        SpecKind::Regression => Vec::new(),
        SpecKind::Binary => vec!["0".to_string(), "1".to_string()],
        SpecKind::Multiclass { classes } => (0..classes)
            .map(|k| format!("class_{}", char::from(b'a' + k as u8)))
            .collect(),
    };
    LinearModel {
        bias,
        weights,
        category_effects,
        labels,
    }
}

/// Distinct ids in `100000..1000000`, in draw order (so not sorted), one per
/// train and test row.
fn draw_ids(spec: &TaskSpec, id_rng: &mut RngStream) -> Vec<u64> {
    let n = spec.n_train + spec.n_test;
    let mut seen = HashSet::with_capacity(n);
    let mut ids = Vec::with_capacity(n);
    while ids.len() < n {
        let id = 100_000 + id_rng.below(900_000);
        if seen.insert(id) {
            ids.push(id);
        }
    }
    ids
}

/// The text of the four generated CSV files.
struct Tables {
    /// `train.csv`: `row_id`, features, `target`.
    train: String,
    /// `test.csv`: `row_id` and features.
    test: String,
    /// `sample_submission.csv`: `row_id` and a constant `target`.
    sample: String,
    /// `test_answer.csv`: `row_id`, `target`.
    answer: String,
}

/// Draws every row (the first `n_train` ids go to training, the rest to the
/// test set) and renders the four CSV files.
fn write_rows(
    spec: &TaskSpec,
    classes: usize,
    model: &LinearModel,
    ids: &[u64],
    row_rng: &mut RngStream,
    noise_rng: &mut RngStream,
) -> Tables {
    let mut header = String::from("row_id");
    for j in 0..spec.n_features {
        write!(header, ",f{j}").expect("writing to a String");
    }
    header.push_str(",color,aux");
    let mut t = Tables {
        train: format!("{header},target\n"),
        test: format!("{header}\n"),
        sample: String::from("row_id,target\n"),
        answer: String::from("row_id,target\n"),
    };
    let placeholder = match spec.kind {
        SpecKind::Regression => "0.0".to_string(),
        _ => model.labels[0].clone(),
    };
    let mut cell = String::new();
    for (i, id) in ids.iter().enumerate() {
        let (line, x, color) = draw_features(spec, *id, row_rng, &mut cell);
        let clean = model
            .outputs(&x, color)
            .expect("generated features fit the model");
        let target = draw_target(spec, classes, model, &clean, noise_rng);
        if i < spec.n_train {
            writeln!(t.train, "{line},{target}").expect("writing to a String");
        } else {
            writeln!(t.test, "{line}").expect("writing to a String");
            writeln!(t.sample, "{id},{placeholder}").expect("writing to a String");
            writeln!(t.answer, "{id},{target}").expect("writing to a String");
        }
    }
    t
}

/// Draws one row's features from the `rows` stream (numeric features, then
/// `color`, then `aux` and whether it is missing). Returns the CSV line
/// without the target, the numeric features as written, and the color.
fn draw_features(
    spec: &TaskSpec,
    id: u64,
    row_rng: &mut RngStream,
    cell: &mut String,
) -> (String, Vec<f64>, &'static str) {
    let mut line = id.to_string();
    let mut x = Vec::with_capacity(spec.n_features);
    for _ in 0..spec.n_features {
        x.push(rounded(row_rng.normal(), cell));
        line.push(',');
        line.push_str(cell);
    }
    let color = CATEGORIES[row_rng.below(CATEGORIES.len() as u64) as usize];
    let aux = row_rng.normal();
    let aux_missing = row_rng.uniform() < AUX_MISSING_RATE;
    line.push(',');
    line.push_str(color);
    line.push(',');
    if !aux_missing {
        rounded(aux, cell);
        line.push_str(cell);
    }
    (line, x, color)
}

/// One row's target as written, from the model's noiseless outputs `clean`
/// and the `noise` stream: the value plus Gaussian noise (regression), or the
/// arg-max label, replaced with probability `noise` by another class drawn
/// uniformly (classification; both draws are made whether or not it flips).
fn draw_target(
    spec: &TaskSpec,
    classes: usize,
    model: &LinearModel,
    clean: &[f64],
    noise_rng: &mut RngStream,
) -> String {
    if classes == 0 {
        return format!("{:.6}", clean[0] + spec.noise * noise_rng.normal());
    }
    let best = (0..classes)
        .max_by(|&a, &b| clean[a].total_cmp(&clean[b]))
        .unwrap_or(0);
    let flip = noise_rng.uniform() < spec.noise;
    let other = noise_rng.below(classes as u64 - 1) as usize;
    let label = if flip {
        other + usize::from(other >= best)
    } else {
        best
    };
    model.labels[label].clone()
}

/// The task record for `spec` under `dir`, its prompt, and the optimal score
/// in its metric.
fn describe_task(dir: &Path, spec: &TaskSpec, model: &LinearModel) -> (TabularTask, String, f64) {
    let (kind, metric, optimal_score) = match spec.kind {
        SpecKind::Regression => (TaskKind::Regression, Metric::Rmse, spec.noise),
        _ => (TaskKind::Classification, Metric::Accuracy, 1.0 - spec.noise),
    };
    let task_dir = dir.join(&spec.id);
    let answer_dir = dir.join("answers").join(&spec.id);
    let prompt = cleaned_prompt(spec, model, metric);
    let task = TabularTask {
        id: spec.id.clone(),
        kind,
        metadata_kind: kind,
        metric,
        target_columns: vec!["target".to_string()],
        id_column: "row_id".to_string(),
        cleaned_prompt: prompt.clone(),
        raw_prompt: prompt.clone(),
        url: None,
        train_csv: task_dir.join("train.csv"),
        test_csv: task_dir.join("test.csv"),
        answer_csv: answer_dir.join("test_answer.csv"),
    };
    (task, prompt, optimal_score)
}

/// Creates the task and answer directories under `dir` and writes the task's
/// files.
fn write_task_files(
    dir: &Path,
    spec: &TaskSpec,
    task: &TabularTask,
    prompt: &str,
    tables: &Tables,
) -> Result<(), TabularError> {
    let task_dir = dir.join(&spec.id);
    create_dir(&task_dir)?;
    create_dir(&dir.join("answers").join(&spec.id))?;
    write_atomic(&task.train_csv, tables.train.as_bytes())?;
    write_atomic(&task.test_csv, tables.test.as_bytes())?;
    write_atomic(
        &task_dir.join("sample_submission.csv"),
        tables.sample.as_bytes(),
    )?;
    write_atomic(&task_dir.join("prompt.txt"), prompt.as_bytes())?;
    write_atomic(&task.answer_csv, tables.answer.as_bytes())?;
    Ok(())
}

fn create_dir(path: &Path) -> Result<(), TabularError> {
    std::fs::create_dir_all(path).map_err(|source| {
        TabularError::Write(mappa_core::CoreError::io(
            "cannot create directory",
            path,
            source,
        ))
    })
}

fn cleaned_prompt(spec: &TaskSpec, model: &LinearModel, metric: Metric) -> String {
    let what = match spec.kind {
        SpecKind::Regression => "Predict the numeric `target` of each row.".to_string(),
        _ => format!(
            "Predict the class `target` of each row (one of: {}).",
            model.labels.join(", ")
        ),
    };
    let goal = if metric.higher_is_better() {
        "higher is better"
    } else {
        "lower is better"
    };
    format!(
        "Task: {what}\n\nEvaluation: {metric} - {goal}.\n\nSubmission Format:\nrow_id,target\n\
         (one row per row_id of test.csv, in any order)\n\nDataset:\n\
         - row_id: row identifier (not a feature)\n\
         - f0..f{last}: numeric features\n\
         - color: categorical feature\n\
         - aux: numeric feature with missing values\n\
         - target: the value to predict (TARGET)\n\nFiles:\n\
         - train.csv: {n_train} rows with target\n\
         - test.csv: {n_test} rows without target\n",
        last = spec.n_features - 1,
        n_train = spec.n_train,
        n_test = spec.n_test,
    )
}

/// Writes `dir/tasks.jsonl` (DSBench task-list format, paths relative to
/// `dir`) and `dir/cleaned_prompts.json` for tasks generated under `dir`, so
/// that `load_tasks(dir/tasks.jsonl, dir/cleaned_prompts.json, dir)` returns
/// them. Returns the two paths.
pub fn write_index(dir: &Path, tasks: &[TabularTask]) -> Result<(PathBuf, PathBuf), TabularError> {
    let rel = |task: &TabularTask, p: &Path| -> Result<String, TabularError> {
        let r = p.strip_prefix(dir).map_err(|_| TabularError::InvalidSpec {
            task: task.id.clone(),
            reason: format!("`{}` is not under `{}`", p.display(), dir.display()),
        })?;
        Ok(format!("./{}", r.display()))
    };
    let mut lines = String::new();
    let mut cleaned = serde_json::Map::new();
    for t in tasks {
        let answer_dir = t.answer_csv.parent().unwrap_or(dir);
        let entry = serde_json::json!({
            "prompt": t.raw_prompt,
            "answer": null,
            "metadata": {
                "task_id": t.id,
                "task_type": "data_modeling",
                "data_type": t.metadata_kind.name(),
                "train_file": rel(t, &t.train_csv)?,
                "test_file": rel(t, &t.test_csv)?,
                "answer_dir": rel(t, answer_dir)?,
                "url": t.url,
            }
        });
        lines.push_str(&entry.to_string());
        lines.push('\n');
        cleaned.insert(
            t.id.clone(),
            serde_json::json!({
                "cleaned_prompt": t.cleaned_prompt,
                "metric": t.metric.name(),
                "task_type": t.kind.name(),
                "target_column": t.target_columns,
                "id_column": t.id_column,
            }),
        );
    }
    let jsonl = dir.join("tasks.jsonl");
    let cleaned_path = dir.join("cleaned_prompts.json");
    write_atomic(&jsonl, lines.as_bytes())?;
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(cleaned))
        .expect("JSON values serialise");
    write_atomic(&cleaned_path, text.as_bytes())?;
    Ok((jsonl, cleaned_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_specs() {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = TaskSpec {
            id: "t".into(),
            kind: SpecKind::Binary,
            n_train: 10,
            n_test: 10,
            n_features: 2,
            noise: 0.5,
        };
        let e = generate_task(dir.path(), &spec, 1).unwrap_err().to_string();
        assert!(e.contains("label noise"), "{e}");
        spec.kind = SpecKind::Multiclass { classes: 2 };
        spec.noise = 0.1;
        assert!(generate_task(dir.path(), &spec, 1).is_err());
        spec.kind = SpecKind::Regression;
        spec.id = "../x".into();
        assert!(generate_task(dir.path(), &spec, 1).is_err());
    }

    #[test]
    fn model_predicts_argmax() {
        let m = LinearModel {
            bias: vec![0.0, 1.0],
            weights: vec![vec![1.0], vec![0.0]],
            category_effects: vec![vec![0.0; 4], vec![0.0; 4]],
            labels: vec!["0".into(), "1".into()],
        };
        assert_eq!(m.predict(&[2.0], "red").as_deref(), Some("0"));
        assert_eq!(m.predict(&[0.5], "red").as_deref(), Some("1"));
        assert_eq!(m.predict(&[0.5], "purple"), None);
    }

    /// Pins the generated bytes (computed before `generate_task` was split
    /// into steps): the same seed must keep producing identical files, so any
    /// change to the order of random draws or to the formatting shows here.
    #[test]
    fn generated_bytes_are_pinned() {
        use mappa_core::hash::sha256_hex;
        let specs = [
            (SpecKind::Binary, 0.1, 11),
            (SpecKind::Multiclass { classes: 5 }, 0.3, 12),
            (SpecKind::Regression, 0.7, 13),
        ];
        let dir = tempfile::tempdir().unwrap();
        let mut got = Vec::new();
        for (i, (kind, noise, seed)) in specs.into_iter().enumerate() {
            let spec = TaskSpec {
                id: format!("pin-{i}"),
                kind,
                n_train: 57,
                n_test: 23,
                n_features: 3,
                noise,
            };
            let g = generate_task(dir.path(), &spec, seed).unwrap();
            let task_dir = dir.path().join(&spec.id);
            let files = [
                g.task.train_csv.clone(),
                g.task.test_csv.clone(),
                task_dir.join("sample_submission.csv"),
                task_dir.join("prompt.txt"),
                g.task.answer_csv.clone(),
            ];
            for f in files {
                got.push(sha256_hex(&std::fs::read(f).unwrap()));
            }
            got.push(sha256_hex(format!("{:?}", g.model).as_bytes()));
        }
        // Per task: train.csv, test.csv, sample_submission.csv, prompt.txt,
        // test_answer.csv, the model's Debug text.
        let want: [&str; 18] = [
            "305efdc2216e4ecfe83fc51d8fb9fb54baffa8d38bdd85a06866fc37e1caccec",
            "10b627d28d1097157f098283980a789547234192a7db65d5e52521e13dd2950d",
            "f29bcecc64e1970601fa40c242d5ab252d241b748ffc70fd2595adf5071e8b35",
            "b01b9456d33b8e1f4228bdaac49e0903c68c30e186cb61d81dcd1b7da14e01ed",
            "f1fae40b184a174137a8f4aa7834171f3f47b8ef015c9034a110a4f39dbc755b",
            "a5468108c90854264cd89bc74334a5f35456572156a364150f35297ef5ef190f",
            "bf958594f2d175d621bcbd9abfec584c3efaabd722ef49d139fde4e7c40fdb16",
            "d422d219ecc6fc4ccb49087fa6a5b6e30b62ba2599fc3f3b101df8080d4dfc52",
            "3b0c5ed336c4af312fd2b7f06aedb2549824d49055bf38dea93c97e30ed7f415",
            "b8653b1375b97d6e54d724ec4cc361781bf2e37b0032f6a60cfec1708156319b",
            "d9a0455836a6523337944054720e32c48ca1fb24973eddbcb66fd55ee34f067f",
            "5ee16648db6ff2fa9e2584292f815ceafb7eec9304cdf305a6ba630a78c6ab99",
            "24788036779c23b97f1c856625090ca8626834a085dd47cb420e8a71185a07f5",
            "2c98490923f199e66c2ff577cf7884f88c61bd2e15ff1a1f1efcdfeb89aab04c",
            "b0d7ea7aac6032f96e3c7ca76c8b647b8f3329c883de158d94e2a3b000cf63e8",
            "d99dfee8883f42153eec22741073f39e866a4af8048a588d0677a6a5c846954b",
            "0c977a3d0999bd9f5dfcc106a15643f55a129c97d0b0c4dea4ec84cb11e28dcc",
            "fed457f9e1b6aaed4af44a2a05b119d0ee39a02b142a9032dec605523fc73bbd",
        ];
        assert_eq!(got, want);
    }
}
