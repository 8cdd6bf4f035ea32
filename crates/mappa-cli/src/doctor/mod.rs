//! `mappa doctor`: what to run on a new machine before a long run. It
//! reports what it found (the backend's libraries and devices, burn's and
//! cubecl's versions, the machine), then runs each check on its own (a
//! failing or panicking check does not hide the rest), prints one
//! PASS/FAIL/SKIP line per check and writes one JSON line with the measured
//! value beside its tolerance (`checks.jsonl`), `environment.json` and a
//! `summary.md` table into `--out`. The exit code says whether all passed.
//!
//! The checks, each against the CPU backend (on the CPU, the CPU against
//! itself, which exercises the checks and the CPU's run-to-run bits):
//! - `parity-*`: a seeded random Qwen3-shaped model and the tiny HF
//!   fixtures ([`parity`]);
//! - `step-*`, `data-parallel`: the learner's update, full and LoRA, with
//!   recomputed layers, fused attention, a bf16 base, data-parallel
//!   replicas ([`step`]);
//! - `determinism-step`, `determinism-run`: the same update, and the same
//!   tiny run, twice on the device, bit for bit;
//! - `memory-*`: the memory plan as an upper bound of the measured peak
//!   ([`memory`]);
//! - `throughput-*`: tokens/s and model FLOPs utilisation ([`speed`]);
//! - `hf-export`: a model trained one step on the device, saved as a HF
//!   checkpoint with its logits (the GPU bundle's `hf_parity.py` loads it
//!   into transformers);
//! - `tiny-run`: two steps of `fixtures/manifests/tiny-arith-warm.toml` on
//!   the device ([`runs`]).
//!
//! Tolerances are fixed in [`compare`] per dtype.

pub mod compare;
pub mod memory;
pub mod parity;
pub mod runs;
pub mod speed;
pub mod step;

use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{anyhow, bail};
#[cfg(any(feature = "cuda", feature = "wgpu"))]
use burn::backend::Autodiff;
use clap::{Args, ValueEnum};
use mappa_model::AutodiffModelBackend;
use mappa_train::manifest::BackendKind;
use serde_json::{json, Value};

use crate::rundir::{check_built, feature_name, repo_root};

/// burn's version in this build (Cargo.lock; checked by a test).
pub const BURN_VERSION: &str = "0.21.0";
/// cubecl's version in this build (Cargo.lock; checked by a test).
pub const CUBECL_VERSION: &str = "0.10.0";

/// Arguments of `mappa doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// The backend to check against the CPU.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    backend: Backend,
    /// Where environment.json, checks.jsonl and summary.md go.
    #[arg(long, default_value = "doctor")]
    out: PathBuf,
    /// Model sizes: `small` (1M-25M parameters; the CPU's default) or
    /// `full` (SmolLM2-135M's config for memory, up to 0.5B for
    /// throughput; a GPU's default).
    #[arg(long, value_enum)]
    size: Option<Size>,
    /// Run only the checks whose names start with one of these
    /// (comma-separated, e.g. `parity,step-lora`).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Internal: measure one memory configuration in this process.
    #[arg(long, hide = true)]
    child: Option<String>,
}

/// A backend on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The CPU backend (against itself).
    Cpu,
    /// CUDA.
    Cuda,
    /// wgpu (Vulkan, Metal).
    Wgpu,
}

impl Backend {
    fn kind(self) -> BackendKind {
        match self {
            Backend::Cpu => BackendKind::Cpu,
            Backend::Cuda => BackendKind::Cuda,
            Backend::Wgpu => BackendKind::Wgpu,
        }
    }
}

/// How large the checked models are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Size {
    /// Small models: minutes on a CPU.
    Small,
    /// The sizes a GPU is checked at.
    Full,
}

impl Size {
    fn name(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Full => "full",
        }
    }
}

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Within its tolerance.
    Pass,
    /// Outside it, or the check could not run.
    Fail,
    /// Not measurable on this backend (said why).
    Skip,
}

