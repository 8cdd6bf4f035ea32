//! What a run holds ([`Runner`]) and how it is built from a manifest: the
//! workflow, the tasks and their grader, the sandbox, one learner and
//! tokenizer per agent (from a checkpoint, random weights, or a warm
//! start), and the coach.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::AutodiffModule;
use mappa_agents::{ActionRecord, Policy, RolloutEngine, TaskInput, Trajectory, Workflow};
use mappa_core::rng::SeedTree;
use mappa_env::sandbox::{Sandbox, SandboxConfig};
use mappa_judge::cache::CacheMode;
use mappa_judge::Coach;
use mappa_model::weights::load_transformer;
use mappa_model::AutodiffModelBackend;
use mappa_model::{
    ChatTemplate, GenerationConfig, HfTokenizer, SamplingConfig, Transformer, TransformerConfig,
};

use super::RunDir;
use crate::engine::{Engine, EngineSampling};
use crate::manifest::Manifest;
use crate::tasks::TaskSet;
use crate::{AgentLearner, ModelPolicy, TrainError};

/// One agent's tokenizer and chat template.
pub(super) struct AgentModel {
    tokenizer: HfTokenizer,
    template: ChatTemplate,
}

/// Everything a run holds.
pub(super) struct Runner<'a, B: AutodiffModelBackend> {
    pub manifest: &'a Manifest,
    pub workflow: Workflow,
    pub tasks: TaskSet,
    pub models: Vec<AgentModel>,
    pub learners: Vec<AgentLearner<B>>,
    pub coach: Option<Box<dyn Coach>>,
    pub sandbox: Sandbox,
    pub seeds: SeedTree,
    pub dir: RunDir,
    /// The inference engine that generates rollouts (`[rollout.engine]`).
    pub engine: Option<Engine>,
}

/// The workflow, tasks and sandbox of a manifest (generated tasks are
/// written under `out_dir/data`).
pub(super) fn open_environment(
    manifest: &Manifest,
    out_dir: &Path,
) -> Result<(Workflow, TaskSet, Sandbox), TrainError> {
    let workflow = Workflow::load(&manifest.workflow)?;
    check_agent_limits(manifest, &workflow)?;
    let tasks = super::load_tasks(manifest, &out_dir.join("data"))?;
    let sandbox = Sandbox::new(SandboxConfig::discover()?)?;
    Ok((workflow, tasks, sandbox))
}

/// An agent's own `max_new_tokens` may lower the rollout's, never raise it
/// (the memory plan counts the rollout's).
fn check_agent_limits(manifest: &Manifest, workflow: &Workflow) -> Result<(), TrainError> {
    let cap = manifest.rollout.max_new_tokens;
    match workflow
        .agents
        .iter()
        .find(|a| a.max_new_tokens.is_some_and(|n| n > cap))
    {
        Some(agent) => Err(TrainError::Config(format!(
            "{}: agent {} has max_new_tokens = {}, above the manifest's rollout.max_new_tokens = {cap}, \
             which bounds it: raise rollout.max_new_tokens or lower the agent's",
            manifest.workflow.display(),
            agent.role,
            agent.max_new_tokens.unwrap_or_default()
        ))),
        None => Ok(()),
    }
}

/// The devices of `role` (`[devices] agents`; device 0 by default), the
/// first being its main device, taken from the box's `devices`
/// ([`crate::data_parallel::devices_of_box`]).
fn role_devices<B: AutodiffModelBackend>(
    manifest: &Manifest,
    role: &str,
    devices: &[B::Device],
) -> Vec<B::Device> {
    let indices = manifest
        .devices
        .as_ref()
        .map_or_else(|| vec![0], |d| d.of(role));
    indices.into_iter().map(|i| devices[i].clone()).collect()
}

