//! Experiment manifests (`experiments/*.toml`): everything a run depends on,
//! and their resolution into `manifest.lock.json`, whose sha256 is the run id.
//!
//! ```toml
//! name = "arith-process"
//! workflow = "workflows/arith.toml"     # paths are relative to the manifest
//! backend = "cpu"                       # cpu | wgpu | cuda
//! seed = 42                             # master seed of every named RNG stream
//!
//! [data]                                # a task family: see mappa_train::tasks
//! kind = "generated_math"
//! train = 64
//! eval = 32
//! seed = 7
//!
//! [models]                              # one base model per role
//! problem_solver = { path = "../fixtures/models/qwen3-tiny" }
//!
//! [rollout]
//! steps = 4
//! prompts_per_step = 4
//! samples_per_prompt = 2
//! max_new_tokens = 64
//! temperature = 1.0
//!
//! [eval]
//! every = 2
//! samples = 1
//! temperature = 0.6
//!
//! [coach]    # mappa_judge::config::CoachConfig
//! [credit]   # mappa_credit::CreditConfig
//! [train]    # mappa_train::TrainConfig
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mappa_credit::CreditConfig;
use mappa_judge::config::CoachConfig;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

pub use crate::engine::EngineSpec;
use crate::files::{check_file, path_err, rebase};
pub use crate::files::{weights_sha256, FileRef};
pub use crate::policy::RequestSeeds;
pub use crate::tasks::{DataSpec, WarmStart};
use crate::{TrainConfig, TrainError};

/// The compute backend of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The pure-Rust CPU backend (tests, CI, laptops).
    #[default]
    Cpu,
    /// wgpu (Vulkan, Metal, DX12): the fallback GPU backend.
    Wgpu,
    /// CUDA: the primary GPU backend.
    Cuda,
}

/// A base model: a HF checkpoint directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// The checkpoint directory (config.json, safetensors, tokenizer files), or a hub name for plans.
    pub path: PathBuf,
    /// Expected sha256 over its safetensors files (see [`weights_sha256`]).
    #[serde(default)]
    pub sha256: Option<String>,
    /// Start from random weights drawn from this seed (`path` then needs only
    /// `config.json` and the tokenizer files).
    #[serde(default)]
    pub init_seed: Option<u64>,
    /// An HF `config.json` with the model's architecture, for the memory
    /// plan of a dry run when the checkpoint is not present yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_config: Option<PathBuf>,
}

/// Rollout settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutSpec {
    /// Training steps (one rollout and one optimiser step per agent each).
    pub steps: usize,
    /// Tasks per step.
    pub prompts_per_step: usize,
    /// Trajectories per task.
    pub samples_per_prompt: usize,
    /// Most new tokens per action.
    pub max_new_tokens: usize,
    /// Sampling temperature.
    #[serde(default = "one")]
    pub temperature: f64,
    /// Nucleus sampling (1: off).
    #[serde(default = "one")]
    pub top_p: f64,
    /// Save a checkpoint every this many steps (and at the end).
    #[serde(default = "one_usize")]
    pub checkpoint_every: usize,
    /// Mask actions cut off at `max_new_tokens` out of the loss (the paper: true).
    #[serde(default = "yes")]
    pub mask_truncated: bool,
    /// Most sequences an agent generates together, in training and
    /// evaluation (none: all of a turn's requests in one batch). Bounds the
    /// KV cache and prompt-pass memory; a bound changes the last bits of
    /// the logits, so results differ from unbounded runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_batch: Option<usize>,
    /// The longest prompt an agent sees, in tokens, as the memory plan
    /// assumes it (none: 512 plus `max_new_tokens` per earlier agent in the
    /// chain); nothing cuts prompts to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_prompt_tokens: Option<usize>,
    /// How each request's sampler is seeded (none: `stream`, or `engine`
    /// with an engine); see [`RequestSeeds`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_seeds: Option<RequestSeeds>,
    /// Generate every rollout with an inference engine (vLLM's API) instead
    /// of the trainer; needs `[train.lora]` and one shared base model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineSpec>,
}

impl RolloutSpec {
    /// How requests are seeded: as set, else `engine` with an engine (the
    /// only way it can carry a seed) and `stream` without.
    pub fn request_seeds(&self) -> RequestSeeds {
        self.request_seeds.unwrap_or(match self.engine {
            Some(_) => RequestSeeds::Engine,
            None => RequestSeeds::Stream,
        })
    }
}

fn yes() -> bool {
    true
}

fn one() -> f64 {
    1.0
}

fn one_usize() -> usize {
    1
}

/// Evaluation protocol.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSpec {
    /// Evaluate before training and every this many steps (0: only at the start and end).
    #[serde(default)]
    pub every: usize,
    /// Samples per held-out task (accuracy is their mean).
    #[serde(default = "one_usize")]
    pub samples: usize,
    /// Sampling temperature of evaluation (the paper: 0.6).
    #[serde(default = "eval_temperature")]
    pub temperature: f64,
}

