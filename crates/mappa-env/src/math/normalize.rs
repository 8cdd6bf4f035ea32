//! Cleaning an answer string: LaTeX presentation commands, math delimiters,
//! units, degree and percent signs, thousands separators.
//!
//! [`clean`] only rewrites text; turning the result into a value is
//! [`super::value`]'s job.

/// Commands whose braced argument is kept and the command dropped.
const UNWRAP: &[&str] = &[
    "text",
    "textbf",
    "textit",
    "textrm",
    "textnormal",
    "textup",
    "mathrm",
    "mathbf",
    "mathit",
    "mathsf",
    "mathtt",
    "mbox",
    "boxed",
    "fbox",
    "operatorname",
];
/// Commands dropped outright (sizing, `\left`/`\right`, degrees).
const DROP: &[&str] = &[
    "left",
    "right",
    "bigl",
    "bigr",
    "Bigl",
    "Bigr",
    "big",
    "Big",
    "displaystyle",
    "circ",
    "degree",
];
/// Commands rendered as a space.
const SPACE: &[&str] = &["quad", "qquad"];

/// Index of the `}` matching the `{` at `open`, skipping escaped braces.
pub(crate) fn matching_brace(chars: &[char], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = open;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 1,
            '{' => depth += 1,
            '}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Rewrite LaTeX commands: unwrap `\text{..}` and friends, drop `\left`,
/// `\right`, `\circ`, map `\dfrac`/`\tfrac` to `\frac` and spacing commands
/// to spaces. Unknown commands are kept verbatim.
fn rewrite_commands(chars: &[char], out: &mut String, depth: usize) {
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c != '\\' {
            out.push(c);
            i += 1;
            continue;
        }
        let Some(&next) = chars.get(i + 1) else {
            out.push(c);
            break;
        };
        if !next.is_ascii_alphabetic() {
            match next {
                '!' | '$' | '%' | '(' | ')' | '[' | ']' => {}
                ',' | ';' | ':' | ' ' | '\\' => out.push(' '),
                _ => {
                    out.push('\\');
                    out.push(next);
                }
            }
            i += 2;
            continue;
        }
        let mut j = i + 1;
        while j < chars.len() && chars[j].is_ascii_alphabetic() {
            j += 1;
        }
        let name: String = chars[i + 1..j].iter().collect();
        if UNWRAP.contains(&name.as_str()) && depth < 32 {
            let mut k = j;
            while k < chars.len() && chars[k].is_whitespace() {
                k += 1;
            }
            if chars.get(k) == Some(&'{') {
                if let Some(close) = matching_brace(chars, k) {
                    out.push(' ');
                    rewrite_commands(&chars[k + 1..close], out, depth + 1);
                    out.push(' ');
                    i = close + 1;
                    continue;
                }
            }
            i = j;
        } else if DROP.contains(&name.as_str()) {
            i = j;
        } else if SPACE.contains(&name.as_str()) {
            out.push(' ');
            i = j;
        } else if matches!(name.as_str(), "dfrac" | "tfrac" | "cfrac") {
            out.push_str("\\frac");
            i = j;
        } else {
            out.push('\\');
            out.push_str(&name);
            i = j;
        }
    }
}

/// `-1,234,567.5` (comma groups) or `1 000` (space groups): the number with
/// the separators removed, when the whole string is such a number.
fn strip_thousands(s: &str) -> Option<String> {
    let body = s.strip_prefix('-').unwrap_or(s);
    let (int_part, frac) = match body.split_once('.') {
        Some((a, b)) if !b.is_empty() && b.chars().all(|c| c.is_ascii_digit()) => (a, Some(b)),
        Some(_) => return None,
        None => (body, None),
    };
    let sep = if int_part.contains(',') { ',' } else { ' ' };
    let groups: Vec<&str> = int_part.split(sep).collect();
    let digits = |g: &str| g.chars().all(|c| c.is_ascii_digit());
    let ok = groups.len() > 1
        && (1..=3).contains(&groups[0].len())
        && digits(groups[0])
        && groups[1..].iter().all(|g| g.len() == 3 && digits(g));
    if !ok {
        return None;
    }
    let mut out = String::new();
    if s.starts_with('-') {
        out.push('-');
    }
    out.push_str(&groups.concat());
    if let Some(f) = frac {
        out.push('.');
        out.push_str(f);
    }
    Some(out)
}

