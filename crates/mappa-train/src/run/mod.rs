//! The training loop of a manifest: each step rolls out with each agent's
//! current weights, coaches every action, grades the outcome, assigns
//! credit and takes one optimiser step per agent ([`stages`]); the run
//! evaluates on held-out tasks, writes `metrics.jsonl` and
//! `trajectories.jsonl` ([`crate::records`]), checkpoints, and resumes
//! exactly.
//!
//! Every random choice derives from the manifest's master seed by name:
//! the data order of epoch e (`data/epoch-e`), the rollout of step k
//! (`rollout/step-k`, then per task, sample, agent and turn), evaluation
//! (`eval/step-k`). A run therefore needs no RNG state beyond its counters,
//! and a resumed run continues exactly.

mod runner;
mod stages;
pub mod timing;

use std::path::{Path, PathBuf};

use mappa_agents::{Policy, RemotePolicy, RolloutEngine, TaskInput};
use mappa_core::rng::SeedTree;
use mappa_judge::cache::CacheMode;
use mappa_judge::openai::OpenAiConfig;
use mappa_model::AutodiffModelBackend;
use serde_json::json;

use crate::checkpoint::{load_checkpoint, save_checkpoint, TrainerState};
use crate::manifest::Manifest;
use crate::records::{append_jsonl, truncate_jsonl, EvalLine, EvalTrajectoryLine, MetricsLine};
use crate::tasks::TaskSet;
use crate::{AgentLearner, TrainError};
use runner::{open_environment, Runner};

/// How to run.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Stop after this many steps in total (a partial run that can be resumed).
    pub max_steps: Option<usize>,
    /// Continue from the run directory's last checkpoint.
    pub resume: bool,
    /// Override the coach's cache mode (e.g. `replay`).
    pub coach_mode: Option<CacheMode>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RunEnd {
    /// Training steps done in total.
    pub step: usize,
    /// The final evaluation, when the run finished and has held-out tasks.
    pub final_eval: Option<EvalLine>,
}

/// Where a run writes.
#[derive(Debug, Clone)]
pub struct RunDir {
    /// The run directory.
    pub root: PathBuf,
}

impl RunDir {
    /// `metrics.jsonl`: one [`MetricsLine`] per line.
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }
    /// `trajectories.jsonl`: one [`crate::records::TrajectoryLine`] per line.
    pub fn trajectories(&self) -> PathBuf {
        self.root.join("trajectories.jsonl")
    }
    /// The latest checkpoint.
    pub fn checkpoint(&self) -> PathBuf {
        self.root.join("checkpoints").join("latest")
    }
    /// `timing.jsonl`: one [`timing::TimingLine`] per evaluation and step.
    pub fn timing(&self) -> PathBuf {
        self.root.join("timing.jsonl")
    }
    /// `eval-trajectories.jsonl`: one [`EvalTrajectoryLine`] per evaluated
    /// trajectory.
    pub fn eval_trajectories(&self) -> PathBuf {
        self.root.join("eval-trajectories.jsonl")
    }
    /// Scratch space for rollouts.
    pub fn work(&self) -> PathBuf {
        self.root.join("work")
    }
    /// The adapters loaded in the inference engine (`[rollout.engine]`):
    /// each agent's current version, in PEFT's layout.
    pub fn engine_adapters(&self) -> PathBuf {
        self.root.join("engine-adapters")
    }
}

/// The training and held-out tasks of a manifest, with their grader;
/// generated tasks are written under `data_dir`.
pub fn load_tasks(manifest: &Manifest, data_dir: &Path) -> Result<TaskSet, TrainError> {
    manifest.data.family().load(data_dir)
}

/// The training-set order of epoch `epoch`: a seeded permutation.
fn epoch_order(seeds: &SeedTree, epoch: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    let mut rng = seeds.stream(&format!("data/epoch-{epoch}"));
    for i in (1..n).rev() {
        order.swap(i, rng.below(i as u64 + 1) as usize);
    }
    order
}

