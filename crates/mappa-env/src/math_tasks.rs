//! A seeded generator of small AIME-format problems for CPU-scale experiments.
//!
//! Every problem has an integer answer in `0..=999`, a contest-style prompt
//! ending with [`BOXED_INSTRUCTION`], canonical solution steps (short
//! sentences carrying the intermediate values, the last one
//! `"The answer is N."`), and a short standard-library Python 3 program that
//! prints the answer, so the generator can be checked independently.
//!
//! Four tiers, each with two forms, chosen so that a tiny model could
//! plausibly learn them:
//!
//! - [`Tier::Arithmetic`]: `(a op b) op c` with `op` in `+ - ×`, two- and
//!   three-digit operands (one-digit multipliers).
//! - [`Tier::Modular`]: `a^k mod m`, or `(a × b + c) mod m`.
//! - [`Tier::DigitSum`]: the digit sum of `a × b`, or of `a^k`.
//! - [`Tier::Counting`]: integers in `[1, N]` divisible by `p` or `q`, or
//!   `C(n, k) <= 999`.
//!
//! Two more tiers are not in the mix: [`Tier::SmallArithmetic`] (`(a op b)
//! op c` with operands up to 20), for the smallest models, whose copying of
//! long numbers is what fails first; and [`Tier::OneStep`] (`a op b` in plain
//! words, no TeX), for small pretrained models that cannot yet chain two
//! operations.
//!
//! Problem `i` of tier `t` under `seed` is drawn from the stream
//! `SeedTree::new(seed).stream("math_tasks/{t}/{i}")`. A candidate whose
//! program equals an earlier problem's of the same batch is redrawn from the
//! same stream, so a batch holds no duplicates, and problem `i` depends only
//! on `(t, seed, i)` and the problems before it: `generate(t, m, seed)` is
//! always a prefix of `generate(t, n, seed)` for `m <= n`.

use std::collections::HashSet;
use std::fmt;

use mappa_core::{RngStream, SeedTree};

pub use crate::datasets::BOXED_INSTRUCTION;

/// How many candidates are drawn for one problem before giving up on finding
/// one that differs from the earlier problems of its batch.
const MAX_ATTEMPTS: usize = 10_000;

/// The kind of a generated problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// Chained arithmetic: `(a op b) op c`.
    Arithmetic,
    /// Modular arithmetic: `a^k mod m` or `(a × b + c) mod m`.
    Modular,
    /// Digit sums of a product or of a power.
    DigitSum,
    /// Small counting: divisibility by inclusion-exclusion, or binomial coefficients.
    Counting,
    /// Chained arithmetic on small numbers: `(a op b) op c`, operands 2 to 20
    /// (multipliers 2 to 9). Not in [`Tier::ALL`].
    SmallArithmetic,
    /// One operation in plain words: `What is a + b?`, `a - b`, `a times b`,
    /// operands 2 to 20 (multipliers 2 to 9). Not in [`Tier::ALL`].
    OneStep,
}

impl Tier {
    /// Every tier, in the order [`generate_mix`] cycles through them.
    pub const ALL: [Tier; 4] = [
        Tier::Arithmetic,
        Tier::Modular,
        Tier::DigitSum,
        Tier::Counting,
    ];

    /// The tier's snake_case name, as in its serde form and in stream names.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Arithmetic => "arithmetic",
            Tier::Modular => "modular",
            Tier::DigitSum => "digit_sum",
            Tier::Counting => "counting",
            Tier::SmallArithmetic => "small_arithmetic",
            Tier::OneStep => "one_step",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One generated problem.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GeneratedProblem {
    /// `"{tier}-{seed}-{index}"`, e.g. `"modular-42-7"`.
    pub id: String,
    /// The problem's tier.
    pub tier: Tier,
    /// The statement, ending with [`BOXED_INSTRUCTION`].
    pub prompt: String,
    /// The answer, in `0..=999`.
    pub answer: u32,
    /// Canonical solution steps, each a short sentence with an intermediate
    /// value; the last is `"The answer is {answer}."`.
    pub steps: Vec<String>,
    /// A short Python 3 program (standard library only) that prints the answer.
    pub program: String,
}

impl GeneratedProblem {
    /// The statement without the trailing [`BOXED_INSTRUCTION`].
    pub fn statement(&self) -> &str {
        self.prompt
            .strip_suffix(BOXED_INSTRUCTION)
            .map_or(self.prompt.as_str(), str::trim_end)
    }

