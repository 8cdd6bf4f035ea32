//! Scoring submissions against answer files, joined by id.
//!
//! A submission is a CSV with the task's id column and a prediction column
//! named like the target (or, failing that, the first column other than the
//! id column). Rows are
//! matched to the answer file **by id**, never by row order (docs/METHOD.md section 8,
//! pitfall 3); extra submission ids are ignored and counted.
//!
//! Labels are compared after canonicalisation ([`canonical_label`]): numbers
//! are compared as numbers (`1.0` equals `1`) and `true`/`false` ignore case.
//!
//! Binary tasks (answer with two labels): the positive label is the one whose
//! canonical form is `1`, `True` or `yes` (any case); failing that, the larger
//! of two numeric labels; failing that, the label that sorts last. Predictions
//! are probabilities of the positive label when every one is a number in
//! [0, 1] and at least one is not itself an answer label; a probability
//! `>= 0.5` counts as the positive label for accuracy and F1. ROC-AUC uses the
//! probabilities, or the 0/1 indicator of predicting the positive label for
//! hard predictions (rank-based, ties averaged). Multi-class tasks get
//! accuracy and support-weighted F1.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use super::tasks::{Metric, TabularTask, TaskKind};
use super::TabularError;

/// The answer file of a task, read and checked: ids unique, values present.
#[derive(Debug, Clone, PartialEq)]
pub struct AnswerKey {
    /// The answer file.
    pub path: PathBuf,
    /// The task kind it was read for.
    pub kind: TaskKind,
    /// Ids in file order.
    pub ids: Vec<String>,
    /// Canonical labels (classification) or values as written (regression), in file order.
    pub values: Vec<String>,
    /// Parsed target values (regression only).
    pub numbers: Vec<f64>,
    /// Sorted distinct canonical labels (classification only).
    pub classes: Vec<String>,
}

impl AnswerKey {
    /// Reads a task's answer file.
    pub fn read(task: &TabularTask) -> Result<Self, TabularError> {
        let target = single_target(task)?;
        let table = read_table(&task.answer_csv)?;
        let id_col = table.column(&task.id_column)?;
        let t_col = table.column(target)?;
        let mut ids = Vec::with_capacity(table.rows.len());
        let mut values = Vec::with_capacity(table.rows.len());
        let mut numbers = Vec::new();
        let mut first: HashMap<String, u64> = HashMap::new();
        for (line, rec) in &table.rows {
            let id = canonical_id(&rec[id_col]);
            if let Some(&first_line) = first.get(&id) {
                return Err(TabularError::DuplicateId {
                    path: table.path.clone(),
                    column: task.id_column.clone(),
                    id,
                    first_line,
                    line: *line,
                });
            }
            first.insert(id.clone(), *line);
            let raw = &rec[t_col];
            if task.kind == TaskKind::Regression {
                numbers.push(parse_number(&table.path, *line, target, raw)?);
                values.push(raw.trim().to_string());
            } else {
                if raw.trim().is_empty() {
                    return Err(unparseable(&table.path, *line, target, raw));
                }
                values.push(canonical_label(raw));
            }
            ids.push(id);
        }
        if ids.is_empty() {
            return Err(TabularError::EmptyAnswer { path: table.path });
        }
        let classes = if task.kind == TaskKind::Classification {
            values
                .iter()
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect()
        } else {
            Vec::new()
        };
        Ok(Self {
            path: table.path,
            kind: task.kind,
            ids,
            values,
            numbers,
            classes,
        })
    }

    /// Number of distinct answer labels (classification), else `None`.
    pub fn n_classes(&self) -> Option<usize> {
        (self.kind == TaskKind::Classification).then_some(self.classes.len())
    }

