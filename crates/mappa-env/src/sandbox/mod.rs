//! The Python sandbox: where agent-written (untrusted) code runs.
//!
//! Each run gets its own working directory, python3 with stdin closed and a
//! scrubbed environment, wall-clock, CPU-time, address-space, process-count
//! and file-size limits, capped output, no network, a kill of everything it
//! started when it ends or times out, and no writes outside its directory.
//! The run returns a [`RunResult`]: a [`Status`], the captured output, the
//! exit code, the time used and the files it created, changed or deleted.
//!
//! # How each guarantee is enforced (Linux)
//! | guarantee | mechanism | where unavailable |
//! |---|---|---|
//! | no network | a new network namespace (only a down loopback), and Landlock TCP rules (ABI >= 4) | reported in [`Isolation`]; a run still happens |
//! | no writes outside the directory | Landlock, writes allowed only beneath the working directory and to `/dev/null` | reported in [`Isolation`] |
//! | process limit | `RLIMIT_NPROC`, per sandbox: as root the run drops to a dedicated uid; otherwise it runs in a new user namespace, where the kernel counts processes per namespace | see [`Isolation::process_limit_scope`] |
//! | memory | `RLIMIT_AS` (address space) | - |
//! | CPU, files | `RLIMIT_CPU`, `RLIMIT_FSIZE`, `RLIMIT_CORE = 0`, `RLIMIT_NOFILE` | - |
//! | kill on timeout | the run leads its own process group, killed with `SIGKILL`; as root every process of the run's uid is killed too | without root, a process that calls `setsid()` leaves the group |
//! | secrets | the environment is replaced by a short fixed list; the parent marks itself non-dumpable so that same-uid code cannot read `/proc/<parent>/environ` | - |
//! | no zombies | the parent is a child subreaper and reaps the run's orphans | - |
//!
//! Files persist across the runs of one trajectory in its working directory;
//! [`workspace::TrajectoryWorkspace`] gives each agent of a trajectory its
//! own directory and passes files matching named patterns from one agent to
//! the next. A worker cap bounds concurrent runs of one [`Sandbox`].

mod files;
#[cfg(target_os = "linux")]
mod landlock;
#[cfg(target_os = "linux")]
mod process;
pub mod workspace;

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use files::{FileChange, FileChangeKind};

/// Directory inside every working directory that holds the sandbox's own
/// files (the program, `TMPDIR`); it is left out of the reported changes.
pub const PRIVATE_DIR: &str = ".mappa";

/// Resource limits of one run.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Limits {
    /// Wall-clock limit; the whole run is killed when it passes.
    pub wall_time: Duration,
    /// CPU-time limit per process (`RLIMIT_CPU`), in seconds.
    pub cpu_time_s: u64,
    /// Address-space limit per process (`RLIMIT_AS`), in MiB.
    pub memory_mb: u64,
    /// Most processes (and threads) alive at once in one run.
    pub max_processes: u64,
    /// Largest file a run may write, in MiB (`RLIMIT_FSIZE`).
    pub max_file_mb: u64,
    /// Most open file descriptors per process.
    pub max_open_files: u64,
    /// Bytes of stdout, and separately of stderr, kept; the rest is dropped
    /// and a marker says how much.
    pub max_output_bytes: usize,
}

impl Default for Limits {
    /// The paper's 60 s timeout (docs/METHOD.md section 2), 4 GiB of address
    /// space (numpy/pandas/scikit-learn need about 1 GiB of it), 64 processes,
    /// 256 MiB files and 64 KiB of each output stream.
    fn default() -> Self {
        Self {
            wall_time: Duration::from_secs(60),
            cpu_time_s: 60,
            memory_mb: 4096,
            max_processes: 64,
            max_file_mb: 256,
            max_open_files: 256,
            max_output_bytes: 64 * 1024,
        }
    }
}

/// Settings of a [`Sandbox`].
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// The Python interpreter: a real executable, not a shell shim (see
    /// [`SandboxConfig::discover`]).
    pub python: PathBuf,
    /// Limits applied to every run.
    pub limits: Limits,
    /// Most runs at once.
    pub max_workers: usize,
    /// When running as root, each run drops to a uid from
    /// `uid_base .. uid_base + 4096`, reserved by a lock file, so that its
    /// process limit and final kill cover exactly its own processes. Pick a
    /// range no real account uses.
    pub uid_base: u32,
}

/// Environment variable naming the Python interpreter for the sandbox.
pub const PYTHON_ENV: &str = "MAPPA_SANDBOX_PYTHON";
/// Environment variable naming the sandbox virtualenv (`just setup-python`).
pub const VENV_ENV: &str = "MAPPA_SANDBOX_VENV";