/// Delete a rollout's working directories.
fn remove_work(work: &Path) -> Result<(), TrainError> {
    std::fs::remove_dir_all(work).map_err(|e| TrainError::io(work, e))
}

/// Evaluate a served model (an OpenAI-compatible endpoint: vLLM, SGLang,
/// llama.cpp, Ollama, a hosted API) as every agent of the manifest's
/// workflow, on its held-out tasks; appends to `out_dir/eval.jsonl`.
pub fn evaluate_remote(
    manifest: &Manifest,
    out_dir: &Path,
    endpoint: OpenAiConfig,
) -> Result<EvalLine, TrainError> {
    let (workflow, tasks, sandbox) = open_environment(manifest, out_dir)?;
    if tasks.eval.is_empty() {
        return Err(TrainError::Config(
            "data: no held-out tasks to evaluate".into(),
        ));
    }
    let policy = RemotePolicy::new(
        endpoint,
        manifest.eval.temperature,
        manifest.rollout.max_new_tokens as u32,
        8,
    )?;
    let policies: Vec<&dyn Policy> = workflow
        .agents
        .iter()
        .map(|_| &policy as &dyn Policy)
        .collect();
    let work = out_dir.join("work").join("eval-remote");
    let engine = RolloutEngine::new(&workflow, policies, &sandbox, &work)?;
    let trajectories = engine.run(&tasks.eval, manifest.eval.samples)?;
    let (mut line, rows) = stages::eval_line(0, &workflow, &tasks, &trajectories)?;
    line.policy = Some(policy.name());
    remove_work(&work)?;
    let _ = std::fs::remove_dir(out_dir.join("work"));
    write_evaluation(out_dir, &line, &rows)?;
    Ok(line)
}

/// Evaluate the base models, or a run's checkpoint, on the manifest's
/// held-out tasks; appends the result to `out_dir/eval.jsonl` and returns it.
pub fn evaluate<B: AutodiffModelBackend>(
    manifest: &Manifest,
    out_dir: &Path,
    checkpoint: Option<&Path>,
    device: &B::Device,
) -> Result<EvalLine, TrainError>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    let mut runner = Runner::<B>::build(manifest, out_dir, None, device)?;
    if runner.tasks.eval.is_empty() {
        return Err(TrainError::Config(
            "data: no held-out tasks to evaluate".into(),
        ));
    }
    let step = match checkpoint {
        Some(dir) => load_checkpoint(dir, &mut runner.learners)?.step,
        None => 0,
    };
    let (mut line, rows, _) = runner.evaluate(step)?;
    line.checkpoint = checkpoint.map(|c| c.display().to_string());
    write_evaluation(out_dir, &line, &rows)?;
    let _ = std::fs::remove_dir(runner.dir.work());
    Ok(line)
}

/// Append an evaluation of `mappa eval` to `out_dir/eval.jsonl`, and its
/// trajectories to `out_dir/eval-trajectories.jsonl`.
fn write_evaluation(
    out_dir: &Path,
    line: &EvalLine,
    rows: &[EvalTrajectoryLine],
) -> Result<(), TrainError> {
    append_jsonl(&out_dir.join("eval-trajectories.jsonl"), rows)?;
    append_jsonl(
        &out_dir.join("eval.jsonl"),
        &[MetricsLine::Eval(line.clone())],
    )
}

/// The state a run starts from: a new run's (its old records removed), or
/// the checkpoint's when resuming (records after it removed).
fn starting_state<B: AutodiffModelBackend>(
    runner: &mut Runner<'_, B>,
    resume: bool,
) -> Result<TrainerState, TrainError>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    let mut state = TrainerState {
        extra: json!({ "seed": runner.manifest.seed }),
        ..Default::default()
    };
    if resume && runner.dir.checkpoint().exists() {
        state = load_checkpoint(&runner.dir.checkpoint(), &mut runner.learners)?;
    } else if !resume {
        for file in [
            runner.dir.metrics(),
            runner.dir.trajectories(),
            runner.dir.eval_trajectories(),
        ] {
            if file.exists() {
                std::fs::remove_file(&file).map_err(|e| TrainError::io(&file, e))?;
            }
        }
    }
    truncate_jsonl(&runner.dir.metrics(), state.step)?;
    truncate_jsonl(&runner.dir.trajectories(), state.step)?;
    truncate_jsonl(&runner.dir.eval_trajectories(), state.step)?;
    Ok(state)
}