/// What one check found.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The verdict.
    pub status: Status,
    /// What was measured.
    pub measured: Value,
    /// What it was held to.
    pub tolerance: Value,
    /// One line for people: the failures first.
    pub detail: String,
}

impl Outcome {
    /// Passed if `failures` is empty, else failed, naming them.
    pub fn from_failures(
        failures: Vec<String>,
        measured: Value,
        tolerance: Value,
        detail: String,
    ) -> Self {
        let (status, detail) = match failures.is_empty() {
            true => (Status::Pass, detail),
            false => (Status::Fail, format!("{}; {detail}", failures.join("; "))),
        };
        Self {
            status,
            measured,
            tolerance,
            detail,
        }
    }

    /// Not measurable here.
    pub fn skipped(measured: Value, tolerance: Value, detail: String) -> Self {
        Self {
            status: Status::Skip,
            measured,
            tolerance,
            detail,
        }
    }

    /// Whether it passed.
    pub fn passed(&self) -> bool {
        self.status == Status::Pass
    }
}

/// The backend every check compares with.
type Reference = mappa_model::backend::CpuAutodiff;

/// A named check, not yet run.
type Check<'a> = (String, Box<dyn FnOnce() -> anyhow::Result<Outcome> + 'a>);

/// Runs `mappa doctor`.
pub fn doctor(args: &DoctorArgs) -> anyhow::Result<()> {
    let kind = args.backend.kind();
    let size = args.size.unwrap_or(match args.backend {
        Backend::Cpu => Size::Small,
        _ => Size::Full,
    });
    if let Some(child) = &args.child {
        return memory_child(args.backend, child, size);
    }
    check_built(kind)?;
    std::fs::create_dir_all(&args.out).map_err(|e| anyhow!("{}: {e}", args.out.display()))?;
    let environment = environment(args.backend);
    write_json(&args.out.join("environment.json"), &environment)?;
    println!(
        "mappa doctor: backend {}, {} sizes",
        feature_name(kind),
        size.name()
    );
    println!("{}", serde_json::to_string_pretty(&environment)?);
    if let Some(error) = environment.get("device_error") {
        // The probe's message names the backend and what it searched.
        bail!("{}", error.as_str().unwrap_or_default());
    }
    let reference = Default::default();
    let report = Report::new(&args.out, args.backend, &args.only)?;
    let device_name = device_name(&environment);
    match args.backend {
        Backend::Cpu => run_all::<mappa_model::backend::CpuAutodiff>(
            &report,
            &Default::default(),
            &reference,
            size,
            &device_name,
        ),
        #[cfg(feature = "cuda")]
        Backend::Cuda => run_all::<Autodiff<mappa_model::backend::Cuda>>(
            &report,
            &Default::default(),
            &reference,
            size,
            &device_name,
        ),
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => run_all::<Autodiff<mappa_model::backend::Wgpu>>(
            &report,
            &Default::default(),
            &reference,
            size,
            &device_name,
        ),
        #[allow(unreachable_patterns)] // reached in builds without every GPU feature
        _ => unreachable!("check_built refused a backend not built in"),
    }
    report.finish()
}