impl SandboxConfig {
    /// Default limits with the interpreter found by [`find_python`].
    pub fn discover() -> Result<Self, SandboxError> {
        Ok(Self::with_python(find_python(None)?))
    }

    /// Default limits with the given interpreter.
    pub fn with_python(python: PathBuf) -> Self {
        Self {
            python,
            limits: Limits::default(),
            max_workers: 4,
            uid_base: 1_960_000_000,
        }
    }
}

/// A fresh temporary directory that the sandbox's run uid can traverse
/// (mode 0711), removed when dropped: for one-off runs and tests. Run
/// directories go below it.
pub fn scratch_dir() -> Result<tempfile::TempDir, SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().map_err(|e| SandboxError::io(std::env::temp_dir(), e))?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
        .map_err(|e| SandboxError::io(dir.path(), e))?;
    Ok(dir)
}

/// The Python interpreter for the sandbox, in order of preference: `$MAPPA_SANDBOX_PYTHON`;
/// `$MAPPA_SANDBOX_VENV/bin/python`; `.venv-sandbox/bin/python` in `workspace`
/// (or any of its ancestors); `python3` on `PATH`. Shims (pyenv, asdf) are
/// resolved to the real executable by asking the interpreter for
/// `sys.executable`, because the sandbox's scrubbed environment breaks them.
pub fn find_python(workspace: Option<&Path>) -> Result<PathBuf, SandboxError> {
    if let Some(p) = std::env::var_os(PYTHON_ENV) {
        return resolve_python(Path::new(&p));
    }
    if let Some(v) = std::env::var_os(VENV_ENV) {
        return resolve_python(&Path::new(&v).join("bin/python"));
    }
    let start = match workspace {
        Some(w) => w.to_path_buf(),
        None => std::env::current_dir().map_err(|e| SandboxError::io(".", e))?,
    };
    for dir in start.ancestors() {
        let candidate = dir.join(".venv-sandbox/bin/python");
        if candidate.exists() {
            return resolve_python(&candidate);
        }
    }
    resolve_python(Path::new("python3"))
}

/// Ask `python` for its real executable (a virtualenv's own `bin/python` is
/// kept: it is what makes the environment's packages importable).
fn resolve_python(python: &Path) -> Result<PathBuf, SandboxError> {
    let out = std::process::Command::new(python)
        .args(["-c", "import sys; print(sys.executable)"])
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| SandboxError::Python {
            python: python.to_path_buf(),
            reason: format!("cannot be started: {e}"),
        })?;
    if !out.status.success() {
        return Err(SandboxError::Python {
            python: python.to_path_buf(),
            reason: format!(
                "exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    let exe = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if exe.is_empty() {
        return Err(SandboxError::Python {
            python: python.to_path_buf(),
            reason: "sys.executable is empty".into(),
        });
    }
    Ok(PathBuf::from(exe))
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Exit code 0, output within the cap.
    Ok,
    /// A non-zero exit code (an exception, `sys.exit(1)`, ...).
    Error,
    /// The wall-clock or CPU-time limit was reached.
    Timeout,
    /// The address-space limit was reached (Python raised `MemoryError`).
    Memory,
    /// Ended by a signal the sandbox did not send for a limit.
    Killed,
    /// Exit code 0, but stdout or stderr passed the cap and was cut.
    OutputTruncated,
}

/// Which protections were in force for a run (they depend on the kernel and
/// on whether mappa runs as root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Isolation {
    /// The run had its own network namespace (no interfaces but a down loopback).
    pub network_namespace: bool,
    /// Landlock forbade TCP connect and bind.
    pub tcp_blocked: bool,
    /// Landlock confined writes to the working directory.
    pub writes_confined: bool,
    /// The uid the program ran as, when mappa (as root) dropped privileges.
    pub uid: Option<u32>,
    /// What `max_processes` counts: `"run-uid"` (a uid of its own),
    /// `"user-namespace"` (processes in the run's user namespace), or
    /// `"user"` (all processes of the invoking user, counted at the start).
    pub process_limit_scope: String,
}

/// The outcome of one run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    /// How the run ended.
    pub status: Status,
    /// The exit code, when the program exited.
    pub exit_code: Option<i32>,
    /// The signal that ended the program, when one did.
    pub signal: Option<i32>,
    /// Captured stdout (lossy UTF-8), ending with a marker when cut.
    pub stdout: String,
    /// Captured stderr (lossy UTF-8), ending with a marker when cut.
    pub stderr: String,
    /// stdout passed the cap.
    pub stdout_truncated: bool,
    /// stderr passed the cap.
    pub stderr_truncated: bool,
    /// Wall-clock seconds from start to the end of the program.
    pub wall_time_s: f64,
    /// CPU seconds (user + system) of the program and the children it waited for.
    pub cpu_time_s: f64,
    /// Files created, modified or deleted in the working directory, by path.
    pub files: Vec<FileChange>,
    /// The protections that were in force.
    pub isolation: Isolation,
}

