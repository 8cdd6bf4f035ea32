//! The files a manifest names: a path with its expected sha256
//! ([`FileRef`]), paths made relative to the manifest's directory, and the
//! hash check (a model directory hashed by its safetensors files).

use std::path::{Path, PathBuf};

use mappa_core::hash::{sha256_file, sha256_hex};
use serde::{Deserialize, Serialize};

use crate::TrainError;

/// A file with its expected hash.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileRef {
    /// The path.
    pub path: PathBuf,
    /// Its expected sha256.
    #[serde(default)]
    pub sha256: Option<String>,
}

/// Make a relative `path` relative to `base` (a manifest's directory).
pub(crate) fn rebase(path: &mut PathBuf, base: &Path) {
    if path.is_relative() {
        *path = tidy(&base.join(&*path));
    }
}

/// `a/b/../c` -> `a/c`, without touching the file system.
fn tidy(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir
                if matches!(
                    out.components().next_back(),
                    Some(std::path::Component::Normal(_))
                ) =>
            {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Check that `path` exists and has the `expected` sha256 (a directory: its
/// safetensors files, see [`weights_sha256`]); returns the hash found.
pub(crate) fn check_file(
    path: &Path,
    expected: &Option<String>,
    what: &str,
) -> Result<String, TrainError> {
    if !path.exists() {
        return Err(path_err(path, format!("{what} does not exist")));
    }
    let found = if path.is_dir() {
        weights_sha256(path)?
    } else {
        sha256_file(path).map_err(|e| path_err(path, e))?
    };
    match expected {
        Some(e) if e != &found => Err(path_err(
            path,
            format!("{what} has sha256 {found}, the manifest expects {e}"),
        )),
        _ => Ok(found),
    }
}

/// A configuration error about `path`: the path, then `message`.
pub(crate) fn path_err(path: &Path, message: impl std::fmt::Display) -> TrainError {
    TrainError::Config(format!("{}: {message}", path.display()))
}

/// sha256 over a checkpoint's safetensors files (their digests, in name order).
pub fn weights_sha256(dir: &Path) -> Result<String, TrainError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| path_err(dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(path_err(dir, "no .safetensors files"));
    }
    let mut digests = String::new();
    for f in &files {
        digests.push_str(&sha256_file(f).map_err(|e| path_err(f, e))?);
    }
    Ok(sha256_hex(digests.as_bytes()))
}