/// Each role's starting model, on its main device, and the directory it
/// came from (for its tokenizer): a checkpoint, or random weights from a
/// seed. Roles on one device that name the same source share one loaded
/// model: its weights are held once in memory (burn's CPU tensors share
/// storage on clone) until an update replaces them, and never with frozen
/// LoRA bases.
fn base_models<B: AutodiffModelBackend>(
    manifest: &Manifest,
    workflow: &Workflow,
    devices: &[B::Device],
) -> Result<BTreeMap<String, (Transformer<B>, PathBuf)>, TrainError> {
    let mut loaded: BTreeMap<(PathBuf, Option<u64>, usize), Transformer<B>> = BTreeMap::new();
    let mut sources = BTreeMap::new();
    for agent in &workflow.agents {
        let spec = manifest.models.get(&agent.role).ok_or_else(|| {
            TrainError::Config(format!("models: no model for role {:?}", agent.role))
        })?;
        let main = manifest
            .devices
            .as_ref()
            .map_or(0, |d| d.of(&agent.role)[0]);
        let device = &devices[main];
        let key = (spec.path.clone(), spec.init_seed, main);
        let model = match loaded.get(&key) {
            Some(model) => model.clone(),
            None => {
                let model_err = |e| TrainError::model_at(&spec.path, e);
                let model = match spec.init_seed {
                    Some(seed) => TransformerConfig::from_hf_file(&spec.path.join("config.json"))
                        .map_err(model_err)?
                        .init::<B>(seed, device),
                    None => load_transformer::<B>(&spec.path, device).map_err(model_err)?,
                };
                let model = manifest.train.base_dtype.store(model).map_err(model_err)?;
                loaded.insert(key, model.clone());
                model
            }
        };
        sources.insert(agent.role.clone(), (model, spec.path.clone()));
    }
    Ok(sources)
}

/// Notes this machine in a coach cache being recorded, and warns once when
/// a replayed cache was recorded on a machine that differs.
fn compare_cache_machine(config: &mappa_judge::config::CoachConfig) -> Result<(), TrainError> {
    let (Some(path), mode) = (&config.cache, config.cache_mode) else {
        return Ok(());
    };
    if mode == CacheMode::Off {
        return Ok(());
    }
    let cache = mappa_judge::cache::CoachCache::open(path, mode)?;
    let here = crate::machine::Machine::here();
    match (mode, cache.recorded_machine()?) {
        (CacheMode::Replay, Some(recorded)) => {
            let recorded = crate::machine::Machine::parse(&recorded);
            if let Some(warning) = crate::machine::warning(
                &format!("the coach cache {} was recorded", path.display()),
                &recorded,
                &here,
            ) {
                eprintln!("{warning}");
            }
        }
        (CacheMode::ReadWrite, None) => cache
            .note_machine(&serde_json::to_string(&here).expect("a machine record serialises"))?,
        _ => {}
    }
    Ok(())
}

/// The warm-started models of every role (made, or read from the cache
/// next to the run directory), each on its role's first device.
fn warm_started<B: AutodiffModelBackend>(
    manifest: &Manifest,
    warm: &crate::manifest::WarmStart,
    (workflow, tasks, sandbox): (&Workflow, &TaskSet, &Sandbox),
    sources: BTreeMap<String, (Transformer<B>, PathBuf)>,
    run_dir: &Path,
    box_devices: &[B::Device],
) -> Result<BTreeMap<String, (Transformer<B>, PathBuf)>, TrainError> {
    let resolved = manifest.resolve()?;
    let cache_root = run_dir.parent().unwrap_or(run_dir).join(".warm-start");
    let dir = crate::warm_start::cache_dir(manifest, &resolved, &cache_root);
    let tuned = crate::warm_start::ensure(
        manifest,
        warm,
        workflow,
        sources,
        &tasks.eval,
        sandbox,
        &dir,
    )?;
    let mut out = BTreeMap::new();
    for (role, path) in tuned {
        let main = role_devices::<B>(manifest, &role, box_devices).remove(0);
        let model = load_transformer::<B>(&path, &main)
            .and_then(|m| manifest.train.base_dtype.store(m))
            .map_err(|e| TrainError::model_at(&path, e))?;
        out.insert(role, (model, path));
    }
    Ok(out)
}

