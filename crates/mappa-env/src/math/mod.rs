//! Math answers: extract a final answer from a response, normalise it, and
//! decide whether it is equivalent to a reference answer.
//!
//! - **Extraction** ([`extract_boxed`], [`extract_answer`]): the last
//!   brace-matched `\boxed{...}` (or `\fbox{...}`); fallbacks ("the answer
//!   is ...", then the last number) only when asked for, and reported as such
//!   in [`Extracted::method`].
//! - **Normalisation** ([`normalize()`]): LaTeX presentation (`\dfrac`,
//!   `\tfrac`, `\left`/`\right`, `\text{}`, `\mathrm{}`, `^\circ`, `\%`,
//!   `$`, spacing commands), trailing units, thousands separators, a leading
//!   `x =`; numbers are then rendered canonically ("023" is `23`, "1.0" is
//!   `1`, "0.5" is `1/2`).
//! - **Equivalence** ([`answers_equal`]): answers are parsed into exact
//!   values: rationals (integers, decimals, fractions, mixed numbers
//!   `3\frac{1}{2}` and `3 1/2`), sums of simple radicals and pi powers
//!   (`\sqrt{12}` is `2\sqrt{3}`, `\frac{\pi}{4}` is `\pi/4`), tuples and
//!   intervals (bracket kinds matter, elements compared in order), sets and
//!   bare comma lists (compared as multisets). Everything else is compared as
//!   its cleaned string. Arithmetic is exact on `i128` with overflow checks;
//!   an overflowing answer falls back to string comparison. An integer never
//!   equals a non-integer, and nothing is ever evaluated as code.
//!
//! Conventions worth knowing: a percentage compares as its number (`50\%`
//! equals `50`); degrees are dropped (`30^\circ` equals `30`); a single
//! `d,ddd` number is read with a thousands separator (`1,000` is 1000), so a
//! tuple must be bracketed; a reference answer of the form
//! `A or B (both were accepted)` (one AIME answer) accepts either
//! alternative, but a *predicted* `A or B` without that note is plain text,
//! so hedging never pays.

mod extract;
mod normalize;
mod value;

use serde::Serialize;

pub use extract::extract_boxed;
use value::parse_value;

/// How an answer was found in a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExtractionMethod {
    /// The last `\boxed{...}` / `\fbox{...}`.
    Boxed,
    /// A fallback: the text after the last "the answer is" / "answer:".
    AnswerIs,
    /// A fallback: the last number in the response.
    LastNumber,
}

/// An answer extracted from a response, with how it was found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Extracted {
    /// The raw answer text (not normalised).
    pub answer: String,
    /// Which rule found it.
    pub method: ExtractionMethod,
}

/// Extract the final answer of `text`: the last boxed answer; only when
/// `fallbacks` is set and there is no box, the last "the answer is X" /
/// "answer: X", then the last number in the text.
pub fn extract_answer(text: &str, fallbacks: bool) -> Option<Extracted> {
    extract::extract(text, fallbacks)
}

/// The alternatives of an answer: `A or B (both were accepted)` (a reference
/// answer accepting several values) gives `[A, B]`; anything else itself.
fn alternatives(answer: &str) -> Vec<String> {
    let cleaned = normalize::clean(answer);
    if let Some(open) = cleaned.rfind(" (") {
        let (head, note) = cleaned.split_at(open);
        if note.ends_with(')')
            && note.to_ascii_lowercase().contains("accepted")
            && head.contains(" or ")
        {
            return head.split(" or ").map(|a| a.trim().to_string()).collect();
        }
    }
    vec![cleaned]
}

/// The canonical string form of an answer, for display and for checking
/// that answers are distinct: numbers in lowest terms (`7/2`,
/// `2\sqrt{3}`, `\pi/4`), sets sorted, anything unparsed as its cleaned
/// text. Answers that are [`answers_equal`] usually normalise to the same
/// string, and an answer always equals its normal form (a reference answer
/// with alternatives renders as `A or B (either accepted)`). Never panics.
pub fn normalize(answer: &str) -> String {
    let alts: Vec<String> = alternatives(answer)
        .iter()
        .map(|a| parse_value(a).to_string())
        .collect();
    if alts.len() == 1 {
        alts.concat()
    } else {
        format!("{} (either accepted)", alts.join(" or "))
    }
}

/// Whether two answers are equivalent (symmetric): exact values compared
/// structurally, anything unparsed by its cleaned string. See the module
/// documentation for the rules.
pub fn answers_equal(gold: &str, pred: &str) -> bool {
    let gold: Vec<_> = alternatives(gold).iter().map(|a| parse_value(a)).collect();
    alternatives(pred)
        .iter()
        .map(|a| parse_value(a))
        .any(|p| gold.contains(&p))
}

/// The outcome of grading one answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Grade {
    /// What was extracted from the response (`None` when nothing was, and
    /// always `None` from [`grade_answer`], which extracts nothing).
    pub extracted: Option<Extracted>,
    /// Whether the answer matches the reference.
    pub correct: bool,
}