    /// The Python expression whose value is the answer: the argument of the
    /// program's final `print(...)` (imports above it stay in [`Self::program`]).
    pub fn expression(&self) -> &str {
        let last = self.program.lines().last().unwrap_or_default();
        last.strip_prefix("print(")
            .and_then(|e| e.strip_suffix(')'))
            .unwrap_or(last)
    }

    /// The program's lines before the final `print(...)` (imports), with a trailing newline when any.
    pub fn preamble(&self) -> String {
        let lines: Vec<&str> = self.program.lines().collect();
        lines[..lines.len().saturating_sub(1)]
            .iter()
            .map(|l| format!("{l}\n"))
            .collect()
    }
}

/// `n` distinct problems of `tier` under `seed` (see the module docs for the
/// streams and the prefix property).
///
/// # Panics
///
/// If no new problem is found in 10 000 draws, which happens only when `n`
/// approaches the size of the tier's problem space (tens of thousands at least).
pub fn generate(tier: Tier, n: usize, seed: u64) -> Vec<GeneratedProblem> {
    let tree = SeedTree::new(seed);
    let mut seen = HashSet::with_capacity(n);
    let mut problems = Vec::with_capacity(n);
    for i in 0..n {
        let mut stream = tree.stream(&format!("math_tasks/{tier}/{i}"));
        let draft = (0..MAX_ATTEMPTS)
            .map(|_| draft(tier, &mut stream))
            .find(|d| seen.insert(d.program.clone()))
            .unwrap_or_else(|| {
                panic!("math_tasks: no new {tier} problem for index {i} in {MAX_ATTEMPTS} draws")
            });
        debug_assert!(draft.answer <= 999);
        let mut steps = draft.steps;
        steps.push(format!("The answer is {}.", draft.answer));
        problems.push(GeneratedProblem {
            id: format!("{tier}-{seed}-{i}"),
            tier,
            prompt: format!("{} {BOXED_INSTRUCTION}", draft.statement),
            answer: draft.answer,
            steps,
            program: draft.program,
        });
    }
    problems
}

/// `n` problems cycling through [`Tier::ALL`]: problem `i` is problem `i / 4`
/// of `generate(Tier::ALL[i % 4], _, seed)`, so it too depends only on `i`
/// and `seed`, never on `n`.
pub fn generate_mix(n: usize, seed: u64) -> Vec<GeneratedProblem> {
    generate_mix_of(&Tier::ALL, n, seed)
}

/// `n` problems cycling through `tiers` (as [`generate_mix`] does through all of them).
pub fn generate_mix_of(tiers: &[Tier], n: usize, seed: u64) -> Vec<GeneratedProblem> {
    let k = tiers.len().max(1);
    let mut per_tier: Vec<std::vec::IntoIter<GeneratedProblem>> = tiers
        .iter()
        .enumerate()
        .map(|(t, &tier)| generate(tier, n / k + usize::from(t < n % k), seed).into_iter())
        .collect();
    (0..n)
        .filter_map(|i| per_tier.get_mut(i % k)?.next())
        .collect()
}

/// A problem before its id, instruction and final step are attached.
struct Draft {
    statement: String,
    answer: u32,
    steps: Vec<String>,
    program: String,
}

fn draft(tier: Tier, s: &mut RngStream) -> Draft {
    let first_form = s.below(2) == 0;
    match (tier, first_form) {
        (Tier::Arithmetic, _) => arithmetic(s, false),
        (Tier::SmallArithmetic, _) => arithmetic(s, true),
        (Tier::OneStep, _) => one_step(s),
        (Tier::Modular, true) => modular_power(s),
        (Tier::Modular, false) => modular_linear(s),
        (Tier::DigitSum, true) => digit_sum_product(s),
        (Tier::DigitSum, false) => digit_sum_power(s),
        (Tier::Counting, true) => counting_divisible(s),
        (Tier::Counting, false) => counting_binomial(s),
    }
}

/// A uniform integer in `lo..=hi`.
fn range(s: &mut RngStream, lo: u64, hi: u64) -> u64 {
    lo + s.below(hi - lo + 1)
}

/// A uniform element of `items` (non-empty).
fn pick<'a>(s: &mut RngStream, items: &[&'a str]) -> &'a str {
    items[s.below(items.len() as u64) as usize]
}

fn to_answer(x: u64) -> u32 {
    u32::try_from(x).expect("answers are at most 999 by construction")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
    Mul,
}

