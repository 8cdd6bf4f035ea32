//! Run directories: a manifest resolved into `manifest.lock.json` (whose
//! sha256 is the run id), and a run trained there on the backend the
//! manifest names.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use mappa_train::lock::{Lock, LOCK_FILE};
use mappa_train::manifest::{BackendKind, Manifest};
use mappa_train::run::{run, RunEnd, RunOptions};

/// Evaluates `$body` with `$B` naming the autodiff backend of `$kind` (a
/// [`BackendKind`]), or returns an error for a backend this binary was
/// built without.
macro_rules! on_backend {
    ($kind:expr, $B:ident => $body:expr) => {
        match $kind {
            mappa_train::manifest::BackendKind::Cpu => {
                type $B = burn::backend::Autodiff<mappa_model::backend::Cpu>;
                $body
            }
            #[cfg(feature = "wgpu")]
            mappa_train::manifest::BackendKind::Wgpu => {
                type $B = burn::backend::Autodiff<mappa_model::backend::Wgpu>;
                $body
            }
            #[cfg(feature = "cuda")]
            mappa_train::manifest::BackendKind::Cuda => {
                type $B = burn::backend::Autodiff<mappa_model::backend::Cuda>;
                $body
            }
            #[allow(unreachable_patterns)] // reached in builds without every GPU feature
            other => anyhow::bail!(
                "backend {} is not built into this binary",
                $crate::rundir::feature_name(other)
            ),
        }
    };
}
pub(crate) use on_backend;

/// The repository root: the nearest ancestor of the current directory with
/// `experiments/` (where `mappa reproduce NAME` finds `experiments/NAME.toml`).
pub fn repo_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    cwd.ancestors()
        .find(|d| d.join("experiments").is_dir())
        .map(Path::to_path_buf)
        .unwrap_or(cwd)
}

/// Which backends this binary was built with.
pub fn backend_available(kind: BackendKind) -> bool {
    match kind {
        BackendKind::Cpu => true,
        BackendKind::Wgpu => cfg!(feature = "wgpu"),
        BackendKind::Cuda => cfg!(feature = "cuda"),
    }
}

/// Checks, before anything is written, that `kind` is built into this
/// binary and that its device can be used here, naming what is missing.
pub fn check_backend(kind: BackendKind) -> anyhow::Result<()> {
    check_built(kind)?;
    check_device(kind)
}

/// That `kind` is built into this binary.
pub fn check_built(kind: BackendKind) -> anyhow::Result<()> {
    if !backend_available(kind) {
        bail!(
            "backend {0}: this binary was built without it; build with `cargo build --release -p mappa-cli --features {0}`",
            feature_name(kind)
        );
    }
    Ok(())
}

/// That the device of `kind` (built in) can be used here: for CUDA, the
/// driver and NVRTC load and the driver sees a device; for wgpu, an
/// adapter is found.
pub fn check_device(kind: BackendKind) -> anyhow::Result<()> {
    let found: Option<String> = match kind {
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Some(mappa_model::device::check_cuda()?),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => Some(mappa_model::device::check_wgpu()?),
        _ => None,
    };
    if let Some(found) = found {
        eprintln!("backend {}: {found}", feature_name(kind));
    }
    Ok(())
}

/// The cargo feature (and manifest name) of a backend.
pub fn feature_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cpu => "cpu",
        BackendKind::Wgpu => "wgpu",
        BackendKind::Cuda => "cuda",
    }
}

/// The manifest's lock (resolved hashes, code version, machine) and run id.
/// The code version is that of the repository holding the manifest's
/// workflow, wherever mappa is run from.
pub fn lock_and_id(manifest: &Manifest) -> anyhow::Result<(Lock, String)> {
    let resolved = manifest.resolve()?;
    let source = manifest.workflow.parent().unwrap_or(Path::new("."));
    let lock = Lock::new(manifest, resolved, source);
    let id = lock.run_id();
    Ok((lock, id))
}

/// With `[rollout.engine]`: what serves there ([`mappa_train::engine::identify`]:
/// the server, its version, the base model, the contract), recorded in the
/// lock as `engine`, outside the run id as the machine is. Asked before
/// anything is written; printed.
fn note_engine(manifest: &Manifest, lock: &mut Lock) -> anyhow::Result<()> {
    if let Some(spec) = &manifest.rollout.engine {
        let mut served = mappa_train::engine::identify(spec)?;
        eprintln!("engine at {}: {served}", spec.url);
        if manifest.coach_shares_engine() {
            let hazard = mappa_train::engine::COACH_SHARES_ENGINE;
            eprintln!("warning: {hazard}");
            served.hazards.push(hazard.to_string());
        }
        lock.engine = Some(served);
    }
    Ok(())
}