fn eval_temperature() -> f64 {
    0.6
}

impl Default for EvalSpec {
    fn default() -> Self {
        Self {
            every: 0,
            samples: 1,
            temperature: eval_temperature(),
        }
    }
}

/// A whole experiment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Run name.
    pub name: String,
    /// What the run is for.
    #[serde(default)]
    pub description: String,
    /// The workflow file.
    pub workflow: PathBuf,
    /// The compute backend.
    #[serde(default)]
    pub backend: BackendKind,
    /// Master seed of every named RNG stream.
    pub seed: u64,
    /// Tasks.
    pub data: DataSpec,
    /// Base model per role.
    pub models: BTreeMap<String, ModelSpec>,
    /// Rollouts.
    pub rollout: RolloutSpec,
    /// Evaluation.
    #[serde(default)]
    pub eval: EvalSpec,
    /// The coach.
    pub coach: CoachConfig,
    /// Credit assignment.
    #[serde(default)]
    pub credit: CreditConfig,
    /// Learner hyper-parameters (`total_steps` is set from `rollout.steps`).
    #[serde(default)]
    pub train: TrainConfig,
    /// An optional supervised warm start.
    #[serde(default)]
    pub warm_start: Option<WarmStart>,
    /// The device's memory, for the memory plan.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<DevicesSpec>,
    /// The arms and seeds `mappa reproduce` runs and compares (its runs
    /// carry none: a run's id does not depend on the study around it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub study: Option<Study>,
    /// The claim a single run tests (`mappa reproduce`): that training
    /// raised held-out accuracy above the base model's on the same
    /// problems. Analysis, not training: it is left out of the run id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<Claim>,
}

/// `[claim]`: a single run's test that training raised held-out accuracy.
/// The first and last evaluations (the base model, then the trained one)
/// are compared problem by problem with McNemar's exact one-sided test
/// (`mappa_core::mcnemar`); the registration states the gain the held-out
/// set detects, from `power` and an assumed share of problems that
/// training breaks (`loss_rate`, measured on validation runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Claim {
    /// Registered (committed with its analysis) before the run: the report
    /// gives a verdict. Off: exploratory, no verdict.
    pub confirmatory: bool,
    /// The test's one-sided level (default 0.05).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// The power at which the registration states the detectable gain
    /// (default 0.8).
    #[serde(default = "default_power")]
    pub power: f64,
    /// The share of held-out problems training is assumed to turn from
    /// right to wrong, for the power statement.
    pub loss_rate: f64,
}

fn default_alpha() -> f64 {
    0.05
}

fn default_power() -> f64 {
    0.8
}

impl Claim {
    /// Check ranges; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        for (key, value) in [("claim.alpha", self.alpha), ("claim.power", self.power)] {
            if !(value > 0.0 && value < 1.0) {
                return Err(format!("{key} = {value}: expected a number in (0, 1)"));
            }
        }
        if !(0.0..1.0).contains(&self.loss_rate) {
            return Err(format!(
                "claim.loss_rate = {}: expected a share in [0, 1)",
                self.loss_rate
            ));
        }
        Ok(())
    }
}

/// The devices a run declares (`[devices]`): how many, how much memory
/// each has (what the memory plan checks against), where each agent lives
/// and where an inference engine takes its memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesSpec {
    /// Each device's memory, in GiB.
    pub memory_gib: f64,
    /// Devices on the box (the backend's devices 0, 1, ...; on the CPU
    /// backend every index is the one CPU).
    #[serde(default = "one_device")]
    pub count: usize,
    /// Each agent's devices (default `[0]`): the first holds its weights,
    /// optimiser state and in-process rollouts; with more, its update runs
    /// data-parallel over all of them ([`crate::data_parallel`]), a replica
    /// of its policy on each.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub agents: BTreeMap<String, Vec<usize>>,
    /// The memory an inference engine on one of these devices takes
    /// (`[rollout.engine]`; vLLM's `--gpu-memory-utilization` times the
    /// device's memory), in GiB; none: the engine runs elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_memory_gib: Option<f64>,
    /// The device the engine's memory is taken from (default 0).
    #[serde(default)]
    pub engine_device: usize,
}

fn one_device() -> usize {
    1
}

impl DevicesSpec {
    /// The devices of `role` (the first is its main device).
    pub fn of(&self, role: &str) -> Vec<usize> {
        self.agents.get(role).cloned().unwrap_or_else(|| vec![0])
    }

