//! Finding the final answer in a model's response.

use super::{Extracted, ExtractionMethod};

/// The content of the last brace-matched `\boxed{...}` or `\fbox{...}` (or
/// `\boxed 5`, a box without braces). Empty boxes and boxes whose braces
/// never close are skipped, so an earlier complete box can still be found.
pub fn extract_boxed(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let closes = brace_matches(&chars);
    let mut found: Option<(usize, usize)> = None;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '\\' {
            i += 1;
            continue;
        }
        let name_end = chars[i + 1..]
            .iter()
            .position(|c| !c.is_ascii_alphabetic())
            .map_or(chars.len(), |p| i + 1 + p);
        let name = &chars[i + 1..name_end];
        if name != ['b', 'o', 'x', 'e', 'd'] && name != ['f', 'b', 'o', 'x'] {
            i = name_end.max(i + 1);
            continue;
        }
        let mut k = name_end;
        while k < chars.len() && chars[k].is_whitespace() {
            k += 1;
        }
        let span = if chars.get(k) == Some(&'{') {
            closes[k].map(|close| (k + 1, close))
        } else if k > name_end {
            // `\boxed 5`: the next whitespace-delimited token, less
            // sentence punctuation.
            let mut end = chars[k..]
                .iter()
                .position(|c| c.is_whitespace() || *c == '$')
                .map_or(chars.len(), |p| k + p);
            while end > k && matches!(chars[end - 1], '.' | ',' | ';') {
                end -= 1;
            }
            Some((k, end))
        } else {
            None
        };
        if let Some((a, b)) = span.filter(|&(a, b)| chars[a..b].iter().any(|c| !c.is_whitespace()))
        {
            found = Some((a, b));
        }
        // Continue inside the box: a nested box starts later and wins.
        i = name_end;
    }
    found.map(|(a, b)| chars[a..b].iter().collect::<String>().trim().to_string())
}