    /// The positive label of a binary (at most two-label) answer, by the rule
    /// in the module docs; `None` for multi-class or regression answers.
    pub fn positive_label(&self) -> Option<&str> {
        if self.kind != TaskKind::Classification || self.classes.len() > 2 {
            return None;
        }
        let is_pos = |c: &str| c == "1" || c == "True" || c.eq_ignore_ascii_case("yes");
        if let Some(c) = self.classes.iter().find(|c| is_pos(c)) {
            return Some(c);
        }
        let nums: Option<Vec<f64>> = self.classes.iter().map(|c| c.parse().ok()).collect();
        if let Some(nums) = nums {
            let best = (0..nums.len()).max_by(|&a, &b| nums[a].total_cmp(&nums[b]))?;
            return Some(&self.classes[best]);
        }
        self.classes.last().map(String::as_str)
    }

    /// The range (max - min) of regression targets, else `None`.
    pub fn target_range(&self) -> Option<f64> {
        if self.numbers.is_empty() {
            return None;
        }
        let max = self.numbers.iter().copied().fold(f64::MIN, f64::max);
        let min = self.numbers.iter().copied().fold(f64::MAX, f64::min);
        Some(max - min)
    }
}

/// Scores of one submission. Classification fields are `Some` for
/// classification tasks, regression fields for regression tasks.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Scores {
    /// Rows scored (= answer rows).
    pub n_rows: usize,
    /// Submission rows whose id is not in the answer file (ignored).
    pub extra_ids: usize,
    /// Distinct answer labels (classification).
    pub n_classes: Option<usize>,
    /// The positive label (binary classification).
    pub positive_label: Option<String>,
    /// Whether predictions were read as probabilities (binary classification).
    pub probabilities: Option<bool>,
    /// Fraction of exactly matching labels.
    pub accuracy: Option<f64>,
    /// Binary F1 of the positive label, or support-weighted F1 (multi-class).
    pub f1: Option<f64>,
    /// ROC-AUC (binary with both labels present).
    pub roc_auc: Option<f64>,
    /// Root mean squared error.
    pub rmse: Option<f64>,
    /// Mean absolute error.
    pub mae: Option<f64>,
    /// Median absolute error.
    pub medae: Option<f64>,
    /// RMSE of `ln(1 + x)`; `None` when any value is negative.
    pub rmsle: Option<f64>,
    /// 100 * RMSE / (max - min of the answer's targets); `None` for a zero range.
    pub rmse_pct_range: Option<f64>,
    /// Coefficient of determination; `None` for constant answers.
    pub r2: Option<f64>,
    /// Symmetric MAPE in percent (0-200), with 0/0 terms counted as 0.
    pub smape: Option<f64>,
    /// The task's official metric, when it is one computed here (accuracy,
    /// f1, f1_micro, roc_auc, normalized_gini, rmse, rmsle, mae, medae,
    /// smape, r2).
    pub official: Option<f64>,
}

/// Scores `submission_csv` against the task's answer file.
pub fn score_submission(task: &TabularTask, submission_csv: &Path) -> Result<Scores, TabularError> {
    let key = AnswerKey::read(task)?;
    score_against(task, &key, submission_csv)
}

/// Scores a submission against an already-read answer key. Errors: a missing
/// id or prediction column, duplicate or missing ids, empty or (regression)
/// unparseable predictions, negative predictions under an RMSLE metric.
pub fn score_against(
    task: &TabularTask,
    key: &AnswerKey,
    submission_csv: &Path,
) -> Result<Scores, TabularError> {
    let target = single_target(task)?;
    let table = read_table(submission_csv)?;
    let id_col = table.column(&task.id_column)?;
    let pred_col = prediction_column(&table, target, id_col)?;
    let pred_name = table.headers[pred_col].clone();
    let by_id = predictions_by_id(task, &table, id_col, pred_col)?;
    let preds = predictions_in_key_order(key, &table.path, &pred_name, &by_id)?;
    let extra_ids = by_id.len() - key.ids.len();
    let mut s = Scores {
        n_rows: key.ids.len(),
        extra_ids,
        n_classes: None,
        positive_label: None,
        probabilities: None,
        accuracy: None,
        f1: None,
        roc_auc: None,
        rmse: None,
        mae: None,
        medae: None,
        rmsle: None,
        rmse_pct_range: None,
        r2: None,
        smape: None,
        official: None,
    };
    match task.kind {
        TaskKind::Classification => classify(key, &preds, &mut s),
        TaskKind::Regression => regress(task, key, &table.path, &pred_name, &preds, &mut s)?,
        TaskKind::Extraction => unreachable!("single_target rejects extraction tasks"),
    }
    s.official = official(task.metric, &s);
    Ok(s)
}