    fn validate(&self, roles: &BTreeMap<String, ModelSpec>, engine: bool) -> Result<(), String> {
        if !(self.memory_gib.is_finite() && self.memory_gib > 0.0) {
            return Err(format!(
                "devices.memory_gib = {}: expected a positive number",
                self.memory_gib
            ));
        }
        if self.count == 0 || self.count > usize::from(u16::MAX) {
            return Err(format!(
                "devices.count = {}: expected 1 to {}",
                self.count,
                u16::MAX
            ));
        }
        for (role, devices) in &self.agents {
            if !roles.contains_key(role) {
                return Err(format!(
                    "devices.agents.{role}: no agent {role:?} (the roles are {})",
                    roles.keys().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            if devices.is_empty() {
                return Err(format!(
                    "devices.agents.{role}: expected at least one device index"
                ));
            }
            if let Some(d) = devices.iter().find(|&&d| d >= self.count) {
                return Err(format!(
                    "devices.agents.{role}: device {d} does not exist (devices.count = {}: indices 0 to {})",
                    self.count,
                    self.count - 1
                ));
            }
            let distinct: std::collections::BTreeSet<_> = devices.iter().collect();
            if distinct.len() < devices.len() {
                return Err(format!(
                    "devices.agents.{role} = {devices:?}: a device is listed twice"
                ));
            }
            if devices.len() > 2 && devices.windows(2).any(|w| w[0] > w[1]) {
                return Err(format!(
                    "devices.agents.{role} = {devices:?}: more than two devices must be listed in \
                     ascending order (burn's all-reduce adds the replicas' gradients in device \
                     order, so another order would change the results under the same run id)"
                ));
            }
        }
        if self.engine_device >= self.count {
            return Err(format!(
                "devices.engine_device = {}: device {0} does not exist (devices.count = {})",
                self.engine_device, self.count
            ));
        }
        if let Some(reserved) = self.engine_memory_gib {
            if !engine {
                return Err("devices.engine_memory_gib: there is no [rollout.engine]".into());
            }
            if !(reserved.is_finite() && reserved > 0.0 && reserved < self.memory_gib) {
                return Err(format!(
                    "devices.engine_memory_gib = {reserved}: expected a positive number below devices.memory_gib"
                ));
            }
        }
        Ok(())
    }
}

/// A comparison of arms over seeds: what `mappa reproduce NAME` runs when
/// the manifest has one, and reports on with a verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Study {
    /// Seeds per arm: the manifest's seed, +1, +2, ...
    #[serde(default = "three")]
    pub seeds: u64,
    /// The credit variant the claim is about (MAPPA: `process`).
    pub method: String,
    /// The credit variant it is compared with (`outcome`).
    pub baseline: String,
    /// A held-out accuracy for the secondary endpoint "training rollouts
    /// until the curve first reaches it" (none: not reported).
    #[serde(default)]
    pub threshold: Option<f64>,
    /// Further credit variants, in `mappa ablate --credit` syntax
    /// (`mixed=0.5`, `scope=per_prompt_group`, ...).
    #[serde(default)]
    pub credit: Vec<String>,
    /// The method arm again under other scripted coaches: a name of
    /// `coach_arms`, or a preset: `weak`, `medium`, `strong` or `biased`
    /// (strong, plus `coach_bias`).
    #[serde(default)]
    pub coaches: Vec<String>,
    /// The biased coach's score offset per task kind.
    #[serde(default)]
    pub coach_bias: BTreeMap<String, f64>,
    /// Named coach arms for `coaches`: each a table merged into the
    /// manifest's `[coach.scripted]` (e.g. `eps_0_2 = { slip_rate = 0.2 }`).
    #[serde(default)]
    pub coach_arms: BTreeMap<String, toml::Table>,
    /// Whether the study is confirmatory: its manifest and analysis were
    /// committed before it ran, and its report names that commit. A
    /// confirmatory study must have enough seeds for its test to reach
    /// alpha. Off: the report labels the study exploratory.
    #[serde(default)]
    pub confirmatory: bool,
    /// Whether each seed also makes its own warm start (seeds are blocks):
    /// seed `base + i` offsets `warm_start.sft.seed` (the teacher's slips
    /// and the order of its demonstrations) and every model's `init_seed`
    /// by `i`. Off: every seed starts RL from one shared warm start.
    #[serde(default)]
    pub vary_warm_start: bool,
    /// The `--quick` profile (a smoke test, not a result).
    #[serde(default)]
    pub quick: Option<StudyProfile>,
    /// The `--validation` profile: the study on other generated problems
    /// (its overrides must change `data`), for choosing values without
    /// looking at the held-out set.
    #[serde(default)]
    pub validation: Option<StudyProfile>,
    /// A factorial design: the method and the baseline in every cell of a
    /// grid of manifest variants, each seed a block that runs every cell,
    /// and registered contrasts of the cells' differences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub factorial: Option<Factorial>,
}

/// `[study.factorial]`: cells (manifest variants, one per combination of
/// the factors' levels), each running the study's method and baseline (and
/// any coach arms it names) at every seed, and contrasts registered before
/// the runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Factorial {
    /// The factors, in the order tables and plots use them.
    pub factors: Vec<Factor>,
    /// One cell per combination of levels.
    pub cells: Vec<Cell>,
    /// The registered contrasts.
    pub contrasts: Vec<Contrast>,
    /// The standard deviation of one cell's per-seed method-minus-baseline
    /// learning-curve area difference (accuracy units, from earlier
    /// studies) that the power statement assumes.
    pub prior_sd: f64,
    /// Warm starts tried per cell and seed (the first and its
    /// replacements) before the study stops.
    #[serde(default = "five")]
    pub max_warm_starts: u64,
}

fn five() -> u64 {
    5
}

/// A factor of a factorial study and its levels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Factor {
    /// Its name (`chain`).
    pub name: String,
    /// Its levels, in order (`["3", "5"]`).
    pub levels: Vec<String>,
}