/// Every check on `D` against the CPU backend.
fn run_all<D: AutodiffModelBackend>(
    report: &Report,
    device: &D::Device,
    reference: &burn::tensor::Device<Reference>,
    size: Size,
    device_name: &str,
) {
    let mut checks: Vec<Check<'_>> = Vec::new();
    let fixtures = repo_root().join("fixtures/models");
    let mut sources = vec![("random-qwen3".to_string(), parity::random_qwen3())];
    for name in ["llama-tiny", "qwen2-tiny", "qwen3-tiny"] {
        sources.push((
            name.to_string(),
            parity::Source::Checkpoint(fixtures.join(name)),
        ));
    }
    for (name, source) in sources {
        checks.push((
            format!("parity-{name}"),
            Box::new(move || {
                parity::check::<D, Reference>(&source, device, reference, &compare::F32)
            }),
        ));
    }
    let random = parity::random_qwen3();
    for (name, variant) in step_variants() {
        let source = random.clone();
        checks.push((
            name.into(),
            Box::new(move || step::check::<D, Reference>(&source, variant, device, reference)),
        ));
    }
    let (source, dir) = (random.clone(), report.out.join("hf-export"));
    checks.push((
        "hf-export".into(),
        Box::new(move || parity::export_hf::<D>(&source, device, &dir)),
    ));
    let source = random.clone();
    checks.push((
        "determinism-step".into(),
        Box::new(move || step::determinism::<D>(&source, step::Variant::default(), device)),
    ));
    let (sizes, iters): (Vec<mappa_benches::Size>, usize) = match size {
        Size::Full => (mappa_benches::Size::GPU.to_vec(), 3),
        Size::Small => (vec![mappa_benches::Size::M1], 2),
    };
    for s in sizes {
        checks.push((
            format!("throughput-{}", s.name()),
            Box::new(move || speed::check::<D>(s, device, device_name, iters)),
        ));
    }
    run_checks(report, checks);
    run_twice(report);
    // Last: one process each, the slowest checks on a GPU (each compiles
    // its kernels anew), so that a time limit cuts only some of them.
    let mut checks: Vec<Check<'_>> = Vec::new();
    let exe = std::env::current_exe().ok();
    for config in memory::configs(size) {
        let exe = exe.clone();
        let backend = feature_name(report.backend.kind());
        checks.push((
            format!("memory-{config}"),
            Box::new(move || {
                let exe = exe.ok_or_else(|| anyhow!("this program's own path is unknown"))?;
                memory::check(&exe, backend, &config, size)
            }),
        ));
    }
    run_checks(report, checks);
}

/// The training-step variants checked against the CPU.
fn step_variants() -> Vec<(&'static str, step::Variant)> {
    use step::Variant;
    let lora = Variant {
        lora: true,
        ..Variant::default()
    };
    vec![
        ("step-full", Variant::default()),
        ("step-lora", lora),
        (
            "step-recompute",
            Variant {
                recompute: true,
                ..Variant::default()
            },
        ),
        (
            "step-fused",
            Variant {
                fused: true,
                ..lora
            },
        ),
        ("step-bf16", Variant { bf16: true, ..lora }),
        (
            "data-parallel",
            Variant {
                data_parallel: true,
                ..lora
            },
        ),
    ]
}

fn run_checks(report: &Report, checks: Vec<Check<'_>>) {
    for (name, check) in checks {
        report.run(&name, check);
    }
}

/// The tiny run, and the same run again.
fn run_twice(report: &Report) {
    let kind = report.backend.kind();
    let (a, b) = (report.out.join("tiny-run-a"), report.out.join("tiny-run-b"));
    let ran = report.run("tiny-run", || {
        runs::tiny_run(kind, &a)?;
        runs::check_finished(&a)
    });
    if report.selected("determinism-run") {
        if ran == Some(Status::Pass) {
            report.run("determinism-run", || {
                runs::tiny_run(kind, &b)?;
                runs::check_same(&a, &b)
            });
        } else {
            report.record(
                "determinism-run",
                &Outcome::skipped(Value::Null, Value::Null, "the tiny run did not pass".into()),
                0.0,
            );
        }
    }
}

