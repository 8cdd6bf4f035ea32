//! The mistakes the arith workflow's agents make, as the warm-start teacher
//! makes them at its error rates and as a simulated coach that re-derives
//! an action makes them at its own slip rate (so that the coach's errors
//! look like the agents' own).
//!
//! Both may slip more often on harder instances: [`difficulty`] is a
//! feature of the plan an action writes or relays (the operation a
//! structural slip leaves out and the size of its operand), and
//! [`slip_probability`] tilts a base rate by it ([`rate_for`]; a relayed
//! value slips at the base rate). When the teacher and
//! the coach tilt by the same feature, the agents (who learn the teacher's
//! mistakes) and the coach tend to fail on the same instances.

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

/// How hard a plan (a Python expression) is to get right, in [0, 1]: three
/// parts the weight of its last operation (the one a structural slip leaves
/// out: `+` 0, `-` 0.5, anything else 1) to one part the magnitude of its
/// last operand, `ln(n) / ln(1000)` clamped to [0, 1] (one-digit operands
/// are easy, three-digit ones hard). `None` for a plain value (what the
/// value relays hand on): their slip (a `0` appended) does not depend on
/// the problem.
pub fn difficulty(text: &str) -> Option<f64> {
    let text = text.trim();
    if text.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let body = text.strip_suffix(')').unwrap_or(text);
    let digits = body.chars().rev().take_while(char::is_ascii_digit).count();
    let (before, last_operand) = body.split_at(body.len() - digits);
    let operation = match before.trim_end().chars().last() {
        Some('+') => 0.0,
        Some('-') => 0.5,
        _ => 1.0,
    };
    let n: f64 = last_operand.parse().unwrap_or(0.0);
    let magnitude = (n.max(1.0).ln() / 1000f64.ln()).clamp(0.0, 1.0);
    Some(0.75 * operation + 0.25 * magnitude)
}

/// The slip probability of an action on `text` at base `rate`: tilted by
/// the text's [`difficulty`] with `weight` ([`slip_probability`]), or
/// `rate` for a plain value.
pub fn rate_for(rate: f64, weight: f64, text: &str) -> f64 {
    difficulty(text).map_or(rate, |d| slip_probability(rate, weight, d))
}

/// The largest difficulty weight a configuration may set: at 8 nearly all
/// slips fall on instances harder than 0.75.
pub const MAX_DIFFICULTY_WEIGHT: f64 = 8.0;

/// A slip probability tilted by difficulty: `rate * (1 + w) * d^w`,
/// clamped to [0, 1]. With `w = 0` it is `rate` on every instance; as `w`
/// grows the slips concentrate on the hardest instances (`d` near 1), and
/// over difficulties spread evenly on [0, 1] the mean stays `rate`.
pub fn slip_probability(rate: f64, weight: f64, d: f64) -> f64 {
    debug_assert!((0.0..=MAX_DIFFICULTY_WEIGHT).contains(&weight));
    (rate * (1.0 + weight) * d.powf(weight)).clamp(0.0, 1.0)
}