/// On resuming with an engine other than the one the run last had: a
/// warning, and the new one appended to the lock's `engine_resumed` (the
/// report names each).
fn note_resumed_engine(dir: &Path, mut old: Lock, lock: &Lock) -> anyhow::Result<()> {
    let Some(now) = &lock.engine else {
        return Ok(());
    };
    let before = old.engines().last().cloned();
    if before.as_ref() == Some(now) {
        return Ok(());
    }
    let before = before.map_or_else(|| "none".to_string(), |b| b.to_string());
    eprintln!(
        "warning: this run was started with another engine serving ({before}); now {now}: \
         its completions may differ from an uninterrupted run's"
    );
    old.engine_resumed.push(now.clone());
    Ok(old.write(dir)?)
}

/// Resolve, lock, and choose the run directory: `runs_dir/<name>-<id>`, or
/// `resume` (whose lock must match).
pub fn prepare(
    manifest: &Manifest,
    resume: Option<&Path>,
    runs_dir: &Path,
) -> anyhow::Result<PathBuf> {
    let (mut lock, id) = lock_and_id(manifest)?;
    note_engine(manifest, &mut lock)?;
    if let Some(dir) = resume {
        let old = Lock::read(dir)?;
        if !old.resumes_as(&lock) {
            bail!(
                "{}: the manifest or its files changed since the run started; start a new run instead",
                dir.display()
            );
        }
        if let Some(warning) =
            mappa_train::machine::warning("this run was started", &old.machine, &lock.machine)
        {
            eprintln!("{warning}");
        }
        note_resumed_engine(dir, old, &lock)?;
        return Ok(dir.to_path_buf());
    }
    let dir = runs_dir.join(format!("{}-{}", manifest.name, &id[..12]));
    lock.write(&dir)?;
    Ok(dir)
}

/// Resolve and lock into `dir`, a new run directory chosen by the caller.
pub fn prepare_in(manifest: &Manifest, dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.join(LOCK_FILE).exists() {
        bail!(
            "{}: already a run directory; continue it with --resume",
            dir.display()
        );
    }
    let (mut lock, _) = lock_and_id(manifest)?;
    note_engine(manifest, &mut lock)?;
    lock.write(dir)?;
    Ok(dir.to_path_buf())
}

/// The manifest's memory plan (`mappa_train::memory`) for `workflow`'s
/// agents and `eval_tasks` held-out tasks.
pub fn memory_plan(
    manifest: &Manifest,
    workflow: &mappa_agents::Workflow,
    eval_tasks: usize,
) -> anyhow::Result<mappa_train::memory::DevicePlans> {
    let agents: Vec<(String, usize)> = workflow
        .agents
        .iter()
        .map(|a| (a.role.clone(), a.max_actions))
        .collect();
    Ok(manifest.memory_plan(&agents, eval_tasks)?)
}

/// With `[devices]` declared: prints the memory plan, and refuses one that
/// does not fit before anything is written (generated tasks are made in a
/// scratch directory for the count of held-out tasks).
pub fn check_memory(manifest: &Manifest) -> anyhow::Result<()> {
    if manifest.devices.is_none() {
        return Ok(());
    }
    let workflow = mappa_agents::Workflow::load(&manifest.workflow)?;
    let scratch = tempfile::tempdir().map_err(|e| anyhow!("temporary directory: {e}"))?;
    let tasks = mappa_train::run::load_tasks(manifest, scratch.path())?;
    let plan = memory_plan(manifest, &workflow, tasks.eval.len())?;
    eprint!("memory plan:\n{}", plan.render());
    plan.check()
        .map_err(|e| anyhow!("{}: {e}; nothing was run", manifest.name))
}

/// Train the manifest in `run_dir` on its backend and say how it ended.
/// Its callers have checked the device before writing anything
/// ([`check_backend`]).
pub fn execute(manifest: &Manifest, run_dir: &Path, options: &RunOptions) -> anyhow::Result<()> {
    check_built(manifest.backend)?;
    eprintln!("run directory: {}", run_dir.display());
    let end: RunEnd = on_backend!(manifest.backend, B => {
        run::<B>(manifest, run_dir, options, &Default::default())
    })?;
    match end.final_eval {
        Some(eval) => eprintln!("final held-out accuracy: {:.3}", eval.accuracy),
        None if end.step < manifest.rollout.steps => eprintln!(
            "stopped after step {}; continue with --resume {}",
            end.step,
            run_dir.display()
        ),
        None => eprintln!("finished {} steps (no held-out tasks)", end.step),
    }
    Ok(())
}
