//! The training loop of a manifest: rollout with each agent's current
//! weights, coach every action, grade the outcome, assign credit, one
//! optimiser step per agent; evaluate on held-out tasks; write
//! `metrics.jsonl` and `trajectories.jsonl`; checkpoint; resume exactly.
//!
//! Every random choice derives from the manifest's master seed by name:
//! the data order of epoch e (`data/epoch-e`), the rollout of step k
//! (`rollout/step-k`, then per task, sample, agent and turn), evaluation
//! (`eval/step-k`). A run therefore needs no RNG state beyond its counters,
//! and a resumed run continues exactly.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::module::AutodiffModule;
use indicatif::{ProgressBar, ProgressStyle};
use mappa_agents::{
    action_contexts, ActionRecord, Policy, RemotePolicy, RolloutEngine, TaskInput, Trajectory,
    Workflow,
};
use mappa_core::rng::SeedTree;
use mappa_env::datasets::{check_disjoint, normalize_problem_text, MathDataset};
use mappa_env::math_tasks::{generate_mix_of, Tier};
use mappa_env::sandbox::{Sandbox, SandboxConfig};
use mappa_env::tabular::{
    evaluate as evaluate_submission, generate_task, FairSummary, Outcome, SpecKind, TabularTask,
    TaskSpec,
};
use mappa_judge::cache::CacheMode;
use mappa_judge::openai::OpenAiConfig;
use mappa_judge::{ActionScore, Coach, KnownSolution};
use mappa_model::weights::load_transformer;
use mappa_model::AutodiffModelBackend;
use mappa_model::{ChatTemplate, GenerationConfig, HfTokenizer, SamplingConfig, TransformerConfig};
use serde_json::{json, Value};

use crate::checkpoint::{load_checkpoint, save_checkpoint, TrainerState};
use crate::manifest::{CheckpointKind, DataSpec, Manifest};
use crate::step::{build_samples, loss_config, RolloutAction, RolloutTrajectory};
use crate::{AgentLearner, ModelPolicy, TrainError};

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

/// Where a run writes.
#[derive(Debug, Clone)]
pub struct RunDir {
    /// The run directory.
    pub root: PathBuf,
}

impl RunDir {
    /// `metrics.jsonl`.
    pub fn metrics(&self) -> PathBuf {
        self.root.join("metrics.jsonl")
    }
    /// `trajectories.jsonl`.
    pub fn trajectories(&self) -> PathBuf {
        self.root.join("trajectories.jsonl")
    }
    /// The latest checkpoint.
    pub fn checkpoint(&self) -> PathBuf {
        self.root.join("checkpoints").join("latest")
    }
    /// Scratch space for rollouts.
    pub fn work(&self) -> PathBuf {
        self.root.join("work")
    }
}

/// A manifest's tasks.
#[derive(Debug, Clone, Default)]
pub struct Tasks {
    /// Training tasks.
    pub train: Vec<TaskInput>,
    /// Held-out tasks.
    pub eval: Vec<TaskInput>,
    /// The tabular task behind each tabular task id (for grading submissions).
    pub tabular: BTreeMap<String, TabularTask>,
}

/// What agents see of a generated problem: the whole prompt (with the
/// boxed-answer instruction) or only the statement.
pub(crate) fn problem_text(
    p: &mappa_env::math_tasks::GeneratedProblem,
    instruction: bool,
) -> String {
    if instruction {
        p.prompt.clone()
    } else {
        p.statement().to_string()
    }
}

