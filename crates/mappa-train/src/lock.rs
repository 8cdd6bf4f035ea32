//! The lock file (`manifest.lock.json`): a manifest as a run used it, with
//! everything else its numbers depend on. Written once when a run starts
//! and read back to resume it, to report on it and to compare machines;
//! its sha256, without what changes no result, is the run id.

use std::path::Path;

use mappa_core::hash::sha256_hex;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::Served;
use crate::machine::Machine;
use crate::manifest::{results_relevant, Manifest};
use crate::TrainError;

/// The lock file's name in a run directory.
pub const LOCK_FILE: &str = "manifest.lock.json";

/// A run's lock. The field order is the file's (and the run id's) key order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lock {
    /// The manifest as resolved (paths made absolute), kept as JSON so that
    /// a run directory written by an older mappa still reads.
    #[serde(default)]
    pub manifest: Value,
    /// The hashes of the files it names ([`Manifest::resolve`]).
    #[serde(default)]
    pub resolved: Value,
    /// The code that ran it.
    #[serde(default)]
    pub code: CodeVersion,
    /// mappa's and burn's versions.
    #[serde(default)]
    pub crates: CrateVersions,
    /// [`mappa_model::kernels::SUMMATION_ORDER`] when it ran.
    #[serde(default)]
    pub summation_order: u32,
    /// The machine it started on (outside the run id).
    #[serde(default)]
    pub machine: Machine,
    /// The inference engine it started with, if any (outside the run id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<Served>,
    /// Each other engine it was resumed with, in order (outside the run id).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_resumed: Vec<Served>,
}

/// The git commit of the code and whether its tree had changes (both
/// unknown outside a git checkout).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CodeVersion {
    /// `git rev-parse HEAD`.
    pub git_commit: Option<String>,
    /// Whether `git status --porcelain` listed anything.
    pub dirty: Option<bool>,
}

/// The versions of mappa and of burn it was built with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CrateVersions {
    /// mappa's version.
    pub mappa: String,
    /// burn's version.
    pub burn: String,
}

impl CodeVersion {
    /// The version of the git checkout holding `dir`.
    pub fn of(dir: &Path) -> Self {
        let git = |args: &[&str]| {
            std::process::Command::new("git")
                .args(args)
                .current_dir(dir)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        match git(&["rev-parse", "HEAD"]) {
            Some(commit) => Self {
                git_commit: Some(commit),
                dirty: Some(git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty())),
            },
            None => Self::default(),
        }
    }
}

impl Lock {
    /// The lock of `manifest` with its `resolved` hashes, run by the code in
    /// the checkout holding `source_dir`, on this machine.
    pub fn new(manifest: &Manifest, resolved: Value, source_dir: &Path) -> Self {
        Self {
            manifest: serde_json::to_value(manifest).expect("a manifest serialises"),
            resolved,
            code: CodeVersion::of(source_dir),
            crates: CrateVersions {
                mappa: env!("CARGO_PKG_VERSION").into(),
                burn: "0.21.0".into(),
            },
            summation_order: mappa_model::kernels::SUMMATION_ORDER,
            machine: Machine::here(),
            engine: None,
            engine_resumed: Vec::new(),
        }
    }

    /// The run id: the sha256 of the lock's JSON without the machine, the
    /// engines (what served it) and the manifest's keys that change no
    /// result ([`results_relevant`]), so that the same experiment has the
    /// same id on every machine.
    pub fn run_id(&self) -> String {
        let mut lock = serde_json::to_value(self).expect("a lock serialises");
        if let Some(object) = lock.as_object_mut() {
            object.remove("machine");
            object.remove("engine");
            object.remove("engine_resumed");
            if let Some(manifest) = object.get_mut("manifest") {
                *manifest = results_relevant(manifest);
            }
        }
        sha256_hex(lock.to_string().as_bytes())
    }

    /// Whether a run locked as `self` may continue under `other`: the same
    /// manifest in every key that changes a result, and the same files.
    pub fn resumes_as(&self, other: &Lock) -> bool {
        results_relevant(&self.manifest) == results_relevant(&other.manifest)
            && self.resolved == other.resolved
    }