/// The submission's prediction column: the one named like the target, else
/// the first column other than the id column (when there are at least two),
/// else a missing-column error naming the target.
fn prediction_column(table: &Table, target: &str, id_col: usize) -> Result<usize, TabularError> {
    match table.headers.iter().position(|h| h == target) {
        Some(i) => Ok(i),
        None if table.headers.len() >= 2 => Ok(usize::from(id_col == 0)),
        None => table.column(target),
    }
}

/// The submission's (line, prediction) by canonical id; a repeated id is an
/// error naming both lines.
fn predictions_by_id(
    task: &TabularTask,
    table: &Table,
    id_col: usize,
    pred_col: usize,
) -> Result<HashMap<String, (u64, String)>, TabularError> {
    let mut by_id: HashMap<String, (u64, String)> = HashMap::new();
    for (line, rec) in &table.rows {
        let id = canonical_id(&rec[id_col]);
        if let Some((first_line, _)) = by_id.get(&id) {
            return Err(TabularError::DuplicateId {
                path: table.path.clone(),
                column: task.id_column.clone(),
                id,
                first_line: *first_line,
                line: *line,
            });
        }
        by_id.insert(id, (*line, rec[pred_col].to_string()));
    }
    Ok(by_id)
}

/// The (line, prediction) of every answer id, in answer-file order. Errors:
/// answer ids missing from the submission (counted, with up to 5 examples),
/// then the first empty prediction.
fn predictions_in_key_order<'a>(
    key: &AnswerKey,
    path: &Path,
    pred_name: &str,
    by_id: &'a HashMap<String, (u64, String)>,
) -> Result<Vec<(u64, &'a str)>, TabularError> {
    let missing: Vec<&String> = key
        .ids
        .iter()
        .filter(|id| !by_id.contains_key(*id))
        .collect();
    if !missing.is_empty() {
        return Err(TabularError::MissingIds {
            path: path.to_path_buf(),
            count: missing.len(),
            examples: missing.iter().take(5).map(|s| s.to_string()).collect(),
        });
    }
    let preds: Vec<(u64, &str)> = key
        .ids
        .iter()
        .map(|id| {
            let (line, v) = &by_id[id];
            (*line, v.as_str())
        })
        .collect();
    for (line, v) in &preds {
        if v.trim().is_empty() {
            return Err(unparseable(path, *line, pred_name, v));
        }
    }
    Ok(preds)
}

/// Fills the regression fields of `s`. Errors: an unparseable prediction, or
/// a negative one under an RMSLE metric (checked row by row, in order).
fn regress(
    task: &TabularTask,
    key: &AnswerKey,
    path: &Path,
    pred_name: &str,
    preds: &[(u64, &str)],
    s: &mut Scores,
) -> Result<(), TabularError> {
    let mut p = Vec::with_capacity(preds.len());
    for (line, v) in preds {
        let x = parse_number(path, *line, pred_name, v)?;
        if task.metric == Metric::Rmsle && x < 0.0 {
            return Err(TabularError::NegativeValue {
                path: path.to_path_buf(),
                line: *line,
                column: pred_name.to_string(),
                value: v.to_string(),
            });
        }
        p.push(x);
    }
    let y = &key.numbers;
    s.rmse = Some(rmse(y, &p));
    s.mae = Some(mae(y, &p));
    s.medae = Some(medae(y, &p));
    s.rmsle = rmsle(y, &p);
    s.r2 = r2(y, &p);
    s.smape = Some(smape(y, &p));
    s.rmse_pct_range = key
        .target_range()
        .filter(|r| *r > 0.0)
        .map(|r| 100.0 * rmse(y, &p) / r);
    Ok(())
}