/// A progress bar over the run's steps (hidden unless `shown`).
fn progress_bar(
    manifest: &Manifest,
    stop: usize,
    at: usize,
    shown: bool,
) -> indicatif::ProgressBar {
    let bar = crate::progress::bar(
        stop,
        "{prefix} [{bar:30}] step {pos}/{len} ({elapsed}, eta {eta}) {msg}",
        shown,
    );
    bar.set_prefix(manifest.name.clone());
    bar.set_position(at as u64);
    bar
}

/// Run (or resume) the manifest's training in `run_dir`.
pub fn run<B: AutodiffModelBackend>(
    manifest: &Manifest,
    run_dir: &Path,
    options: &RunOptions,
    device: &B::Device,
) -> Result<RunEnd, TrainError>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    let mut runner = Runner::<B>::build(manifest, run_dir, Some(options.coach_mode), device)?;
    if runner.tasks.train.is_empty() {
        return Err(TrainError::Config("data: no training tasks".into()));
    }
    let mut state = starting_state(&mut runner, options.resume)?;
    let total = manifest.rollout.steps;
    let stop = options.max_steps.map_or(total, |m| m.min(total));
    let has_eval = !runner.tasks.eval.is_empty();
    let eval_due = |step: usize| {
        has_eval
            && (step == 0 || (manifest.eval.every > 0 && step.is_multiple_of(manifest.eval.every)))
    };
    let n = runner.tasks.train.len();
    let per_step = manifest.rollout.prompts_per_step;
    let bar = progress_bar(manifest, stop, state.step, options.progress);
    for step in state.step..stop {
        if eval_due(step) {
            let (line, rows, timing) = runner.evaluate(step)?;
            bar.set_message(format!("held-out accuracy {:.3}", line.accuracy));
            append_jsonl(&runner.dir.eval_trajectories(), &rows)?;
            append_jsonl(&runner.dir.metrics(), &[MetricsLine::Eval(line)])?;
            append_jsonl(&runner.dir.timing(), &[timing])?;
        }
        let batch: Vec<TaskInput> = (0..per_step)
            .map(|i| {
                let cursor = state.dataset_cursor as usize + i;
                let order = epoch_order(&runner.seeds, (cursor / n) as u64, n);
                runner.tasks.train[order[cursor % n]].clone()
            })
            .collect();
        let (metrics, rows, timing) = runner.train_step(step, &batch)?;
        append_jsonl(&runner.dir.trajectories(), &rows)?;
        append_jsonl(&runner.dir.metrics(), &[MetricsLine::Train(metrics)])?;
        append_jsonl(&runner.dir.timing(), &[timing])?;
        state.step = step + 1;
        state.dataset_cursor += per_step as u64;
        bar.inc(1);
        if state.step % manifest.rollout.checkpoint_every == 0 || state.step == stop {
            let learners: Vec<&AgentLearner<B>> = runner.learners.iter().collect();
            save_checkpoint(&runner.dir.checkpoint(), &learners, &state)?;
        }
    }
    bar.finish_and_clear();
    let final_eval = if stop == total && has_eval {
        let (line, rows, timing) = runner.evaluate(total)?;
        append_jsonl(&runner.dir.eval_trajectories(), &rows)?;
        append_jsonl(&runner.dir.metrics(), &[MetricsLine::Eval(line.clone())])?;
        append_jsonl(&runner.dir.timing(), &[timing])?;
        Some(line)
    } else {
        None
    };
    let _ = std::fs::remove_dir(runner.dir.work()); // only when empty
    Ok(RunEnd {
        step: stop,
        final_eval,
    })
}
