//! What a run did to its working directory: snapshots of (size, mtime) by
//! relative path before and after, and their difference.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

use super::{SandboxError, PRIVATE_DIR};

/// How a file changed during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FileChangeKind {
    /// It did not exist before.
    Created,
    /// Its size or modification time changed.
    Modified,
    /// It existed before and does not now.
    Deleted,
}

/// A file created, modified or deleted by a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// Path relative to the working directory, with `/` separators.
    pub path: String,
    /// What happened to it.
    pub change: FileChangeKind,
    /// Size in bytes after the run (0 when deleted).
    pub size: u64,
}

/// (size, modification time in ns) of every file beneath a directory.
pub(crate) type Snapshot = BTreeMap<String, (u64, u128)>;

/// Every regular file and symlink beneath `root`, except [`PRIVATE_DIR`].
/// Symlinks are recorded, never followed.
pub(crate) fn snapshot(root: &Path) -> Result<Snapshot, SandboxError> {
    let mut out = Snapshot::new();
    for_each_file(root, &mut |rel, _, meta| {
        let mtime = meta
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        out.insert(rel.to_string(), (meta.len(), mtime));
        Ok(())
    })?;
    Ok(out)
}

/// Call `visit(relative path, path, metadata)` for every entry that is not a
/// directory beneath `root` (symlinks included, never followed), in no
/// particular order, leaving out the top-level [`PRIVATE_DIR`].
pub(crate) fn for_each_file(
    root: &Path,
    visit: &mut dyn FnMut(&str, &Path, &std::fs::Metadata) -> Result<(), SandboxError>,
) -> Result<(), SandboxError> {
    fn walk(
        dir: &Path,
        prefix: &str,
        visit: &mut dyn FnMut(&str, &Path, &std::fs::Metadata) -> Result<(), SandboxError>,
    ) -> Result<(), SandboxError> {
        for entry in std::fs::read_dir(dir).map_err(|e| SandboxError::io(dir, e))? {
            let entry = entry.map_err(|e| SandboxError::io(dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if prefix.is_empty() && name == PRIVATE_DIR {
                continue;
            }
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            let path = entry.path();
            let meta = path
                .symlink_metadata()
                .map_err(|e| SandboxError::io(&path, e))?;
            if meta.is_dir() {
                walk(&path, &rel, visit)?;
            } else {
                visit(&rel, &path, &meta)?;
            }
        }
        Ok(())
    }
    walk(root, "", visit)
}

/// The changes from `before` to `after`, sorted by path.
pub(crate) fn diff(before: &Snapshot, after: &Snapshot) -> Vec<FileChange> {
    let mut changes = Vec::new();
    for (path, &(size, mtime)) in after {
        let change = match before.get(path) {
            None => FileChangeKind::Created,
            Some(&(s, m)) if s != size || m != mtime => FileChangeKind::Modified,
            Some(_) => continue,
        };
        changes.push(FileChange {
            path: path.clone(),
            change,
            size,
        });
    }
    for path in before.keys().filter(|p| !after.contains_key(*p)) {
        changes.push(FileChange {
            path: path.clone(),
            change: FileChangeKind::Deleted,
            size: 0,
        });
    }
    changes.sort_by(|a, b| a.path.cmp(&b.path));
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_reports_created_modified_deleted_and_skips_private_dir() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("keep.txt"), "a").unwrap();
        std::fs::write(root.join("change.txt"), "a").unwrap();
        std::fs::write(root.join("gone.txt"), "a").unwrap();
        std::fs::create_dir(root.join(PRIVATE_DIR)).unwrap();
        let before = snapshot(root).unwrap();
        std::fs::write(root.join("change.txt"), "abc").unwrap();
        std::fs::remove_file(root.join("gone.txt")).unwrap();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/new.csv"), "x,y\n").unwrap();
        std::fs::write(root.join(PRIVATE_DIR).join("tmp"), "hidden").unwrap();
        let after = snapshot(root).unwrap();
        let changes = diff(&before, &after);
        let summary: Vec<_> = changes
            .iter()
            .map(|c| (c.path.as_str(), c.change, c.size))
            .collect();
        assert_eq!(
            summary,
            vec![
                ("change.txt", FileChangeKind::Modified, 3),
                ("gone.txt", FileChangeKind::Deleted, 0),
                ("sub/new.csv", FileChangeKind::Created, 4),
            ]
        );
    }
}