impl Op {
    fn tex(self) -> &'static str {
        match self {
            Op::Add => "+",
            Op::Sub => "-",
            Op::Mul => "\\times",
        }
    }

    fn python(self) -> &'static str {
        match self {
            Op::Add => "+",
            Op::Sub => "-",
            Op::Mul => "*",
        }
    }

    fn apply(self, x: i64, y: i64) -> i64 {
        match self {
            Op::Add => x + y,
            Op::Sub => x - y,
            Op::Mul => x * y,
        }
    }
}

/// `a op b` in words (`What is 12 + 7?`), redrawn until the result is
/// non-negative; operands 2 to 20, multipliers 2 to 9.
fn one_step(s: &mut RngStream) -> Draft {
    const OPS: [Op; 3] = [Op::Add, Op::Sub, Op::Mul];
    loop {
        let op = OPS[s.below(3) as usize];
        let a = range(s, 2, 20) as i64;
        let b = match op {
            Op::Mul => range(s, 2, 9),
            _ => range(s, 2, 20),
        } as i64;
        let r = op.apply(a, b);
        if r < 0 {
            continue;
        }
        let word = match op {
            Op::Add => "+",
            Op::Sub => "-",
            Op::Mul => "times",
        };
        return Draft {
            statement: format!("What is {a} {word} {b}?"),
            answer: to_answer(r as u64),
            steps: vec![format!("${a} {} {b} = {r}$.", op.tex())],
            program: format!("print({a} {} {b})", op.python()),
        };
    }
}

/// `(a op1 b) op2 c`, redrawn until the intermediate is non-negative and the
/// result in `0..=999`; `small`: operands 2 to 20, multipliers 2 to 9.
fn arithmetic(s: &mut RngStream, small: bool) -> Draft {
    const OPS: [Op; 3] = [Op::Add, Op::Sub, Op::Mul];
    loop {
        let op1 = OPS[s.below(3) as usize];
        let op2 = OPS[s.below(3) as usize];
        if op1 == Op::Mul && op2 == Op::Mul {
            continue;
        }
        // Multipliers have one digit; the other operands two digits when a
        // multiplication follows, else two or three.
        let (a, b) = match (op1, op2, small) {
            (Op::Mul, _, true) => (range(s, 2, 20), range(s, 2, 9)),
            (_, _, true) => (range(s, 2, 20), range(s, 2, 20)),
            (Op::Mul, _, false) => (range(s, 10, 99), range(s, 2, 9)),
            (_, Op::Mul, false) => (range(s, 10, 99), range(s, 10, 99)),
            _ => (range(s, 10, 999), range(s, 10, 999)),
        };
        let c = match (op2, small) {
            (Op::Mul, _) => range(s, 2, 9),
            (_, true) => range(s, 2, 20),
            (_, false) => range(s, 10, 999),
        };
        let (a, b, c) = (a as i64, b as i64, c as i64);
        let t = op1.apply(a, b);
        let r = op2.apply(t, c);
        if t < 0 || !(0..=999).contains(&r) {
            continue;
        }
        let (o1, o2) = (op1.tex(), op2.tex());
        let expr = format!("({a} {o1} {b}) {o2} {c}");
        let lead = pick(
            s,
            &["Compute", "Evaluate", "Find the value of", "Calculate"],
        );
        return Draft {
            statement: format!("{lead} ${expr}$."),
            answer: to_answer(r as u64),
            steps: vec![
                format!("First, ${a} {o1} {b} = {t}$."),
                format!("Then, ${t} {o2} {c} = {r}$."),
            ],
            program: format!("print(({a} {} {b}) {} {c})", op1.python(), op2.python()),
        };
    }
}

/// The remainder of `a^k` modulo `m`, by successive multiplication.
fn modular_power(s: &mut RngStream) -> Draft {
    let a = range(s, 2, 50);
    let k = range(s, 2, 6);
    let m = range(s, 3, 97);
    let base = a % m;
    let mut steps = vec![format!("First, ${a} \\equiv {base} \\pmod{{{m}}}$.")];
    let mut r = base;
    for j in 2..=k {
        let product = r * base;
        let next = product % m;
        steps.push(format!(
            "Then ${a}^{{{j}}} \\equiv {r} \\times {base} = {product} \\equiv {next} \\pmod{{{m}}}$."
        ));
        r = next;
    }
    let statement = match s.below(2) {
        0 => format!("Find the remainder when ${a}^{{{k}}}$ is divided by ${m}$."),
        _ => format!("What is the remainder when ${a}^{{{k}}}$ is divided by ${m}$?"),
    };
    Draft {
        statement,
        answer: to_answer(r),
        steps,
        program: format!("print(pow({a}, {k}, {m}))"),
    }
}

