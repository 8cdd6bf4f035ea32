//! Helpers shared by the command-line tests: the workspace, the `mappa`
//! binary run from it, and scratch directories the sandbox can reach.

#![allow(dead_code)] // each test binary uses its own part of these helpers

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The workspace root (where `experiments/`, `fixtures/` and the sandbox's
/// `.venv-sandbox` are).
pub(crate) fn workspace() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The `mappa` binary under test, run from the workspace.
pub(crate) fn mappa() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mappa"));
    cmd.current_dir(workspace());
    cmd
}

/// The text of `fixtures/manifests/NAME.toml` with its relative paths made
/// absolute, so that it can be written anywhere.
pub(crate) fn fixture_manifest(name: &str) -> String {
    let ws = workspace().canonicalize().unwrap();
    std::fs::read_to_string(ws.join(format!("fixtures/manifests/{name}.toml")))
        .unwrap()
        .replace(
            "\"../../experiments",
            &format!("\"{}/experiments", ws.display()),
        )
        .replace(
            "\"../models",
            &format!("\"{}/fixtures/models", ws.display()),
        )
}

/// A temporary directory the sandbox's run uid can traverse.
pub(crate) fn scratch() -> tempfile::TempDir {
    mappa_env::sandbox::scratch_dir().unwrap()
}

/// Run `cmd` and check it succeeded (its stderr in the failure message).
pub(crate) fn succeeds(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run `cmd` and check it failed; returns its stderr.
pub(crate) fn fails(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected a failure: {stderr}");
    stderr
}

/// The single run directory under `runs`.
pub(crate) fn run_dir(runs: &Path) -> PathBuf {
    let dirs: Vec<_> = std::fs::read_dir(runs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].clone()
}