/// The task's official metric from the computed scores, when it is one
/// computed here.
fn official(metric: Metric, s: &Scores) -> Option<f64> {
    match metric {
        Metric::Accuracy | Metric::F1Micro => s.accuracy,
        Metric::F1 => s.f1,
        Metric::RocAuc => s.roc_auc,
        Metric::NormalizedGini => s.roc_auc.map(|a| 2.0 * a - 1.0),
        Metric::Rmse => s.rmse,
        Metric::Rmsle => s.rmsle,
        Metric::Mae => s.mae,
        Metric::MedAe => s.medae,
        Metric::Smape => s.smape,
        Metric::R2 => s.r2,
        _ => None,
    }
}

fn classify(key: &AnswerKey, preds: &[(u64, &str)], s: &mut Scores) {
    let y = &key.values;
    s.n_classes = key.n_classes();
    if let Some(pos) = key.positive_label() {
        let classes: BTreeSet<&str> = key.classes.iter().map(String::as_str).collect();
        let probs: Option<Vec<f64>> = preds
            .iter()
            .map(|(_, v)| {
                v.trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|x| (0.0..=1.0).contains(x))
            })
            .collect();
        let any_non_label = preds
            .iter()
            .any(|(_, v)| !classes.contains(canonical_label(v).as_str()));
        let neg = key.classes.iter().find(|c| *c != pos).map(String::as_str);
        let (labels, scores): (Vec<String>, Vec<f64>) = match probs {
            Some(probs) if any_non_label => {
                s.probabilities = Some(true);
                let labels = probs
                    .iter()
                    .map(|&p| {
                        if p >= 0.5 {
                            pos.to_string()
                        } else {
                            neg.unwrap_or("").to_string()
                        }
                    })
                    .collect();
                (labels, probs)
            }
            _ => {
                s.probabilities = Some(false);
                let labels: Vec<String> = preds.iter().map(|(_, v)| canonical_label(v)).collect();
                let scores = labels
                    .iter()
                    .map(|l| f64::from(u8::from(l == pos)))
                    .collect();
                (labels, scores)
            }
        };
        let truth: Vec<bool> = y.iter().map(|l| l == pos).collect();
        s.accuracy = Some(accuracy(y, &labels));
        s.f1 = Some(f1_binary(y, &labels, pos));
        s.roc_auc = roc_auc(&truth, &scores);
        s.positive_label = Some(pos.to_string());
    } else {
        let labels: Vec<String> = preds.iter().map(|(_, v)| canonical_label(v)).collect();
        s.accuracy = Some(accuracy(y, &labels));
        s.f1 = Some(f1_weighted(y, &labels));
    }
}

/// Fraction of positions where `pred` equals `truth`.
pub fn accuracy(truth: &[String], pred: &[String]) -> f64 {
    let hits = truth.iter().zip(pred).filter(|(a, b)| a == b).count();
    hits as f64 / truth.len().max(1) as f64
}

fn f1_of(truth: &[String], pred: &[String], class: &str) -> f64 {
    let (mut tp, mut fp, mut fn_) = (0usize, 0usize, 0usize);
    for (t, p) in truth.iter().zip(pred) {
        match (t == class, p == class) {
            (true, true) => tp += 1,
            (false, true) => fp += 1,
            (true, false) => fn_ += 1,
            (false, false) => {}
        }
    }
    let denom = 2 * tp + fp + fn_;
    if denom == 0 {
        0.0
    } else {
        2.0 * tp as f64 / denom as f64
    }
}