/// Each agent's tokenizer and chat template, and its learner (with LoRA
/// adapters and data-parallel replicas where the manifest asks for them).
fn agents<B: AutodiffModelBackend>(
    manifest: &Manifest,
    workflow: &Workflow,
    mut sources: BTreeMap<String, (Transformer<B>, PathBuf)>,
    box_devices: &[B::Device],
    seeds: SeedTree,
) -> Result<(Vec<AgentModel>, Vec<AgentLearner<B>>), TrainError> {
    let mut models = Vec::new();
    let mut learners = Vec::new();
    for agent in &workflow.agents {
        let (mut policy, path) = sources.remove(&agent.role).expect("every role has a model");
        let model_err = |e| TrainError::model_at(&path, e);
        if let Some(lora) = &manifest.train.lora {
            let mut rng = seeds.stream(&format!("lora-init/{}", agent.role));
            policy = policy.with_lora(lora, &mut rng).map_err(model_err)?;
        }
        let tokenizer = HfTokenizer::from_dir(&path).map_err(model_err)?;
        let template = ChatTemplate::from_tokenizer(&tokenizer).map_err(model_err)?;
        let mut learner = AgentLearner::new(&agent.role, policy, manifest.train.clone())?
            .with_base_model(path.display().to_string());
        let devices = role_devices::<B>(manifest, &agent.role, box_devices);
        if devices.len() > 1 {
            learner = learner.with_data_parallel(devices)?;
        }
        learners.push(learner);
        models.push(AgentModel {
            tokenizer,
            template,
        });
    }
    Ok((models, learners))
}

/// The manifest's coach, its cache mode overridden by `mode` when given.
fn open_coach(manifest: &Manifest, mode: Option<CacheMode>) -> Result<Box<dyn Coach>, TrainError> {
    let mut config = manifest.coach.clone();
    if let Some(mode) = mode {
        config.cache_mode = mode;
    }
    compare_cache_machine(&config)?;
    Ok(config.build()?)
}

