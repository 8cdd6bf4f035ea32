//! Exact values of math answers: rationals, sums of simple radicals and pi
//! powers, tuples, intervals and sets, parsed from a cleaned answer string.
//!
//! The parser reads a small LaTeX-flavoured expression grammar (numbers,
//! `+ - * / ^`, `\frac`, `\sqrt`, `\pi`, `\cdot`, `\times`, `\div`, groups);
//! it never evaluates anything as code. Every arithmetic step is checked:
//! on overflow (or anything outside the grammar) parsing fails and the caller
//! falls back to comparing normalised strings.

use std::collections::BTreeMap;
use std::fmt;

use super::normalize::clean;

/// Largest number whose square factors are extracted under `\sqrt`.
const MAX_RADICAND: u128 = 10_000_000_000;
/// Largest absolute integer exponent accepted in `x^{n}`.
const MAX_EXPONENT: u128 = 64;
/// Most terms an expression may have (bounds the cost of products).
const MAX_TERMS: usize = 64;
/// Largest nesting depth of groups, tuples and sets (bounds recursion).
const MAX_DEPTH: usize = 32;

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// An exact reduced fraction `num / den` with `den > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rational {
    num: i128,
    den: i128,
}

impl Rational {
    const ZERO: Rational = Rational { num: 0, den: 1 };
    const ONE: Rational = Rational { num: 1, den: 1 };

    fn int(n: i128) -> Self {
        Rational { num: n, den: 1 }
    }

    /// `num / den` reduced; `None` when `den` is zero or on overflow.
    fn new(num: i128, den: i128) -> Option<Self> {
        if den == 0 {
            return None;
        }
        let g = gcd(num.unsigned_abs(), den.unsigned_abs());
        let g = i128::try_from(g).ok()?;
        let (mut num, mut den) = (num / g, den / g);
        if den < 0 {
            num = num.checked_neg()?;
            den = den.checked_neg()?;
        }
        Some(Rational { num, den })
    }

    fn is_zero(self) -> bool {
        self.num == 0
    }

    fn add(self, o: Self) -> Option<Self> {
        let g = i128::try_from(gcd(self.den.unsigned_abs(), o.den.unsigned_abs())).ok()?;
        let a = self.num.checked_mul(o.den / g)?;
        let b = o.num.checked_mul(self.den / g)?;
        Rational::new(a.checked_add(b)?, (self.den / g).checked_mul(o.den)?)
    }

    fn neg(self) -> Option<Self> {
        Some(Rational {
            num: self.num.checked_neg()?,
            den: self.den,
        })
    }

    fn mul(self, o: Self) -> Option<Self> {
        // Cross-reduce first to keep intermediates small.
        let g1 = i128::try_from(gcd(self.num.unsigned_abs(), o.den.unsigned_abs()))
            .ok()?
            .max(1);
        let g2 = i128::try_from(gcd(o.num.unsigned_abs(), self.den.unsigned_abs()))
            .ok()?
            .max(1);
        let num = (self.num / g1).checked_mul(o.num / g2)?;
        let den = (self.den / g2).checked_mul(o.den / g1)?;
        Rational::new(num, den)
    }

    fn inv(self) -> Option<Self> {
        Rational::new(self.den, self.num)
    }
}

impl fmt::Display for Rational {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.den == 1 {
            write!(f, "{}", self.num)
        } else {
            write!(f, "{}/{}", self.num, self.den)
        }
    }
}

/// `coef * sqrt(radicand) * pi^pi_pow`, with `radicand` square-free.
type Key = (u64, i32);

/// A finite sum of terms `q * sqrt(r) * pi^k` (`q` rational, `r` square-free):
/// a canonical form, so two expressions are equal iff their maps are.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Expr(BTreeMap<Key, Rational>);

impl Expr {
    fn rational(q: Rational) -> Self {
        Expr::term((1, 0), q)
    }

    fn term(key: Key, q: Rational) -> Self {
        let mut m = BTreeMap::new();
        if !q.is_zero() {
            m.insert(key, q);
        }
        Expr(m)
    }

    fn pi() -> Self {
        Expr::term((1, 1), Rational::ONE)
    }

    /// The value as a plain rational, if it is one.
    fn as_rational(&self) -> Option<Rational> {
        match self.0.len() {
            0 => Some(Rational::ZERO),
            1 => self.0.get(&(1, 0)).copied(),
            _ => None,
        }
    }