/// F1 of the `positive` label (0 when it is neither true nor predicted).
pub fn f1_binary(truth: &[String], pred: &[String], positive: &str) -> f64 {
    f1_of(truth, pred, positive)
}

/// Per-class F1 averaged with weights equal to each true label's support.
pub fn f1_weighted(truth: &[String], pred: &[String]) -> f64 {
    let mut support: HashMap<&str, usize> = HashMap::new();
    for t in truth {
        *support.entry(t.as_str()).or_default() += 1;
    }
    let n = truth.len().max(1) as f64;
    support
        .iter()
        .map(|(c, k)| f1_of(truth, pred, c) * *k as f64 / n)
        .sum()
}

/// Rank-based ROC-AUC (Mann-Whitney U) with tied scores given averaged
/// ranks; `None` unless both classes are present.
pub fn roc_auc(truth: &[bool], scores: &[f64]) -> Option<f64> {
    let n_pos = truth.iter().filter(|t| **t).count();
    let n_neg = truth.len() - n_pos;
    if n_pos == 0 || n_neg == 0 {
        return None;
    }
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
    let mut rank_sum_pos = 0.0;
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1]] == scores[order[i]] {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            if truth[k] {
                rank_sum_pos += avg_rank;
            }
        }
        i = j + 1;
    }
    let (p, n) = (n_pos as f64, n_neg as f64);
    Some((rank_sum_pos - p * (p + 1.0) / 2.0) / (p * n))
}

/// Root mean squared error.
pub fn rmse(y: &[f64], p: &[f64]) -> f64 {
    let n = y.len().max(1) as f64;
    (y.iter().zip(p).map(|(a, b)| (a - b).powi(2)).sum::<f64>() / n).sqrt()
}

/// Mean absolute error.
pub fn mae(y: &[f64], p: &[f64]) -> f64 {
    let n = y.len().max(1) as f64;
    y.iter().zip(p).map(|(a, b)| (a - b).abs()).sum::<f64>() / n
}

/// Median absolute error (mean of the two middle values for even counts).
pub fn medae(y: &[f64], p: &[f64]) -> f64 {
    let mut e: Vec<f64> = y.iter().zip(p).map(|(a, b)| (a - b).abs()).collect();
    if e.is_empty() {
        return 0.0;
    }
    e.sort_by(f64::total_cmp);
    let m = e.len() / 2;
    if e.len() % 2 == 1 {
        e[m]
    } else {
        (e[m - 1] + e[m]) / 2.0
    }
}

/// RMSE of `ln(1 + x)`; `None` when any value is negative.
pub fn rmsle(y: &[f64], p: &[f64]) -> Option<f64> {
    if y.iter().chain(p).any(|x| *x < 0.0) {
        return None;
    }
    let ly: Vec<f64> = y.iter().map(|x| x.ln_1p()).collect();
    let lp: Vec<f64> = p.iter().map(|x| x.ln_1p()).collect();
    Some(rmse(&ly, &lp))
}

/// Coefficient of determination; `None` when the targets are constant.
pub fn r2(y: &[f64], p: &[f64]) -> Option<f64> {
    let mean = y.iter().sum::<f64>() / y.len().max(1) as f64;
    let ss_tot: f64 = y.iter().map(|a| (a - mean).powi(2)).sum();
    let ss_res: f64 = y.iter().zip(p).map(|(a, b)| (a - b).powi(2)).sum();
    (ss_tot > 0.0).then(|| 1.0 - ss_res / ss_tot)
}

/// Symmetric MAPE in percent: mean of `200 |p - y| / (|y| + |p|)`, 0/0 as 0.
pub fn smape(y: &[f64], p: &[f64]) -> f64 {
    let n = y.len().max(1) as f64;
    y.iter()
        .zip(p)
        .map(|(a, b)| {
            let d = a.abs() + b.abs();
            if d == 0.0 {
                0.0
            } else {
                200.0 * (a - b).abs() / d
            }
        })
        .sum::<f64>()
        / n
}

