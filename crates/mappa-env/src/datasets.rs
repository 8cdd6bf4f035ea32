//! The AIME and AMC benchmark files: loading, seeded sampling, and overlap checks.
//!
//! Six JSON files are supported, each a list of objects (copies live in
//! `fixtures/bench/`, whose README gives their sha256 values). Three schemas
//! occur, told apart by the fields of the first item:
//!
//! | schema | detected by | fields |
//! |---|---|---|
//! | [`Schema::AimePool`] | `year` | `prompt`, `answer` (string), `id` "YYYY-[I\|II]-N", `year`, `problem_number`, `part` |
//! | [`Schema::Amc`] | `source` | `prompt`, `answer` (float), `source`, `id` |
//! | [`Schema::Plain`] | neither | `prompt`, `answer`, optional `id` (and other fields, ignored) |
//!
//! Every item of a file is checked against its file's schema; an error names
//! the file, the item's index and the field at fault. Answers may be JSON
//! strings or numbers; numbers are rendered canonically (see [`render_number`]).
//!
//! [`overlap`] and [`check_disjoint`] compare problem texts after
//! [`normalize_problem_text`], to keep evaluation problems out of training.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mappa_core::SeedTree;
use serde_json::{Map, Value};

/// The instruction some prompt files append to each problem; ignored when comparing texts.
pub const BOXED_INSTRUCTION: &str =
    "Please reason step by step, and put your final answer within \\boxed{}.";

/// Errors raised while loading, sampling or comparing math datasets.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The file could not be read.
    #[error("`{}`: cannot read: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid JSON.
    #[error("`{}`: invalid JSON: {source}", path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// The parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// The file's top-level value is not a list.
    #[error("`{}`: expected a JSON list of problems, found {found}", path.display())]
    NotAList {
        /// The file.
        path: PathBuf,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// An item of the list is not an object.
    #[error("`{}`: item {index}: expected an object, found {found}", path.display())]
    NotAnObject {
        /// The file.
        path: PathBuf,
        /// The item's 0-based index in the list.
        index: usize,
        /// The JSON type found instead.
        found: &'static str,
    },
    /// A field the file's schema requires is absent (`prompt` and `answer` also when `null`).
    #[error("`{}`: item {index}: field `{field}` is missing", path.display())]
    MissingField {
        /// The file.
        path: PathBuf,
        /// The item's 0-based index in the list.
        index: usize,
        /// The missing field.
        field: &'static str,
    },
    /// A field has the wrong JSON type.
    #[error(
        "`{}`: item {index}: field `{field}` should be {expected}, found {found}",
        path.display()
    )]
    WrongType {
        /// The file.
        path: PathBuf,
        /// The item's 0-based index in the list.
        index: usize,
        /// The field at fault.
        field: &'static str,
        /// What the schema expects, e.g. "a string or a number".
        expected: &'static str,
        /// The JSON type found.
        found: &'static str,
    },
    /// More problems were requested than the dataset holds.
    #[error(
        "dataset `{name}`: cannot sample {requested} problems without replacement from {available}"
    )]
    SampleTooLarge {
        /// The dataset's name.
        name: String,
        /// How many were requested.
        requested: usize,
        /// How many the dataset holds.
        available: usize,
    },
    /// Two problem sets that must be disjoint share problems.
    #[error(
        "training problem `{train_id}` and evaluation problem `{eval_id}` have the same text \
         ({count} overlapping pair(s) in all)"
    )]
    Overlap {
        /// The id of the first overlapping training problem.
        train_id: String,
        /// The id of the evaluation problem it equals.
        eval_id: String,
        /// The number of overlapping (train, eval) pairs.
        count: usize,
    },
}

/// One benchmark problem.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MathProblem {
    /// The file's `id` (numbers rendered as decimal), or `"<file stem>-<index>"` when absent.
    pub id: String,
    /// The problem statement, as stored in the file.
    pub prompt: String,
    /// The reference answer. Numeric answers are rendered by [`render_number`]
    /// (`3.0` becomes `"3"`, `0.5` stays `"0.5"`); string answers are kept, trimmed.
    pub answer: String,
    /// The stem of the file the problem came from, e.g. `"amc_eval_32"`.
    pub source: String,
}