/// The remainder of `a × b + c` modulo `m`.
fn modular_linear(s: &mut RngStream) -> Draft {
    let a = range(s, 10, 99);
    let b = range(s, 10, 99);
    let c = range(s, 1, 999);
    let m = range(s, 7, 999);
    let product = a * b;
    let sum = product + c;
    let (q, r) = (sum / m, sum % m);
    let statement = match s.below(2) {
        0 => format!("Find the remainder when ${a} \\times {b} + {c}$ is divided by ${m}$."),
        _ => format!("What is the remainder when ${a} \\cdot {b} + {c}$ is divided by ${m}$?"),
    };
    Draft {
        statement,
        answer: to_answer(r),
        steps: vec![
            format!("First, ${a} \\times {b} = {product}$."),
            format!("Then, ${product} + {c} = {sum}$."),
            format!("Since ${sum} = {q} \\times {m} + {r}$, the remainder is ${r}$."),
        ],
        program: format!("print(({a} * {b} + {c}) % {m})"),
    }
}

/// The sentence summing the digits of `n`, and the sum.
fn digit_sum_step(n: u64) -> (String, u64) {
    let digits: Vec<u64> = n.to_string().bytes().map(|d| u64::from(d - b'0')).collect();
    let sum = digits.iter().sum();
    let terms: Vec<String> = digits.iter().map(u64::to_string).collect();
    (
        format!(
            "The digits of ${n}$ sum to ${} = {sum}$.",
            terms.join(" + ")
        ),
        sum,
    )
}

/// The digit sum of `a × b`.
fn digit_sum_product(s: &mut RngStream) -> Draft {
    let a = range(s, 10, 999);
    let b = range(s, 10, 999);
    let n = a * b;
    let (step, sum) = digit_sum_step(n);
    let statement = match s.below(2) {
        0 => format!("What is the sum of the digits of the product ${a} \\times {b}$?"),
        _ => format!("Find the sum of the digits of ${a} \\cdot {b}$."),
    };
    Draft {
        statement,
        answer: to_answer(sum),
        steps: vec![format!("First, ${a} \\times {b} = {n}$."), step],
        program: format!("print(sum(int(d) for d in str({a} * {b})))"),
    }
}

/// The digit sum of `a^k` (at most 20^12, well within `u64`).
fn digit_sum_power(s: &mut RngStream) -> Draft {
    let a = range(s, 2, 20);
    let k = range(s, 2, 12);
    let n = a.pow(k as u32);
    let (step, sum) = digit_sum_step(n);
    let statement = match s.below(2) {
        0 => format!("What is the sum of the digits of ${a}^{{{k}}}$?"),
        _ => format!("Find the sum of the digits of the integer ${a}^{{{k}}}$."),
    };
    Draft {
        statement,
        answer: to_answer(sum),
        steps: vec![format!("First, ${a}^{{{k}}} = {n}$."), step],
        program: format!("print(sum(int(d) for d in str({a} ** {k})))"),
    }
}

