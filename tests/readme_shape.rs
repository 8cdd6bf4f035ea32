//! The README is a front door, not a lab notebook: at most 200 lines and
//! 2,500 words (as `wc -l` and `wc -w` count them), and no paragraph over
//! 120 words. A paragraph is a run of non-blank lines outside code fences;
//! each table row counts on its own. What does not fit goes to `docs/`.

use std::path::Path;

const MAX_LINES: usize = 200;
const MAX_WORDS: usize = 2_500;
const MAX_PARAGRAPH_WORDS: usize = 120;

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The paragraphs of `text` outside fenced code blocks, each with the line
/// it starts on; a table row is a paragraph of its own.
fn paragraphs(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let (mut fenced, mut open) = (false, false);
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            open = false;
            continue;
        }
        let table_row = line.trim_start().starts_with('|');
        if fenced || line.trim().is_empty() {
            open = false;
        } else if open && !table_row {
            let last = out.last_mut().expect("an open paragraph");
            last.1.push(' ');
            last.1.push_str(line);
        } else {
            out.push((i + 1, line.to_string()));
            open = !table_row;
        }
    }
    out
}

fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

#[test]
fn the_readme_fits_its_limits() {
    let text = readme();
    let lines = text.lines().count();
    assert!(
        lines <= MAX_LINES,
        "README.md has {lines} lines; at most {MAX_LINES}: move detail to docs/"
    );
    let total = words(&text);
    assert!(
        total <= MAX_WORDS,
        "README.md has {total} words; at most {MAX_WORDS}: move detail to docs/"
    );
    for (line, paragraph) in paragraphs(&text) {
        let n = words(&paragraph);
        assert!(
            n <= MAX_PARAGRAPH_WORDS,
            "README.md:{line}: a paragraph of {n} words; at most {MAX_PARAGRAPH_WORDS}"
        );
    }
}

#[test]
fn paragraphs_split_at_blank_lines_fences_and_table_rows() {
    let text = "one two\nthree\n\n```\nin a fence\n```\n| a | b |\n| c |\nfour\n";
    let found: Vec<(usize, usize)> = paragraphs(text)
        .iter()
        .map(|(l, p)| (*l, words(p)))
        .collect();
    assert_eq!(found, [(1, 3), (7, 5), (8, 3), (9, 1)]);
}