    fn add(&self, o: &Self) -> Option<Self> {
        let mut m = self.0.clone();
        for (k, q) in &o.0 {
            let sum = m.get(k).copied().unwrap_or(Rational::ZERO).add(*q)?;
            if sum.is_zero() {
                m.remove(k);
            } else {
                m.insert(*k, sum);
            }
        }
        Some(Expr(m))
    }

    fn neg(&self) -> Option<Self> {
        let mut m = BTreeMap::new();
        for (k, q) in &self.0 {
            m.insert(*k, q.neg()?);
        }
        Some(Expr(m))
    }

    fn mul(&self, o: &Self) -> Option<Self> {
        let mut acc = Expr::rational(Rational::ZERO);
        for (&(ra, pa), qa) in &self.0 {
            for (&(rb, pb), qb) in &o.0 {
                let g = gcd(u128::from(ra), u128::from(rb));
                let g64 = u64::try_from(g).ok()?;
                let radicand = (ra / g64).checked_mul(rb / g64)?;
                let coef = qa.mul(*qb)?.mul(Rational::int(i128::try_from(g).ok()?))?;
                let key = (radicand, pa.checked_add(pb)?);
                acc = acc.add(&Expr::term(key, coef))?;
            }
        }
        (acc.0.len() <= MAX_TERMS).then_some(acc)
    }

    /// The reciprocal of a single term, or of `x + y*sqrt(d)` (by the
    /// conjugate); `None` for zero and for anything else.
    fn inv(&self) -> Option<Self> {
        let terms: Vec<(Key, Rational)> = self.0.iter().map(|(k, q)| (*k, *q)).collect();
        match terms.as_slice() {
            [((r, p), q)] => {
                // 1 / (q sqrt(r) pi^p) = sqrt(r) / (q r) * pi^-p
                let coef = q.mul(Rational::int(i128::from(*r)))?.inv()?;
                Some(Expr::term((*r, p.checked_neg()?), coef))
            }
            [((1, 0), x), ((d, 0), y)] => {
                // 1 / (x + y sqrt(d)) = (x - y sqrt(d)) / (x^2 - d y^2)
                let norm = x
                    .mul(*x)?
                    .add(y.mul(*y)?.mul(Rational::int(i128::from(*d)))?.neg()?)?;
                let inv_norm = norm.inv()?;
                let conj = Expr::rational(*x).add(&Expr::term((*d, 0), y.neg()?))?;
                conj.mul(&Expr::rational(inv_norm))
            }
            _ => None,
        }
    }

    fn pow(&self, n: i128) -> Option<Self> {
        if n.unsigned_abs() > MAX_EXPONENT {
            return None;
        }
        let base = if n < 0 { self.inv()? } else { self.clone() };
        let mut acc = Expr::rational(Rational::ONE);
        for _ in 0..n.unsigned_abs() {
            acc = acc.mul(&base)?;
        }
        Some(acc)
    }

    /// Square root of a non-negative rational, with square factors taken out.
    fn sqrt(&self) -> Option<Self> {
        let q = self.as_rational()?;
        if q.num < 0 {
            return None;
        }
        // sqrt(p/q) = sqrt(p*q) / q
        let n = u128::try_from(q.num.checked_mul(q.den)?).ok()?;
        if n > MAX_RADICAND {
            return None;
        }
        let (outside, radicand) = split_square(n);
        let coef = Rational::new(i128::try_from(outside).ok()?, q.den)?;
        Some(Expr::term((u64::try_from(radicand).ok()?, 0), coef))
    }
}

/// `n = outside^2 * radicand` with `radicand` square-free.
fn split_square(mut n: u128) -> (u128, u128) {
    if n == 0 {
        return (0, 1);
    }
    let (mut outside, mut radicand) = (1u128, 1u128);
    let mut p = 2u128;
    while p * p <= n {
        while n.is_multiple_of(p * p) {
            outside *= p;
            n /= p * p;
        }
        if n.is_multiple_of(p) {
            radicand *= p;
            n /= p;
        }
        p += 1;
    }
    (outside, radicand * n)
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return write!(f, "0");
        }
        for (i, (&(r, p), q)) in self.0.iter().enumerate() {
            let negative = q.num < 0;
            if negative {
                write!(f, "-")?;
            } else if i > 0 {
                write!(f, "+")?;
            }
            let abs_num = q.num.unsigned_abs();
            let has_factor = r != 1 || p != 0;
            if abs_num != 1 || !has_factor {
                write!(f, "{abs_num}")?;
            }
            if r != 1 {
                write!(f, "\\sqrt{{{r}}}")?;
            }
            match p {
                0 => {}
                1 => write!(f, "\\pi")?,
                _ => write!(f, "\\pi^{{{p}}}")?,
            }
            if q.den != 1 {
                write!(f, "/{}", q.den)?;
            }
        }
        Ok(())
    }
}