/// Extract the answer from `response` (see [`extract_answer`]) and compare
/// it with `gold`; a response with no extractable answer is incorrect.
pub fn grade_response(gold: &str, response: &str, fallbacks: bool) -> Grade {
    let extracted = extract_answer(response, fallbacks);
    let correct = extracted
        .as_ref()
        .is_some_and(|e| answers_equal(gold, &e.answer));
    Grade { extracted, correct }
}

/// Compare a bare predicted answer with `gold` (no extraction).
pub fn grade_answer(gold: &str, pred: &str) -> Grade {
    Grade {
        extracted: None,
        correct: answers_equal(gold, pred),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn equivalences() {
        let yes = [
            ("7", "7.0"),
            ("7", "14/2"),
            ("023", "23"),
            ("0.5", "\\frac{1}{2}"),
            ("\\dfrac{1}{2}", "\\tfrac12"),
            ("1,000", "1000"),
            ("3\\frac{1}{2}", "3 1/2"),
            ("2\\sqrt{3}", "\\sqrt{12}"),
            ("\\frac{\\sqrt{3}}{2}", "$\\frac{\\sqrt 3}{2}$"),
            ("3\\pi", "3 \\pi"),
            ("\\frac{\\pi}{4}", "\\pi/4"),
            ("30^\\circ", "30"),
            ("50\\%", "50"),
            ("5 \\text{ cm}", "5"),
            ("\\left( 1, 2 \\right)", "(1,2)"),
            ("\\{3, 1\\}", "\\{1,3\\}"),
            ("[0, 1)", "\\left[0,1\\right)"),
            ("x = 5", "5"),
            ("080 or 081 (both were accepted)", "81"),
            ("080 or 081 (both were accepted)", "\\boxed{080}"),
            ("\\text{Monday}", "Monday"),
        ];
        for (a, b) in yes {
            assert!(answers_equal(a, b), "{a} should equal {b}");
            assert!(answers_equal(b, a), "{b} should equal {a}");
        }
        let no = [
            ("7", "7.5"),
            ("7", "-7"),
            ("1/2", "0.49"),
            ("\\sqrt{2}", "1.41421356"),
            ("(1,2)", "(2,1)"),
            ("(1,2)", "[1,2]"),
            ("80", "80 or 81"),
            ("080 or 081 (both were accepted)", "82"),
            ("3\\pi", "3"),
            ("2\\sqrt{3}", "2\\sqrt{2}"),
            ("", "0"),
        ];
        for (a, b) in no {
            assert!(!answers_equal(a, b), "{a} should differ from {b}");
            assert!(!answers_equal(b, a), "{b} should differ from {a}");
        }
    }

    #[test]
    fn normalized_forms() {
        assert_eq!(normalize("023"), "23");
        assert_eq!(normalize("1.0"), "1");
        assert_eq!(normalize("$\\dfrac{6}{4}$"), "3/2");
        assert_eq!(normalize("\\sqrt{12}"), "2\\sqrt{3}");
        assert_eq!(normalize("336^\\circ"), "336");
        assert_eq!(
            normalize("080 or 081 (both were accepted)"),
            "80 or 81 (either accepted)"
        );
        assert_eq!(normalize("\\{2,1\\}"), "\\{1,2\\}");
    }

    #[test]
    fn grading_reports_method() {
        let g = grade_response("12", "so \\boxed{10} no wait \\boxed{12}", false);
        assert!(g.correct);
        assert_eq!(g.extracted.map(|e| e.method), Some(ExtractionMethod::Boxed));
        let g = grade_response("12", "The answer is 12.", false);
        assert_eq!(
            g,
            Grade {
                extracted: None,
                correct: false
            }
        );
        let g = grade_response("12", "The answer is 12.", true);
        assert!(g.correct);
        assert_eq!(g.extracted.unwrap().method, ExtractionMethod::AnswerIs);
        let g = grade_response("12", "we get 3 then 12", true);
        assert!(g.correct);
        assert_eq!(g.extracted.unwrap().method, ExtractionMethod::LastNumber);
        assert_eq!(
            grade_answer("1/2", "0.5"),
            Grade {
                extracted: None,
                correct: true
            }
        );
        let json = serde_json::to_string(&grade_response("1", "answer: 1", true)).unwrap();
        assert_eq!(
            json,
            r#"{"extracted":{"answer":"1","method":"answer_is"},"correct":true}"#
        );
    }

    #[test]
    fn deep_or_long_inputs_are_handled() {
        let n = 20_000;
        for s in [
            format!("{}1{}", "(".repeat(n), ")".repeat(n)),
            format!("{}1{}", "\\text{".repeat(n), "}".repeat(n)),
            format!("{}1{}", "\\{".repeat(n), "\\}".repeat(n)),
            "-".repeat(n) + "1",
            "1+".repeat(n) + "1",
            "\\sqrt{9999999967}+".repeat(200) + "1",
        ] {
            let _ = normalize(&s);
            assert!(answers_equal(&s, &s));
            let _ = extract_answer(&s, true);
        }
        assert_eq!(normalize(&("1+".repeat(n) + "1")), (n + 1).to_string());
    }

    /// Renderings of a fraction `n/d` (d > 0) and of `c\sqrt{r}`.
    fn renderings(n: i64, d: i64) -> Vec<String> {
        let sign = if n < 0 { "-" } else { "" };
        let a = n.unsigned_abs();
        vec![
            format!("{n}/{d}"),
            format!("{sign}\\frac{{{a}}}{{{d}}}"),
            format!("{sign}\\dfrac{{{a}}}{{{d}}}"),
            format!("$ {sign}\\tfrac{{ {a} }}{{ {d} }} $"),
            format!("\\boxed{{{sign}\\frac{{{a}}}{{{d}}}}}"),
            format!("\\text{{{n}/{d}}}"),
            format!("  {n} / {d}  "),
            format!("\\left({n}\\right)/{d}"),
        ]
    }

    proptest! {
        #[test]
        fn fractions_equal_themselves_under_perturbation(n in -10_000i64..10_000, d in 1i64..1000) {
            let forms = renderings(n, d);
            for a in &forms {
                for b in &forms {
                    prop_assert!(answers_equal(a, b), "{} vs {}", a, b);
                }
            }
        }

        #[test]
        fn radicals_equal_themselves_under_perturbation(c in 1u32..50, r in 2u32..200, d in 1u32..20) {
            let forms = [
                format!("\\frac{{{c}\\sqrt{{{r}}}}}{{{d}}}"),
                format!("\\dfrac{{{c} \\sqrt{{ {r} }}}}{{{d}}}"),
                format!("${c}\\sqrt{{{r}}}/{d}$"),
                format!("\\boxed{{\\frac{{{c}}}{{{d}}}\\sqrt{{{r}}}}}"),
                format!("\\sqrt{{{}}}/{d}", u64::from(c) * u64::from(c) * u64::from(r)),
            ];
            for a in &forms {
                for b in &forms {
                    prop_assert!(answers_equal(a, b), "{} vs {}", a, b);
                }
            }
        }

        #[test]
        fn integers_match_exactly_when_equal(a in -100_000i64..100_000, b in -100_000i64..100_000) {
            let (sa, sb) = (a.to_string(), format!("{b}.0"));
            prop_assert_eq!(answers_equal(&sa, &sb), a == b);
            prop_assert_eq!(answers_equal(&sa, &format!("{a}.5")), false);
        }

        #[test]
        fn distinct_integers_never_match(a in -100_000i64..100_000, b in -100_000i64..100_000) {
            prop_assume!(a != b);
            let forms = |k: i64| vec![
                k.to_string(),
                format!("$\\boxed{{{k}}}$"),
                format!("\\text{{ {k} }}"),
                format!("\\dfrac{{{}}}{{2}}", 2 * k),
                format!("{k}.0"),
            ];
            for x in forms(a) {
                for y in forms(b) {
                    prop_assert!(!answers_equal(&x, &y), "{} vs {}", x, y);
                }
            }
        }

        #[test]
        fn answers_equal_their_normal_form(n in -1000i64..1000, d in 1i64..100, r in 1u32..100, pi in 0u32..2) {
            let pi = if pi == 1 { "\\pi" } else { "" };
            for s in [
                format!("\\frac{{{n}\\sqrt{{{r}}}{pi}}}{{{d}}}"),
                format!("({n}, \\frac{{{d}}}{{3}}]"),
                format!("\\{{{n}, {d}, \\sqrt{{{r}}}\\}}"),
                format!("{n} + {d}\\sqrt{{{r}}}"),
            ] {
                let canonical = normalize(&s);
                prop_assert!(answers_equal(&s, &canonical), "{} vs {}", s, canonical);
                prop_assert_eq!(normalize(&canonical), canonical.clone());
            }
        }

        #[test]
        fn equality_is_symmetric(a in "[-0-9./ ,()\\\\{}a-z^]{0,16}", b in "[-0-9./ ,()\\\\{}a-z^]{0,16}") {
            prop_assert_eq!(answers_equal(&a, &b), answers_equal(&b, &a));
            prop_assert!(answers_equal(&a, &a));
        }

        #[test]
        fn never_panics(s in "\\PC{0,64}", t in ".{0,32}") {
            let _ = normalize(&s);
            let _ = extract_answer(&s, true);
            let _ = extract_boxed(&s);
            let _ = answers_equal(&s, &t);
            let _ = grade_response(&t, &s, true);
        }

        #[test]
        fn never_panics_on_latex_soup(s in "(\\\\boxed|\\\\frac|\\\\sqrt|\\\\pi|\\\\\\{|\\\\\\}|\\{|\\}|\\(|\\)|\\[|\\]|\\^|[0-9]|,|/|-| |\\\\text|\\\\left|\\\\right|\\$|\\\\)*") {
            let _ = normalize(&s);
            let _ = extract_answer(&s, true);
            let _ = answers_equal(&s, "1");
        }
    }
}