/// A label's canonical form: trimmed; a finite number is written as an
/// integer when integral (`1.0` -> `1`) or in Rust's shortest form; `true`
/// and `false` in any case become `True` and `False`.
pub fn canonical_label(raw: &str) -> String {
    let t = raw.trim();
    if let Ok(x) = t.parse::<f64>() {
        if x.is_finite() {
            if x.fract() == 0.0 && x.abs() < 1e15 {
                return format!("{}", x as i64);
            }
            return format!("{x}");
        }
    }
    if t.eq_ignore_ascii_case("true") {
        "True".to_string()
    } else if t.eq_ignore_ascii_case("false") {
        "False".to_string()
    } else {
        t.to_string()
    }
}

/// An id's canonical form: trimmed, and `123.0` written as `123` (pandas
/// writes integer ids of float columns that way). Other ids are kept as
/// written, so `007` and `7` differ.
fn canonical_id(raw: &str) -> String {
    let t = raw.trim();
    if t.contains('.') {
        if let Ok(x) = t.parse::<f64>() {
            if x.is_finite() && x.fract() == 0.0 && x.abs() < 1e15 {
                return format!("{}", x as i64);
            }
        }
    }
    t.to_string()
}

fn single_target(task: &TabularTask) -> Result<&str, TabularError> {
    if task.kind == TaskKind::Extraction {
        return Err(TabularError::Unsupported {
            task: task.id.clone(),
            reason: "text-extraction tasks are not scored".to_string(),
        });
    }
    task.target_column()
        .ok_or_else(|| TabularError::Unsupported {
            task: task.id.clone(),
            reason: format!(
                "{} target columns ({}); only single-target tasks are scored",
                task.target_columns.len(),
                task.target_columns.join(", ")
            ),
        })
}

fn unparseable(path: &Path, line: u64, column: &str, value: &str) -> TabularError {
    TabularError::UnparseableValue {
        path: path.to_path_buf(),
        line,
        column: column.to_string(),
        value: value.to_string(),
    }
}

fn parse_number(path: &Path, line: u64, column: &str, raw: &str) -> Result<f64, TabularError> {
    raw.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| unparseable(path, line, column, raw))
}

/// A CSV file read whole: trimmed header names and records with their line.
struct Table {
    path: PathBuf,
    headers: Vec<String>,
    rows: Vec<(u64, csv::StringRecord)>,
}

impl Table {
    fn column(&self, name: &str) -> Result<usize, TabularError> {
        self.headers
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| TabularError::MissingColumn {
                path: self.path.clone(),
                column: name.to_string(),
                available: self.headers.clone(),
            })
    }
}