/// The schema of a benchmark file, detected from the fields of its first item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schema {
    /// `AIME_1983_2024.json`: `prompt`, `answer`, `id`, `year`, `problem_number`, `part`.
    AimePool,
    /// `amc*.json`: `prompt`, `answer` (float), `source`, `id`.
    Amc,
    /// `aime_2025.json`, `aime_eval_32.json`: `prompt`, `answer`, optional `id`.
    Plain,
}

impl Schema {
    fn detect(first: Option<&Map<String, Value>>) -> Self {
        match first {
            Some(item) if item.contains_key("year") => Self::AimePool,
            Some(item) if item.contains_key("source") => Self::Amc,
            _ => Self::Plain,
        }
    }

    /// Fields whose key must be present (besides `prompt` and `answer`) in every item.
    fn required_extra_fields(self) -> &'static [&'static str] {
        match self {
            Self::AimePool => &["id", "year", "problem_number", "part"],
            Self::Amc => &["source", "id"],
            Self::Plain => &[],
        }
    }
}

/// A loaded benchmark file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MathDataset {
    /// The file stem, e.g. `"AIME_1983_2024"`.
    pub name: String,
    /// The file it was loaded from.
    pub path: PathBuf,
    /// sha256 of the file's bytes, as 64 lowercase hex characters.
    pub sha256: String,
    /// The schema detected.
    pub schema: Schema,
    /// The problems, in file order.
    pub problems: Vec<MathProblem>,
}

impl MathDataset {
    /// Loads and validates the benchmark file at `path` (see the module docs for the schemas).
    ///
    /// The sha256 is computed over the very bytes that were parsed.
    pub fn load(path: &Path) -> Result<Self, DatasetError> {
        let bytes = std::fs::read(path).map_err(|source| DatasetError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let sha256 = mappa_core::hash::sha256_hex(&bytes);
        let value: Value = serde_json::from_slice(&bytes).map_err(|source| DatasetError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let Value::Array(items) = value else {
            return Err(DatasetError::NotAList {
                path: path.to_path_buf(),
                found: json_type(&value),
            });
        };
        let name = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let schema = Schema::detect(items.first().and_then(Value::as_object));
        let problems = items
            .iter()
            .enumerate()
            .map(|(index, item)| parse_item(path, &name, schema, index, item))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name,
            path: path.to_path_buf(),
            sha256,
            schema,
            problems,
        })
    }

    /// The number of problems.
    pub fn len(&self) -> usize {
        self.problems.len()
    }

    /// Whether the dataset holds no problems.
    pub fn is_empty(&self) -> bool {
        self.problems.is_empty()
    }

    /// `n` distinct problems drawn without replacement, in draw order.
    ///
    /// A partial Fisher-Yates shuffle driven by
    /// `SeedTree::new(seed).stream("dataset/sample")`: step `i` swaps position
    /// `i` with a uniform position in `i..len`. The same `(file, n, seed)`
    /// always gives the same problems, and the first `m` problems drawn for
    /// `n >= m` are those drawn for `m`.
    ///
    /// This stream is not Python's `random`, so the 512 problems drawn with
    /// seed 42 are not the 512 the MAPPA paper's reference code draws with
    /// `random.seed(42)`; only the procedure (512 of 933, seeded, without
    /// replacement) matches.
    ///
    /// Errors with [`DatasetError::SampleTooLarge`] when `n > self.len()`.
    pub fn sample(&self, n: usize, seed: u64) -> Result<Vec<MathProblem>, DatasetError> {
        let len = self.problems.len();
        if n > len {
            return Err(DatasetError::SampleTooLarge {
                name: self.name.clone(),
                requested: n,
                available: len,
            });
        }
        let mut stream = SeedTree::new(seed).stream("dataset/sample");
        let mut order: Vec<usize> = (0..len).collect();
        for i in 0..n {
            // `len - i >= 1` because `i < n <= len`.
            let j = i + stream.below((len - i) as u64) as usize;
            order.swap(i, j);
        }
        Ok(order[..n]
            .iter()
            .map(|&k| self.problems[k].clone())
            .collect())
    }
}

