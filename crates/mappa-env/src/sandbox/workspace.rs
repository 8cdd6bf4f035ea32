//! Working directories of one trajectory: one per agent, files persisting
//! across that agent's actions, and files passed to the next agent by named
//! patterns (for example `*.csv`, `model/*.pkl`, `submission.csv`).

use std::path::{Path, PathBuf};

use super::SandboxError;

/// Glob patterns (`*`, `?`, `[...]`, `**`) over paths relative to an agent's
/// directory, with `/` separators.
#[derive(Debug, Clone, Default)]
pub struct FilePatterns(Vec<glob::Pattern>);

impl FilePatterns {
    /// Parse patterns; a malformed one is an error naming it.
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, SandboxError> {
        patterns
            .iter()
            .map(|p| {
                glob::Pattern::new(p.as_ref()).map_err(|e| SandboxError::Pattern {
                    pattern: p.as_ref().to_string(),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `path` (relative, `/`-separated) matches any pattern.
    pub fn matches(&self, path: &str) -> bool {
        let options = glob::MatchOptions {
            require_literal_separator: true,
            ..Default::default()
        };
        self.0.iter().any(|p| p.matches_with(path, options))
    }
}

/// The directories of one trajectory: `<root>/<agent>/` per agent.
#[derive(Debug, Clone)]
pub struct TrajectoryWorkspace {
    root: PathBuf,
}

impl TrajectoryWorkspace {
    /// Use (creating if needed) `root` for one trajectory.
    pub fn create(root: impl Into<PathBuf>) -> Result<Self, SandboxError> {
        let root = root.into();
        std::fs::create_dir_all(&root).map_err(|e| SandboxError::io(&root, e))?;
        Ok(Self { root })
    }

    /// The trajectory's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The working directory of `agent` (created if needed). Agent names are
    /// single path components.
    pub fn agent_dir(&self, agent: &str) -> Result<PathBuf, SandboxError> {
        if agent.is_empty() || agent.contains('/') || agent == "." || agent == ".." {
            return Err(SandboxError::io(
                &self.root,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("bad agent name {agent:?}"),
                ),
            ));
        }
        let dir = self.root.join(agent);
        std::fs::create_dir_all(&dir).map_err(|e| SandboxError::io(&dir, e))?;
        Ok(dir)
    }

    /// Copy input files (task data) into `agent`'s directory under their file
    /// names; returns the names.
    pub fn stage_inputs(
        &self,
        agent: &str,
        inputs: &[PathBuf],
    ) -> Result<Vec<String>, SandboxError> {
        let dir = self.agent_dir(agent)?;
        let mut names = Vec::new();
        for input in inputs {
            let name = input.file_name().ok_or_else(|| {
                SandboxError::io(
                    input,
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"),
                )
            })?;
            let target = dir.join(name);
            std::fs::copy(input, &target).map_err(|e| SandboxError::io(input, e))?;
            names.push(name.to_string_lossy().into_owned());
        }
        Ok(names)
    }

    /// Copy the regular files of `from`'s directory that match `patterns` into
    /// `to`'s directory, keeping relative paths; returns them, sorted.
    /// Symlinks are never followed or copied.
    pub fn hand_off(
        &self,
        from: &str,
        to: &str,
        patterns: &FilePatterns,
    ) -> Result<Vec<String>, SandboxError> {
        let source = self.agent_dir(from)?;
        let target = self.agent_dir(to)?;
        let mut passed = Vec::new();
        super::files::for_each_file(&source, &mut |rel, path, meta| {
            if meta.is_file() && patterns.matches(rel) {
                let dest = target.join(rel);
                if let Some(parent) = dest.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| SandboxError::io(parent, e))?;
                }
                std::fs::copy(path, &dest).map_err(|e| SandboxError::io(path, e))?;
                passed.push(rel.to_string());
            }
            Ok(())
        })?;
        passed.sort();
        Ok(passed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::PRIVATE_DIR;

    #[test]
    fn hand_off_copies_only_matching_regular_files() {
        let dir = tempfile::tempdir().unwrap();
        let ws = TrajectoryWorkspace::create(dir.path().join("traj-0")).unwrap();
        let eng = ws.agent_dir("engineer").unwrap();
        std::fs::write(eng.join("clean.csv"), "a\n1\n").unwrap();
        std::fs::write(eng.join("notes.txt"), "private").unwrap();
        std::fs::create_dir_all(eng.join("features")).unwrap();
        std::fs::write(eng.join("features/x.csv"), "x\n").unwrap();
        std::fs::create_dir_all(eng.join(PRIVATE_DIR)).unwrap();
        std::fs::write(eng.join(PRIVATE_DIR).join("main.py"), "print(1)").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", eng.join("link.csv")).unwrap();

        let patterns = FilePatterns::new(&["*.csv", "features/*.csv"]).unwrap();
        let passed = ws.hand_off("engineer", "modeler", &patterns).unwrap();
        assert_eq!(passed, vec!["clean.csv", "features/x.csv"]);
        let modeler = ws.agent_dir("modeler").unwrap();
        assert_eq!(
            std::fs::read_to_string(modeler.join("clean.csv")).unwrap(),
            "a\n1\n"
        );
        assert!(!modeler.join("notes.txt").exists());
        assert!(!modeler.join("link.csv").exists());
        assert!(!modeler.join(PRIVATE_DIR).exists());
    }

    #[test]
    fn star_does_not_cross_directories_and_bad_patterns_are_named() {
        let p = FilePatterns::new(&["*.csv"]).unwrap();
        assert!(p.matches("a.csv"));
        assert!(!p.matches("sub/a.csv"));
        assert!(FilePatterns::new(&["**/*.csv"])
            .unwrap()
            .matches("sub/a.csv"));
        let err = FilePatterns::new(&["[abc"]).unwrap_err().to_string();
        assert!(err.contains("[abc"), "{err}");
        let ws =
            TrajectoryWorkspace::create(tempfile::tempdir().unwrap().path().join("t")).unwrap();
        assert!(ws.agent_dir("..").is_err());
    }
}