impl<'a, B: AutodiffModelBackend> Runner<'a, B>
where
    Transformer<B::InnerBackend>: Send,
{
    /// Load the workflow, tasks, models (warm-started when the manifest
    /// says so) and sandbox of a manifest; with `coach = Some(mode)` also
    /// the coach, its cache mode overridden by `mode`.
    pub(super) fn build(
        manifest: &'a Manifest,
        run_dir: &Path,
        coach: Option<Option<CacheMode>>,
        device: &B::Device,
    ) -> Result<Self, TrainError> {
        let (workflow, tasks, sandbox) = open_environment(manifest, run_dir)?;
        let count = manifest.devices.as_ref().map_or(1, |d| d.count);
        let box_devices = crate::data_parallel::devices_of_box::<B>(device, count)?;
        let mut sources = base_models::<B>(manifest, &workflow, &box_devices)?;
        if let Some(warm) = &manifest.warm_start {
            let env = (&workflow, &tasks, &sandbox);
            sources = warm_started::<B>(manifest, warm, env, sources, run_dir, &box_devices)?;
        }
        let seeds = SeedTree::new(manifest.seed);
        let (models, learners) = agents::<B>(manifest, &workflow, sources, &box_devices, seeds)?;
        let coach = coach.map(|mode| open_coach(manifest, mode)).transpose()?;
        let dir = RunDir {
            root: run_dir.to_path_buf(),
        };
        std::fs::create_dir_all(&dir.root).map_err(|e| TrainError::io(&dir.root, e))?;
        let engine = match &manifest.rollout.engine {
            Some(spec) => Some(Engine::connect(
                spec,
                &dir.engine_adapters(),
                &engine_prefix(&dir.root)?,
            )?),
            None => None,
        };
        Ok(Runner {
            manifest,
            workflow,
            tasks,
            models,
            learners,
            coach,
            sandbox,
            seeds,
            dir,
            engine,
        })
    }

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

    /// Roll out `tasks` with each agent's current weights, calling
    /// `on_agent_done` as each agent finishes (see
    /// [`RolloutEngine::run_with`]). Returns the trajectories and their
    /// working directory.
    pub(super) fn rollout(
        &self,
        tasks: &[TaskInput],
        samples: usize,
        temperature: f64,
        stream: &str,
        on_agent_done: &mut dyn FnMut(usize, Vec<(usize, Vec<ActionRecord>)>),
    ) -> Result<(Vec<Trajectory>, PathBuf), TrainError> {
        let seeds = SeedTree::new(self.seeds.stream(stream).next_u64());
        let policies: Vec<Box<dyn Policy + '_>> = match &self.engine {
            Some(engine) => self.engine_policies(engine, temperature, seeds)?,
            None => self
                .learners
                .iter()
                .zip(&self.models)
                .map(|(l, m)| {
                    Box::new(
                        ModelPolicy::new(
                            l.name(),
                            l.policy().valid(),
                            &m.tokenizer,
                            &m.template,
                            self.generation(temperature),
                            seeds,
                        )
                        .with_max_batch(self.manifest.rollout.max_batch)
                        .with_request_seeds(self.manifest.rollout.request_seeds()),
                    ) as Box<dyn Policy + '_>
                })
                .collect(),
        };
        let work = self.dir.work().join(stream.replace('/', "-"));
        let engine = RolloutEngine::new(
            &self.workflow,
            policies.iter().map(|p| p.as_ref()).collect(),
            &self.sandbox,
            &work,
        )?;
        let trajectories = engine.run_with(tasks, samples, on_agent_done)?;
        Ok((trajectories, work))
    }

    /// Each agent's policy served by the engine, after loading its adapter
    /// at the current version (its optimiser steps) when that is new.
    fn engine_policies<'e>(
        &'e self,
        engine: &'e Engine,
        temperature: f64,
        seeds: SeedTree,
    ) -> Result<Vec<Box<dyn Policy + 'e>>, TrainError> {
        let r = &self.manifest.rollout;
        let mut policies: Vec<Box<dyn Policy + 'e>> = Vec::new();
        for (learner, model) in self.learners.iter().zip(&self.models) {
            engine.publish(
                learner.name(),
                learner.step(),
                &learner.policy().valid(),
                learner.base_model(),
            )?;
            policies.push(Box::new(engine.policy(
                learner.name(),
                &model.tokenizer,
                &model.template,
                EngineSampling {
                    max_tokens: r.max_new_tokens,
                    temperature,
                    top_p: r.top_p,
                },
                seeds,
            )));
        }
        Ok(policies)
    }
}

/// The adapter-name prefix of the run in `root`: 8 hex digits of its
/// path's hash, so that runs sharing an engine never share a name.
fn engine_prefix(root: &Path) -> Result<String, TrainError> {
    let path = std::fs::canonicalize(root).map_err(|e| TrainError::io(root, e))?;
    let hash = mappa_core::hash::sha256_hex(path.display().to_string().as_bytes());
    Ok(format!("mappa-{}", &hash[..8]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_agent_may_not_generate_more_than_the_rollout_allows() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let manifest = Manifest::load(&root.join("fixtures/manifests/tiny-arith.toml")).unwrap();
        let mut workflow = Workflow::load(&manifest.workflow).unwrap();
        workflow.agents[1].max_new_tokens = Some(manifest.rollout.max_new_tokens);
        check_agent_limits(&manifest, &workflow).unwrap();
        workflow.agents[1].max_new_tokens = Some(manifest.rollout.max_new_tokens + 1);
        let err = check_agent_limits(&manifest, &workflow)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("agent code_executor has max_new_tokens = 11")
                && err.contains("rollout.max_new_tokens = 10"),
            "{err}"
        );
    }
}