fn parse_item(
    path: &Path,
    stem: &str,
    schema: Schema,
    index: usize,
    item: &Value,
) -> Result<MathProblem, DatasetError> {
    let Value::Object(fields) = item else {
        return Err(DatasetError::NotAnObject {
            path: path.to_path_buf(),
            index,
            found: json_type(item),
        });
    };
    let missing = |field: &'static str| DatasetError::MissingField {
        path: path.to_path_buf(),
        index,
        field,
    };
    let wrong =
        |field: &'static str, expected: &'static str, value: &Value| DatasetError::WrongType {
            path: path.to_path_buf(),
            index,
            field,
            expected,
            found: json_type(value),
        };
    let present = |field: &'static str| fields.get(field).filter(|v| !v.is_null());

    let prompt = match present("prompt") {
        None => return Err(missing("prompt")),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(wrong("prompt", "a string", other)),
    };
    let answer = match present("answer") {
        None => return Err(missing("answer")),
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => render_json_number(n),
        Some(other) => return Err(wrong("answer", "a string or a number", other)),
    };
    // Key presence only: `part` is `null` for the single-exam years before 1984.
    for &field in schema.required_extra_fields() {
        if !fields.contains_key(field) {
            return Err(missing(field));
        }
    }
    let id = match present("id") {
        None => format!("{stem}-{index}"),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => render_json_number(n),
        Some(other) => return Err(wrong("id", "a string or a number", other)),
    };
    Ok(MathProblem {
        id,
        prompt,
        answer,
        source: stem.to_string(),
    })
}

fn render_json_number(n: &serde_json::Number) -> String {
    match (n.as_u64(), n.as_i64(), n.as_f64()) {
        (Some(u), _, _) => u.to_string(),
        (None, Some(i), _) => i.to_string(),
        // serde_json numbers are always representable as f64 without the
        // `arbitrary_precision` feature.
        (None, None, Some(f)) => render_number(f),
        (None, None, None) => n.to_string(),
    }
}

/// Renders a float answer canonically: the shortest decimal that reads back
/// as the same `f64`, without a trailing `.0` for integer values
/// (`3.0` → `"3"`, `0.5` → `"0.5"`, `-0.0` → `"0"`).
pub fn render_number(x: f64) -> String {
    if x == 0.0 {
        // Also maps -0.0 to "0".
        return "0".to_string();
    }
    // Rust's `Display` for f64 is the shortest round-trip decimal, never in
    // exponent notation, and omits `.0` for integer values.
    format!("{x}")
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// The text key under which two problem statements count as the same problem.
///
/// Lowercases; deletes `$`; deletes Asymptote diagrams (`[asy] ... [/asy]`,
/// which some copies of a problem carry and others drop); drops whitespace
/// except a single space between two letters or digits (so `"30 ."`,
/// `"30."` and `"such that\[" / "such that \["` agree, while words stay
/// apart); and finally removes a trailing [`BOXED_INSTRUCTION`].
pub fn normalize_problem_text(text: &str) -> String {
    let text = strip_asy(&text.to_lowercase().replace('$', ""));
    let text = squeeze_whitespace(&text);
    let suffix = squeeze_whitespace(&BOXED_INSTRUCTION.to_lowercase());
    match text.strip_suffix(&suffix) {
        Some(rest) => rest.trim_end().to_string(),
        None => text,
    }
}

/// Removes every `[asy] ... [/asy]` block (to the end when unclosed); `text` is lowercase.
fn strip_asy(text: &str) -> String {
    const OPEN: &str = "[asy]";
    const CLOSE: &str = "[/asy]";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        out.push_str(&rest[..start]);
        out.push(' ');
        rest = match rest[start..].find(CLOSE) {
            Some(end) => &rest[start + end + CLOSE.len()..],
            None => "",
        };
    }
    out.push_str(rest);
    out
}

