//! `mappa run MANIFEST`: resolve the manifest into a run directory with
//! `manifest.lock.json` (whose sha256 is the run id), then train, evaluate
//! and checkpoint there; `--resume RUN_DIR` continues a stopped run.
//! `mappa reproduce NAME`: the same for `experiments/NAME.toml`, after
//! checking that everything the run needs is present; `--dry-run` prints
//! the plan.

use std::path::{Path, PathBuf};

use burn::backend::Autodiff;
use clap::Args;
use mappa_judge::cache::CacheMode;
use mappa_judge::openai::OpenAiConfig;
use mappa_train::manifest::{lock, run_id, BackendKind, Manifest};
use mappa_train::records::MetricsLine;
use mappa_train::run::{load_tasks, run, RunOptions};
use serde_json::Value;

use crate::study::Profile;

/// Arguments of `mappa run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The experiment manifest (TOML).
    manifest: PathBuf,
    /// Continue the run in this directory from its last checkpoint.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Start the run in this new directory instead of `RUNS_DIR/<name>-<run id>`
    /// (`mappa reproduce` names its runs' directories itself).
    #[arg(long, conflicts_with = "resume")]
    run_dir: Option<PathBuf>,
    /// Stop after this many training steps in total (the run can be resumed).
    #[arg(long)]
    max_steps: Option<usize>,
    /// Where new run directories go.
    #[arg(long, default_value = "runs")]
    runs_dir: PathBuf,
    /// Override the coach cache mode: `off`, `read-write` or `replay` (hits only).
    #[arg(long, value_parser = parse_mode)]
    coach: Option<CacheMode>,
}

fn parse_mode(s: &str) -> Result<CacheMode, String> {
    match s {
        "off" => Ok(CacheMode::Off),
        "read-write" => Ok(CacheMode::ReadWrite),
        "replay" => Ok(CacheMode::Replay),
        other => Err(format!("{other:?}: expected off, read-write or replay")),
    }
}

/// Arguments of `mappa reproduce`.
#[derive(Args, Debug)]
pub struct ReproduceArgs {
    /// The experiment: `experiments/NAME.toml`.
    name: String,
    /// Validate everything and print the plan, without running.
    #[arg(long)]
    dry_run: bool,
    /// The manifest's `[study.quick]` profile: a smoke test of the study (for CI), not a result.
    #[arg(long, conflicts_with = "validation")]
    quick: bool,
    /// The manifest's `[study.validation]` profile: the study on other generated problems, to choose values on without looking at the held-out set.
    #[arg(long)]
    validation: bool,
    /// Runs of a study at once (default: the number of CPUs).
    #[arg(long)]
    jobs: Option<usize>,
    /// Where new run directories go.
    #[arg(long, default_value = "runs")]
    runs_dir: PathBuf,
}

/// The repository root: the nearest ancestor of the current directory with `experiments/`.
pub fn repo_root() -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    cwd.ancestors()
        .find(|d| d.join("experiments").is_dir())
        .map(Path::to_path_buf)
        .unwrap_or(cwd)
}

/// Which backends this binary was built with.
fn backend_available(kind: BackendKind) -> bool {
    match kind {
        BackendKind::Cpu => true,
        BackendKind::Wgpu => cfg!(feature = "wgpu"),
        BackendKind::Cuda => cfg!(feature = "cuda"),
    }
}

fn feature_name(kind: BackendKind) -> &'static str {
    match kind {
        BackendKind::Cpu => "cpu",
        BackendKind::Wgpu => "wgpu",
        BackendKind::Cuda => "cuda",
    }
}

/// Runs `mappa run`.
pub fn run_manifest(args: &RunArgs) -> Result<(), String> {
    let manifest = Manifest::load(&args.manifest).map_err(|e| e.to_string())?;
    let run_dir = match &args.run_dir {
        Some(dir) => prepare_in(&manifest, dir)?,
        None => prepare(&manifest, args.resume.as_deref(), &args.runs_dir)?,
    };
    let options = RunOptions {
        max_steps: args.max_steps,
        resume: args.resume.is_some(),
        coach_mode: args.coach,
        progress: true,
    };
    execute(&manifest, &run_dir, &options)
}

/// The manifest's lock (resolved hashes, code version, machine) and run id.
pub fn lock_and_id(manifest: &Manifest) -> Result<(Value, String), String> {
    let resolved = manifest.resolve().map_err(|e| e.to_string())?;
    let lock = lock(manifest, resolved, &repo_root());
    let id = run_id(&lock);
    Ok((lock, id))
}