/// A parsed answer. Equality is structural on a canonical form: sets and
/// bare lists are stored sorted, so they compare as multisets.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum MathValue {
    /// A number: rational, or a sum of simple radicals and pi powers.
    Num(Expr),
    /// `\infty` (`false`) or `-\infty` (`true`), as an interval end point.
    Infinity(bool),
    /// A bracketed sequence: a tuple `(a,b)`, a vector `[a,b]` or an
    /// interval `[a,b)`; the bracket characters are part of the value.
    Seq {
        open: char,
        close: char,
        items: Vec<MathValue>,
    },
    /// `\{a, b\}` or a bare list `a, b`: compared as a multiset.
    Set(Vec<MathValue>),
    /// A union of intervals or sets, in order.
    Union(Vec<MathValue>),
    /// Anything else, as its cleaned string.
    Text(String),
}

impl fmt::Display for MathValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |items: &[MathValue], sep: &str| {
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(sep)
        };
        match self {
            MathValue::Num(e) => write!(f, "{e}"),
            MathValue::Infinity(neg) => write!(f, "{}\\infty", if *neg { "-" } else { "" }),
            MathValue::Seq { open, close, items } => write!(f, "{open}{}{close}", join(items, ",")),
            MathValue::Set(items) => write!(f, "\\{{{}\\}}", join(items, ",")),
            MathValue::Union(items) => write!(f, "{}", join(items, "\\cup")),
            MathValue::Text(s) => write!(f, "{s}"),
        }
    }
}

/// Parse a (possibly uncleaned) answer into a value; never fails, unparsed
/// answers become [`MathValue::Text`].
pub(crate) fn parse_value(answer: &str) -> MathValue {
    parse_cleaned(&clean(answer), 0)
}

fn is_open(c: char) -> bool {
    matches!(c, '(' | '[' | '{')
}

fn is_close(c: char) -> bool {
    matches!(c, ')' | ']' | '}')
}

/// Split `chars` at top-level occurrences of `sep` (depth counted over any
/// bracket kind; escaped braces `\{ \}` count as brackets too).
fn split_top(chars: &[char], sep: &[char]) -> Vec<Vec<char>> {
    let mut parts = Vec::new();
    let mut depth = 0i64;
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' && i + 1 < chars.len() && (chars[i + 1] == '{' || chars[i + 1] == '}') {
            depth += if chars[i + 1] == '{' { 1 } else { -1 };
            i += 2;
            continue;
        }
        if is_open(c) {
            depth += 1;
        } else if is_close(c) {
            depth -= 1;
        } else if depth == 0 && chars[i..].starts_with(sep) {
            parts.push(chars[start..i].to_vec());
            i += sep.len();
            start = i;
            continue;
        }
        i += 1;
    }
    parts.push(chars[start..].to_vec());
    parts
}

/// Whether the bracket opened at index 0 closes exactly at the last char.
fn wraps_whole(chars: &[char]) -> bool {
    let mut depth = 0i64;
    for (i, &c) in chars.iter().enumerate() {
        if is_open(c) {
            depth += 1;
        } else if is_close(c) {
            depth -= 1;
            if depth == 0 {
                return i + 1 == chars.len();
            }
        }
    }
    false
}

fn parse_items(parts: Vec<Vec<char>>, depth: usize) -> Vec<MathValue> {
    parts
        .into_iter()
        .map(|p| parse_cleaned(p.iter().collect::<String>().trim(), depth + 1))
        .collect()
}

