//! `mappa reproduce NAME`: run `experiments/NAME.toml` after checking that
//! everything it needs is present (`--dry-run`: the plan and what is
//! missing); a manifest with a `[study]` runs its arms and seeds
//! ([`crate::study`]).

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use clap::Args;
use mappa_judge::config::Judge;
use mappa_judge::openai::OpenAiConfig;
use mappa_train::manifest::Manifest;
use mappa_train::run::{load_tasks, RunOptions};

use crate::ablate::default_jobs;
use crate::rundir::{backend_available, check_device, execute, feature_name, prepare, repo_root};
use crate::study::Profile;

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

/// What a dry run prints, from one reading of the workflow and tasks.
struct Plan {
    /// (what, value) lines.
    rows: Vec<(String, String)>,
    /// The memory plan, or why it is not available.
    memory: anyhow::Result<mappa_train::memory::DevicePlans>,
}

/// What a run would do, in numbers, and its memory plan.
fn plan(manifest: &Manifest) -> anyhow::Result<Plan> {
    let workflow = mappa_agents::Workflow::load(&manifest.workflow)?;
    // Generated tasks are written somewhere disposable for the count.
    let scratch = tempfile::tempdir().map_err(|e| anyhow!("temporary directory: {e}"))?;
    let tasks = load_tasks(manifest, scratch.path())?;
    let (train, eval) = (tasks.train.len(), tasks.eval.len());
    let r = &manifest.rollout;
    let trajectories = r.steps * r.prompts_per_step * r.samples_per_prompt;
    let max_actions: usize = workflow.agents.iter().map(|a| a.max_actions).sum();
    // Before step 0, at every `every`-th step, and after the last.
    let evaluations = match manifest.eval.every {
        0 => 2,
        every => r.steps.div_ceil(every) + 1,
    };
    let samples = manifest.eval.samples;
    let eval_trajectories = evaluations * eval * samples;
    let coach_calls = trajectories * max_actions;
    let roles: Vec<&str> = workflow.agents.iter().map(|a| a.role.as_str()).collect();
    let tokens = (trajectories + eval_trajectories) * max_actions * r.max_new_tokens;
    let mut rows: Vec<(&str, String)> = vec![
        ("workflow", format!("{} ({} agents: {})", workflow.name, roles.len(), roles.join(" -> "))),
        ("training tasks", format!("{train} ({eval} held out)")),
        ("steps", format!("{} ({} prompts x {} samples each)", r.steps, r.prompts_per_step, r.samples_per_prompt)),
        ("training trajectories", trajectories.to_string()),
        ("actions", format!("at most {coach_calls} ({max_actions} per trajectory)")),
        ("generated tokens", format!("at most {tokens} ({} per action)", r.max_new_tokens)),
        ("evaluations", format!("{evaluations} x {eval} tasks x {samples} samples = {eval_trajectories} trajectories")),
        ("coach calls", format!("at most {coach_calls} (plus one re-prompt per malformed reply)")),
    ];
    if let Judge::OpenAi(openai) = &manifest.coach.judge {
        // A coach prompt carries the task, the agent's input and output: about 3 actions' worth of tokens.
        let prompt_tokens = (coach_calls * (r.max_new_tokens * 2 + 1000)) as f64;
        let completion_tokens = (coach_calls * 300) as f64;
        let cost = (prompt_tokens * openai.usd_per_million_prompt_tokens
            + completion_tokens * openai.usd_per_million_completion_tokens)
            / 1e6;
        rows.push(("estimated coach cost", format!("up to {cost:.0} USD ({} at the configured prices; the paper reports 50-150 USD per run)", openai.model)));
    }
    if let Some(claim) = &manifest.claim {
        let power = crate::claim::PowerStatement::of(claim, eval * samples);
        rows.push((
            "claim",
            format!(
                "{}: base against trained, paired over problems; {}",
                if claim.confirmatory {
                    "confirmatory"
                } else {
                    "exploratory"
                },
                power.sentence(claim.alpha)
            ),
        ));
    }
    let memory = crate::rundir::memory_plan(manifest, &workflow, eval);
    Ok(Plan {
        rows: rows.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        memory,
    })
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
    } else if let Err(why) = check_device(manifest.backend) {
        out.push((
            format!("the {} backend's device", feature_name(manifest.backend)),
            why.to_string(),
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
    if let Some(engine) = &manifest.rollout.engine {
        if let Err(why) = mappa_train::engine::probe(engine) {
            out.push((
                format!("the inference engine of [rollout.engine] ({why})"),
                "start it: the vLLM command line in docs/engines.md, or `mappa serve MODEL_DIR --port N` on the CPU".into(),
            ));
        }
    }
    if let Judge::OpenAi(OpenAiConfig {
        api_key_env: Some(var),
        ..
    }) = &manifest.coach.judge
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

/// Print the plan of a dry run and what is missing.
fn print_plan(
    manifest: &Manifest,
    path: &Path,
    planned: &Manifest,
    profile: Profile,
    missing: &[(String, String)],
) -> anyhow::Result<()> {
    println!("plan for {} ({}):", manifest.name, path.display());
    let Plan { rows, memory } = plan(planned)?;
    for (what, value) in rows {
        println!("  {what:<22} {value}");
    }
    if let Some((study, factorial)) = manifest
        .study
        .as_ref()
        .and_then(|s| Some((s, s.factorial.as_ref()?)))
    {
        let dir = path.parent().unwrap_or(Path::new("."));
        for line in crate::study::factorial::describe(manifest, study, factorial, profile, dir)? {
            println!("  {line}");
        }
    } else if let Some(study) = &manifest.study {
        let arms = crate::study::plan::arms(manifest, study, profile)?;
        let labels: Vec<&str> = arms.iter().map(|(a, _)| a.label.as_str()).collect();
        println!(
            "  {:<22} {} arms x {} seeds: {}",
            "study",
            arms.len(),
            profile.seeds(study)?,
            labels.join("; ")
        );
    }
    match memory {
        Ok(memory) => {
            println!("memory plan:");
            print!("{}", memory.render());
            match memory.check() {
                Ok(()) if planned.devices.is_some() => {
                    println!("  fits the declared [devices] memory.")
                }
                Ok(()) => println!("  (declare [devices] memory_gib to have the plan checked)"),
                Err(e) => println!("  DOES NOT FIT: {e}"),
            }
        }
        Err(e) => println!("memory plan: not available ({e})"),
    }
    if missing.is_empty() {
        println!("everything else the run needs is present.");
    } else {
        println!("missing before it can run:");
        for (what, how) in missing {
            println!("  - {what}: {how}");
        }
    }
    Ok(())
}

/// The error when something the run needs is missing.
fn missing_error(manifest: &Manifest, missing: &[(String, String)]) -> anyhow::Error {
    let mut message = format!(
        "{} cannot start; nothing was run. Missing:\n",
        manifest.name
    );
    for (what, how) in missing {
        message.push_str(&format!("  - {what}: {how}\n"));
    }
    message.push_str(
        "On a machine without these, run the CPU-scale experiment instead: `just reproduce arith`.",
    );
    anyhow!(message)
}

/// Runs `mappa reproduce`.
pub fn reproduce(args: &ReproduceArgs) -> anyhow::Result<()> {
    let path = repo_root()
        .join("experiments")
        .join(format!("{}.toml", args.name));
    if !path.exists() {
        bail!(
            "{}: no such experiment (see experiments/*.toml)",
            path.display()
        );
    }
    let manifest = Manifest::load(&path)?;
    let profile = match (args.quick, args.validation) {
        (true, _) => Profile::Quick,
        (_, true) => Profile::Validation,
        _ => Profile::Full,
    };
    // The manifest the profile runs (checked here, before anything starts).
    let planned = match (&manifest.study, profile.key()) {
        (Some(study), _) => crate::study::plan::profile_manifest(&manifest, study, profile)
            .map_err(|e| anyhow!("{}: {e}", path.display()))?,
        (None, None) => manifest.clone(),
        (None, Some(key)) => bail!(
            "{}: --{key} is for manifests with a [study]",
            path.display()
        ),
    };
    let missing = missing(&manifest);
    if args.dry_run {
        return print_plan(&manifest, &path, &planned, profile, &missing);
    }
    if !missing.is_empty() {
        return Err(missing_error(&manifest, &missing));
    }
    crate::rundir::check_memory(&planned)?;
    if manifest.study.is_some() {
        let dir = crate::study::run_study(
            &manifest,
            &crate::study::StudyOptions {
                profile,
                jobs: args.jobs.unwrap_or_else(default_jobs),
                runs_dir: args.runs_dir.clone(),
                manifest_path: Some(path.clone()),
            },
        )?;
        println!("{}", dir.join("report.md").display());
        return Ok(());
    }
    let report = single_run(&manifest, &path, &args.runs_dir)?;
    println!("{}", report.display());
    Ok(())
}

/// A manifest without a study: one run (continued from its last checkpoint
/// when its directory holds one), then its `report.md`, led by its claim's
/// test when it has a `[claim]`. Returns the report's path.
fn single_run(manifest: &Manifest, path: &Path, runs_dir: &Path) -> anyhow::Result<PathBuf> {
    // A confirmatory claim's registration, as it stood when the run began.
    let registration = manifest
        .claim
        .as_ref()
        .filter(|c| c.confirmatory)
        .map(|_| crate::study::registration::find_claim(path));
    let (_, id) = crate::rundir::lock_and_id(manifest)?;
    let existing = runs_dir.join(format!("{}-{}", manifest.name, &id[..12]));
    let resume = existing.join("checkpoints").join("latest").exists();
    if resume {
        eprintln!(
            "continuing the run in {} from its last checkpoint (delete the directory to start over)",
            existing.display()
        );
    }
    let run_dir = prepare(manifest, resume.then_some(existing.as_path()), runs_dir)?;
    let options = RunOptions {
        progress: true,
        resume,
        ..Default::default()
    };
    execute(manifest, &run_dir, &options)?;
    let lead = match &manifest.claim {
        Some(claim) => crate::claim::write(&run_dir, manifest, claim, registration)?,
        None => String::new(),
    };
    run_report(manifest, &run_dir, &lead)
}

/// Writes the single run's `report.md` in `run_dir`, `lead` first (a
/// claim's test); `mappa run` and `mappa reproduce` both end with it.
pub(crate) fn run_report(
    manifest: &Manifest,
    run_dir: &Path,
    lead: &str,
) -> anyhow::Result<PathBuf> {
    let workflow = mappa_agents::Workflow::load(&manifest.workflow)?;
    let last = workflow.agents.last().map_or("", |a| a.role.as_str());
    let coach_note = match &manifest.coach.judge {
        Judge::Local(local) if !local.reply_prefix.is_empty() => Some(format!(
            "The local coach's replies were made to begin with {:?} (`reply_prefix`): a reply \
             parses when the model continues it with a number, and carries no analysis.",
            local.reply_prefix
        )),
        _ => None,
    };
    crate::run_report::write(run_dir, last, coach_note.as_deref(), lead)
}
