//! `mappa grade`: reads JSON lines `{"gold": ..., "response": ...}` (a full
//! model output) and writes JSON lines `{"gold", "extracted", "method",
//! "correct"}`; with `--answer`, each line's `pred` is compared directly,
//! without extraction. `gold` (and `pred`) may be JSON strings or numbers.
//! A summary goes to stderr.

use anyhow::anyhow;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;

use clap::Args;
use mappa_env::math::{grade_answer, grade_response, Grade};
use serde_json::{json, Value};

/// Arguments of `mappa grade`.
#[derive(Args, Debug)]
pub struct GradeArgs {
    /// JSON-lines input file; `-` or nothing reads standard input.
    input: Option<PathBuf>,
    /// Compare each line's `pred` field directly instead of extracting an answer from `response`.
    #[arg(long)]
    answer: bool,
    /// When no `\boxed{}` answer is found, fall back to "the answer is ..." and then the last number (reported as such).
    #[arg(long)]
    fallbacks: bool,
}

/// A field that must hold a string or a number.
fn text_field(line: &Value, field: &str, lineno: usize, source: &str) -> anyhow::Result<String> {
    match line.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(other) => Err(anyhow!(
            "{source}:{lineno}: field `{field}` is {other}, expected a string or a number"
        )),
        None => Err(anyhow!("{source}:{lineno}: field `{field}` is missing")),
    }
}

/// Runs `mappa grade`.
pub fn run(args: &GradeArgs) -> anyhow::Result<()> {
    let (reader, source): (Box<dyn BufRead>, String) = match &args.input {
        Some(path) if path.as_os_str() != "-" => {
            let file = std::fs::File::open(path)
                .map_err(|e| anyhow!("cannot open `{}`: {e}", path.display()))?;
            (Box::new(BufReader::new(file)), path.display().to_string())
        }
        _ => (
            Box::new(BufReader::new(std::io::stdin())),
            "<stdin>".to_string(),
        ),
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (mut total, mut correct, mut unextracted) = (0usize, 0usize, 0usize);
    for (i, line) in reader.lines().enumerate() {
        let lineno = i + 1;
        let line = line.map_err(|e| anyhow!("{source}:{lineno}: cannot read: {e}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line)
            .map_err(|e| anyhow!("{source}:{lineno}: not valid JSON: {e}"))?;
        let gold = text_field(&value, "gold", lineno, &source)?;
        let (grade, extracted): (Grade, Option<(String, Value)>) = if args.answer {
            let pred = text_field(&value, "pred", lineno, &source)?;
            (grade_answer(&gold, &pred), Some((pred, Value::Null)))
        } else {
            let response = text_field(&value, "response", lineno, &source)?;
            let grade = grade_response(&gold, &response, args.fallbacks);
            let extracted = grade.extracted.as_ref().map(|e| {
                (
                    e.answer.clone(),
                    serde_json::to_value(e.method).expect("method serialises"),
                )
            });
            (grade, extracted)
        };
        total += 1;
        correct += usize::from(grade.correct);
        unextracted += usize::from(extracted.is_none());
        let (answer, method) = match extracted {
            Some((a, m)) => (Value::String(a), m),
            None => (Value::Null, Value::Null),
        };
        let row =
            json!({"gold": gold, "extracted": answer, "method": method, "correct": grade.correct});
        writeln!(out, "{row}").map_err(|e| anyhow!("cannot write output: {e}"))?;
    }
    let accuracy = if total > 0 {
        correct as f64 / total as f64
    } else {
        0.0
    };
    eprintln!(
        "graded {total}: {correct} correct ({:.1}%){}",
        100.0 * accuracy,
        if args.answer {
            String::new()
        } else {
            format!(", {unextracted} without an extractable answer")
        }
    );
    Ok(())
}