fn parse_cleaned(s: &str, depth: usize) -> MathValue {
    let text = || MathValue::Text(s.to_string());
    if depth > MAX_DEPTH {
        return text();
    }
    match s {
        "\\infty" | "+\\infty" | "infty" => return MathValue::Infinity(false),
        "-\\infty" | "-infty" => return MathValue::Infinity(true),
        _ => {}
    }
    let chars: Vec<char> = s.chars().collect();
    let n = chars.len();
    let union = split_top(&chars, &['\\', 'c', 'u', 'p']);
    if union.len() > 1 {
        return MathValue::Union(parse_items(union, depth));
    }
    if n >= 4 && chars.starts_with(&['\\', '{']) && chars.ends_with(&['\\', '}']) {
        let inner = &chars[2..n - 2];
        let mut items = if inner.iter().all(|c| c.is_whitespace()) {
            Vec::new()
        } else {
            parse_items(split_top(inner, &[',']), depth)
        };
        items.sort();
        return MathValue::Set(items);
    }
    if n >= 2
        && matches!(chars[0], '(' | '[')
        && matches!(chars[n - 1], ')' | ']')
        && wraps_whole(&chars)
    {
        let parts = split_top(&chars[1..n - 1], &[',']);
        if parts.len() > 1 {
            return MathValue::Seq {
                open: chars[0],
                close: chars[n - 1],
                items: parse_items(parts, depth),
            };
        }
    }
    let parts = split_top(&chars, &[',']);
    if parts.len() > 1 {
        let mut items = parse_items(parts, depth);
        items.sort();
        return MathValue::Set(items);
    }
    match Parser::new(&chars).parse_all() {
        Some(e) => MathValue::Num(e),
        None => text(),
    }
}