/// A unit word such as `cm`, `units`, `m^2`, `km/h` (two letters or more:
/// a single letter is more likely a variable, as in `2\pi r`).
fn is_unit_token(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && t.chars().filter(char::is_ascii_alphabetic).count() >= 2
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || "^/.{}".contains(c))
}

/// Drop `x =` (a short identifier and `=`) in front of an answer.
fn strip_assignment(s: &str) -> &str {
    match s.split_once('=') {
        Some((lhs, rhs)) if !rhs.contains('=') => {
            let lhs = lhs.trim();
            let ident = lhs.len() <= 3
                && lhs.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
                && lhs.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if ident && !rhs.trim().is_empty() {
                rhs.trim()
            } else {
                s
            }
        }
        _ => s,
    }
}

/// Strip trailing unit words after a number (`5 cm` -> `5`,
/// `12 square units` -> `12`).
fn strip_units(s: &str) -> String {
    let tokens: Vec<&str> = s.split(' ').collect();
    let units = tokens.iter().rev().take_while(|t| is_unit_token(t)).count();
    let core = tokens[..tokens.len() - units].join(" ");
    if units > 0 && core.ends_with(|c: char| c.is_ascii_digit() || c == '}' || c == ')') {
        core
    } else {
        s.to_string()
    }
}

/// Clean an answer string into the form the value parser reads: no `$`,
/// no presentation commands, single spaces, no trailing period, no units
/// or thousands separators, no degree or percent signs (a percentage is
/// compared as its number: `50\%` is 50, the AIME/AMC convention).
pub(crate) fn clean(answer: &str) -> String {
    let mut s = String::with_capacity(answer.len());
    for c in answer.chars() {
        match c {
            '\u{2212}' | '\u{2013}' => s.push('-'),
            '\u{3c0}' => s.push_str("\\pi "),
            '\u{221e}' => s.push_str("\\infty "),
            '\u{d7}' => s.push_str("\\times "),
            '\u{b7}' | '\u{22c5}' => s.push_str("\\cdot "),
            '\u{f7}' => s.push_str("\\div "),
            '\u{221a}' => s.push_str("\\sqrt"),
            '\u{222a}' => s.push_str("\\cup "),
            '\u{b0}' => {}
            _ => s.push(c),
        }
    }
    let chars: Vec<char> = s.chars().collect();
    let mut s = String::with_capacity(chars.len());
    rewrite_commands(&chars, &mut s, 0);
    let s = s
        .replace(['$', '%'], "")
        .replace('~', " ")
        .replace("{,}", ",");
    let mut s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    // What a dropped `\circ` leaves behind: `^{}`, `^{ }` or a bare `^`.
    s = s
        .replace("^{ }", "")
        .replace("^{}", "")
        .replace("^ {}", "")
        .replace(" ^", "^");
    loop {
        let t = s.trim_end_matches(['.', ' ', '^']);
        if t.len() == s.len() {
            break;
        }
        s = t.to_string();
    }
    let s = strip_assignment(s.trim());
    let s = strip_units(s);
    strip_thousands(&s).unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleans_presentation() {
        assert_eq!(clean("$\\dfrac{1}{2}$"), "\\frac{1}{2}");
        assert_eq!(clean("\\left( 1, 2 \\right)"), "( 1, 2 )");
        assert_eq!(clean("336^\\circ"), "336");
        assert_eq!(clean("336^{\\circ}"), "336");
        assert_eq!(clean("30°"), "30");
        assert_eq!(clean("50\\%"), "50");
        assert_eq!(clean("\\$1,000"), "1000");
        assert_eq!(clean("1{,}000."), "1000");
        assert_eq!(clean("1\\,000"), "1000");
        assert_eq!(clean("5 \\text{ cm}"), "5");
        assert_eq!(clean("5\\,\\mathrm{cm}^2"), "5");
        assert_eq!(clean("x = \\frac{\\pi}{4}"), "\\frac{\\pi}{4}");
        assert_eq!(clean("\\boxed{\\textbf{42}}"), "42");
        assert_eq!(clean("\\{1, 2\\}"), "\\{1, 2\\}");
        assert_eq!(clean("\\rightarrow"), "\\rightarrow");
        assert_eq!(clean("3 1/2"), "3 1/2");
        assert_eq!(clean("1,2"), "1,2");
        assert_eq!(clean("12 square units"), "12");
        assert_eq!(clean("2\\pi r"), "2\\pi r");
        assert_eq!(clean("5 and 6"), "5 and 6");
        assert_eq!(clean("cm"), "cm");
    }
}
