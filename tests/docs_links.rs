//! Every relative link in the README and `docs/` resolves: the file or
//! folder exists, and a `#anchor` into a Markdown file names one of its
//! headings (GitHub's slugs: lower case, punctuation dropped, spaces as
//! hyphens, `-1`, `-2` for repeats). Links to the web are not followed.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Markdown files checked: README.md and every `.md` under docs/.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![workspace().join("README.md")];
    let mut dirs = vec![workspace().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// The lines of `text` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// `line` without its inline code spans.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// The targets of the inline links `[text](target)` in `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            out.push(target.to_string());
            rest = &after[end..];
        }
    }
    out
}

/// GitHub's anchor of a heading's text.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown page's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(&heading.replace('`', ""));
        let mut anchor = base.clone();
        let mut n = 0;
        while !seen.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    seen
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(
        slug("The plan as an upper bound (issue 53, 2026-12-06)"),
        "the-plan-as-an-upper-bound-issue-53-2026-12-06"
    );
    let a = anchors("# A\n## B: `c`\n```\n# not a heading\n```\n## B: c\n");
    assert!(
        a.contains("a") && a.contains("b-c") && a.contains("b-c-1"),
        "{a:?}"
    );
    assert_eq!(
        links("see [x](a.md#b) and `[y](no.md)` and [z](https://e.org)"),
        ["a.md#b", "https://e.org"]
    );
}

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for target in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, anchor) = target
                .split_once('#')
                .map_or((target.as_str(), None), |(p, a)| (p, Some(a)));
            let file = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let name = page
                .strip_prefix(workspace())
                .unwrap_or(&page)
                .display()
                .to_string();
            if !file.exists() {
                broken.push(format!("{name}: {target} (no such file)"));
                continue;
            }
            let Some(anchor) = anchor.filter(|_| file.extension().is_some_and(|e| e == "md"))
            else {
                continue;
            };
            let headings = anchors(&std::fs::read_to_string(&file).unwrap());
            if !headings.contains(anchor) {
                broken.push(format!("{name}: {target} (no heading with that anchor)"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}