/// The value of an integer expression of the generated problems' plans
/// (`+ - * % **`, parentheses, `pow(a, k)` and `pow(a, k, m)`), with
/// Python's semantics (`%` takes the divisor's sign); `None` for anything
/// else, or on overflow.
pub fn evaluate(expr: &str) -> Option<i128> {
    let tokens = tokenize(expr)?;
    let mut parser = Parser { tokens, at: 0 };
    let value = parser.sum()?;
    (parser.at == parser.tokens.len()).then_some(value)
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(i128),
    Op(&'static str),
    Open,
    Close,
    Comma,
    Pow,
}

fn tokenize(expr: &str) -> Option<Vec<Token>> {
    let mut tokens = Vec::new();
    let mut rest = expr.trim();
    while !rest.is_empty() {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        let (token, len) = if digits > 0 {
            (Token::Number(rest[..digits].parse().ok()?), digits)
        } else if rest.starts_with("pow(") {
            (Token::Pow, 3)
        } else if rest.starts_with("**") {
            (Token::Op("**"), 2)
        } else {
            let token = match rest.as_bytes()[0] {
                b'+' => Token::Op("+"),
                b'-' => Token::Op("-"),
                b'*' => Token::Op("*"),
                b'%' => Token::Op("%"),
                b'(' => Token::Open,
                b')' => Token::Close,
                b',' => Token::Comma,
                _ => return None,
            };
            (token, 1)
        };
        tokens.push(token);
        rest = rest[len..].trim_start();
    }
    Some(tokens)
}

/// A recursive-descent parser over [`Token`]s: sums of products of powers.
struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

impl Parser {
    fn eat(&mut self, token: &Token) -> bool {
        let hit = self.tokens.get(self.at) == Some(token);
        self.at += usize::from(hit);
        hit
    }

    fn sum(&mut self) -> Option<i128> {
        let mut value = self.product()?;
        loop {
            if self.eat(&Token::Op("+")) {
                value = value.checked_add(self.product()?)?;
            } else if self.eat(&Token::Op("-")) {
                value = value.checked_sub(self.product()?)?;
            } else {
                return Some(value);
            }
        }
    }

    fn product(&mut self) -> Option<i128> {
        let mut value = self.power()?;
        loop {
            if self.eat(&Token::Op("*")) {
                value = value.checked_mul(self.power()?)?;
            } else if self.eat(&Token::Op("%")) {
                let m = self.power()?;
                value = value.checked_rem_euclid(m)?;
                if m < 0 && value != 0 {
                    value += m;
                }
            } else {
                return Some(value);
            }
        }
    }

    fn power(&mut self) -> Option<i128> {
        let base = self.atom()?;
        if self.eat(&Token::Op("**")) {
            let exponent = u32::try_from(self.power()?).ok()?;
            return base.checked_pow(exponent);
        }
        Some(base)
    }

    fn atom(&mut self) -> Option<i128> {
        if self.eat(&Token::Op("-")) {
            return self.atom()?.checked_neg();
        }
        if self.eat(&Token::Pow) {
            return self.pow_call();
        }
        if self.eat(&Token::Open) {
            let value = self.sum()?;
            return self.eat(&Token::Close).then_some(value);
        }
        match self.tokens.get(self.at)? {
            Token::Number(n) => {
                self.at += 1;
                Some(*n)
            }
            _ => None,
        }
    }

    /// `pow(a, k)` or `pow(a, k, m)`, after `pow`.
    fn pow_call(&mut self) -> Option<i128> {
        if !self.eat(&Token::Open) {
            return None;
        }
        let mut args = vec![self.sum()?];
        while self.eat(&Token::Comma) {
            args.push(self.sum()?);
        }
        if !self.eat(&Token::Close) {
            return None;
        }
        match args[..] {
            [a, k] => a.checked_pow(u32::try_from(k).ok()?),
            [a, k, m] if m > 0 && k >= 0 => {
                let (mut result, mut base, mut k) = (1i128, a.rem_euclid(m), k);
                while k > 0 {
                    if k & 1 == 1 {
                        result = result * base % m;
                    }
                    base = base * base % m;
                    k >>= 1;
                }
                Some(result % m)
            }
            _ => None,
        }
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

    #[test]
    fn difficulty_weighs_the_operation_left_out_and_the_operand() {
        assert!(difficulty("(3 + 4) + 2") < difficulty("(3 + 4) - 2"));
        assert!(difficulty("(3 + 4) - 2") < difficulty("(3 + 4) * 2"));
        assert!(difficulty("(3 + 4) + 2") < difficulty("(3 + 4) + 20"));
        assert_eq!(
            difficulty("pow(45, 3, 4)"),
            Some(0.75 + 0.25 * (4f64.ln() / 1000f64.ln()))
        );
        assert_eq!(difficulty("999"), None, "a value");
        assert_eq!(difficulty("x"), Some(0.75));
        assert_eq!(rate_for(0.3, 2.0, "999"), 0.3);
        assert_eq!(
            rate_for(0.3, 2.0, "(3 + 4) + 1"),
            slip_probability(0.3, 2.0, 0.0)
        );
        for d in [0.0, 0.3, 1.0] {
            assert_eq!(slip_probability(0.2, 0.0, d), 0.2);
        }
        assert_eq!(slip_probability(0.2, 1.0, 0.0), 0.0);
        assert!((slip_probability(0.2, 1.0, 1.0) - 0.4).abs() < 1e-12);
        assert!((slip_probability(0.2, 3.0, 0.5) - 0.1).abs() < 1e-12);
        assert_eq!(slip_probability(0.8, 1.0, 1.0), 1.0);
        // The mean over evenly spread difficulties is the rate.
        let mean = (0..10_000)
            .map(|i| slip_probability(0.1, 4.0, (f64::from(i) + 0.5) / 10_000.0))
            .sum::<f64>()
            / 10_000.0;
        assert!((mean - 0.1).abs() < 1e-6, "{mean}");
    }

    #[test]
    fn plans_evaluate_as_python_would() {
        assert_eq!(evaluate("(12 - 7) * 5 + 1"), Some(26));
        assert_eq!(evaluate("(51 * 29 + 39) % 81"), Some((51 * 29 + 39) % 81));
        assert_eq!(evaluate("pow(45, 3, 4)"), Some(45i128.pow(3) % 4));
        assert_eq!(evaluate("pow(45, 3)"), Some(45i128.pow(3)));
        assert_eq!(evaluate("2 ** 3 ** 2"), Some(512));
        assert_eq!(evaluate("-7 % 3"), Some(2));
        assert_eq!(evaluate("7 % -3"), Some(-2));
        assert_eq!(evaluate("3 - 2 - 1"), Some(0));
        assert_eq!(evaluate("(1 + 2"), None);
        assert_eq!(evaluate("sum(int(d) for d in str(5))"), None);
        assert_eq!(evaluate("9 ** 99"), None, "overflow");
        assert_eq!(evaluate("5 % 0"), None);
    }
}