/// Errors that prevent a run from happening at all (a program that fails is
/// a [`RunResult`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A file-system operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The interpreter is unusable.
    #[error("python interpreter {python}: {reason}")]
    Python {
        /// The interpreter tried.
        python: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// As root, the run's unprivileged uid cannot reach a path it needs.
    #[error(
        "{path} is not reachable by the sandbox's unprivileged uid {uid}: {reason}. \
         Put the sandbox interpreter (see `just setup-python`, $MAPPA_SANDBOX_VENV) and the working \
         directory where every user may traverse the parent directories"
    )]
    Unreachable {
        /// The path.
        path: PathBuf,
        /// The uid that must reach it.
        uid: u32,
        /// Why it cannot.
        reason: String,
    },
    /// A file pattern is malformed.
    #[error("file pattern {pattern:?}: {reason}")]
    Pattern {
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Starting the program failed.
    #[error("could not start the sandboxed program: {0}")]
    Spawn(std::io::Error),
    /// The platform lacks what the sandbox needs.
    #[error("the sandbox needs Linux; this platform has no equivalent of its limits")]
    Unsupported,
}

impl SandboxError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// Runs Python programs under [`Limits`], at most `max_workers` at a time.
#[derive(Debug)]
pub struct Sandbox {
    config: SandboxConfig,
    busy: Mutex<usize>,
    freed: Condvar,
    /// Wall time spent in [`Sandbox::run_all`] so far.
    batch_time: Mutex<std::time::Duration>,
}

impl Sandbox {
    /// A sandbox with the given settings. On Linux this also marks the
    /// current process non-dumpable and a child subreaper (see the module docs).
    pub fn new(config: SandboxConfig) -> Result<Self, SandboxError> {
        if config.max_workers == 0 {
            return Err(SandboxError::Python {
                python: config.python.clone(),
                reason: "max_workers must be at least 1".into(),
            });
        }
        #[cfg(target_os = "linux")]
        process::prepare_parent();
        Ok(Self {
            config,
            busy: Mutex::new(0),
            freed: Condvar::new(),
            batch_time: Mutex::new(std::time::Duration::ZERO),
        })
    }

    /// The settings.
    pub fn config(&self) -> &SandboxConfig {
        &self.config
    }

    /// Run `code` as a Python program in `workdir` (created if missing).
    /// Blocks while `max_workers` runs are already going.
    pub fn run(&self, workdir: &Path, code: &str) -> Result<RunResult, SandboxError> {
        let _slot = self.acquire();
        #[cfg(target_os = "linux")]
        {
            process::run(&self.config, workdir, code)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (workdir, code);
            Err(SandboxError::Unsupported)
        }
    }

    /// Run each program of `jobs` (`(workdir, Some(code))`; `None` where
    /// there is nothing to run) on at most `max_workers` threads; the results
    /// in the order of `jobs`.
    pub fn run_all(
        &self,
        jobs: &[(&Path, Option<&str>)],
    ) -> Vec<Option<Result<RunResult, SandboxError>>> {
        let start = std::time::Instant::now();
        let results = mappa_core::par::map_bounded(jobs, self.config.max_workers, |(dir, code)| {
            code.map(|code| self.run(dir, code))
        });
        *self.batch_time.lock().unwrap_or_else(|e| e.into_inner()) += start.elapsed();
        results
    }

    /// Wall time spent in [`Sandbox::run_all`] since the sandbox was made:
    /// how long callers waited for batches of programs.
    pub fn batch_time(&self) -> std::time::Duration {
        *self.batch_time.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn acquire(&self) -> WorkerSlot<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy >= self.config.max_workers {
            busy = self.freed.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        *busy += 1;
        WorkerSlot(self)
    }
}

/// One of a [`Sandbox`]'s `max_workers` places; freed on drop.
struct WorkerSlot<'a>(&'a Sandbox);

impl Drop for WorkerSlot<'_> {
    fn drop(&mut self) {
        let mut busy = self.0.busy.lock().unwrap_or_else(|e| e.into_inner());
        *busy -= 1;
        self.0.freed.notify_one();
    }
}