fn gcd(mut x: u64, mut y: u64) -> u64 {
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

/// The count of integers in `[1, N]` divisible by `p` or `q`, by inclusion-exclusion.
fn counting_divisible(s: &mut RngStream) -> Draft {
    let big_n = range(s, 50, 999);
    let p = range(s, 2, 15);
    let q = loop {
        let q = range(s, 2, 15);
        if q != p {
            break q;
        }
    };
    let lcm = p / gcd(p, q) * q;
    let (x, y, z) = (big_n / p, big_n / q, big_n / lcm);
    let count = x + y - z;
    let statement = match s.below(2) {
        0 => format!(
            "How many integers between $1$ and ${big_n}$, inclusive, are divisible by ${p}$ or by ${q}$?"
        ),
        _ => format!(
            "Find the number of positive integers $n \\le {big_n}$ such that $n$ is a multiple of ${p}$ or of ${q}$."
        ),
    };
    Draft {
        statement,
        answer: to_answer(count),
        steps: vec![
            format!("There are $\\lfloor {big_n}/{p} \\rfloor = {x}$ multiples of ${p}$."),
            format!("There are $\\lfloor {big_n}/{q} \\rfloor = {y}$ multiples of ${q}$."),
            format!(
                "The multiples of both are the multiples of $\\operatorname{{lcm}}({p}, {q}) = {lcm}$, and there are $\\lfloor {big_n}/{lcm} \\rfloor = {z}$ of them."
            ),
            format!("By inclusion-exclusion, ${x} + {y} - {z} = {count}$."),
        ],
        program: format!(
            "print(sum(1 for n in range(1, {big_n} + 1) if n % {p} == 0 or n % {q} == 0))"
        ),
    }
}

/// `C(n, k)` with `2 <= k <= n / 2`, redrawn until it is at most 999.
fn counting_binomial(s: &mut RngStream) -> Draft {
    loop {
        let n = range(s, 4, 20);
        let k = range(s, 2, n / 2);
        let numerator: u64 = (n - k + 1..=n).product();
        let factorial: u64 = (1..=k).product();
        let count = numerator / factorial;
        if count > 999 {
            continue;
        }
        let statement = match s.below(2) {
            0 => format!(
                "In how many ways can a committee of ${k}$ people be chosen from a group of ${n}$ people?"
            ),
            _ => format!("How many ${k}$-element subsets does a set with ${n}$ elements have?"),
        };
        let factors: Vec<String> = (n - k + 1..=n).rev().map(|f| f.to_string()).collect();
        return Draft {
            statement,
            answer: to_answer(count),
            steps: vec![
                format!(
                    "The count is $\\binom{{{n}}}{{{k}}} = \\frac{{{}}}{{{k}!}}$.",
                    factors.join(" \\cdot ")
                ),
                format!("The numerator is ${numerator}$ and ${k}! = {factorial}$."),
                format!("So $\\binom{{{n}}}{{{k}}} = {numerator} / {factorial} = {count}$."),
            ],
            program: format!("import math\nprint(math.comb({n}, {k}))"),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tier_names_match_serde_and_display() {
        for tier in Tier::ALL {
            let json = serde_json::to_string(&tier).unwrap();
            assert_eq!(json, format!("\"{tier}\""));
            assert_eq!(serde_json::from_str::<Tier>(&json).unwrap(), tier);
        }
    }

    #[test]
    fn one_step_is_one_plain_operation_with_its_answer() {
        let problems = generate(Tier::OneStep, 200, 9);
        assert_eq!(problems[0].id, "one_step-9-0");
        for p in &problems {
            assert!(p.statement().starts_with("What is ") && !p.statement().contains('$'));
            let e = p.expression();
            let t: Vec<&str> = e.split(' ').collect();
            let (a, b): (i64, i64) = (t[0].parse().unwrap(), t[2].parse().unwrap());
            let r = match t[1] {
                "+" => a + b,
                "-" => a - b,
                _ => a * b,
            };
            assert_eq!(r, i64::from(p.answer), "{e}");
        }
    }

    #[test]
    fn small_arithmetic_keeps_operands_small_and_answers_right() {
        let problems = generate(Tier::SmallArithmetic, 300, 5);
        assert_eq!(problems[0].id, "small_arithmetic-5-0");
        for p in &problems {
            let numbers: Vec<i64> = p
                .expression()
                .split(|c: char| !c.is_ascii_digit())
                .filter(|w| !w.is_empty())
                .map(|w| w.parse().unwrap())
                .collect();
            assert_eq!(numbers.len(), 3, "{}", p.expression());
            assert!(
                numbers.iter().all(|n| (2..=20).contains(n)),
                "{}",
                p.expression()
            );
            // The expression is Python and TeX-free arithmetic: evaluate it here.
            let e = p.expression().replace(['(', ')'], "");
            let t: Vec<&str> = e.split(' ').collect();
            let apply = |x: i64, op: &str, y: i64| match op {
                "+" => x + y,
                "-" => x - y,
                _ => x * y,
            };
            let inner = apply(numbers[0], t[1], numbers[1]);
            assert_eq!(
                apply(inner, t[3], numbers[2]),
                i64::from(p.answer),
                "{}",
                p.expression()
            );
        }
        let serde = serde_json::to_string(&Tier::SmallArithmetic).unwrap();
        assert_eq!(serde, "\"small_arithmetic\"");
    }

    #[test]
    fn gcd_and_digit_sums() {
        assert_eq!(gcd(12, 18), 6);
        assert_eq!(gcd(7, 5), 1);
        assert_eq!(digit_sum_step(4096).1, 19);
    }

    #[test]
    fn mix_cycles_through_tiers() {
        let mix = generate_mix(9, 3);
        let tiers: Vec<Tier> = mix.iter().map(|p| p.tier).collect();
        let expected: Vec<Tier> = (0..9).map(|i| Tier::ALL[i % 4]).collect();
        assert_eq!(tiers, expected);
    }
}