/// For each `{`, the index of its matching `}` (one pass; escaped braces
/// `\{ \}` are skipped).
fn brace_matches(chars: &[char]) -> Vec<Option<usize>> {
    let mut closes = vec![None; chars.len()];
    let mut stack = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '{' => stack.push(i),
            '}' => {
                if let Some(open) = stack.pop() {
                    closes[open] = Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    closes
}

/// Phrases introducing an answer, matched case-insensitively.
const ANSWER_MARKERS: &[&str] = &["the answer is", "answer is", "answer:"];

/// The text after the last "the answer is" / "answer:" phrase, up to the
/// end of the line or of the sentence.
fn answer_is(text: &str) -> Option<String> {
    // ASCII lowercasing keeps byte offsets valid.
    let lower = text.to_ascii_lowercase();
    let (at, marker) = ANSWER_MARKERS
        .iter()
        .filter_map(|m| lower.rfind(m).map(|at| (at, *m)))
        .max_by_key(|&(at, m)| (at + m.len(), m.len()))?;
    let rest = &text[at + marker.len()..];
    let line = rest.lines().next().unwrap_or("");
    // End at a sentence period: a '.' followed by whitespace or the end, and
    // not part of a decimal number.
    let chars: Vec<char> = line.chars().collect();
    let mut end = chars.len();
    for (i, &c) in chars.iter().enumerate() {
        if c == '.' && chars.get(i + 1).is_none_or(|n| n.is_whitespace()) {
            end = i;
            break;
        }
    }
    let answer: String = chars[..end].iter().collect();
    let answer = answer
        .trim()
        .trim_start_matches([':', '*'])
        .trim_end_matches(['*', ',', ';', '!'])
        .trim();
    let answer = answer
        .strip_prefix('$')
        .and_then(|a| a.strip_suffix('$'))
        .unwrap_or(answer)
        .trim();
    (!answer.is_empty()).then(|| answer.to_string())
}

/// The last number in the text: `-12`, `3.5`, `1,000` or `7/2`.
fn last_number(text: &str) -> Option<String> {
    let chars: Vec<char> = text.chars().collect();
    let mut last = None;
    let mut i = 0;
    while i < chars.len() {
        if !chars[i].is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = if i > 0 && chars[i - 1] == '-' {
            i - 1
        } else {
            i
        };
        let mut j = i;
        while j < chars.len() {
            let c = chars[j];
            let next_digit = chars.get(j + 1).is_some_and(char::is_ascii_digit);
            if c.is_ascii_digit() || (matches!(c, '.' | '/') && next_digit) {
                j += 1;
            } else if c == ','
                && chars.len() >= j + 4
                && chars[j + 1..j + 4].iter().all(char::is_ascii_digit)
                && !chars.get(j + 4).is_some_and(char::is_ascii_digit)
            {
                j += 4;
            } else {
                break;
            }
        }
        last = Some(chars[start..j].iter().collect::<String>());
        i = j;
    }
    last
}

/// See [`super::extract_answer`].
pub(crate) fn extract(text: &str, fallbacks: bool) -> Option<Extracted> {
    if let Some(answer) = extract_boxed(text) {
        return Some(Extracted {
            answer,
            method: ExtractionMethod::Boxed,
        });
    }
    if !fallbacks {
        return None;
    }
    if let Some(answer) = answer_is(text) {
        return Some(Extracted {
            answer,
            method: ExtractionMethod::AnswerIs,
        });
    }
    last_number(text).map(|answer| Extracted {
        answer,
        method: ExtractionMethod::LastNumber,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_last_wins_and_nests() {
        assert_eq!(
            extract_boxed("\\boxed{1} then \\boxed{\\frac{1}{2}}").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(
            extract_boxed("so \\boxed{\\{1, \\frac{2}{3}\\}}.").as_deref(),
            Some("\\{1, \\frac{2}{3}\\}")
        );
        assert_eq!(extract_boxed("\\fbox{7}").as_deref(), Some("7"));
        assert_eq!(extract_boxed("$\\boxed 5$.").as_deref(), Some("5"));
        assert_eq!(
            extract_boxed("\\boxed{12} and \\boxed{3").as_deref(),
            Some("12")
        );
        assert_eq!(extract_boxed("\\boxed{}"), None);
        assert_eq!(extract_boxed("\\boxedx{3}"), None);
        assert_eq!(extract_boxed("no box here 42"), None);
        assert_eq!(extract_boxed("\\boxed{\\boxed{9}}").as_deref(), Some("9"));
    }

    #[test]
    fn deeply_nested_boxes_are_fast() {
        let n = 20_000;
        let text = format!("{}7{}", "\\boxed{".repeat(n), "}".repeat(n));
        assert_eq!(extract_boxed(&text).as_deref(), Some("7"));
        let unclosed = "\\boxed{".repeat(n);
        assert_eq!(extract_boxed(&unclosed), None);
    }

    #[test]
    fn answer_is_phrases() {
        assert_eq!(
            answer_is("So the answer is 3.5. Done.").as_deref(),
            Some("3.5")
        );
        assert_eq!(
            answer_is("The answer is $\\frac{1}{2}$.").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(answer_is("Answer: 12\nmore").as_deref(), Some("12"));
        assert_eq!(answer_is("**Final Answer:** 7").as_deref(), Some("7"));
        assert_eq!(
            answer_is("answer is 1; the answer is 2").as_deref(),
            Some("2")
        );
        assert_eq!(answer_is("no phrase"), None);
    }

    #[test]
    fn last_number_forms() {
        assert_eq!(
            last_number("x = 3, then -12.5 apples").as_deref(),
            Some("-12.5")
        );
        assert_eq!(
            last_number("total 1,000 dollars.").as_deref(),
            Some("1,000")
        );
        assert_eq!(last_number("ratio 7/2.").as_deref(), Some("7/2"));
        assert_eq!(last_number("none"), None);
    }
}