/// One cell of a factorial study.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cell {
    /// Its name (`5-low`), used in contrasts, run names and tables.
    pub name: String,
    /// Its level of every factor.
    pub levels: BTreeMap<String, String>,
    /// Merged into the manifest for this cell, key by key (relative paths
    /// relative to the manifest's directory).
    #[serde(default)]
    pub manifest: toml::Table,
    /// The step-0 held-out accuracy a warm start must have to be used
    /// (inclusive); one outside it is replaced by the next and counted.
    pub start_band: [f64; 2],
    /// The method again under these `study.coach_arms`, in this cell only.
    #[serde(default)]
    pub coaches: Vec<String>,
}

/// A registered contrast: a per-seed weighted sum, tested one-sided (that
/// it is above 0) by sign flips over seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contrast {
    /// Its name (`gain_at_low_start`).
    pub name: String,
    /// What it tests, in words.
    pub hypothesis: String,
    /// Primary contrasts are tested together with Holm's correction;
    /// secondary ones are reported with unadjusted p-values.
    #[serde(default)]
    pub primary: bool,
    /// Weights: a cell's name weighs its method-minus-baseline difference;
    /// `cell/arm` weighs that arm's learning-curve area.
    pub weights: BTreeMap<String, f64>,
}

fn three() -> u64 {
    3
}

/// A variant of a study (`[study.quick]`, `[study.validation]`): other seeds
/// or arms, and manifest values overridden.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudyProfile {
    /// Seeds per arm.
    pub seeds: Option<u64>,
    /// Replaces `study.credit`.
    pub credit: Option<Vec<String>>,
    /// Replaces `study.coaches`.
    pub coaches: Option<Vec<String>>,
    /// Merged into the manifest, key by key (e.g. `rollout = { steps = 2 }`).
    #[serde(default)]
    pub manifest: toml::Table,
}

impl Manifest {
    /// This manifest with `overrides` merged in key by key (tables merge,
    /// other values replace), checked again.
    pub fn with_overrides(&self, overrides: &toml::Table) -> Result<Self, String> {
        fn merge(into: &mut Value, from: &Value) {
            match (into, from) {
                (Value::Object(a), Value::Object(b)) => {
                    for (k, v) in b {
                        match a.get_mut(k) {
                            Some(slot) => merge(slot, v),
                            None => {
                                a.insert(k.clone(), v.clone());
                            }
                        }
                    }
                }
                (slot, v) => *slot = v.clone(),
            }
        }
        let mut value = serde_json::to_value(self).map_err(|e| e.to_string())?;
        let overrides = serde_json::to_value(overrides).map_err(|e| e.to_string())?;
        merge(&mut value, &overrides);
        let mut out: Self = serde_json::from_value(value).map_err(|e| format!("overrides: {e}"))?;
        out.train.total_steps = out.rollout.steps.max(1);
        out.validate()?;
        Ok(out)
    }
}

impl Manifest {
    /// Read a manifest; relative paths become relative to its directory.
    /// Unknown keys are errors that name them.
    pub fn load(path: &Path) -> Result<Self, TrainError> {
        let text = std::fs::read_to_string(path).map_err(|e| path_err(path, e))?;
        let mut manifest: Self = toml::from_str(&text).map_err(|e| path_err(path, e))?;
        let base = path.parent().unwrap_or(Path::new("."));
        rebase(&mut manifest.workflow, base);
        manifest.data.family_mut().rebase(base);
        manifest.models.values_mut().for_each(|m| {
            rebase(&mut m.path, base);
            if let Some(config) = &mut m.plan_config {
                rebase(config, base);
            }
        });
        manifest.coach.rebase(base);
        manifest.train.total_steps = manifest.rollout.steps.max(1);
        manifest.validate().map_err(|e| path_err(path, e))?;
        Ok(manifest)
    }