/// Drops whitespace, keeping one space only between two alphanumeric characters.
fn squeeze_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut pending_space = false;
    for c in text.chars() {
        if c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if pending_space
            && c.is_alphanumeric()
            && out.chars().last().is_some_and(char::is_alphanumeric)
        {
            out.push(' ');
        }
        pending_space = false;
        out.push(c);
    }
    out
}

/// The `(a id, b id)` pairs of problems whose texts are equal after
/// [`normalize_problem_text`], in the order of `b`, then of `a`.
pub fn overlap(a: &[MathProblem], b: &[MathProblem]) -> Vec<(String, String)> {
    let mut by_text: HashMap<String, Vec<&str>> = HashMap::new();
    for p in a {
        by_text
            .entry(normalize_problem_text(&p.prompt))
            .or_default()
            .push(&p.id);
    }
    let mut pairs = Vec::new();
    for q in b {
        if let Some(ids) = by_text.get(&normalize_problem_text(&q.prompt)) {
            pairs.extend(ids.iter().map(|id| (id.to_string(), q.id.clone())));
        }
    }
    pairs
}

/// Succeeds when no problem of `eval` has the (normalized) text of a problem
/// of `train`; otherwise names the first overlapping pair and the count.
pub fn check_disjoint(train: &[MathProblem], eval: &[MathProblem]) -> Result<(), DatasetError> {
    let pairs = overlap(train, eval);
    match pairs.first() {
        None => Ok(()),
        Some((train_id, eval_id)) => Err(DatasetError::Overlap {
            train_id: train_id.clone(),
            eval_id: eval_id.clone(),
            count: pairs.len(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_render_canonically() {
        assert_eq!(render_number(3.0), "3");
        assert_eq!(render_number(0.5), "0.5");
        assert_eq!(render_number(-0.0), "0");
        assert_eq!(render_number(-2.25), "-2.25");
        assert_eq!(render_number(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(render_number(1e21), "1000000000000000000000");
    }

    #[test]
    fn normalization_ignores_case_dollars_spacing_diagrams_and_instruction() {
        let a = "Find  $x$ such that\\[x^2=4\\] .\n[asy] draw((0,0)--(1,1)); [/asy]";
        let b = format!("find x such that \\[ x^2 = 4 \\]. {BOXED_INSTRUCTION}");
        assert_eq!(normalize_problem_text(a), normalize_problem_text(&b));
        assert_eq!(normalize_problem_text(a), "find x such that\\[x^2=4\\].");
        // Words stay apart.
        assert_ne!(normalize_problem_text("a b"), normalize_problem_text("ab"));
        // An unclosed diagram runs to the end.
        assert_eq!(normalize_problem_text("Hi [asy] draw("), "hi");
    }

    #[test]
    fn sampling_is_a_prefix_stable_permutation() {
        let problems: Vec<MathProblem> = (0..50)
            .map(|i| MathProblem {
                id: i.to_string(),
                prompt: format!("problem {i}"),
                answer: i.to_string(),
                source: "t".into(),
            })
            .collect();
        let ds = MathDataset {
            name: "t".into(),
            path: PathBuf::from("t.json"),
            sha256: String::new(),
            schema: Schema::Plain,
            problems,
        };
        let all = ds.sample(50, 1).unwrap();
        let mut ids: Vec<usize> = all.iter().map(|p| p.id.parse().unwrap()).collect();
        ids.sort_unstable();
        assert_eq!(ids, (0..50).collect::<Vec<_>>());
        assert_eq!(ds.sample(10, 1).unwrap(), all[..10].to_vec());
        assert!(ds.sample(0, 1).unwrap().is_empty());
        let err = ds.sample(51, 1).unwrap_err().to_string();
        assert!(err.contains("51") && err.contains("50"), "{err}");
    }
}