/// Resolve, lock, and choose the run directory.
fn prepare(manifest: &Manifest, resume: Option<&Path>, runs_dir: &Path) -> Result<PathBuf, String> {
    let (lock, id) = lock_and_id(manifest)?;
    if let Some(dir) = resume {
        let old: Value = std::fs::read_to_string(dir.join("manifest.lock.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .ok_or_else(|| {
                format!(
                    "{}: no readable manifest.lock.json: is it a run directory?",
                    dir.display()
                )
            })?;
        if old["manifest"] != lock["manifest"] || old["resolved"] != lock["resolved"] {
            return Err(format!(
                "{}: the manifest or its files changed since the run started; start a new run instead",
                dir.display()
            ));
        }
        if let Some(warning) =
            mappa_train::machine::warning("this run was started", &old["machine"], &lock["machine"])
        {
            eprintln!("{warning}");
        }
        return Ok(dir.to_path_buf());
    }
    let dir = runs_dir.join(format!("{}-{}", manifest.name, &id[..12]));
    write_lock(&dir, &lock)?;
    Ok(dir)
}

/// Resolve and lock into `dir`, a new run directory chosen by the caller.
fn prepare_in(manifest: &Manifest, dir: &Path) -> Result<PathBuf, String> {
    if dir.join("manifest.lock.json").exists() {
        return Err(format!(
            "{}: already a run directory; continue it with --resume",
            dir.display()
        ));
    }
    let (lock, _) = lock_and_id(manifest)?;
    write_lock(dir, &lock)?;
    Ok(dir.to_path_buf())
}

fn write_lock(dir: &Path, lock: &Value) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let text = serde_json::to_string_pretty(lock).map_err(|e| e.to_string())?;
    mappa_core::fs::write_atomic(&dir.join("manifest.lock.json"), text.as_bytes())
        .map_err(|e| e.to_string())
}

fn execute(manifest: &Manifest, run_dir: &Path, options: &RunOptions) -> Result<(), String> {
    if !backend_available(manifest.backend) {
        return Err(format!(
            "backend {0}: this binary was built without it; build with `cargo build --release -p mappa-cli --features {0}`",
            feature_name(manifest.backend)
        ));
    }
    eprintln!("run directory: {}", run_dir.display());
    let last = match manifest.backend {
        BackendKind::Cpu => run::<Autodiff<mappa_model::backend::Cpu>>(
            manifest,
            run_dir,
            options,
            &Default::default(),
        ),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => run::<Autodiff<mappa_model::backend::Wgpu>>(
            manifest,
            run_dir,
            options,
            &Default::default(),
        ),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => run::<Autodiff<mappa_model::backend::Cuda>>(
            manifest,
            run_dir,
            options,
            &Default::default(),
        ),
        #[allow(unreachable_patterns)]
        other => {
            return Err(format!(
                "backend {} is not built into this binary",
                feature_name(other)
            ))
        }
    }
    .map_err(|e| e.to_string())?;
    match last.final_eval {
        Some(eval) => eprintln!("final held-out accuracy: {:.3}", eval.accuracy),
        None if last.step < manifest.rollout.steps => eprintln!(
            "stopped after step {}; continue with --resume {}",
            last.step,
            run_dir.display()
        ),
        None => eprintln!("finished {} steps (no held-out tasks)", last.step),
    }
    Ok(())
}