fn read_table(path: &Path) -> Result<Table, TabularError> {
    let file = std::fs::File::open(path).map_err(|source| TabularError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let csv_err = |e: csv::Error| TabularError::Csv {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(true)
        .from_reader(file);
    let headers: Vec<String> = reader
        .headers()
        .map_err(csv_err)?
        .iter()
        .map(|h| h.trim_start_matches('\u{feff}').trim().to_string())
        .collect();
    if headers.iter().all(String::is_empty) {
        return Err(TabularError::Csv {
            path: path.to_path_buf(),
            message: "no header row".to_string(),
        });
    }
    let mut rows = Vec::new();
    for rec in reader.records() {
        let rec = rec.map_err(csv_err)?;
        let line = rec.position().map_or(0, |p| p.line());
        rows.push((line, rec));
    }
    Ok(Table {
        path: path.to_path_buf(),
        headers,
        rows,
    })
}

/// The result of evaluating one task attempt.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// The task id.
    pub task_id: String,
    /// The task kind.
    pub kind: TaskKind,
    /// Distinct answer labels (classification), for the chance fallback.
    pub n_classes: Option<usize>,
    /// Whether a parseable submission with every answer id exists.
    pub success: bool,
    /// The scores of a successful attempt.
    pub scores: Option<Scores>,
    /// Why a failed attempt failed.
    pub failure: Option<String>,
}

/// Evaluates an attempt: `None` (no submission), a missing file or any
/// submission error gives a failed [`Outcome`] with the reason; only answer-file
/// problems (which are not the agents' fault) are returned as errors.
pub fn evaluate(task: &TabularTask, submission: Option<&Path>) -> Result<Outcome, TabularError> {
    let key = AnswerKey::read(task)?;
    let mut out = Outcome {
        task_id: task.id.clone(),
        kind: task.kind,
        n_classes: key.n_classes(),
        success: false,
        scores: None,
        failure: None,
    };
    match submission {
        None => out.failure = Some("no submission".to_string()),
        Some(p) if !p.is_file() => {
            out.failure = Some(format!("`{}`: no such file", p.display()));
        }
        Some(p) => match score_against(task, &key, p) {
            Ok(s) => {
                out.success = true;
                out.scores = Some(s);
            }
            Err(e) => out.failure = Some(e.to_string()),
        },
    }
    Ok(out)
}

/// Aggregates over many outcomes. Plain means are over successes only;
/// "fair" means count every attempt, failures at a fallback:
/// - accuracy: chance, `1 / n_classes` of the answer (uniform guessing);
/// - F1: 0;
/// - ROC-AUC (binary tasks, two answer labels): 0.5;
/// - RMSE % of range (regression): 100 (an error as large as the whole range).
///
/// A mean with nothing to average is `None`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct FairSummary {
    /// Attempts.
    pub n: usize,
    /// Successful attempts.
    pub successes: usize,
    /// `successes / n`.
    pub success_rate: f64,
    /// Mean accuracy of successful classification attempts.
    pub accuracy: Option<f64>,
    /// Mean accuracy of all classification attempts, failures at chance.
    pub fair_accuracy: Option<f64>,
    /// Mean F1 of successful classification attempts.
    pub f1: Option<f64>,
    /// Mean F1 of all classification attempts, failures at 0.
    pub fair_f1: Option<f64>,
    /// Mean ROC-AUC of successful binary attempts.
    pub roc_auc: Option<f64>,
    /// Mean ROC-AUC of all binary attempts, failures at 0.5.
    pub fair_roc_auc: Option<f64>,
    /// Mean RMSE % of range of successful regression attempts.
    pub rmse_pct_range: Option<f64>,
    /// Mean RMSE % of range of all regression attempts, failures at 100.
    pub fair_rmse_pct_range: Option<f64>,
}

impl FairSummary {
    /// Aggregates `outcomes` (see the type's docs for the fallbacks).
    pub fn from_outcomes(outcomes: &[Outcome]) -> Self {
        let mut acc = (Vec::new(), Vec::new());
        let mut f1 = (Vec::new(), Vec::new());
        let mut auc = (Vec::new(), Vec::new());
        let mut pct = (Vec::new(), Vec::new());
        for o in outcomes {
            let s = o.scores.as_ref().filter(|_| o.success);
            match o.kind {
                TaskKind::Classification => {
                    let chance = 1.0 / o.n_classes.unwrap_or(2).max(1) as f64;
                    let binary = o.n_classes == Some(2);
                    match s {
                        Some(s) => {
                            let a = s.accuracy.unwrap_or(chance);
                            acc.0.push(a);
                            acc.1.push(a);
                            let f = s.f1.unwrap_or(0.0);
                            f1.0.push(f);
                            f1.1.push(f);
                            if binary {
                                let r = s.roc_auc.unwrap_or(0.5);
                                auc.0.push(r);
                                auc.1.push(r);
                            }
                        }
                        None => {
                            acc.1.push(chance);
                            f1.1.push(0.0);
                            if binary {
                                auc.1.push(0.5);
                            }
                        }
                    }
                }
                TaskKind::Regression => match s.and_then(|s| s.rmse_pct_range) {
                    Some(p) => {
                        pct.0.push(p);
                        pct.1.push(p);
                    }
                    None if s.is_none() => pct.1.push(100.0),
                    None => {}
                },
                TaskKind::Extraction => {}
            }
        }
        let successes = outcomes.iter().filter(|o| o.success).count();
        Self {
            n: outcomes.len(),
            successes,
            success_rate: successes as f64 / outcomes.len().max(1) as f64,
            accuracy: mean(&acc.0),
            fair_accuracy: mean(&acc.1),
            f1: mean(&f1.0),
            fair_f1: mean(&f1.1),
            roc_auc: mean(&auc.0),
            fair_roc_auc: mean(&auc.1),
            rmse_pct_range: mean(&pct.0),
            fair_rmse_pct_range: mean(&pct.1),
        }
    }
}