    /// Check ranges and cross-references; errors name the key.
    pub fn validate(&self) -> Result<(), String> {
        let r = &self.rollout;
        for (value, key) in [
            (r.steps, "rollout.steps"),
            (r.prompts_per_step, "rollout.prompts_per_step"),
            (r.samples_per_prompt, "rollout.samples_per_prompt"),
            (r.max_new_tokens, "rollout.max_new_tokens"),
            (r.checkpoint_every, "rollout.checkpoint_every"),
            (r.max_batch.unwrap_or(1), "rollout.max_batch"),
            (self.eval.samples, "eval.samples"),
        ] {
            if value == 0 {
                return Err(format!("{key}: expected at least 1"));
            }
        }
        if !(r.temperature.is_finite() && r.temperature > 0.0 && r.top_p > 0.0 && r.top_p <= 1.0) {
            return Err(
                "rollout.temperature > 0 (finite) and rollout.top_p in (0, 1] expected".into(),
            );
        }
        let t = self.eval.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return Err(format!(
                "eval.temperature = {t}: expected a finite number >= 0 (0: greedy)"
            ));
        }
        self.train.validate().map_err(|e| format!("train.{e}"))?;
        if let crate::config::Recompute::Roles(roles) = &self.train.recompute_layers {
            if let Some(role) = roles.iter().find(|r| !self.models.contains_key(*r)) {
                return Err(format!(
                    "train.recompute_layers: no agent {role:?} (the roles are {})",
                    self.models.keys().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
        }
        self.credit.validate().map_err(|e| format!("credit: {e}"))?;
        if let Some(engine) = &r.engine {
            self.validate_engine(engine)?;
        }
        if let Some(devices) = &self.devices {
            devices.validate(&self.models, r.engine.is_some())?;
        }
        if let Some(claim) = &self.claim {
            claim.validate()?;
            if self.study.is_some() {
                return Err(
                    "claim: a study ([study]) compares arms over seeds; [claim] is a single \
                     run's test: keep one"
                        .into(),
                );
            }
        }
        Ok(())
    }

    /// Whether the coach is an OpenAI-compatible endpoint at the rollout
    /// engine's URL ([`crate::engine::COACH_SHARES_ENGINE`]).
    pub fn coach_shares_engine(&self) -> bool {
        let normal = |url: &str| url.trim_end_matches('/').replace("localhost", "127.0.0.1");
        match (&self.rollout.engine, &self.coach.judge) {
            (Some(engine), mappa_judge::config::Judge::OpenAi(coach)) => {
                normal(&engine.url) == normal(&coach.base_url)
            }
            _ => false,
        }
    }

    /// Whether the log-probs the rollout policy reports are those of the
    /// policy its tokens were sampled from, so that they compare with the
    /// trainer's (the rollout-trainer mismatch, a rollout correction); if
    /// not, why. mappa's own sampler reports them at the rollout's
    /// temperature (before top-p); an engine as its `logprobs_mode` says.
    pub fn rollout_logprobs_compare(&self) -> Result<(), String> {
        match &self.rollout.engine {
            None => Ok(()),
            Some(engine) => engine
                .logprobs_mode
                .samples_policy(self.rollout.temperature, self.rollout.top_p),
        }
    }

    /// An engine serves one base model with an adapter per agent: the run
    /// must train LoRA adapters on one checkpoint shared by every role.
    fn validate_engine(&self, engine: &EngineSpec) -> Result<(), String> {
        engine.validate()?;
        if self.train.rollout_correction.is_some() {
            self.rollout_logprobs_compare()
                .map_err(|e| format!("train.rollout_correction: {e}"))?;
        }
        if self.train.lora.is_none() {
            return Err(
                "rollout.engine: needs [train.lora]: the engine serves one base model \
                        and hot-loads each agent's adapter after every update"
                    .into(),
            );
        }
        match self.rollout.request_seeds {
            Some(RequestSeeds::Stream) => {
                return Err(
                    "rollout.request_seeds = \"stream\": an engine takes a seed per \
                            request; use \"engine\" (the default with an engine)"
                        .into(),
                )
            }
            Some(RequestSeeds::U64) => {
                return Err(
                    "rollout.request_seeds = \"u64\": half of its seeds are above \
                            2^63 - 1, which vLLM and SGLang refuse; use \"engine\" (the \
                            default with an engine)"
                        .into(),
                )
            }
            Some(RequestSeeds::Engine) | None => {}
        }
        let r = &self.rollout;
        for (table, temperature) in [("rollout", r.temperature), ("eval", self.eval.temperature)] {
            let sampling = crate::engine::EngineSampling {
                max_tokens: r.max_new_tokens,
                temperature,
                top_p: r.top_p,
            };
            engine.check_sampling(&sampling).map_err(|e| {
                format!(
                    "{table}.temperature = {temperature} (rollout.top_p = {}, \
                     rollout.max_new_tokens = {}) with [rollout.engine] kind = \"{}\": the \
                     engine refuses it: {e}",
                    r.top_p, r.max_new_tokens, engine.kind
                )
            })?;
        }
        if self.warm_start.is_some() {
            return Err(
                "rollout.engine: a warm start gives each role its own base model; \
                        the engine serves one"
                    .into(),
            );
        }
        let first = self.models.iter().next();
        for (role, spec) in &self.models {
            if spec.init_seed.is_some() {
                return Err(format!(
                    "models.{role}.init_seed: the engine loads its base model from disk; \
                     random weights cannot be served"
                ));
            }
            if let Some((first_role, first)) = first.filter(|(_, f)| f.path != spec.path) {
                return Err(format!(
                    "models.{role}.path: with rollout.engine every role shares the served \
                     base model, {} (models.{first_role}.path), got {}",
                    first.path.display(),
                    spec.path.display()
                ));
            }
        }
        Ok(())
    }

    /// The run's memory plan ([`crate::memory`]), from each role's
    /// `config.json` (or `plan_config` when the checkpoint is absent).
    /// `agents` are the workflow's roles in order with their most actions
    /// per trajectory; `eval_tasks` is the number of held-out tasks.
    pub fn memory_plan(
        &self,
        agents: &[(String, usize)],
        eval_tasks: usize,
    ) -> Result<crate::memory::DevicePlans, TrainError> {
        use crate::memory::{AgentShape, DevicePlans, GIB};
        let r = &self.rollout;
        let trajectories = r.prompts_per_step * r.samples_per_prompt;
        let mut shapes = Vec::new();
        for (index, (role, max_actions)) in agents.iter().enumerate() {
            let spec = self
                .models
                .get(role)
                .ok_or_else(|| TrainError::Config(format!("models: no model for role {role:?}")))?;
            let in_checkpoint = spec.path.join("config.json");
            let config_path = match (&spec.plan_config, in_checkpoint.exists()) {
                (Some(plan), false) => plan.clone(),
                _ => in_checkpoint,
            };
            let model = mappa_model::TransformerConfig::from_hf_file(&config_path)
                .map_err(|e| TrainError::model_at(&config_path, e))?;
            // The runner shares a model between roles that load the same
            // checkpoint and seed; a warm start gives each role its own.
            let base = match (&self.warm_start, spec.init_seed) {
                (Some(_), _) => format!("{} (warm-started for {role})", dir_name(&spec.path)),
                (None, Some(seed)) => format!("{} (seed {seed})", dir_name(&spec.path)),
                (None, None) => dir_name(&spec.path),
            };
            shapes.push(AgentShape {
                role: role.clone(),
                model,
                base,
                prompt_tokens: r
                    .max_prompt_tokens
                    .unwrap_or(512 + index * r.max_new_tokens),
                actions_per_step: {
                    let all = trajectories * max_actions;
                    self.train
                        .logprob_batch_size
                        .map_or(all, |bound| all.min(bound))
                },
                recompute_layers: self.train.recompute_layers.applies_to(role),
                fused_attention: self.train.attention == mappa_model::AttentionKind::Fused,
                replica: false,
            });
        }
        let devices = self.devices.clone().unwrap_or(DevicesSpec {
            memory_gib: 0.0,
            count: 1,
            agents: BTreeMap::new(),
            engine_memory_gib: None,
            engine_device: 0,
        });
        let engine_reservation = devices
            .engine_memory_gib
            .map_or(0, |gib| (gib * GIB).min(u64::MAX as f64) as u64);
        let mut plans = Vec::new();
        for device in 0..devices.count {
            let here: Vec<AgentShape> = shapes
                .iter()
                .filter_map(|shape| {
                    let placed = devices.of(&shape.role);
                    placed.contains(&device).then(|| AgentShape {
                        replica: placed[0] != device,
                        ..shape.clone()
                    })
                })
                .collect();
            let engine_here = device == devices.engine_device && engine_reservation > 0;
            if here.is_empty() && !engine_here {
                continue;
            }
            let reserved = if engine_here { engine_reservation } else { 0 };
            plans.push((device, self.device_plan(here, eval_tasks, reserved)));
        }
        Ok(DevicePlans { devices: plans })
    }

    /// The plan of one device holding `agents` (and `engine_reservation`
    /// bytes of an inference engine).
    fn device_plan(
        &self,
        agents: Vec<crate::memory::AgentShape>,
        eval_tasks: usize,
        engine_reservation: u64,
    ) -> crate::memory::MemoryPlan {
        use crate::memory::{Kernels, PlanInputs, GIB};
        let r = &self.rollout;
        let trajectories = r.prompts_per_step * r.samples_per_prompt;
        crate::memory::plan(&PlanInputs {
            agents,
            lora: self.train.lora.clone(),
            bf16_base: self.train.base_dtype == crate::config::BaseDtype::Bf16,
            micro_batch: self.train.micro_batch_size,
            completion_tokens: r.max_new_tokens,
            rollout_batch: match r.engine {
                Some(_) => 0,
                None => {
                    let all = trajectories.max(eval_tasks * self.eval.samples);
                    r.max_batch.map_or(all, |bound| all.min(bound))
                }
            },
            engine_reservation,
            kernels: match self.backend {
                BackendKind::Cpu => Kernels::Cpu {
                    threads: crate::machine::threads(),
                },
                BackendKind::Wgpu | BackendKind::Cuda => Kernels::Default,
            },
            capacity: self
                .devices
                .as_ref()
                .map(|d| (d.memory_gib * GIB).min(u64::MAX as f64) as u64),
        })
    }

    /// Check every file the run depends on and its hash, and collect the
    /// resolved hashes. Missing files and mismatches are errors naming them.
    pub fn resolve(&self) -> Result<Value, TrainError> {
        let workflow = check_file(&self.workflow, &None, "the workflow")?;
        let mut models = serde_json::Map::new();
        for (role, model) in &self.models {
            let hash = match model.init_seed {
                Some(_) => check_file(
                    &model.path.join("config.json"),
                    &model.sha256,
                    &format!("the model config of {role}"),
                )?,
                None => check_file(&model.path, &model.sha256, &format!("the model of {role}"))?,
            };
            models.insert(role.clone(), json!(hash));
        }
        let data = self.data.family().resolve()?;
        Ok(json!({ "workflow_sha256": workflow, "models_sha256": models, "data_sha256": data }))
    }
}

/// The last component of a model path (how plans name a model).
fn dir_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// A locked manifest without the keys that only feed the memory plan
/// (`devices`, except how many devices each data-parallel agent's update
/// spans; `rollout.max_prompt_tokens`, `models.*.plan_config`), reach
/// the engine (`rollout.engine.*` but its `kind`: each engine samples its
/// own way) or trade memory
/// for compute with the same bits (`train.recompute_layers`): they change
/// no result, so they change neither the run id nor whether a run
/// may be resumed.
pub fn results_relevant(manifest: &Value) -> Value {
    let mut manifest = manifest.clone();
    if let Some(m) = manifest.as_object_mut() {
        // Where agents live changes no bit; over how many devices an
        // update is summed does (the grouping of the gradient sum).
        let replicas: serde_json::Map<String, Value> = m
            .get("devices")
            .and_then(|d| d.get("agents"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .filter_map(|(role, devices)| {
                let n = devices.as_array().map_or(1, Vec::len);
                (n > 1).then(|| (role.clone(), json!(n)))
            })
            .collect();
        m.remove("devices");
        m.remove("claim");
        if !replicas.is_empty() {
            m.insert("devices".into(), json!({ "data_parallel": replicas }));
        }
        if let Some(rollout) = m.get_mut("rollout").and_then(Value::as_object_mut) {
            rollout.remove("max_prompt_tokens");
            // That an engine generates, and which, matters; where it
            // listens does not. (Engine runs before `kind` existed locked
            // `{}`: their seeds were drawn otherwise, so their ids differ.)
            if let Some(engine) = rollout.get_mut("engine") {
                let kind = engine.get("kind").cloned().unwrap_or(json!("vllm"));
                *engine = json!({ "kind": kind });
            }
        }
        if let Some(train) = m.get_mut("train").and_then(Value::as_object_mut) {
            train.remove("recompute_layers");
        }
        if let Some(models) = m.get_mut("models").and_then(Value::as_object_mut) {
            for model in models.values_mut() {
                if let Some(model) = model.as_object_mut() {
                    model.remove("plan_config");
                }
            }
        }
    }
    manifest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_width_of_data_parallel_updates_is_results_relevant() {
        let manifest = |devices: Value| results_relevant(&json!({"seed": 1, "devices": devices}));
        let plain = results_relevant(&json!({"seed": 1}));
        let placed = manifest(json!({"memory_gib": 80.0, "count": 2, "agents": {"solver": [1]}}));
        let wide = manifest(json!({"memory_gib": 80.0, "count": 2, "agents": {"solver": [0, 1]}}));
        let elsewhere =
            manifest(json!({"memory_gib": 40.0, "count": 4, "agents": {"solver": [2, 3]}}));
        assert_eq!(plain, placed);
        assert_ne!(plain, wide);
        assert_eq!(wide, elsewhere);
    }

    #[test]
    fn where_the_engine_listens_is_not_results_relevant_but_whether_there_is_one_is() {
        let lock = |engine: Value| json!({"manifest": {"seed": 1, "rollout": {"steps": 2, "engine": engine}}});
        let a = lock(json!({"kind": "vllm", "url": "http://127.0.0.1:8000/v1", "concurrency": 8}));
        let b = lock(json!({"kind": "vllm", "url": "http://10.0.0.2:9000/v1", "concurrency": 2}));
        let c =
            lock(json!({"kind": "sglang", "url": "http://127.0.0.1:8000/v1", "concurrency": 8}));
        assert_eq!(
            results_relevant(&a["manifest"]),
            results_relevant(&b["manifest"])
        );
        assert_ne!(
            results_relevant(&a["manifest"]),
            results_relevant(&c["manifest"])
        );
        let mut none = a.clone();
        none["manifest"]["rollout"]
            .as_object_mut()
            .unwrap()
            .remove("engine");
        assert_ne!(
            results_relevant(&a["manifest"]),
            results_relevant(&none["manifest"])
        );
    }

    #[test]
    fn device_placements_are_checked() {
        let models: BTreeMap<String, ModelSpec> =
            toml::from_str("solver = { path = \"m\" }\nverifier = { path = \"m\" }").unwrap();
        let check = |text: &str, engine: bool| {
            toml::from_str::<DevicesSpec>(&format!("memory_gib = 80\n{text}"))
                .unwrap()
                .validate(&models, engine)
        };
        check(
            "count = 2\nagents = { solver = [0, 1], verifier = [1] }",
            false,
        )
        .unwrap();
        let refused = |text: &str, engine: bool, expected: &str| {
            let err = check(text, engine).unwrap_err();
            assert!(err.contains(expected), "{text}: {err}");
        };
        refused("count = 0", false, "devices.count = 0");
        refused("agents = { planner = [0] }", false, "no agent \"planner\"");
        refused("agents = { solver = [] }", false, "at least one device");
        refused(
            "count = 2\nagents = { solver = [0, 2] }",
            false,
            "device 2 does not exist",
        );
        refused(
            "count = 2\nagents = { solver = [1, 1] }",
            false,
            "listed twice",
        );
        check(
            "count = 3\nagents = { solver = [1, 0], verifier = [0, 1, 2] }",
            false,
        )
        .unwrap();
        refused(
            "count = 3\nagents = { solver = [2, 0, 1] }",
            false,
            "ascending order",
        );
        refused("engine_device = 1", true, "devices.engine_device = 1");
        refused(
            "engine_memory_gib = 20",
            false,
            "there is no [rollout.engine]",
        );
    }

    #[test]
    fn a_bf16_base_needs_lora() {
        let mut train = TrainConfig {
            base_dtype: crate::config::BaseDtype::Bf16,
            ..Default::default()
        };
        let err = train.validate().unwrap_err();
        assert!(
            err.starts_with("base_dtype") && err.contains("[train.lora]"),
            "{err}"
        );
        train.lora = Some(mappa_model::LoraConfig::new(4, 8.0));
        train.validate().unwrap();
    }

    #[test]
    fn a_coach_at_the_engines_url_is_named_and_comparability_follows_the_logprobs_mode() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/manifests/tiny-arith-lora.toml");
        let text = std::fs::read_to_string(fixture).unwrap().replace(
            "[coach.scripted]\nview = \"oracle\"\nstrength = \"medium\"\nseed = 3\n",
            "",
        );
        let load = |coach_url: &str, engine_extra: &str, temperature: &str| {
            let text = text.replace("temperature = 1.0", &format!("temperature = {temperature}"));
            let m: Manifest = toml::from_str(&format!(
                "{text}\n[coach.openai]\nbase_url = \"{coach_url}\"\nmodel = \"smol\"\n\
                 [rollout.engine]\nurl = \"http://127.0.0.1:8000/v1\"\n{engine_extra}"
            ))
            .unwrap();
            m
        };
        assert!(load("http://localhost:8000/v1/", "", "1.0").coach_shares_engine());
        assert!(!load("http://127.0.0.1:8001/v1", "", "1.0").coach_shares_engine());
        assert!(load("http://127.0.0.1:8001/v1", "", "1.0")
            .rollout_logprobs_compare()
            .is_ok());
        let raw = load("http://127.0.0.1:8001/v1", "", "0.7");
        let why = raw.rollout_logprobs_compare().unwrap_err();
        assert!(why.contains("--logprobs-mode processed_logprobs"), "{why}");
        let processed = load(
            "http://127.0.0.1:8001/v1",
            "logprobs_mode = \"processed_logprobs\"",
            "0.7",
        );
        assert!(processed.rollout_logprobs_compare().is_ok());
    }

    #[test]
    fn a_claim_is_checked_and_left_out_of_the_run_id() {
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/manifests/tiny-arith.toml");
        let text = std::fs::read_to_string(fixture).unwrap();
        let load = |extra: &str| {
            let m: Manifest =
                toml::from_str(&format!("{text}\n{extra}")).map_err(|e| e.to_string())?;
            m.validate()?;
            Ok::<Manifest, String>(m)
        };
        let plain = load("").unwrap();
        let claimed = load("[claim]\nconfirmatory = true\nloss_rate = 0.05\n").unwrap();
        let claim = claimed.claim.as_ref().unwrap();
        assert_eq!((claim.alpha, claim.power), (0.05, 0.8));
        let id = |m: &Manifest| results_relevant(&serde_json::to_value(m).unwrap());
        assert_eq!(id(&plain), id(&claimed));
        let err = load("[claim]\nconfirmatory = true\nloss_rate = 1.5\n").unwrap_err();
        assert!(err.contains("claim.loss_rate = 1.5"), "{err}");
        let err = load("[claim]\nconfirmatory = true\nalpha = 0\nloss_rate = 0.1\n").unwrap_err();
        assert!(err.contains("claim.alpha = 0"), "{err}");
    }
}