/// What a run would do, in numbers.
fn plan(manifest: &Manifest) -> Result<Vec<(String, String)>, String> {
    let workflow = mappa_agents::Workflow::load(&manifest.workflow).map_err(|e| e.to_string())?;
    // Generated tasks are written somewhere disposable for the count.
    let scratch = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
    let tasks = load_tasks(manifest, scratch.path()).map_err(|e| e.to_string())?;
    let (train, eval) = (tasks.train, tasks.eval);
    let r = &manifest.rollout;
    let trajectories = r.steps * r.prompts_per_step * r.samples_per_prompt;
    let max_actions: usize = workflow.agents.iter().map(|a| a.max_actions).sum();
    // Before step 0, at every `every`-th step, and after the last.
    let evaluations = match manifest.eval.every {
        0 => 2,
        every => r.steps.div_ceil(every) + 1,
    };
    let eval_trajectories = evaluations * eval.len() * manifest.eval.samples;
    let coach_calls = trajectories * max_actions;
    let mut rows = vec![
        (
            "workflow".into(),
            format!(
                "{} ({} agents: {})",
                workflow.name,
                workflow.agents.len(),
                workflow
                    .agents
                    .iter()
                    .map(|a| a.role.as_str())
                    .collect::<Vec<_>>()
                    .join(" -> ")
            ),
        ),
        (
            "training tasks".into(),
            format!("{} ({} held out)", train.len(), eval.len()),
        ),
        (
            "steps".into(),
            format!(
                "{} ({} prompts x {} samples each)",
                r.steps, r.prompts_per_step, r.samples_per_prompt
            ),
        ),
        ("training trajectories".into(), trajectories.to_string()),
        (
            "actions".into(),
            format!(
                "at most {} ({} per trajectory)",
                trajectories * max_actions,
                max_actions
            ),
        ),
        (
            "generated tokens".into(),
            format!(
                "at most {} ({} per action)",
                (trajectories + eval_trajectories) * max_actions * r.max_new_tokens,
                r.max_new_tokens
            ),
        ),
        (
            "evaluations".into(),
            format!(
                "{evaluations} x {} tasks x {} samples = {eval_trajectories} trajectories",
                eval.len(),
                manifest.eval.samples
            ),
        ),
        (
            "coach calls".into(),
            format!("at most {coach_calls} (plus one re-prompt per malformed reply)"),
        ),
    ];
    if let Some(openai) = &manifest.coach.openai {
        // A coach prompt carries the task, the agent's input and output: about 3 actions' worth of tokens.
        let prompt_tokens = (coach_calls * (r.max_new_tokens * 2 + 1000)) as f64;
        let completion_tokens = (coach_calls * 300) as f64;
        let cost = (prompt_tokens * openai.usd_per_million_prompt_tokens
            + completion_tokens * openai.usd_per_million_completion_tokens)
            / 1e6;
        rows.push(("estimated coach cost".into(), format!("up to {cost:.0} USD ({} at the configured prices; the paper reports 50-150 USD per run)", openai.model)));
    }
    Ok(rows)
}

/// Everything the run needs that is not here: (what, how to supply it).
fn missing(manifest: &Manifest) -> Vec<(String, String)> {
    let mut out = Vec::new();
    if !backend_available(manifest.backend) {
        out.push((
            format!("the {} backend (this binary was built without it)", feature_name(manifest.backend)),
            format!(
                "build with `cargo build --release -p mappa-cli --features {}` on a machine with the GPU",
                feature_name(manifest.backend)
            ),
        ));
    }
    let mut roles_by_path: std::collections::BTreeMap<&Path, Vec<&str>> =
        std::collections::BTreeMap::new();
    for (role, model) in &manifest.models {
        if !model.path.exists() {
            roles_by_path.entry(&model.path).or_default().push(role);
        }
    }
    for (path, roles) in roles_by_path {
        out.push((
            format!("model weights for {} at {}", roles.join(", "), path.display()),
            "download them there (see the comment in the manifest), or point [models] at a local HF checkpoint".into(),
        ));
    }
    out.extend(manifest.data.family().missing());
    if let Some(var) = manifest
        .coach
        .openai
        .as_ref()
        .and_then(|o| o.api_key_env.as_ref())
    {
        if std::env::var(var).map_or(true, |v| v.is_empty()) {
            out.push((
                format!("the coach's API key (${var})"),
                format!(
                    "export {var}=... (the key is read from the environment and never written)"
                ),
            ));
        }
    }
    out
}

/// Runs `mappa reproduce`.
pub fn reproduce(args: &ReproduceArgs) -> Result<(), String> {
    let path = repo_root()
        .join("experiments")
        .join(format!("{}.toml", args.name));
    if !path.exists() {
        return Err(format!(
            "{}: no such experiment (see experiments/*.toml)",
            path.display()
        ));
    }
    let manifest = Manifest::load(&path).map_err(|e| e.to_string())?;
    let profile = match (args.quick, args.validation) {
        (true, _) => Profile::Quick,
        (_, true) => Profile::Validation,
        _ => Profile::Full,
    };
    // The manifest the profile runs (checked here, before anything starts).
    let planned = match (&manifest.study, profile.key()) {
        (Some(study), _) => crate::study::profile_manifest(&manifest, study, profile)
            .map_err(|e| format!("{}: {e}", path.display()))?,
        (None, None) => manifest.clone(),
        (None, Some(key)) => {
            return Err(format!(
                "{}: --{key} is for manifests with a [study]",
                path.display()
            ))
        }
    };
    let missing = missing(&manifest);
    if args.dry_run {
        println!("plan for {} ({}):", manifest.name, path.display());
        for (what, value) in plan(&planned)? {
            println!("  {what:<22} {value}");
        }
        if let Some(study) = &manifest.study {
            let arms = crate::study::arms(&manifest, study, profile)?;
            println!(
                "  {:<22} {} arms x {} seeds: {}",
                "study",
                arms.len(),
                profile.seeds(study)?,
                arms.iter()
                    .map(|(a, _)| a.label.as_str())
                    .collect::<Vec<_>>()
                    .join("; ")
            );
        }
        if missing.is_empty() {
            println!("everything the run needs is present.");
        } else {
            println!("missing before it can run:");
            for (what, how) in &missing {
                println!("  - {what}: {how}");
            }
        }
        return Ok(());
    }
    if !missing.is_empty() {
        let mut message = format!(
            "{} cannot start; nothing was run. Missing:\n",
            manifest.name
        );
        for (what, how) in &missing {
            message.push_str(&format!("  - {what}: {how}\n"));
        }
        message.push_str("On a machine without these, run the CPU-scale experiment instead: `just reproduce arith`.");
        return Err(message);
    }
    if manifest.study.is_some() {
        let jobs = args.jobs.unwrap_or_else(|| {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        });
        let dir = crate::study::run_study(
            &manifest,
            &crate::study::StudyOptions {
                profile,
                jobs,
                runs_dir: args.runs_dir.clone(),
            },
        )?;
        println!("{}", dir.join("report.md").display());
        return Ok(());
    }
    let run_dir = prepare(&manifest, None, &args.runs_dir)?;
    execute(
        &manifest,
        &run_dir,
        &RunOptions {
            progress: true,
            ..Default::default()
        },
    )
}

