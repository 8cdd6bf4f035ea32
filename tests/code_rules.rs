//! Rules the code keeps, each a kind of fix that recurred in `tidy:`
//! commits, checked here so that review need not find the next one.
//!
//! - **No function body is written twice.** Most `tidy:` commits merged a
//!   second copy of a helper into the first (the counting allocator, the
//!   bits of a tensor, test fixtures' paths, a contract's fields). Two
//!   functions anywhere in `crates/`, `benches/` or `tests/` whose bodies
//!   are the same code (whitespace and comments aside) over at least
//!   [`MIN_LINES`] lines fail, with both places named: merge them into one,
//!   shared where both can reach it.
//! - **Every `allow` says why**, on its own line, after `//`.
//!
//! Function length (80 lines) is clippy's `too_many_lines`, in `just lint`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Bodies shorter than this (in non-blank lines) may repeat: a constructor
/// or a two-line accessor says nothing worth sharing.
const MIN_LINES: usize = 6;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir`, build outputs left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && !path.ends_with("target") {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `line` without string and char literals' contents and without a `//`
/// comment, so that the braces left are the code's.
fn code_of(line: &str) -> String {
    let (mut out, mut chars) = (String::new(), line.chars().peekable());
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                while let Some(d) = chars.next() {
                    match d {
                        '\\' => _ = chars.next(),
                        '"' => break,
                        _ => {}
                    }
                }
                out.push_str("\"\"");
            }
            '\'' if matches!(chars.clone().nth(1), Some('\'')) => {
                chars.nth(1);
                out.push_str("''");
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => out.push(c),
        }
    }
    out
}

fn starts_fn(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().take(5).collect();
    let fn_at = words.iter().position(|w| *w == "fn");
    fn_at.is_some_and(|i| {
        words[..i]
            .iter()
            .all(|w| w.starts_with("pub") || ["const", "async", "unsafe", "extern"].contains(w))
    })
}

/// The functions of `text`: (line of the signature, the body's code lines
/// without blanks, whitespace collapsed).
fn bodies(text: &str) -> Vec<(usize, Vec<String>)> {
    let lines: Vec<String> = text.lines().map(code_of).collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        if !starts_fn(line) {
            continue;
        }
        let (mut depth, mut body) = (0i64, Vec::new());
        for line in &lines[start..] {
            let opened = depth > 0 || line.contains('{');
            if !opened && line.contains(';') {
                break; // a declaration without a body
            }
            depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
            if opened {
                body.push(line.split_whitespace().collect::<Vec<_>>().join(" "));
            }
            if opened && depth <= 0 {
                break;
            }
        }
        let inner: Vec<String> = body
            .iter()
            .skip(1)
            .take(body.len().saturating_sub(2))
            .filter(|l| !l.is_empty())
            .cloned()
            .collect();
        out.push((start + 1, inner));
    }
    out
}

/// Every `.rs` file of the workspace's crates, benches and tests.
fn workspace_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in ["crates", "benches", "tests"] {
        rust_files(&workspace().join(dir), &mut files);
    }
    files
}

#[test]
fn every_allow_says_why() {
    let mut silent = Vec::new();
    for file in workspace_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        for (i, line) in text.lines().enumerate() {
            let attribute = line.trim_start();
            let allows = attribute.starts_with("#[allow(") || attribute.starts_with("#![allow(");
            let says_why = line
                .split_once("//")
                .is_some_and(|(_, why)| why.trim().len() > 3);
            if allows && !says_why {
                let name = file
                    .strip_prefix(workspace())
                    .unwrap_or(&file)
                    .display()
                    .to_string();
                silent.push(format!("{name}:{}: {}", i + 1, attribute));
            }
        }
    }
    assert!(
        silent.is_empty(),
        "an allow without its reason beside it (`// why`): {silent:#?}"
    );
}

#[test]
fn no_function_body_is_written_twice() {
    let files = workspace_files();
    let mut seen: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let name = file
            .strip_prefix(workspace())
            .unwrap_or(file)
            .display()
            .to_string();
        for (line, body) in bodies(&text) {
            if body.len() >= MIN_LINES {
                seen.entry(body).or_default().push(format!("{name}:{line}"));
            }
        }
    }
    let twice: Vec<&Vec<String>> = seen.values().filter(|places| places.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "the same function body in several places: {twice:#?}"
    );
    assert!(
        seen.len() > 500,
        "only {} function bodies found: is the scan broken?",
        seen.len()
    );
}

#[test]
fn a_copied_body_is_found_and_a_braced_string_is_not_code() {
    let body =
        "    let a = 1;\n    let b = \"{\";\n    let c = '}';\n    a + 1\n    + 2\n    + 3\n";
    let text = format!("fn one() {{\n{body}}}\n\npub(crate) fn two() -> u8 {{\n{body}}}\n");
    let found = bodies(&text);
    assert_eq!(found.len(), 2);
    assert_eq!(found[0].1, found[1].1);
    assert_eq!(found[0].1.len(), 6);
    assert_eq!(found[1].0, 10);
}
