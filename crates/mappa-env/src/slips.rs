//! The mistakes the arith workflow's agents make, as the warm-start teacher
//! makes them at its error rates and as a simulated coach that re-derives
//! an action makes them at its own slip rate (so that the coach's errors
//! look like the agents' own).

use mappa_core::rng::RngStream;
use serde::{Deserialize, Serialize};

/// What a wrong action looks like.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlipKind {
    /// One number changed by a small amount, anywhere: the models learn
    /// uncertain digits everywhere.
    #[default]
    Digit,
    /// A fixed mistake per role, made whole: the roles that write or relay
    /// the expression (Problem Solver, Plan Checker, Code Executor) leave
    /// out its last operation; the roles that relay or box the printed value
    /// (Output Reader, Verifier) append a `0`. Every digit copied is right, so the error is one
    /// decision per action that training can find and unlearn.
    Structural,
}

/// Change one number of `text` by a small non-zero amount (a plausible slip).
pub fn perturb_number(text: &str, rng: &mut RngStream) -> String {
    let mut spans = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    let Some(&(start, end)) = spans.get(rng.below(spans.len().max(1) as u64) as usize) else {
        return format!("{text}1");
    };
    let value: i64 = text[start..end].parse().unwrap_or(0);
    let delta = [1i64, -1, 2, -2, 3][rng.below(5) as usize];
    let new = if value + delta < 0 {
        value + 1
    } else {
        value + delta
    };
    format!("{}{new}{}", &text[..start], &text[end..])
}

/// `expr` with its last operation left out: `pow(a, k, m)` -> `pow(a, k)`,
/// `(a op b) op c` -> `(a op b)`; an expression of one term gains ` + 1`.
pub fn drop_last_step(expr: &str) -> String {
    if let Some(head) = expr
        .strip_prefix("pow(")
        .and_then(|e| e.rsplit_once(", "))
        .map(|(h, _)| h)
    {
        return format!("pow({head})");
    }
    match expr.rsplit_once(' ').and_then(|(h, _)| h.rsplit_once(' ')) {
        Some((head, _)) if !head.is_empty() => head.to_string(),
        _ => format!("{expr} + 1"),
    }
}

/// One role's mistake of `kind` on the text it would have written (a plan
/// or program expression, or a value read from the program's output).
pub fn slip(kind: SlipKind, role: &str, text: &str, rng: &mut RngStream) -> String {
    match (kind, role) {
        (SlipKind::Digit, _) => perturb_number(text, rng),
        (SlipKind::Structural, "verifier" | "output_reader") => format!("{text}0"),
        (SlipKind::Structural, _) => drop_last_step(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_core::rng::SeedTree;

    #[test]
    fn structural_slips_leave_out_the_last_operation() {
        assert_eq!(drop_last_step("pow(45, 3, 4)"), "pow(45, 3)");
        assert_eq!(drop_last_step("(51 * 29 + 39) % 81"), "(51 * 29 + 39)");
        assert_eq!(drop_last_step("(12 - 7) * 3"), "(12 - 7)");
        assert_eq!(drop_last_step("17"), "17 + 1");
        let mut rng = SeedTree::new(1).stream("t");
        assert_eq!(
            slip(SlipKind::Structural, "verifier", "42", &mut rng),
            "420"
        );
        assert_eq!(
            slip(
                SlipKind::Structural,
                "code_executor",
                "pow(2, 5, 7)",
                &mut rng
            ),
            "pow(2, 5)"
        );
        assert_eq!(
            slip(SlipKind::Structural, "output_reader", "42", &mut rng),
            "420"
        );
        assert_eq!(
            slip(
                SlipKind::Structural,
                "plan_checker",
                "(12 - 7) * 3",
                &mut rng
            ),
            "(12 - 7)"
        );
        let digit = slip(SlipKind::Digit, "verifier", "42", &mut rng);
        assert_ne!(digit, "42");
        assert_eq!(digit.len(), 2);
    }
}