/// Arguments of `mappa eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The experiment manifest: its held-out tasks, workflow and base models.
    manifest: PathBuf,
    /// Evaluate this run's latest checkpoint instead of the base models.
    #[arg(long)]
    run: Option<PathBuf>,
    /// Where eval.jsonl goes (default: the run directory, else `runs/<name>-eval`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Evaluate a served model (OpenAI-compatible base URL, e.g. vLLM's
    /// `http://127.0.0.1:8000/v1`) as every agent, instead of local models.
    #[arg(long, requires = "remote_model", conflicts_with = "run")]
    remote_url: Option<String>,
    /// The served model's name.
    #[arg(long)]
    remote_model: Option<String>,
    /// Environment variable holding the endpoint's API key, if it needs one.
    #[arg(long)]
    remote_key_env: Option<String>,
}

/// Runs `mappa eval`.
pub fn eval(args: &EvalArgs) -> Result<(), String> {
    let manifest = Manifest::load(&args.manifest).map_err(|e| e.to_string())?;
    manifest.resolve().map_err(|e| e.to_string())?;
    let checkpoint = args
        .run
        .as_ref()
        .map(|r| r.join("checkpoints").join("latest"));
    let out = args
        .out
        .clone()
        .or_else(|| args.run.clone())
        .unwrap_or_else(|| PathBuf::from("runs").join(format!("{}-eval", manifest.name)));
    let line = match (&args.remote_url, &args.remote_model) {
        (Some(url), Some(model)) => {
            let mut endpoint: OpenAiConfig =
                toml::from_str(&format!("base_url = {url:?}\nmodel = {model:?}"))
                    .map_err(|e| format!("--remote-url/--remote-model: {e}"))?;
            endpoint.api_key_env = args.remote_key_env.clone();
            mappa_train::run::evaluate_remote(&manifest, &out, endpoint)
                .map_err(|e| e.to_string())?
        }
        _ => {
            type B = Autodiff<mappa_model::backend::Cpu>;
            mappa_train::run::evaluate::<B>(
                &manifest,
                &out,
                checkpoint.as_deref(),
                &Default::default(),
            )
            .map_err(|e| e.to_string())?
        }
    };
    println!(
        "{}",
        serde_json::to_string(&MetricsLine::Eval(line.clone())).map_err(|e| e.to_string())?
    );
    eprintln!(
        "held-out accuracy {:.3} ({} trajectories); appended to {}",
        line.accuracy,
        line.trajectories,
        out.join("eval.jsonl").display()
    );
    Ok(())
}

/// Arguments of `mappa ablate`.
#[derive(Args, Debug)]
pub struct AblateArgs {
    /// The experiment: `experiments/NAME.toml`, or a path to a manifest.
    name: String,
    /// Credit variants, comma-separated: strategy kinds (`process`, `outcome`,
    /// `outcome_final_agent`, `min_form`, `mixed=0.5`, `discounted_outcome=0.9`)
    /// or normalisation scopes (`scope=per_prompt_group`, ...).
    #[arg(long, value_delimiter = ',', required = true)]
    credit: Vec<String>,
    /// Seeds per variant (the manifest's seed, +1, +2, ...).
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// Where the runs and the comparison go.
    #[arg(long, default_value = "runs")]
    runs_dir: PathBuf,
}