fn mean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn auc_hand_computed_with_ties() {
        // Pairs (pos, neg): scores pos {0.8, 0.4}, neg {0.4, 0.1}:
        // 0.8>0.4, 0.8>0.1, 0.4=0.4 (half), 0.4>0.1 -> 3.5 / 4.
        let auc = roc_auc(&[true, true, false, false], &[0.8, 0.4, 0.4, 0.1]).unwrap();
        assert!((auc - 0.875).abs() < 1e-12);
        assert_eq!(roc_auc(&[true, true], &[0.1, 0.2]), None);
    }

    #[test]
    fn f1_hand_computed() {
        let t = s(&["1", "1", "0", "0", "1"]);
        let p = s(&["1", "0", "1", "0", "1"]);
        // tp 2, fp 1, fn 1 -> 4 / 6.
        assert!((f1_binary(&t, &p, "1") - 4.0 / 6.0).abs() < 1e-12);
        assert!((accuracy(&t, &p) - 0.6).abs() < 1e-12);
        // class 1: 2/3 with support 3; class 0: tp 1 fp 1 fn 1 -> 1/2, support 2.
        let w = 0.6 * (4.0 / 6.0) + 0.4 * 0.5;
        assert!((f1_weighted(&t, &p) - w).abs() < 1e-12);
    }

    #[test]
    fn regression_hand_computed() {
        let y = [1.0, 2.0, 3.0, 4.0];
        let p = [1.0, 3.0, 3.0, 2.0];
        assert!((rmse(&y, &p) - (5.0f64 / 4.0).sqrt()).abs() < 1e-12);
        assert!((mae(&y, &p) - 0.75).abs() < 1e-12);
        assert!((medae(&y, &p) - 0.5).abs() < 1e-12);
        assert!((r2(&y, &p).unwrap() - (1.0 - 5.0 / 5.0)).abs() < 1e-12);
        let e = ((2f64.ln() - 2f64.ln()).powi(2)
            + (3f64.ln() - 4f64.ln()).powi(2)
            + 0.0
            + (5f64.ln() - 3f64.ln()).powi(2))
            / 4.0;
        assert!((rmsle(&y, &p).unwrap() - e.sqrt()).abs() < 1e-12);
        assert_eq!(rmsle(&[-1.0], &[0.0]), None);
        assert!((smape(&[0.0, 2.0], &[0.0, 6.0]) - 50.0).abs() < 1e-12);
    }

    #[test]
    fn labels_canonicalise() {
        assert_eq!(canonical_label(" 1.0 "), "1");
        assert_eq!(canonical_label("TRUE"), "True");
        assert_eq!(canonical_label("0.25"), "0.25");
        assert_eq!(canonical_label("Cat"), "Cat");
        assert_eq!(canonical_id("12.0"), "12");
        assert_eq!(canonical_id("0013_01"), "0013_01");
        assert_eq!(canonical_id("007"), "007");
    }
}