/// Recursive-descent parser for the expression grammar.
struct Parser<'a> {
    s: &'a [char],
    pos: usize,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(s: &'a [char]) -> Self {
        Parser {
            s,
            pos: 0,
            depth: 0,
        }
    }

    fn parse_all(mut self) -> Option<Expr> {
        let e = self.expr()?;
        self.skip_ws();
        (self.pos == self.s.len()).then_some(e)
    }

    fn peek(&self) -> Option<char> {
        self.s.get(self.pos).copied()
    }

    fn skip_ws(&mut self) -> bool {
        let start = self.pos;
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
        self.pos > start
    }

    /// Whether a command `\name` (not followed by a letter) starts here.
    fn at_command(&self, name: &str) -> bool {
        let mut i = self.pos;
        if self.s.get(i) != Some(&'\\') {
            return false;
        }
        i += 1;
        for c in name.chars() {
            if self.s.get(i) != Some(&c) {
                return false;
            }
            i += 1;
        }
        !self.s.get(i).is_some_and(char::is_ascii_alphabetic)
    }

    fn eat_command(&mut self, name: &str) -> bool {
        let ok = self.at_command(name);
        if ok {
            self.pos += 1 + name.len();
        }
        ok
    }

    fn eat(&mut self, c: char) -> bool {
        self.skip_ws();
        let ok = self.peek() == Some(c);
        if ok {
            self.pos += 1;
        }
        ok
    }

    fn enter(&mut self) -> Option<()> {
        self.depth += 1;
        (self.depth <= MAX_DEPTH).then_some(())
    }

    fn expr(&mut self) -> Option<Expr> {
        self.enter()?;
        let mut acc = self.term()?;
        loop {
            self.skip_ws();
            match self.peek() {
                Some('+') => {
                    self.pos += 1;
                    acc = acc.add(&self.term()?)?;
                }
                Some('-') => {
                    self.pos += 1;
                    acc = acc.add(&self.term()?.neg()?)?;
                }
                _ => break,
            }
        }
        self.depth -= 1;
        Some(acc)
    }

    fn term(&mut self) -> Option<Expr> {
        let mut acc = self.unary()?;
        loop {
            self.skip_ws();
            if self.eat('*') || self.eat_command("cdot") || self.eat_command("times") {
                acc = acc.mul(&self.unary()?)?;
            } else if self.eat('/') || self.eat_command("div") {
                acc = acc.mul(&self.unary()?.inv()?)?;
            } else if self.peek().is_some_and(|c| c == '(' || c == '{')
                || self.at_command("frac")
                || self.at_command("sqrt")
                || self.at_command("pi")
            {
                // Implicit multiplication: `2\sqrt{3}`, `3\pi`, `2(1+x)`.
                acc = acc.mul(&self.power()?)?;
            } else {
                break;
            }
        }
        Some(acc)
    }

    fn unary(&mut self) -> Option<Expr> {
        self.enter()?;
        self.skip_ws();
        let v = if self.eat('-') {
            self.unary()?.neg()?
        } else if self.eat('+') {
            self.unary()?
        } else {
            self.power()?
        };
        self.depth -= 1;
        Some(v)
    }

    fn power(&mut self) -> Option<Expr> {
        let base = self.primary()?;
        if !self.eat('^') {
            return Some(base);
        }
        self.skip_ws();
        let exp = if self.peek() == Some('{') {
            self.group()?
        } else {
            self.digit()?
        };
        let q = exp.as_rational()?;
        if q.den != 1 {
            return None;
        }
        base.pow(q.num)
    }

    /// A single digit, as in `\frac12` or `x^2`.
    fn digit(&mut self) -> Option<Expr> {
        let d = self.peek()?.to_digit(10)?;
        self.pos += 1;
        Some(Expr::rational(Rational::int(i128::from(d))))
    }

    /// `{ expr }`
    fn group(&mut self) -> Option<Expr> {
        if !self.eat('{') {
            return None;
        }
        let e = self.expr()?;
        self.eat('}').then_some(e)
    }

    /// A command argument: `{expr}`, a single digit or `\pi`.
    fn arg(&mut self) -> Option<Expr> {
        self.skip_ws();
        match self.peek()? {
            '{' => self.group(),
            c if c.is_ascii_digit() => self.digit(),
            _ if self.eat_command("pi") => Some(Expr::pi()),
            _ => None,
        }
    }

    fn primary(&mut self) -> Option<Expr> {
        self.skip_ws();
        let c = self.peek()?;
        if c.is_ascii_digit() || c == '.' {
            let int_part = self.number()?;
            return self.mixed(int_part);
        }
        if c == '(' {
            self.pos += 1;
            let e = self.expr()?;
            return self.eat(')').then_some(e);
        }
        if c == '{' {
            return self.group();
        }
        if self.eat_command("frac") {
            let num = self.arg()?;
            let den = self.arg()?;
            return num.mul(&den.inv()?);
        }
        if self.eat_command("sqrt") {
            return self.arg()?.sqrt();
        }
        if self.eat_command("pi") {
            return Some(Expr::pi());
        }
        None
    }

    /// After an integer literal: a mixed number `3\frac{1}{2}` or `3 1/2`
    /// (digits only) is `3 + 1/2`.
    fn mixed(&mut self, whole: (Expr, bool)) -> Option<Expr> {
        let (value, is_int) = whole;
        if !is_int {
            return Some(value);
        }
        let save = self.pos;
        let spaced = self.skip_ws();
        let frac = if self.eat_command("frac") {
            self.digits_arg()
                .and_then(|n| self.digits_arg().map(|d| (n, d)))
        } else if spaced {
            self.slash_fraction()
        } else {
            None
        };
        match frac {
            Some((n, d)) if d != 0 && n < d => {
                let whole = value.as_rational()?;
                let part = Rational::new(n, d)?;
                Some(Expr::rational(whole.add(part)?))
            }
            _ => {
                self.pos = save;
                Some(value)
            }
        }
    }

    /// `{123}` or a single digit, as a plain non-negative integer.
    fn digits_arg(&mut self) -> Option<i128> {
        self.skip_ws();
        if self.peek()?.is_ascii_digit() {
            let d = self.peek()?.to_digit(10)?;
            self.pos += 1;
            return Some(i128::from(d));
        }
        if !self.eat('{') {
            return None;
        }
        self.skip_ws();
        let n = self.int_literal()?;
        self.eat('}').then_some(n)
    }

    /// `n/d` with digit-only `n` and `d`, ending the input.
    fn slash_fraction(&mut self) -> Option<(i128, i128)> {
        let n = self.int_literal()?;
        if !self.eat('/') {
            return None;
        }
        self.skip_ws();
        let d = self.int_literal()?;
        self.skip_ws();
        (self.pos == self.s.len()).then_some((n, d))
    }

    fn int_literal(&mut self) -> Option<i128> {
        let start = self.pos;
        let mut n: i128 = 0;
        while let Some(d) = self.peek().and_then(|c| c.to_digit(10)) {
            n = n.checked_mul(10)?.checked_add(i128::from(d))?;
            self.pos += 1;
        }
        (self.pos > start).then_some(n)
    }

    /// A decimal literal `123`, `0.5`, `.5`, `1.` as an exact rational;
    /// the flag tells whether it had no decimal point.
    fn number(&mut self) -> Option<(Expr, bool)> {
        let mut num: i128 = 0;
        let mut den: i128 = 1;
        let mut digits = 0;
        let mut seen_point = false;
        while let Some(c) = self.peek() {
            if let Some(d) = c.to_digit(10) {
                num = num.checked_mul(10)?.checked_add(i128::from(d))?;
                if seen_point {
                    den = den.checked_mul(10)?;
                }
                digits += 1;
            } else if c == '.'
                && !seen_point
                && self.s.get(self.pos + 1).is_none_or(char::is_ascii_digit)
            {
                seen_point = true;
            } else {
                break;
            }
            self.pos += 1;
        }
        if digits == 0 {
            return None;
        }
        Some((Expr::rational(Rational::new(num, den)?), !seen_point))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(s: &str) -> Option<Expr> {
        match parse_value(s) {
            MathValue::Num(e) => Some(e),
            _ => None,
        }
    }

    #[test]
    fn rationals_are_exact() {
        assert_eq!(num("0.5"), num("1/2"));
        assert_eq!(num("1.0"), num("1"));
        assert_eq!(num("023"), num("23"));
        assert_eq!(num("14/2"), num("7"));
        assert_ne!(num("7"), num("7.5"));
        assert_eq!(num("3 1/2"), num("7/2"));
        assert_eq!(num("3\\frac{1}{2}"), num("3.5"));
        assert_eq!(num("-3\\frac12"), num("-7/2"));
        assert_eq!(num("2^{10}"), num("1024"));
        assert_eq!(num("2^{-1}"), num("0.5"));
    }

    #[test]
    fn radicals_and_pi_are_symbolic() {
        assert_eq!(num("\\sqrt{12}"), num("2\\sqrt{3}"));
        assert_eq!(num("\\sqrt{12}"), num("2\\sqrt3"));
        assert_eq!(num("\\frac{\\sqrt{3}}{2}"), num("\\sqrt{3}/2"));
        assert_eq!(num("\\frac{\\sqrt{3}}{2}"), num("\\sqrt{3/4}"));
        assert_eq!(num("\\frac{1}{\\sqrt{2}}"), num("\\frac{\\sqrt2}{2}"));
        assert_eq!(num("\\frac{1}{\\sqrt{2}+1}"), num("\\sqrt{2}-1"));
        assert_eq!(num("\\frac{\\pi}{4}"), num("\\pi/4"));
        assert_eq!(num("3\\pi"), num("\\pi \\cdot 3"));
        assert_eq!(num("\\sqrt{8}\\sqrt{2}"), num("4"));
        assert_ne!(num("\\sqrt{2}"), num("1.4142135623730951"));
        assert_eq!(
            num("\\frac{1+\\sqrt{5}}{2}")
                .map(|e| e.to_string())
                .as_deref(),
            Some("1/2+\\sqrt{5}/2")
        );
    }

    #[test]
    fn overflow_fails_instead_of_wrapping() {
        assert_eq!(num("99999999999999999999999999999999999999999"), None);
        assert_eq!(num("10^{60}"), None);
        assert_eq!(num("2^{-170141183460469231731687303715884105727-1}"), None);
        assert_eq!(num("\\sqrt{99999999999999999}"), None);
        let many: Vec<String> = (2..40).map(|k| format!("\\sqrt{{{k}}}")).collect();
        assert_eq!(num(&format!("({})^{{64}}", many.join("+"))), None);
    }

    #[test]
    fn structures() {
        assert_eq!(parse_value("(1, 2)"), parse_value("(1,2)"));
        assert_ne!(parse_value("(1, 2)"), parse_value("(2,1)"));
        assert_ne!(parse_value("(1, 2)"), parse_value("[1,2]"));
        assert_eq!(parse_value("\\{1,2\\}"), parse_value("\\{2, 1\\}"));
        assert_eq!(parse_value("1, 2"), parse_value("2,1"));
        assert_eq!(parse_value("(-\\infty, 0]"), parse_value("(-\\infty,0]"));
        assert_eq!(
            parse_value("[0, \\frac12)\\cup(1,2]").to_string(),
            "[0,1/2)\\cup(1,2]"
        );
        assert_eq!(parse_value("(1,2),(3,4)"), parse_value("(3,4), (1,2)"));
    }
}