/// Apply one `--credit` variant to a manifest.
pub fn apply_variant(manifest: &mut Manifest, variant: &str) -> Result<(), String> {
    let (key, value) = variant
        .split_once('=')
        .map_or((variant, None), |(k, v)| (k, Some(v)));
    let number = |v: Option<&str>| -> Result<f64, String> {
        v.ok_or_else(|| format!("{variant:?}: expected {key}=NUMBER"))?
            .parse()
            .map_err(|_| format!("{variant:?}: {v:?} is not a number"))
    };
    let strategy = match key {
        "scope" => {
            let scope = value.ok_or_else(|| format!("{variant:?}: expected scope=NAME"))?;
            manifest.credit.scope = serde_json::from_value(serde_json::json!(scope))
                .map_err(|_| format!("{variant:?}: unknown scope (per_agent_global, all_agents_global, per_prompt_group, group_mean_then_global, none)"))?;
            return Ok(());
        }
        "mixed" => serde_json::json!({ "kind": "mixed", "alpha": number(value)? }),
        "discounted_outcome" => {
            serde_json::json!({ "kind": "discounted_outcome", "gamma": number(value)? })
        }
        kind => serde_json::json!({ "kind": kind }),
    };
    manifest.credit.strategy = serde_json::from_value(strategy)
        .map_err(|e| format!("{variant:?}: {e} (strategies: process, outcome, outcome_final_agent, mixed=A, discounted_outcome=G, min_form)"))?;
    manifest.validate().map_err(|e| format!("{variant:?}: {e}"))
}

/// Runs `mappa ablate`.
pub fn ablate(args: &AblateArgs) -> Result<(), String> {
    let path = if args.name.ends_with(".toml") {
        PathBuf::from(&args.name)
    } else {
        repo_root()
            .join("experiments")
            .join(format!("{}.toml", args.name))
    };
    let base = Manifest::load(&path).map_err(|e| e.to_string())?;
    if args.seeds == 0 {
        return Err("--seeds 0: expected at least 1".into());
    }
    let mut plan = Vec::new();
    for variant in &args.credit {
        for s in 0..args.seeds {
            let mut manifest = base.clone();
            apply_variant(&mut manifest, variant)?;
            manifest.seed = base.seed + s;
            manifest.name = format!(
                "{}-{}-s{}",
                base.name,
                variant.replace(['=', '.'], "_"),
                manifest.seed
            );
            plan.push((variant.clone(), manifest));
        }
    }
    let mut dirs: Vec<(String, PathBuf)> = Vec::new();
    for (i, (variant, manifest)) in plan.iter().enumerate() {
        eprintln!("[{}/{}] {}", i + 1, plan.len(), manifest.name);
        let dir = prepare(manifest, None, &args.runs_dir)?;
        execute(
            manifest,
            &dir,
            &RunOptions {
                progress: true,
                ..Default::default()
            },
        )?;
        dirs.push((variant.clone(), dir));
    }
    let out = args.runs_dir.join(format!("ablate-{}", base.name));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let runs: Vec<_> = dirs
        .iter()
        .map(|(_, d)| crate::report::load_run(d))
        .collect::<Result<_, _>>()?;
    let mut md = comparison(&dirs, &runs);
    md.push('\n');
    md.push_str(&crate::report::write_report(&runs, &out, &repo_root())?);
    let report = out.join("report.md");
    mappa_core::fs::write_atomic(&report, md.as_bytes()).map_err(|e| e.to_string())?;
    println!("{}", report.display());
    Ok(())
}

/// Final held-out accuracy per variant: mean and standard deviation over seeds.
fn comparison(dirs: &[(String, PathBuf)], runs: &[crate::report::RunData]) -> String {
    let mut by_variant: Vec<(String, Vec<f64>)> = Vec::new();
    for ((variant, _), run) in dirs.iter().zip(runs) {
        let last = run.evals().last().map(|m| m.accuracy);
        let Some(acc) = last else { continue };
        match by_variant.iter_mut().find(|(v, _)| v == variant) {
            Some((_, values)) => values.push(acc),
            None => by_variant.push((variant.clone(), vec![acc])),
        }
    }
    let mut md = String::from("# Ablation: final held-out accuracy by credit variant\n\n| variant | seeds | mean | std | per seed |\n|---|---|---|---|---|\n");
    for (variant, values) in &by_variant {
        let n = values.len() as f64;
        let mean = values.iter().sum::<f64>() / n;
        let std =
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
        let each: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
        md.push_str(&format!(
            "| {variant} | {} | {mean:.3} | {std:.3} | {} |\n",
            values.len(),
            each.join(", ")
        ));
    }
    md
}