/// The measuring process of one memory configuration: prints its JSON.
fn memory_child(backend: Backend, child: &str, size: Size) -> anyhow::Result<()> {
    let config = child
        .strip_prefix("memory:")
        .ok_or_else(|| anyhow!("--child {child:?}: expected memory:CONFIG"))?;
    let measured = match backend {
        Backend::Cpu => {
            let mut meter = mappa_benches::memory::ProcessMemory::new();
            memory::child::<mappa_model::backend::CpuAutodiff>(config, size, &mut meter)
        }
        #[cfg(feature = "cuda")]
        Backend::Cuda => {
            let mut meter = mappa_benches::memory::CudaMemory::new().map_err(|e| anyhow!(e))?;
            memory::child::<Autodiff<mappa_model::backend::Cuda>>(config, size, &mut meter)
        }
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => memory::child::<Autodiff<mappa_model::backend::Wgpu>>(
            config,
            size,
            &mut mappa_benches::memory::Unmeasured,
        ),
        #[allow(unreachable_patterns)] // reached in builds without every GPU feature
        other => bail!("backend {other:?} is not built into this binary"),
    }
    .map_err(|e| anyhow!(e))?;
    println!("{}", serde_json::to_string(&measured)?);
    Ok(())
}

/// What the doctor found before checking anything.
fn environment(backend: Backend) -> Value {
    let mut env = json!({
        "mappa": env!("CARGO_PKG_VERSION"),
        "backend": feature_name(backend.kind()),
        "burn": BURN_VERSION,
        "cubecl": CUBECL_VERSION,
        "machine": mappa_train::machine::record(),
    });
    match device_details(backend) {
        Ok(device) => env["device"] = device,
        Err(e) => env["device_error"] = json!(e),
    }
    env
}

/// The device's own description, found by the same probe that checks it
/// (`mappa_model::device`): for CUDA the libraries loaded, the driver's
/// version and each device's name and memory; for wgpu its adapters. An
/// error says what was searched.
fn device_details(backend: Backend) -> Result<Value, String> {
    match backend {
        #[cfg(feature = "cuda")]
        Backend::Cuda => {
            let found = mappa_model::device::cuda_inventory().map_err(|e| e.to_string())?;
            let version = found.driver_version;
            Ok(json!({
                "driver_library": found.driver_library,
                "nvrtc_library": found.nvrtc_library,
                "driver_cuda_version": format!("{}.{}", version / 1000, version % 1000 / 10),
                "devices": found.devices.iter().map(|(name, bytes)| json!({"name": name, "memory_bytes": bytes})).collect::<Vec<_>>(),
            }))
        }
        #[cfg(feature = "wgpu")]
        Backend::Wgpu => {
            let adapters = mappa_model::device::check_wgpu().map_err(|e| e.to_string())?;
            Ok(json!({ "adapters": adapters }))
        }
        _ => Ok(json!({"name": "cpu"})),
    }
}

/// The name the device's stated peak is looked up by.
fn device_name(environment: &Value) -> String {
    let device = &environment["device"];
    device["devices"][0]["name"]
        .as_str()
        .or(device["adapters"].as_str())
        .or(environment["machine"]["cpu_model"].as_str())
        .unwrap_or("cpu")
        .to_string()
}

/// Where the checks' lines go, and which checks run.
struct Report {
    out: PathBuf,
    backend: Backend,
    only: Vec<String>,
    lines: std::cell::RefCell<Vec<(String, Outcome)>>,
}

impl Report {
    fn new(out: &Path, backend: Backend, only: &[String]) -> anyhow::Result<Self> {
        let checks = out.join("checks.jsonl");
        if checks.exists() {
            std::fs::remove_file(&checks).map_err(|e| anyhow!("{}: {e}", checks.display()))?;
        }
        Ok(Self {
            out: out.to_path_buf(),
            backend,
            only: only.to_vec(),
            lines: Default::default(),
        })
    }

    fn selected(&self, name: &str) -> bool {
        self.only.is_empty()
            || self
                .only
                .iter()
                .any(|prefix| name.starts_with(prefix.as_str()))
    }

    /// Runs one check if selected (a panic or an error is its failure)
    /// and records it; returns its status.
    fn run(&self, name: &str, check: impl FnOnce() -> anyhow::Result<Outcome>) -> Option<Status> {
        if !self.selected(name) {
            return None;
        }
        let start = Instant::now();
        let outcome = match catch_unwind(AssertUnwindSafe(check)) {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => failed(format!("could not run: {e:#}")),
            Err(panic) => failed(format!("panicked: {}", panic_message(&panic))),
        };
        self.record(name, &outcome, start.elapsed().as_secs_f64());
        Some(outcome.status)
    }