    /// The manifest's master seed.
    pub fn seed(&self) -> Option<u64> {
        self.manifest["seed"].as_u64()
    }

    /// The engines that served the run: the one it started with, then each
    /// it was resumed with.
    pub fn engines(&self) -> impl Iterator<Item = &Served> {
        self.engine.iter().chain(&self.engine_resumed)
    }

    /// The lock of the run directory `dir`.
    pub fn read(dir: &Path) -> Result<Self, TrainError> {
        let path = dir.join(LOCK_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| {
            TrainError::Config(format!("{}: {e} (is it a run directory?)", path.display()))
        })?;
        serde_json::from_str(&text)
            .map_err(|e| TrainError::Config(format!("{}: not a lock file: {e}", path.display())))
    }

    /// Write the lock into the run directory `dir` (made if missing),
    /// atomically.
    pub fn write(&self, dir: &Path) -> Result<(), TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let text = serde_json::to_string_pretty(self).expect("a lock serialises");
        let path = dir.join(LOCK_FILE);
        Ok(mappa_core::fs::write_atomic(&path, text.as_bytes())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lock(manifest: Value) -> Lock {
        Lock {
            manifest,
            resolved: json!({ "workflow_sha256": "ab" }),
            code: CodeVersion {
                git_commit: Some("c0ffee".into()),
                dirty: Some(false),
            },
            crates: CrateVersions {
                mappa: "0.1.0".into(),
                burn: "0.21.0".into(),
            },
            summation_order: 1,
            machine: Machine::here(),
            engine: None,
            engine_resumed: Vec::new(),
        }
    }

    /// The file's layout, key order included, is the one run ids were
    /// computed over before the lock was typed: the ids stay.
    #[test]
    fn the_lock_keeps_the_layout_its_ids_were_computed_over() {
        let l = lock(json!({ "name": "x", "seed": 3 }));
        let before = json!({
            "manifest": { "name": "x", "seed": 3 },
            "resolved": { "workflow_sha256": "ab" },
            "code": { "git_commit": "c0ffee", "dirty": false },
            "crates": { "mappa": "0.1.0", "burn": "0.21.0" },
            "summation_order": 1,
            "machine": serde_json::to_value(&l.machine).unwrap(),
        });
        assert_eq!(serde_json::to_string(&l).unwrap(), before.to_string());
        let mut no_machine = before.as_object().unwrap().clone();
        no_machine.remove("machine");
        assert_eq!(
            l.run_id(),
            sha256_hex(Value::Object(no_machine).to_string().as_bytes())
        );
        assert_eq!(l.seed(), Some(3));
    }

    #[test]
    fn a_lock_round_trips_through_its_file_and_old_files_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = lock(json!({ "seed": 1 }));
        l.machine.threads = Some(7);
        l.write(dir.path()).unwrap();
        assert_eq!(Lock::read(dir.path()).unwrap(), l);
        // Written before code, crates and the machine's record existed.
        std::fs::write(
            dir.path().join(LOCK_FILE),
            r#"{"manifest": {"seed": 2}, "resolved": {}}"#,
        )
        .unwrap();
        let old = Lock::read(dir.path()).unwrap();
        assert_eq!((old.seed(), old.machine.cpu_model), (Some(2), None));
        let e = Lock::read(&dir.path().join("nowhere"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is it a run directory?"), "{e}");
    }

    #[test]
    fn runs_resume_only_under_the_same_results() {
        let a = lock(json!({ "seed": 1, "rollout": { "steps": 2, "max_prompt_tokens": 9 } }));
        let plan_only = lock(json!({ "seed": 1, "rollout": { "steps": 2 } }));
        let other = lock(json!({ "seed": 1, "rollout": { "steps": 3 } }));
        assert!(a.resumes_as(&plan_only));
        assert_eq!(a.run_id(), plan_only.run_id());
        assert!(!a.resumes_as(&other));
        assert_ne!(a.run_id(), other.run_id());
    }
}
