//! `docs/ARCHITECTURE.md` matches the code: the crate table's "depends on"
//! column names each crate's own mappa dependencies (its required ones;
//! parentheses hold optional and indirect ones), the list is in layers (no
//! crate depends on one below it), and every repository path the "to add
//! X, touch Y" table names exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn architecture() -> String {
    std::fs::read_to_string(workspace().join("docs/ARCHITECTURE.md")).unwrap()
}

/// The rows of the first table after `heading`, as cells.
fn table_after(text: &str, heading: &str) -> Vec<Vec<String>> {
    let start = text
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    text[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// `text` without its parenthesised parts.
fn outside_parentheses(text: &str) -> String {
    let mut depth = 0usize;
    text.chars()
        .filter(|&c| {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ => return depth == 0,
            }
            false
        })
        .collect()
}

/// The required `mappa-*` dependencies of the crate whose manifest is `path`.
fn mappa_dependencies(path: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let manifest: toml::Table = toml::from_str(&text).unwrap();
    let Some(deps) = manifest.get("dependencies").and_then(|d| d.as_table()) else {
        return BTreeSet::new();
    };
    deps.iter()
        .filter(|(name, spec)| {
            name.starts_with("mappa-")
                && !spec
                    .get("optional")
                    .and_then(|o| o.as_bool())
                    .unwrap_or(false)
        })
        .map(|(name, _)| name.trim_start_matches("mappa-").to_string())
        .collect()
}

/// The crate table: (crate name, its folder, the dependencies it lists).
fn crate_rows() -> Vec<(String, PathBuf, BTreeSet<String>)> {
    table_after(&architecture(), "## Crates")
        .into_iter()
        .map(|cells| {
            let name = cells[0]
                .split('`')
                .nth(1)
                .expect("a crate name in backticks")
                .to_string();
            let folder = match cells[0].split('`').nth(3) {
                Some(folder) => workspace().join(folder),
                None => workspace().join("crates").join(&name),
            };
            let listed = outside_parentheses(&cells[1])
                .split(',')
                .map(str::trim)
                .filter(|d| !d.is_empty() && *d != "-" && *d != "burn")
                .map(str::to_string)
                .collect();
            (name, folder, listed)
        })
        .collect()
}

#[test]
fn the_crate_table_names_each_crates_dependencies_in_layers() {
    let rows = crate_rows();
    assert!(rows.len() >= 9, "the crate table has {} rows", rows.len());
    let mut above = BTreeSet::new();
    for (name, folder, listed) in &rows {
        let actual = mappa_dependencies(&folder.join("Cargo.toml"));
        assert_eq!(
            listed, &actual,
            "{name}: ARCHITECTURE.md lists {listed:?}, Cargo.toml has {actual:?}"
        );
        for dep in &actual {
            assert!(
                above.contains(dep),
                "{name} depends on mappa-{dep}, which is not above it"
            );
        }
        above.insert(name.trim_start_matches("mappa-").to_string());
    }
    let members: BTreeSet<String> = std::fs::read_dir(workspace().join("crates"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let named: BTreeSet<String> = rows.iter().map(|r| r.0.clone()).collect();
    assert!(
        members.is_subset(&named),
        "crates missing from the table: {:?}",
        members.difference(&named)
    );
}

#[test]
fn every_path_the_change_table_names_exists() {
    let rows = table_after(&architecture(), "## To add X, touch Y");
    assert!(rows.len() > 10, "the change table has {} rows", rows.len());
    let roots = [
        "crates/",
        "experiments/",
        "fixtures/",
        "tests/",
        "benches/",
        "docs/",
    ];
    let (mut checked, mut missing) = (0, Vec::new());
    for cells in &rows {
        for (i, span) in cells.join(" ").split('`').enumerate() {
            let path = span.split_whitespace().next().unwrap_or("");
            if i % 2 == 1 && roots.iter().any(|r| path.starts_with(r)) && !path.contains('<') {
                if !workspace().join(path).exists() {
                    missing.push(format!("{path} (row {:?})", cells[0]));
                }
                checked += 1;
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but not in the tree: {missing:#?}"
    );
    assert!(checked > 20, "only {checked} paths checked");
}

#[test]
fn parentheses_are_left_out() {
    assert_eq!(
        outside_parentheses("core, env (model), a (b (c)) d"),
        "core, env , a  d"
    );
}