    /// Prints the check's line and appends its JSON line.
    fn record(&self, name: &str, outcome: &Outcome, seconds: f64) {
        let label = match outcome.status {
            Status::Pass => "PASS",
            Status::Fail => "FAIL",
            Status::Skip => "SKIP",
        };
        println!("{label} {name} ({seconds:.1} s): {}", outcome.detail);
        let line = json!({
            "check": name,
            "backend": feature_name(self.backend.kind()),
            "status": label,
            "measured": outcome.measured,
            "tolerance": outcome.tolerance,
            "detail": outcome.detail,
            "seconds": seconds,
        });
        let path = self.out.join("checks.jsonl");
        let appended = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| writeln!(f, "{line}"));
        if let Err(e) = appended {
            eprintln!("mappa doctor: {}: {e}", path.display());
        }
        self.lines
            .borrow_mut()
            .push((name.to_string(), outcome.clone()));
    }

    /// Writes summary.md; an error if any check failed.
    fn finish(&self) -> anyhow::Result<()> {
        let lines = self.lines.borrow();
        let count = |s: Status| lines.iter().filter(|(_, o)| o.status == s).count();
        let (passed, failed, skipped) = (
            count(Status::Pass),
            count(Status::Fail),
            count(Status::Skip),
        );
        let mut table = format!(
            "# mappa doctor: backend {}\n\n{passed} passed, {failed} failed, {skipped} skipped.\n\n| check | verdict | detail |\n|---|---|---|\n",
            feature_name(self.backend.kind())
        );
        for (name, o) in lines.iter() {
            let verdict = format!("{:?}", o.status).to_uppercase();
            table.push_str(&format!(
                "| {name} | {verdict} | {} |\n",
                o.detail.replace('|', "/")
            ));
        }
        mappa_core::fs::write_atomic(&self.out.join("summary.md"), table.as_bytes())?;
        println!(
            "{passed} passed, {failed} failed, {skipped} skipped; {}",
            self.out.join("summary.md").display()
        );
        if failed > 0 {
            bail!(
                "{failed} of {} checks failed (see {})",
                lines.len(),
                self.out.join("checks.jsonl").display()
            );
        }
        Ok(())
    }
}

fn failed(why: String) -> Outcome {
    Outcome::from_failures(vec![why], Value::Null, Value::Null, String::new())
}

fn panic_message(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

fn write_json(path: &Path, value: &Value) -> anyhow::Result<()> {
    mappa_core::fs::write_atomic(path, serde_json::to_string_pretty(value)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The versions the environment report names are this build's.
    #[test]
    fn named_versions_are_the_locked_ones() {
        let lock = include_str!("../../../../Cargo.lock");
        for (name, version) in [("burn", BURN_VERSION), ("cubecl", CUBECL_VERSION)] {
            let entry = format!("name = \"{name}\"\nversion = \"{version}\"\n");
            assert!(lock.contains(&entry), "Cargo.lock has no {name} {version}");
        }
    }

    #[test]
    fn a_panicking_check_fails_without_stopping_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let report = Report::new(dir.path(), Backend::Cpu, &[]).unwrap();
        let panicked = report.run("boom", || panic!("on purpose"));
        let passed = report.run("fine", || {
            Ok(Outcome::from_failures(
                vec![],
                json!(1),
                json!(2),
                "ok".into(),
            ))
        });
        assert_eq!((panicked, passed), (Some(Status::Fail), Some(Status::Pass)));
        let text = std::fs::read_to_string(dir.path().join("checks.jsonl")).unwrap();
        assert!(text
            .lines()
            .next()
            .unwrap()
            .contains("panicked: on purpose"));
        assert_eq!(text.lines().count(), 2);
        assert!(report
            .finish()
            .unwrap_err()
            .to_string()
            .starts_with("1 of 2 checks failed"));
    }
}
