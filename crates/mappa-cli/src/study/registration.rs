//! A confirmatory study's registration, read from git when the study
//! starts: the commit that last changed its manifest (the registration),
//! the commits after it that changed the analysis code (the verdict, the
//! paired test, the learning-curve summaries), and whether the checkout
//! still matches.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Serialize;

/// Where a study's registered files stand in git.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Registration {
    /// The registration: the last commit that changed the manifest, with
    /// the analysis code as it stood there.
    pub commit: String,
    /// Its commit date (`YYYY-MM-DD`).
    pub date: String,
    /// The registered files, relative to the repository root: the manifest,
    /// then the analysis code.
    pub files: Vec<String>,
    /// Commits after the registration that changed the analysis code
    /// (`<short hash> <subject>`, oldest first): the verdict is computed by
    /// code that was not registered, unless these left it as it was.
    pub analysis_changed_since: Vec<String>,
    /// Those of `files` that differ from the last commit in the checkout.
    pub modified: Vec<String>,
}

/// Files given relative to this crate's directory, as paths in this
/// repository.
fn cli_files(relative: &[&str]) -> Vec<PathBuf> {
    let cli = Path::new(env!("CARGO_MANIFEST_DIR"));
    relative.iter().map(|f| cli.join(f)).collect()
}

/// The analysis code a verdict depends on, as paths in this repository.
fn analysis_files() -> Vec<PathBuf> {
    cli_files(&[
        "src/study/verdict.rs",
        "src/study/summarise.rs",
        "../mappa-core/src/paired.rs",
    ])
}

/// [`find`] for a single run's claim (`crate::claim`), whose analysis code
/// is the claim's module, its recomputing script and McNemar's test.
pub fn find_claim(manifest: &Path) -> Result<Registration, String> {
    find_with(
        manifest,
        &cli_files(&[
            "src/claim.rs",
            "src/claim/recompute.py",
            "../mappa-core/src/mcnemar.rs",
        ]),
    )
}

/// Run git in `dir`; its standard output, or why it failed.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| format!("git: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The registration of the study in `manifest` (a file of a git checkout):
/// an error says why there is none (not a checkout, files never committed).
pub fn find(manifest: &Path) -> Result<Registration, String> {
    find_with(manifest, &analysis_files())
}

/// [`find`] for a factorial study, whose analysis code includes the
/// factorial module's.
pub fn find_factorial(manifest: &Path) -> Result<Registration, String> {
    find_with(manifest, &factorial_analysis_files())
}

/// The analysis code of a factorial study: [`analysis_files`] and the
/// factorial module, its recomputing script included.
fn factorial_analysis_files() -> Vec<PathBuf> {
    let factorial = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/study/factorial");
    let parts = [
        "mod.rs",
        "design.rs",
        "analysis.rs",
        "output.rs",
        "recompute.py",
    ];
    let mut files = analysis_files();
    files.extend(parts.map(|f| factorial.join(f)));
    files
}

