//! Every reference answer of the AIME and AMC benchmark files grades correct
//! against itself in several renderings, and against none of 20 other
//! answers of the same file.

use std::collections::BTreeSet;

use mappa_env::math::{
    answers_equal, extract_answer, grade_answer, grade_response, normalize, ExtractionMethod,
};
use serde_json::Value;

const FILES: &[&str] = &[
    "AIME_1983_2024.json",
    "aime_2025.json",
    "aime_eval_32.json",
    "amc.json",
    "amc_32.json",
    "amc_eval_32.json",
];

/// The reference answers of a benchmark file, as strings (AMC answers are
/// JSON floats such as `3.0`, read as their JSON text).
fn answers(file: &str) -> Vec<String> {
    let path = format!("{}/../../fixtures/bench/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let items: Vec<Value> = serde_json::from_str(&text).unwrap();
    items
        .iter()
        .map(|item| match &item["answer"] {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            other => panic!("{file}: unexpected answer {other}"),
        })
        .collect()
}

/// The values an answer stands for, by normalised form (several for an
/// `A or B (both were accepted)` answer, normalised as
/// `A or B (either accepted)`).
fn values(answer: &str) -> BTreeSet<String> {
    let canonical = normalize(answer);
    let head = canonical
        .split(" (either accepted)")
        .next()
        .unwrap_or_default();
    head.split(" or ").map(str::to_string).collect()
}

/// Bare renderings of `gold` that must grade as equal.
fn bare_renderings(gold: &str) -> Vec<String> {
    let mut out = vec![
        gold.to_string(),
        format!("${gold}$"),
        format!("\\text{{{gold}}}"),
        format!("   {gold}  "),
        format!("$ \\text{{ {gold} }} $"),
        gold.replace("\\frac", "\\dfrac"),
        normalize(gold),
    ];
    let canonical = normalize(gold);
    if let Ok(k) = canonical.parse::<i64>() {
        out.push(format!("{k}.0"));
        out.push(format!("\\frac{{{}}}{{2}}", 2 * k));
        out.push(format!("\\dfrac{{{}}}{{2}}", 2 * k));
        out.push(format!("{}/3", 3 * k));
        if k >= 0 {
            out.push(format!("0{k}"));
        }
    }
    out
}

/// Full responses containing `gold`, with the extraction method expected.
fn responses(gold: &str) -> Vec<(String, bool, ExtractionMethod)> {
    vec![
        (
            format!("Adding up, the total is \\boxed{{{gold}}}."),
            false,
            ExtractionMethod::Boxed,
        ),
        (
            format!("First \\boxed{{1.5}} was wrong; so $\\boxed{{ {gold} }}$"),
            false,
            ExtractionMethod::Boxed,
        ),
        (
            format!("Hence \\fbox{{\\text{{{gold}}}}}"),
            false,
            ExtractionMethod::Boxed,
        ),
        (
            format!("We check 17 cases. The answer is {gold}."),
            true,
            ExtractionMethod::AnswerIs,
        ),
    ]
}

#[test]
fn every_reference_answer_parses_to_an_integer() {
    for file in FILES {
        for gold in answers(file) {
            let ok = values(&gold).iter().all(|v| v.parse::<i64>().is_ok());
            assert!(ok, "{file}: {gold} normalises to {}", normalize(&gold));
        }
    }
}

#[test]
fn every_reference_answer_matches_itself_in_several_renderings() {
    let mut checked = 0;
    for file in FILES {
        for gold in answers(file) {
            for r in bare_renderings(&gold) {
                assert!(grade_answer(&gold, &r).correct, "{file}: {gold:?} vs {r:?}");
                assert!(
                    answers_equal(&r, &gold),
                    "{file}: {r:?} vs {gold:?} (symmetry)"
                );
                checked += 1;
            }
            for (text, fallbacks, method) in responses(&gold) {
                let g = grade_response(&gold, &text, fallbacks);
                assert!(g.correct, "{file}: {gold:?} vs response {text:?}: {g:?}");
                assert_eq!(g.extracted.map(|e| e.method), Some(method), "{text:?}");
                checked += 1;
            }
        }
    }
    assert!(checked > 10_000, "{checked}");
}

#[test]
fn every_reference_answer_matches_none_of_20_other_answers() {
    for file in FILES {
        let all = answers(file);
        let n = all.len();
        for (i, gold) in all.iter().enumerate() {
            let gold_values = values(gold);
            let mut seen = BTreeSet::new();
            let mut others = Vec::new();
            // A deterministic walk over the file, starting at a per-item offset.
            for step in 0..n {
                let j = (i * 31 + 7 + step * 17) % n;
                let other = &all[j];
                let v = values(other);
                if v.is_disjoint(&gold_values) && seen.insert(normalize(other)) {
                    others.push(other.clone());
                }
                if others.len() == 20 {
                    break;
                }
            }
            assert_eq!(
                others.len(),
                20,
                "{file}: too few distinct answers for {gold}"
            );
            for other in &others {
                assert!(!answers_equal(gold, other), "{file}: {gold:?} == {other:?}");
                assert!(!answers_equal(other, gold), "{file}: {other:?} == {gold:?}");
                let boxed = format!("So the answer is \\boxed{{{other}}}.");
                assert!(
                    !grade_response(gold, &boxed, true).correct,
                    "{file}: {gold:?} vs {boxed:?}"
                );
            }
        }
    }
}

#[test]
fn fallbacks_are_used_only_when_asked() {
    let text = "so the result is 204";
    assert_eq!(extract_answer(text, false), None);
    assert_eq!(
        extract_answer(text, true).map(|e| e.method),
        Some(ExtractionMethod::LastNumber)
    );
    assert!(!grade_response("204", text, false).correct);
    assert!(grade_response("204", text, true).correct);
}