/// A tabular task as agents see it: the cleaned text, the data files; the coach gets the raw text.
pub(crate) fn tabular_input(group: usize, task: &TabularTask) -> TaskInput {
    let dir = task
        .train_csv
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let sample = dir.join("sample_submission.csv");
    let mut inputs = vec![task.train_csv.clone(), task.test_csv.clone()];
    if sample.exists() {
        inputs.push(sample);
    }
    TaskInput {
        id: task.id.clone(),
        group,
        text: task.cleaned_prompt.clone(),
        coach_text: Some(task.raw_prompt.clone()),
        inputs,
        solution: Some(KnownSolution {
            task_kind: task.kind.name().to_string(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Generated tabular tasks: binary, multi-class and regression in turn.
pub(crate) fn generated_tabular(
    dir: &Path,
    n: usize,
    seed: u64,
    prefix: &str,
) -> Result<Vec<TabularTask>, TrainError> {
    (0..n)
        .map(|i| {
            let kind = match i % 3 {
                0 => SpecKind::Binary,
                1 => SpecKind::Multiclass { classes: 3 },
                _ => SpecKind::Regression,
            };
            let spec = TaskSpec {
                id: format!("{prefix}-{i}"),
                kind,
                n_train: 300,
                n_test: 100,
                n_features: 3,
                noise: 0.1,
            };
            generate_task(dir, &spec, seed + i as u64)
                .map(|g| g.task)
                .map_err(|e| TrainError::Config(format!("data: {e}")))
        })
        .collect()
}

/// The training and held-out tasks of a manifest; generated tabular tasks
/// are written under `data_dir`.
pub fn load_tasks(manifest: &Manifest, data_dir: &Path) -> Result<Tasks, TrainError> {
    let data_err = |e: &dyn std::fmt::Display| TrainError::Config(format!("data: {e}"));
    let tabular_tasks = |train: Vec<TabularTask>, eval: Vec<TabularTask>| {
        let tabular = train
            .iter()
            .chain(&eval)
            .map(|t| (t.id.clone(), t.clone()))
            .collect();
        Tasks {
            train: train
                .iter()
                .enumerate()
                .map(|(i, t)| tabular_input(i, t))
                .collect(),
            eval: eval
                .iter()
                .enumerate()
                .map(|(i, t)| tabular_input(i, t))
                .collect(),
            tabular,
        }
    };
    match &manifest.data {
        DataSpec::Tabular(files) => {
            let load = |list: &Path| {
                mappa_env::tabular::load_tasks(list, &files.cleaned_prompts.path, &files.data_root)
                    .map(|l| l.tasks)
                    .map_err(|e| data_err(&e))
            };
            Ok(tabular_tasks(
                load(&files.train.path)?,
                load(&files.eval.path)?,
            ))
        }
        DataSpec::GeneratedTabular { train, eval, seed } => {
            let train = generated_tabular(data_dir, *train, *seed, "train")?;
            let eval = generated_tabular(data_dir, *eval, seed.wrapping_add(1_000_003), "eval")?;
            Ok(tabular_tasks(train, eval))
        }
        DataSpec::GeneratedMath {
            train,
            eval,
            seed,
            coach_checkpoints,
            instruction,
            tiers,
        } => {
            let tiers = tiers.as_deref().unwrap_or(&Tier::ALL);
            let train_problems = generate_mix_of(tiers, *train, *seed);
            let seen: HashSet<String> = train_problems
                .iter()
                .map(|p| normalize_problem_text(&p.prompt))
                .collect();
            let eval_seed = SeedTree::new(*seed).stream("data/eval-seed").next_u64();
            // Draw extra and drop any that repeat a training problem.
            let eval_problems: Vec<_> = generate_mix_of(tiers, *eval * 2 + 8, eval_seed)
                .into_iter()
                .filter(|p| !seen.contains(&normalize_problem_text(&p.prompt)))
                .take(*eval)
                .collect();
            if eval_problems.len() < *eval {
                return Err(data_err(&format!(
                    "only {} held-out problems disjoint from training",
                    eval_problems.len()
                )));
            }
            let task = |group: usize, p: &mappa_env::math_tasks::GeneratedProblem| TaskInput {
                id: p.id.clone(),
                group,
                text: problem_text(p, *instruction),
                ground_truth: Some(p.answer.to_string()),
                solution: Some(KnownSolution {
                    // The tier, so that a scripted coach can be biased per tier.
                    task_kind: p.tier.name().into(),
                    answer: Some(p.answer.to_string()),
                    checkpoints: match coach_checkpoints {
                        CheckpointKind::Steps => p.steps.clone(),
                        CheckpointKind::Expression => vec![p.expression().to_string()],
                    },
                    ..Default::default()
                }),
                ..Default::default()
            };
            Ok(Tasks {
                train: train_problems
                    .iter()
                    .enumerate()
                    .map(|(i, p)| task(i, p))
                    .collect(),
                eval: eval_problems
                    .iter()
                    .enumerate()
                    .map(|(i, p)| task(i, p))
                    .collect(),
                tabular: BTreeMap::new(),
            })
        }
        DataSpec::MathFile {
            path,
            train_size,
            seed,
            eval,
            ..
        } => {
            let dataset = MathDataset::load(path).map_err(|e| data_err(&e))?;
            let train = dataset
                .sample(train_size.unwrap_or(dataset.problems.len()), *seed)
                .map_err(|e| data_err(&e))?;
            let mut held_out = Vec::new();
            for f in eval {
                let set = MathDataset::load(&f.path).map_err(|e| data_err(&e))?;
                check_disjoint(&train, &set.problems).map_err(|e| data_err(&e))?;
                held_out.extend(set.problems);
            }
            let task = |group: usize, p: &mappa_env::datasets::MathProblem| TaskInput {
                id: p.id.clone(),
                group,
                text: p.prompt.clone(),
                ground_truth: Some(p.answer.clone()),
                ..Default::default()
            };
            Ok(Tasks {
                train: train.iter().enumerate().map(|(i, p)| task(i, p)).collect(),
                eval: held_out
                    .iter()
                    .enumerate()
                    .map(|(i, p)| task(i, p))
                    .collect(),
                tabular: BTreeMap::new(),
            })
        }
    }
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

/// The outcome of a trajectory (1 or 0) and, for tabular tasks, the
/// submission's evaluation (whose metrics the last agent's coach sees).
fn grade(
    workflow: &Workflow,
    tabular: &BTreeMap<String, TabularTask>,
    task: &TaskInput,
    trajectory: &Trajectory,
) -> Result<(f64, Option<Outcome>), TrainError> {
    if let Some(tabular) = tabular.get(&task.id) {
        let submission = trajectory
            .workdir
            .join(&workflow.final_answer_from)
            .join("submission.csv");
        let outcome = evaluate_submission(tabular, Some(&submission))
            .map_err(|e| TrainError::Input(format!("grading {}: {e}", task.id)))?;
        return Ok((outcome.success as u8 as f64, Some(outcome)));
    }
    let correct = match (&task.ground_truth, &trajectory.final_output) {
        (Some(gold), Some(output)) => mappa_env::math::grade_response(gold, output, false).correct,
        _ => false,
    };
    Ok((correct as u8 as f64, None))
}

/// An evaluation line: accuracy over `trajectories`, plus DSBench's fair metrics for tabular tasks.
fn eval_line(
    step: usize,
    workflow: &Workflow,
    tabular: &BTreeMap<String, TabularTask>,
    tasks: &[TaskInput],
    trajectories: &[Trajectory],
) -> Result<Value, TrainError> {
    let by_id: BTreeMap<&str, &TaskInput> = tasks.iter().map(|t| (t.id.as_str(), t)).collect();
    let mut correct = 0.0;
    let mut outcomes = Vec::new();
    for t in trajectories {
        let (value, outcome) = grade(workflow, tabular, by_id[t.task_id.as_str()], t)?;
        correct += value;
        outcomes.extend(outcome);
    }
    let mut line = json!({
        "step": step,
        "kind": "eval",
        "accuracy": correct / trajectories.len().max(1) as f64,
        "trajectories": trajectories.len(),
    });
    if !outcomes.is_empty() {
        line["tabular"] = serde_json::to_value(FairSummary::from_outcomes(&outcomes))
            .expect("summary serialises");
    }
    Ok(line)
}

/// Evaluate a served model (an OpenAI-compatible endpoint: vLLM, SGLang,
/// llama.cpp, Ollama, a hosted API) as every agent of the manifest's
/// workflow, on its held-out tasks; appends to `out_dir/eval.jsonl`.
pub fn evaluate_remote(
    manifest: &Manifest,
    out_dir: &Path,
    endpoint: OpenAiConfig,
) -> Result<Value, TrainError> {
    let workflow =
        Workflow::load(&manifest.workflow).map_err(|e| TrainError::Config(e.to_string()))?;
    let tasks = load_tasks(manifest, &out_dir.join("data"))?;
    if tasks.eval.is_empty() {
        return Err(TrainError::Config(
            "data: no held-out tasks to evaluate".into(),
        ));
    }
    let sandbox =
        Sandbox::new(SandboxConfig::discover().map_err(|e| TrainError::Config(e.to_string()))?)
            .map_err(|e| TrainError::Config(e.to_string()))?;
    let policy = RemotePolicy::new(
        endpoint,
        manifest.eval.temperature,
        manifest.rollout.max_new_tokens as u32,
        8,
    )
    .map_err(|e| TrainError::Config(e.to_string()))?;
    let policies: Vec<&dyn Policy> = workflow
        .agents
        .iter()
        .map(|_| &policy as &dyn Policy)
        .collect();
    let work = out_dir.join("work").join("eval-remote");
    let engine = RolloutEngine::new(&workflow, policies, &sandbox, &work)
        .map_err(|e| TrainError::Input(e.to_string()))?;
    let trajectories = engine
        .run(&tasks.eval, manifest.eval.samples)
        .map_err(|e| TrainError::Input(e.to_string()))?;
    let mut line = eval_line(0, &workflow, &tasks.tabular, &tasks.eval, &trajectories)?;
    line["policy"] = json!(policy.name());
    remove_work(&work)?;
    let _ = std::fs::remove_dir(out_dir.join("work"));
    append_jsonl(&out_dir.join("eval.jsonl"), std::slice::from_ref(&line))?;
    Ok(line)
}

/// Delete a rollout's working directories.
fn remove_work(work: &Path) -> Result<(), TrainError> {
    std::fs::remove_dir_all(work).map_err(|e| TrainError::Checkpoint {
        path: work.display().to_string(),
        message: e.to_string(),
    })
}

/// Keep only the lines of a JSON-lines file whose `step` is below `step`
/// (a resumed run rewrites what followed its checkpoint).
fn truncate_jsonl(path: &Path, step: usize) -> Result<(), TrainError> {
    if !path.exists() {
        return Ok(());
    }
    let io = |e: std::io::Error| TrainError::Checkpoint {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let text = std::fs::read_to_string(path).map_err(io)?;
    let kept: String = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<Value>(l)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| (s as usize) < step)
        })
        .map(|l| format!("{l}\n"))
        .collect();
    mappa_core::fs::write_atomic(path, kept.as_bytes()).map_err(|e| TrainError::Checkpoint {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

fn append_jsonl(path: &Path, rows: &[Value]) -> Result<(), TrainError> {
    let io = |e: std::io::Error| TrainError::Checkpoint {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    let mut text = String::new();
    for row in rows {
        text.push_str(&row.to_string());
        text.push('\n');
    }
    file.write_all(text.as_bytes()).map_err(io)?;
    file.sync_data().map_err(io)
}

/// One agent's model files.
struct AgentModel {
    tokenizer: HfTokenizer,
    template: ChatTemplate,
}

/// Everything a run holds.
struct Runner<'a, B: AutodiffModelBackend> {
    manifest: &'a Manifest,
    workflow: Workflow,
    models: Vec<AgentModel>,
    learners: Vec<AgentLearner<B>>,
    coach: Option<Box<dyn Coach>>,
    sandbox: Sandbox,
    seeds: SeedTree,
    dir: RunDir,
    tabular: BTreeMap<String, TabularTask>,
}

impl<B: AutodiffModelBackend> Runner<'_, B>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    fn generation(&self, temperature: f64) -> GenerationConfig {
        GenerationConfig {
            max_new_tokens: self.manifest.rollout.max_new_tokens,
            sampling: SamplingConfig {
                top_p: self.manifest.rollout.top_p as f32,
                ..SamplingConfig::with_temperature(temperature as f32)
            },
            eos_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }

    /// Roll out `tasks` with each agent's current weights.
    fn rollout(
        &self,
        tasks: &[TaskInput],
        samples: usize,
        temperature: f64,
        stream: &str,
        on_agent_done: &mut dyn FnMut(usize, Vec<(usize, Vec<ActionRecord>)>),
    ) -> Result<(Vec<Trajectory>, PathBuf), TrainError> {
        let seeds = SeedTree::new(self.seeds.stream(stream).next_u64());
        let policies: Vec<ModelPolicy<'_, B::InnerBackend>> = self
            .learners
            .iter()
            .zip(&self.models)
            .map(|(l, m)| {
                ModelPolicy::new(
                    l.name(),
                    l.policy().valid(),
                    &m.tokenizer,
                    &m.template,
                    self.generation(temperature),
                    seeds,
                )
            })
            .collect();
        let work = self.dir.work().join(stream.replace('/', "-"));
        let engine = RolloutEngine::new(
            &self.workflow,
            policies.iter().map(|p| p as &dyn Policy).collect(),
            &self.sandbox,
            &work,
        )
        .map_err(|e| TrainError::Input(e.to_string()))?;
        let trajectories = engine
            .run_with(tasks, samples, on_agent_done)
            .map_err(|e| TrainError::Input(e.to_string()))?;
        Ok((trajectories, work))
    }

    /// The outcome of a trajectory (1 or 0) and, for tabular tasks, the
    /// submission's evaluation (whose metrics the last agent's coach sees).
    fn grade(
        &self,
        task: &TaskInput,
        trajectory: &Trajectory,
    ) -> Result<(f64, Option<Outcome>), TrainError> {
        grade(&self.workflow, &self.tabular, task, trajectory)
    }

    fn evaluate(&self, step: usize, eval: &[TaskInput]) -> Result<Value, TrainError> {
        let e = &self.manifest.eval;
        let (trajectories, work) = self.rollout(
            eval,
            e.samples,
            e.temperature,
            &format!("eval/step-{step}"),
            &mut |_, _| {},
        )?;
        let line = eval_line(step, &self.workflow, &self.tabular, eval, &trajectories)?;
        remove_work(&work)?;
        Ok(line)
    }

    fn train_step(
        &mut self,
        step: usize,
        batch: &[TaskInput],
    ) -> Result<(Value, Vec<Value>), TrainError> {
        let r = &self.manifest.rollout;
        let coach = self
            .coach
            .as_ref()
            .ok_or_else(|| TrainError::Config("training needs a coach".into()))?;
        let samples_per_task = r.samples_per_prompt;
        let last_agent = self.workflow.agents.len() - 1;
        let workflow = &self.workflow;
        // Coach each agent but the last while the next one generates: the last
        // agent's coach may need the graded outcome (DSBench metrics).
        let (sender, receiver) =
            std::sync::mpsc::channel::<(usize, Vec<(usize, Vec<ActionRecord>)>)>();
        let (rolled, early) = std::thread::scope(|s| {
            let scorer = s.spawn(
                move || -> Result<BTreeMap<(usize, usize), Vec<ActionScore>>, TrainError> {
                    let mut scored = BTreeMap::new();
                    for (agent, done) in receiver {
                        let mut contexts = Vec::new();
                        let mut owners = Vec::new();
                        for (i, actions) in &done {
                            let task = &batch[i / samples_per_task];
                            contexts.extend(action_contexts(
                                workflow,
                                task,
                                i % samples_per_task,
                                actions,
                            ));
                            owners.push((*i, actions.len()));
                        }
                        let scores = coach
                            .score_batch(&contexts)
                            .map_err(|e| TrainError::Input(format!("coach: {e}")))?;
                        let mut it = scores.into_iter();
                        for (i, n) in owners {
                            scored.insert((i, agent), it.by_ref().take(n).collect());
                        }
                    }
                    Ok(scored)
                },
            );
            let rolled = self.rollout(
                batch,
                samples_per_task,
                r.temperature,
                &format!("rollout/step-{step}"),
                &mut |agent, done| {
                    if agent != last_agent {
                        let _ = sender.send((agent, done));
                    }
                },
            );
            drop(sender);
            (rolled, scorer.join().expect("the coaching thread"))
        });
        let (trajectories, work) = rolled?;
        let mut early = early?;
        let by_id: BTreeMap<&str, &TaskInput> = batch.iter().map(|t| (t.id.as_str(), t)).collect();
        // Grade, then coach the last agent: a tabular task's coach sees the submission's metrics.
        let mut outcomes = Vec::with_capacity(trajectories.len());
        let mut last_contexts = Vec::new();
        for t in &trajectories {
            let task = by_id[t.task_id.as_str()];
            let (value, tabular) = self.grade(task, t)?;
            outcomes.push(value);
            let mut seen = task.clone();
            if let Some(o) = &tabular {
                seen.ground_truth = Some(serde_json::to_string(o).expect("outcome serialises"));
            }
            let last: Vec<ActionRecord> = t
                .actions
                .iter()
                .filter(|a| a.agent == last_agent)
                .cloned()
                .collect();
            last_contexts.extend(action_contexts(&self.workflow, &seen, t.sample, &last));
        }
        remove_work(&work)?;
        let mut last_scores = coach
            .score_batch(&last_contexts)
            .map_err(|e| TrainError::Input(format!("coach: {e}")))?
            .into_iter();
        // Every action's score, in trajectory order.
        let mut scores = Vec::new();
        for (i, t) in trajectories.iter().enumerate() {
            for agent in 0..=last_agent {
                let n = t.actions.iter().filter(|a| a.agent == agent).count();
                if agent == last_agent {
                    scores.extend(last_scores.by_ref().take(n));
                } else {
                    scores.extend(early.remove(&(i, agent)).unwrap_or_default());
                }
            }
        }
        let mut scores_iter = scores.iter();
        let mut rollout = Vec::new();
        let mut per_trajectory_scores: Vec<Vec<&ActionScore>> = Vec::new();
        for (t, &outcome) in trajectories.iter().zip(&outcomes) {
            let mine: Vec<&ActionScore> = scores_iter.by_ref().take(t.actions.len()).collect();
            rollout.push(RolloutTrajectory {
                group: t.group,
                outcome,
                actions: t
                    .actions
                    .iter()
                    .zip(&mine)
                    .map(|(a, s)| RolloutAction {
                        agent: a.agent,
                        prompt: a.prompt_ids.clone(),
                        completion: a.completion_ids.clone(),
                        truncated: a.truncated && self.manifest.rollout.mask_truncated,
                        score: s.score,
                    })
                    .collect(),
            });
            per_trajectory_scores.push(mine);
        }
        let samples = build_samples(&self.learners, &rollout, &self.manifest.credit)?;
        // Each action's reward and mean advantage, in trajectory order (samples are per agent, in that order).
        let mut next = vec![0usize; samples.len()];
        let credit: Vec<Vec<(f64, f64)>> = rollout
            .iter()
            .map(|t| {
                t.actions
                    .iter()
                    .map(|a| {
                        let s = &samples[a.agent][next[a.agent]];
                        next[a.agent] += 1;
                        let valid: Vec<f64> = s
                            .advantages
                            .iter()
                            .zip(&s.mask)
                            .filter(|(_, m)| **m)
                            .map(|(x, _)| *x as f64)
                            .collect();
                        (
                            s.reward,
                            valid.iter().sum::<f64>() / valid.len().max(1) as f64,
                        )
                    })
                    .collect()
            })
            .collect();
        let loss = loss_config(&self.manifest.train, &self.manifest.credit);
        let mut agents = Vec::new();
        for (learner, samples) in self.learners.iter_mut().zip(&samples) {
            agents.push(
                serde_json::to_value(learner.train_step(samples, &loss)?)
                    .expect("metrics serialise"),
            );
        }
        // Per-role coach means and tool use, for reports.
        let mut role_scores: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        let (mut executor_actions, mut with_code) = (0usize, 0usize);
        for (t, scores) in trajectories.iter().zip(&per_trajectory_scores) {
            for (a, s) in t.actions.iter().zip(scores) {
                let e = role_scores.entry(a.role.clone()).or_default();
                e.0 += s.score;
                e.1 += 1;
                if self.workflow.agents[a.agent].tool == mappa_agents::Tool::Python {
                    executor_actions += 1;
                    with_code += a.code.is_some() as usize;
                }
            }
        }
        let accuracy = rollout.iter().map(|t| t.outcome).sum::<f64>() / rollout.len().max(1) as f64;
        let metrics = json!({
            "step": step,
            "kind": "train",
            "train_accuracy": accuracy,
            "coach_mean_score": role_scores.iter().map(|(k, (s, n))| (k.clone(), json!(s / *n as f64))).collect::<serde_json::Map<_, _>>(),
            "tool_call_rate": if executor_actions == 0 { Value::Null } else { json!(with_code as f64 / executor_actions as f64) },
            "agents": agents,
        });
        let rows = trajectories
            .iter()
            .zip(&rollout)
            .zip(&per_trajectory_scores)
            .zip(&credit)
            .map(|(((t, r), scores), credit)| {
                json!({
                    "step": step,
                    "task_id": t.task_id,
                    "sample": t.sample,
                    "outcome": r.outcome,
                    "actions": t.actions.iter().zip(scores).zip(credit).map(|((a, s), (reward, advantage))| json!({
                        "role": a.role,
                        "turn": a.turn,
                        "text": a.text,
                        "truncated": a.truncated,
                        "code": a.code,
                        "tool_observation": a.tool_observation,
                        "tool_status": a.tool_status,
                        "score": s.score,
                        "rationale": s.rationale,
                        "coach_fallback": s.fallback,
                        "reward": reward,
                        "advantage_mean": advantage,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        Ok((metrics, rows))
    }
}

/// A runner with the training and held-out tasks.
type Built<'a, B> = (Runner<'a, B>, Vec<TaskInput>, Vec<TaskInput>);

/// Notes this machine in a coach cache being recorded, and warns once when
/// a replayed cache was recorded on a machine that differs.
fn compare_cache_machine(config: &mappa_judge::config::CoachConfig) -> Result<(), TrainError> {
    let (Some(path), mode) = (&config.cache, config.cache_mode) else {
        return Ok(());
    };
    if mode == CacheMode::Off {
        return Ok(());
    }
    let cache_error = |e: mappa_judge::CoachError| TrainError::Config(e.to_string());
    let cache = mappa_judge::cache::CoachCache::open(path, mode).map_err(cache_error)?;
    let here = crate::machine::record();
    match (mode, cache.recorded_machine().map_err(cache_error)?) {
        (CacheMode::Replay, Some(recorded)) => {
            let recorded: serde_json::Value = serde_json::from_str(&recorded).unwrap_or_default();
            if let Some(warning) = crate::machine::warning(
                &format!("the coach cache {} was recorded", path.display()),
                &recorded,
                &here,
            ) {
                eprintln!("{warning}");
            }
        }
        (CacheMode::ReadWrite, None) => {
            cache.note_machine(&here.to_string()).map_err(cache_error)?
        }
        _ => {}
    }
    Ok(())
}

/// Load the workflow, tasks, models, coach (when `coach` is true) and sandbox of a manifest.
fn build_runner<'a, B: AutodiffModelBackend>(
    manifest: &'a Manifest,
    run_dir: &Path,
    coach: bool,
    coach_mode: Option<CacheMode>,
    device: &B::Device,
) -> Result<Built<'a, B>, TrainError>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    let workflow =
        Workflow::load(&manifest.workflow).map_err(|e| TrainError::Config(e.to_string()))?;
    let tasks = load_tasks(manifest, &run_dir.join("data"))?;
    let sandbox =
        Sandbox::new(SandboxConfig::discover().map_err(|e| TrainError::Config(e.to_string()))?)
            .map_err(|e| TrainError::Config(e.to_string()))?;
    // Each role's starting model: a checkpoint, or random weights from a seed.
    let mut sources = BTreeMap::new();
    for agent in &workflow.agents {
        let spec = manifest.models.get(&agent.role).ok_or_else(|| {
            TrainError::Config(format!("models: no model for role {:?}", agent.role))
        })?;
        let model_err =
            |e: &dyn std::fmt::Display| TrainError::Model(format!("{}: {e}", spec.path.display()));
        let model = match spec.init_seed {
            Some(seed) => TransformerConfig::from_hf_file(&spec.path.join("config.json"))
                .map_err(|e| model_err(&e))?
                .init::<B>(seed, device),
            None => load_transformer::<B>(&spec.path, device).map_err(|e| model_err(&e))?,
        };
        sources.insert(agent.role.clone(), (model, spec.path.clone()));
    }
    if let Some(warm) = &manifest.warm_start {
        let resolved = manifest.resolve()?;
        let cache_root = run_dir.parent().unwrap_or(run_dir).join(".warm-start");
        let dir = crate::warm_start::cache_dir(manifest, &resolved, &cache_root);
        let tuned = crate::warm_start::ensure(
            manifest,
            warm,
            &workflow,
            sources,
            &tasks.eval,
            &sandbox,
            &dir,
        )?;
        sources = BTreeMap::new();
        for (role, path) in tuned {
            let model = load_transformer::<B>(&path, device)
                .map_err(|e| TrainError::Model(format!("{}: {e}", path.display())))?;
            sources.insert(role, (model, path));
        }
    }
    let mut models = Vec::new();
    let mut learners = Vec::new();
    for agent in &workflow.agents {
        let (policy, path) = sources.remove(&agent.role).expect("every role has a model");
        let model_err =
            |e: &dyn std::fmt::Display| TrainError::Model(format!("{}: {e}", path.display()));
        let tokenizer = HfTokenizer::from_dir(&path).map_err(|e| model_err(&e))?;
        let template = ChatTemplate::from_tokenizer(&tokenizer).map_err(|e| model_err(&e))?;
        learners.push(AgentLearner::new(
            &agent.role,
            policy,
            manifest.train.clone(),
        )?);
        models.push(AgentModel {
            tokenizer,
            template,
        });
    }
    let coach = if coach {
        let mut config = manifest.coach.clone();
        if let Some(mode) = coach_mode {
            config.cache_mode = mode;
        }
        compare_cache_machine(&config)?;
        Some(
            config
                .build()
                .map_err(|e| TrainError::Config(e.to_string()))?,
        )
    } else {
        None
    };
    let dir = RunDir {
        root: run_dir.to_path_buf(),
    };
    std::fs::create_dir_all(&dir.root)
        .map_err(|e| TrainError::Config(format!("{}: {e}", dir.root.display())))?;
    let runner = Runner {
        manifest,
        workflow,
        models,
        learners,
        coach,
        sandbox,
        seeds: SeedTree::new(manifest.seed),
        dir,
        tabular: tasks.tabular,
    };
    Ok((runner, tasks.train, tasks.eval))
}

/// Evaluate the base models, or a run's checkpoint, on the manifest's
/// held-out tasks; appends the result to `out_dir/eval.jsonl` and returns it.
pub fn evaluate<B: AutodiffModelBackend>(
    manifest: &Manifest,
    out_dir: &Path,
    checkpoint: Option<&Path>,
    device: &B::Device,
) -> Result<Value, TrainError>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    let (mut runner, _, eval_tasks) = build_runner::<B>(manifest, out_dir, false, None, device)?;
    if eval_tasks.is_empty() {
        return Err(TrainError::Config(
            "data: no held-out tasks to evaluate".into(),
        ));
    }
    let step = match checkpoint {
        Some(dir) => load_checkpoint(dir, &mut runner.learners)?.step,
        None => 0,
    };
    let mut line = runner.evaluate(step, &eval_tasks)?;
    line["checkpoint"] = json!(checkpoint.map(|c| c.display().to_string()));
    append_jsonl(&out_dir.join("eval.jsonl"), std::slice::from_ref(&line))?;
    let _ = std::fs::remove_dir(runner.dir.work());
    Ok(line)
}

/// Run (or resume) the manifest's training in `run_dir`. Returns the final
/// evaluation's metrics line.
pub fn run<B: AutodiffModelBackend>(
    manifest: &Manifest,
    run_dir: &Path,
    options: &RunOptions,
    device: &B::Device,
) -> Result<Value, TrainError>
where
    mappa_model::Transformer<B::InnerBackend>: Send,
{
    let (mut runner, train_tasks, eval_tasks) =
        build_runner::<B>(manifest, run_dir, true, options.coach_mode, device)?;
    if train_tasks.is_empty() {
        return Err(TrainError::Config("data: no training tasks".into()));
    }
    let mut state = TrainerState {
        extra: json!({ "seed": manifest.seed }),
        ..Default::default()
    };
    if options.resume && runner.dir.checkpoint().exists() {
        state = load_checkpoint(&runner.dir.checkpoint(), &mut runner.learners)?;
    } else if !options.resume {
        for file in [runner.dir.metrics(), runner.dir.trajectories()] {
            if file.exists() {
                std::fs::remove_file(&file)
                    .map_err(|e| TrainError::Config(format!("{}: {e}", file.display())))?;
            }
        }
    }
    truncate_jsonl(&runner.dir.metrics(), state.step)?;
    truncate_jsonl(&runner.dir.trajectories(), state.step)?;

    let total = manifest.rollout.steps;
    let stop = options.max_steps.map_or(total, |m| m.min(total));
    let eval_due =
        |step: usize| step == 0 || (manifest.eval.every > 0 && step % manifest.eval.every == 0);
    let n = train_tasks.len();
    let per_step = manifest.rollout.prompts_per_step;
    let bar = if options.progress {
        ProgressBar::new(stop as u64)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix} [{bar:30}] step {pos}/{len} ({elapsed}, eta {eta}) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.set_prefix(manifest.name.clone());
    bar.set_position(state.step as u64);
    for step in state.step..stop {
        if eval_due(step) && !eval_tasks.is_empty() {
            let line = runner.evaluate(step, &eval_tasks)?;
            bar.set_message(format!(
                "held-out accuracy {:.3}",
                line["accuracy"].as_f64().unwrap_or(0.0)
            ));
            append_jsonl(&runner.dir.metrics(), &[line])?;
        }
        let batch: Vec<TaskInput> = (0..per_step)
            .map(|i| {
                let cursor = state.dataset_cursor as usize + i;
                let order = epoch_order(&runner.seeds, (cursor / n) as u64, n);
                train_tasks[order[cursor % n]].clone()
            })
            .collect();
        let (metrics, rows) = runner.train_step(step, &batch)?;
        append_jsonl(&runner.dir.trajectories(), &rows)?;
        append_jsonl(&runner.dir.metrics(), &[metrics])?;
        state.step = step + 1;
        state.dataset_cursor += per_step as u64;
        bar.inc(1);
        if state.step % manifest.rollout.checkpoint_every == 0 || state.step == stop {
            let learners: Vec<&AgentLearner<B>> = runner.learners.iter().collect();
            save_checkpoint(&runner.dir.checkpoint(), &learners, &state)?;
        }
    }
    bar.finish_and_clear();
    let last = if stop == total && !eval_tasks.is_empty() {
        let line = runner.evaluate(total, &eval_tasks)?;
        append_jsonl(&runner.dir.metrics(), std::slice::from_ref(&line))?;
        line
    } else {
        json!({ "step": stop, "kind": "partial" })
    };
    let _ = std::fs::remove_dir(runner.dir.work()); // only when empty
    Ok(last)
}