/// [`find`] with the analysis code in `analysis`.
fn find_with(manifest: &Path, analysis: &[PathBuf]) -> Result<Registration, String> {
    let dir = manifest
        .parent()
        .ok_or_else(|| format!("{}: no directory", manifest.display()))?;
    let root = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"])?)
        .canonicalize()
        .map_err(|e| format!("the checkout of {}: {e}", manifest.display()))?;
    let mut files = vec![manifest.to_path_buf()];
    files.extend(analysis.iter().cloned());
    let relative: Vec<String> = files
        .iter()
        .map(|f| {
            let f = f
                .canonicalize()
                .map_err(|e| format!("{}: {e}", f.display()))?;
            f.strip_prefix(&root)
                .map(|p| p.to_string_lossy().into_owned())
                .map_err(|_| format!("{} is outside the checkout {}", f.display(), root.display()))
        })
        .collect::<Result<_, String>>()?;
    let never = || {
        format!(
            "{} and the analysis code were never committed",
            manifest.display()
        )
    };
    git(&root, &["rev-parse", "--verify", "--quiet", "HEAD"]).map_err(|_| never())?;
    let log = git(&root, &["log", "-1", "--format=%H %cs", "--", &relative[0]])?;
    let (commit, date) = log.split_once(' ').ok_or_else(never)?;
    let since = format!("{commit}..HEAD");
    let mut args = vec!["log", "--reverse", "--format=%h %s", &since, "--"];
    args.extend(relative[1..].iter().map(String::as_str));
    let analysis_changed_since = git(&root, &args)?.lines().map(String::from).collect();
    let mut args = vec!["status", "--porcelain", "--"];
    args.extend(relative.iter().map(String::as_str));
    let status = git(&root, &args)?;
    let modified = relative
        .iter()
        .filter(|f| status.lines().any(|l| l.ends_with(f.as_str())))
        .cloned()
        .collect();
    Ok(Registration {
        commit: commit.to_string(),
        date: date.to_string(),
        files: relative,
        analysis_changed_since,
        modified,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_analysis_file_exists() {
        for file in factorial_analysis_files() {
            assert!(file.is_file(), "{}", file.display());
        }
    }

    fn git_ok(dir: &Path, args: &[&str]) {
        git(dir, args).unwrap();
    }

    #[test]
    fn a_registration_names_the_commit_and_what_changed_since() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path();
        git_ok(repo, &["init", "-q"]);
        let manifest = repo.join("study.toml");
        let analysis = vec![repo.join("verdict.rs")];
        std::fs::write(&manifest, "name = \"study\"\n").unwrap();
        std::fs::write(&analysis[0], "// the test\n").unwrap();
        let never = |err: String| assert!(err.contains("never committed"), "{err}");
        never(find_with(&manifest, &analysis).unwrap_err());
        let commit = |message: &str| {
            git_ok(repo, &["add", "."]);
            git_ok(
                repo,
                &[
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "commit",
                    "-qm",
                    message,
                ],
            );
            git(repo, &["rev-parse", "HEAD"]).unwrap()
        };
        // A checkout with commits, none of them holding the files.
        std::fs::write(repo.join(".gitignore"), "*.toml\n*.rs\n").unwrap();
        commit("unrelated");
        never(find_with(&manifest, &analysis).unwrap_err());
        std::fs::remove_file(repo.join(".gitignore")).unwrap();
        let registered = commit("register");
        let r = find_with(&manifest, &analysis).unwrap();
        assert_eq!(r.commit, registered);
        assert_eq!(r.files, ["study.toml", "verdict.rs"]);
        assert!(r.modified.is_empty());
        assert!(r.analysis_changed_since.is_empty());
        // A later commit elsewhere does not move the registration.
        std::fs::write(repo.join("other.txt"), "x").unwrap();
        commit("other");
        assert_eq!(find_with(&manifest, &analysis).unwrap().commit, registered);
        // An edit to the analysis is reported, and once committed it does
        // not move the registration: it is listed as a change since.
        std::fs::write(&analysis[0], "// another test\n").unwrap();
        let r = find_with(&manifest, &analysis).unwrap();
        assert_eq!(r.modified, ["verdict.rs"]);
        commit("change the verdict");
        let r = find_with(&manifest, &analysis).unwrap();
        assert_eq!(r.commit, registered);
        assert!(r.modified.is_empty());
        assert_eq!(r.analysis_changed_since.len(), 1, "{r:?}");
        assert!(r.analysis_changed_since[0].ends_with(" change the verdict"));
        // Changing the manifest registers again, with the analysis as it is.
        std::fs::write(&manifest, "name = \"study 2\"\n").unwrap();
        let again = commit("register again");
        let r = find_with(&manifest, &analysis).unwrap();
        assert_eq!(r.commit, again);
        assert!(r.analysis_changed_since.is_empty());
        // Outside a checkout there is no registration.
        let elsewhere = tempfile::tempdir().unwrap();
        let lone = elsewhere.path().join("study.toml");
        std::fs::write(&lone, "").unwrap();
        assert!(find_with(&lone, &[]).is_err());
    }

    #[test]
    fn this_checkouts_study_manifests_are_registered_when_committed() {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/arith.toml");
        // Outside a git checkout (a source tarball) there is no registration.
        let Ok(r) = find(&manifest) else { return };
        assert_eq!(r.commit.len(), 40, "{r:?}");
        assert!(
            r.files.contains(&"experiments/arith.toml".to_string()),
            "{r:?}"
        );
        assert!(r
            .files
            .contains(&"crates/mappa-cli/src/study/verdict.rs".to_string()));
        assert!(r.modified.iter().all(|f| r.files.contains(f)));
    }
}
