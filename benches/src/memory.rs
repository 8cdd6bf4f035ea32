//! Peak memory of training updates and inference phases against the
//! memory plan (`mappa_train::memory`), one configuration at a time (each
//! in a fresh process: `memory_bench --child`, `mappa doctor`'s children).
//!
//! A configuration is `KIND-N[-MODIFIER...]`: `full-N` or `lora-N` (an
//! update of N agents on one base), `logprob-N` and `generate-N`
//! (inference phases of N sequences); modifiers `-ckpt` (burn's
//! checkpointing: [`measure`]'s caller picks that backend), `-layers`
//! (`train.recompute_layers`), `-fused` (`train.attention = "fused"`),
//! `-bf16` (`train.base_dtype = "bf16"`), `-dp` (data-parallel over two
//! devices, or one twice).
//!
//! An update is measured after one warm-up update per agent (so that the
//! AdamW moments exist): the peak over [`MEASURED_ROUNDS`] more updates per
//! agent, less what the process held before any model was loaded; an
//! inference phase after one warm-up call, over as many more. Since
//! mappa's allocator keeps freed memory (`mappa_kernels::alloc`), the peak
//! resident size covers everything since the model was loaded. On the
//! CPU the peak is the kernel's peak resident size (`VmHWM`, reset through
//! `/proc/self/clear_refs`); on a CUDA device, the device memory in use
//! after the measured work (the driver's `cuMemGetInfo`), which holds
//! cubecl's memory pools at their largest, as they keep what they reserved.

use std::path::PathBuf;
use std::time::Instant;

use burn::tensor::backend::DeviceOps;
use mappa_core::RngStream;
use mappa_model::weights::load_transformer;
use mappa_model::{
    AttentionKind, AutodiffModelBackend, LoraConfig, ModelBackend, Transformer, TransformerConfig,
};
use mappa_train::config::BaseDtype;
use mappa_train::memory::{plan, reserve_for, AgentShape, Kernels, Phase, PlanInputs, GIB};
use mappa_train::{AgentLearner, LossConfig, TrainConfig, TrainSample};
use serde::{Deserialize, Serialize};

/// The configurations of `just bench-memory` and of `mappa doctor`'s
/// memory checks: what mappa's runs can be configured to do. (`-ckpt`, burn's
/// own checkpointing, which runs do not use, is measured only when named,
/// and the plan has no bound for it.)
pub const CONFIGS: &str = "full-1,lora-1,full-3,lora-3,full-1-layers,lora-1-layers,lora-1-fused,lora-1-layers-fused,lora-1-bf16,lora-3-bf16,lora-1-layers-bf16,lora-1-dp,logprob-16,logprob-16-fused,generate-16,generate-16-fused";

/// Updates per agent (or inference calls) measured after the warm-up one.
/// The CPU's peak resident size still creeps up for a few steps after the
/// first (the allocator's freed memory settling between its threads' heaps:
/// a LoRA update of SmolLM2 1.35, 1.38, 1.38, 1.41 GiB after steps 2 to 5,
/// then 1.41 through step 10), so the peak is taken over four.
pub const MEASURED_ROUNDS: usize = 4;

/// The shapes of a measured step.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Shape {
    /// Sequences per update (one micro-batch).
    pub batch: usize,
    /// Prompt tokens per sequence.
    pub prompt: usize,
    /// Completion tokens per sequence.
    pub completion: usize,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            batch: 4,
            prompt: 64,
            completion: 64,
        }
    }
}

/// Where the measured model's weights come from (the bytes depend only on
/// its config).
#[derive(Debug, Clone)]
pub enum Weights {
    /// A checkpoint directory (`just models`' SmolLM2-135M).
    Checkpoint(PathBuf),
    /// Random weights of this config.
    Random(TransformerConfig),
}

/// One configuration's measurement.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Measured {
    /// The configuration.
    pub config: String,
    /// Agents updated.
    pub agents: usize,
    /// Under LoRA.
    pub lora: bool,
    /// Under burn's checkpointing.
    pub checkpointing: bool,
    /// Seconds of one update (mean over agents), or of one inference call.
    pub step_seconds: f64,
    /// Completion tokens per second.
    pub tokens_per_second: f64,
    /// The measured peak, less the process's own bytes (none where the
    /// backend's memory cannot be read).
    pub measured_bytes: Option<u64>,
    /// The peak of the bytes allocated and not yet freed (the allocator's
    /// slack excluded), where the meter counts them.
    #[serde(default)]
    pub live_bytes: Option<u64>,
    /// The memory plan's peak for the same shapes.
    pub predicted_bytes: u64,
    /// The plan's tensors alone, before the allocator's reserve (to set
    /// beside the live bytes).
    #[serde(default)]
    pub planned_tensor_bytes: u64,
    /// The live bytes when the measured window began (what the phase
    /// starts from), where the meter counts them.
    #[serde(default)]
    pub live_start_bytes: Option<u64>,
    /// The plan's bytes of the measured phase alone (every worker's
    /// update, a log-prob pass or a rollout), tensors only.
    #[serde(default)]
    pub planned_phase_bytes: u64,
}

impl Measured {
    /// `plan / measured - 1`, when measured.
    pub fn plan_error(&self) -> Option<f64> {
        self.measured_bytes
            .map(|m| self.predicted_bytes as f64 / m as f64 - 1.0)
    }
}

/// Reads a backend's memory in use: once before anything is loaded, then
/// as the peak since the last reset.
pub trait Meter {
    /// Marks the start of the measured window.
    fn reset(&mut self);
    /// Bytes held at their peak since [`Meter::reset`], less the bytes
    /// held when the meter was made; none if this backend cannot tell.
    fn peak(&self) -> Option<u64>;
    /// The peak of allocated bytes not yet freed since [`Meter::reset`],
    /// less those when the meter was made, where the meter counts them.
    fn live_peak(&self) -> Option<u64> {
        None
    }
    /// The allocated bytes not yet freed now, less those when the meter
    /// was made, where the meter counts them.
    fn live_now(&self) -> Option<u64> {
        None
    }
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

/// The process's resident memory (the CPU backend's tensors).
pub struct ProcessMemory {
    own: u64,
}

impl ProcessMemory {
    /// A meter whose baseline is the resident size now.
    pub fn new() -> Self {
        Self {
            own: status_kib("VmRSS:") * 1024,
        }
    }
}

impl Default for ProcessMemory {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessMemory {
    /// [`Meter::peak`] for a shared meter.
    pub fn peak(&self) -> Option<u64> {
        Some((status_kib("VmHWM:") * 1024).saturating_sub(self.own))
    }
}

impl Meter for ProcessMemory {
    fn reset(&mut self) {
        std::fs::write("/proc/self/clear_refs", "5")
            .expect("resetting the peak RSS (/proc/self/clear_refs)");
    }
    fn peak(&self) -> Option<u64> {
        ProcessMemory::peak(self)
    }
}

/// No reading (wgpu: its memory is not the process's, and cubecl does not
/// report it here).
pub struct Unmeasured;

impl Meter for Unmeasured {
    fn reset(&mut self) {}
    fn peak(&self) -> Option<u64> {
        None
    }
}

/// The device memory in use on CUDA device 0 (the driver's count, every
/// allocation of this process's context included).
#[cfg(feature = "cuda")]
pub struct CudaMemory {
    base: u64,
}

#[cfg(feature = "cuda")]
impl CudaMemory {
    /// A meter whose baseline is the device memory in use now.
    pub fn new() -> Result<Self, String> {
        let base = mappa_model::device::cuda_memory_in_use(0).map_err(|e| e.to_string())?;
        Ok(Self { base })
    }
}

#[cfg(feature = "cuda")]
impl Meter for CudaMemory {
    fn reset(&mut self) {}
    fn peak(&self) -> Option<u64> {
        mappa_model::device::cuda_memory_in_use(0)
            .ok()
            .map(|used| used.saturating_sub(self.base))
    }
}

/// What a configuration's suffixes ask for.
#[derive(Debug, Clone, Copy, Default)]
pub struct Modifiers {
    /// `-ckpt`: burn's `BalancedCheckpointing`.
    pub checkpointing: bool,
    /// `-layers`: `train.recompute_layers`.
    pub recompute_layers: bool,
    /// `-fused`: `train.attention = "fused"`.
    pub fused_attention: bool,
    /// `-bf16`: `train.base_dtype = "bf16"` (LoRA only).
    pub bf16_base: bool,
    /// `-dp`: data-parallel over two devices (0 and 1, or 0 twice), one
    /// micro-batch of half the sequences each.
    pub data_parallel: bool,
}

/// A configuration parsed: its kind, its count and its modifiers.
pub fn parse(config: &str) -> Result<(&str, usize, Modifiers), String> {
    let mut parts = config.split('-');
    let kind = parts.next().unwrap_or_default();
    if !["full", "lora", "logprob", "generate"].contains(&kind) {
        return Err(format!(
            "{config}: unknown kind {kind:?} (full, lora, logprob, generate)"
        ));
    }
    let n: usize = parts
        .next()
        .and_then(|n| n.parse().ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{config}: expected KIND-N[-MODIFIER...] with N >= 1"))?;
    let mut m = Modifiers::default();
    for modifier in parts {
        match modifier {
            "ckpt" => m.checkpointing = true,
            "layers" => m.recompute_layers = true,
            "fused" => m.fused_attention = true,
            "bf16" => m.bf16_base = true,
            "dp" => m.data_parallel = true,
            other => {
                return Err(format!(
                    "{config}: unknown modifier {other:?} (ckpt, layers, fused, bf16, dp)"
                ))
            }
        }
    }
    Ok((kind, n, m))
}

fn lora() -> LoraConfig {
    LoraConfig::new(16, 32.0)
}

fn base_dtype(m: Modifiers) -> BaseDtype {
    if m.bf16_base {
        BaseDtype::Bf16
    } else {
        BaseDtype::F32
    }
}

fn attention(m: Modifiers) -> AttentionKind {
    if m.fused_attention {
        AttentionKind::Fused
    } else {
        AttentionKind::Dense
    }
}

/// Workers of an update: two with `-dp`, else one.
fn workers(m: Modifiers) -> usize {
    if m.data_parallel {
        2
    } else {
        1
    }
}

/// The model, frozen and stored in bf16 with `-bf16`.
fn load_base<B: ModelBackend>(
    weights: &Weights,
    m: Modifiers,
    device: &B::Device,
) -> Result<Transformer<B>, String> {
    let model = match weights {
        Weights::Checkpoint(dir) => load_transformer(dir, device)
            .map_err(|e| format!("{}: {e} (run `just models`)", dir.display()))?,
        Weights::Random(config) => config.init(0, device),
    };
    base_dtype(m)
        .store(model)
        .map_err(|e| format!("a frozen base in bf16: {e}"))
}

/// What the plan predicts for an update on backend `B`: the held bytes
/// (with a replica of the trained weights per further data-parallel
/// worker) and one update per worker (the workers share the one device),
/// or loading a bf16 base if that is larger, with the allocator's reserve.
fn predicted_update<B: ModelBackend>(
    model: &TransformerConfig,
    agents: usize,
    lora: bool,
    m: Modifiers,
    shape: Shape,
) -> Planned {
    // Each further worker holds a replica of the agent's trained weights.
    let shapes = (0..agents).flat_map(|i| {
        (0..workers(m)).map(move |worker| AgentShape {
            role: format!("agent{i}"),
            model: model.clone(),
            base: "base".into(),
            prompt_tokens: shape.prompt,
            actions_per_step: shape.batch,
            recompute_layers: m.recompute_layers,
            fused_attention: m.fused_attention,
            replica: worker > 0,
        })
    });
    let inputs = PlanInputs {
        agents: shapes.collect(),
        lora: lora.then(self::lora),
        bf16_base: m.bf16_base,
        micro_batch: shape.batch / workers(m),
        completion_tokens: shape.completion,
        rollout_batch: shape.batch,
        capacity: None,
        engine_reservation: 0,
        kernels: Kernels::of::<B>(),
    };
    let all = plan(&inputs);
    // Replicas are copied from the policy at each update and dropped after
    // it: part of the measured phase.
    let mains = PlanInputs {
        agents: inputs
            .agents
            .iter()
            .filter(|a| !a.replica)
            .cloned()
            .collect(),
        ..inputs.clone()
    };
    let replicas = all.phase(Phase::Held) - plan(&mains).phase(Phase::Held);
    let update = workers(m) as u64 * all.phase(Phase::Update);
    let tensors = all.phase(Phase::Held) + update.max(all.phase(Phase::Load));
    Planned {
        tensors,
        total: tensors + reserve_for(tensors, Kernels::of::<B>()),
        update: update + replicas,
    }
}

/// The plan's numbers for a measured update.
struct Planned {
    /// Its tensors.
    tensors: u64,
    /// With the allocator's reserve.
    total: u64,
    /// Every worker's update, with the replicas it copies.
    update: u64,
}

/// Measures one configuration on backend `B` (its `-ckpt` is the caller's
/// choice of `B`).
pub fn measure<B: AutodiffModelBackend>(
    config: &str,
    shape: Shape,
    weights: &Weights,
    meter: &mut dyn Meter,
) -> Result<Measured, String> {
    let (kind, n, m) = parse(config)?;
    match kind {
        "logprob" | "generate" => {
            inference::<B::InnerBackend>(config, n, kind == "generate", m, shape, weights, meter)
        }
        _ => update::<B>(config, kind == "lora", n, m, shape, weights, meter),
    }
}

/// Random (prompt, completion) pairs below `vocab`.
fn pairs(vocab: usize, n: usize, shape: Shape, seed: u64) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut rng = RngStream::from_u64(seed);
    let mut ids =
        |len: usize| -> Vec<u32> { (0..len).map(|_| rng.below(vocab as u64) as u32).collect() };
    (0..n)
        .map(|_| (ids(shape.prompt), ids(shape.completion)))
        .collect()
}

/// One inference phase of `n` sequences: a log-prob pass, or generation.
fn inference<B: ModelBackend>(
    config: &str,
    n: usize,
    generating: bool,
    m: Modifiers,
    shape: Shape,
    weights: &Weights,
    meter: &mut dyn Meter,
) -> Result<Measured, String> {
    use mappa_model::{completion_logprobs, generate_greedy, GenerationConfig};
    let device = Default::default();
    let model: Transformer<B> = load_base(weights, m, &device)?.with_attention(attention(m));
    let x = model.config().clone();
    let pairs = pairs(x.vocab_size, n, shape, 7);
    let prompts: Vec<Vec<u32>> = pairs.iter().map(|(p, _)| p.clone()).collect();
    let mut generation = GenerationConfig::greedy(shape.completion);
    // Random prompts: run to the full length, whatever is sampled.
    generation.eos_token_ids = Vec::new();
    let run = || -> Result<(), String> {
        if generating {
            generate_greedy(&model, None, &prompts, &generation).map_err(|e| e.to_string())?;
        } else {
            completion_logprobs(&model, &pairs, 1.0).map_err(|e| e.to_string())?;
        }
        B::sync(&device).map_err(|e| format!("waiting for the device: {e:?}"))
    };
    run()?;
    meter.reset();
    let live_start = meter.live_now();
    let start = Instant::now();
    for _ in 0..MEASURED_ROUNDS {
        run()?;
    }
    let seconds = start.elapsed().as_secs_f64() / MEASURED_ROUNDS as f64;
    let (p, c, fused) = (shape.prompt, shape.completion, m.fused_attention);
    let kernels = Kernels::of::<B>();
    let phase = match generating {
        true => mappa_train::memory::rollout_bytes(&x, n, p, c, fused, kernels),
        false => mappa_train::memory::logprob_pass_bytes(&x, n, p, c, fused, kernels),
    };
    let f32_weights = 4 * x.num_params() as u64;
    let tensors = if m.bf16_base {
        // Loaded in f32, then narrowed.
        let (held, widened) = mappa_train::memory::bf16_base_inference_bytes(&x);
        (held + widened + phase).max(f32_weights)
    } else {
        f32_weights + phase
    };
    Ok(Measured {
        config: config.to_string(),
        agents: 1,
        lora: false,
        checkpointing: false,
        step_seconds: seconds,
        tokens_per_second: (n * shape.completion) as f64 / seconds,
        measured_bytes: meter.peak(),
        live_bytes: meter.live_peak(),
        predicted_bytes: tensors + reserve_for(tensors, kernels),
        planned_tensor_bytes: tensors,
        live_start_bytes: live_start,
        planned_phase_bytes: phase,
    })
}

/// Samples with alternating advantages, old and reference log-probs the
/// learner's own.
fn samples<B: AutodiffModelBackend>(
    learner: &AgentLearner<B>,
    shape: Shape,
    seed: u64,
) -> Result<Vec<TrainSample>, String> {
    let vocab = learner.policy().config().vocab_size;
    let pairs = pairs(vocab, shape.batch, shape, seed);
    let advantage = |i: usize| if i.is_multiple_of(2) { 1.0 } else { -1.0 };
    samples_of(learner, pairs, advantage).map_err(|e| e.to_string())
}

/// Training samples of `pairs` whose every token has advantage (and
/// reward) `advantage(i)` for pair `i`, with the learner's own old and
/// reference log-probs, as a run computes them.
pub fn samples_of<B: AutodiffModelBackend>(
    learner: &AgentLearner<B>,
    pairs: Vec<(Vec<u32>, Vec<u32>)>,
    advantage: impl Fn(usize) -> f32,
) -> Result<Vec<TrainSample>, mappa_train::TrainError> {
    let refs: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let old = learner.policy_logprobs(&refs)?;
    let reference = learner.reference_logprobs(&refs)?;
    Ok(pairs
        .into_iter()
        .zip(old.into_iter().zip(reference))
        .enumerate()
        .map(
            |(i, ((prompt, completion), (old_logprobs, ref_logprobs)))| {
                let a = advantage(i);
                TrainSample {
                    mask: vec![true; completion.len()],
                    advantages: vec![a; completion.len()],
                    prompt,
                    completion,
                    old_logprobs,
                    ref_logprobs,
                    is_weights: Vec::new(),
                    reward: a as f64,
                }
            },
        )
        .collect())
}

/// `agents` learners on one base on the default device.
fn learners<B: AutodiffModelBackend>(
    base: &Transformer<B>,
    lora: bool,
    agents: usize,
    m: Modifiers,
    shape: Shape,
) -> Result<Vec<AgentLearner<B>>, String> {
    let device = base.device();
    let second = match B::device_count(device.id().type_id) {
        0 | 1 => device.clone(),
        _ => mappa_train::data_parallel::devices_of_box::<B>(&device, 2)
            .map_err(|e| e.to_string())?
            .remove(1),
    };
    let train = TrainConfig {
        lr: 1e-5,
        micro_batch_size: shape.batch / workers(m),
        lora: lora.then(self::lora),
        recompute_layers: mappa_train::config::Recompute::All(m.recompute_layers),
        attention: attention(m),
        base_dtype: base_dtype(m),
        ..Default::default()
    };
    (0..agents)
        .map(|i| {
            // Every agent starts from the one loaded base (shared storage).
            let mut policy = base.clone();
            if lora {
                policy = policy
                    .with_lora(&self::lora(), &mut RngStream::from_u64(i as u64))
                    .map_err(|e| e.to_string())?;
            }
            let learner = AgentLearner::new(format!("agent{i}"), policy, train.clone())
                .map_err(|e| e.to_string())?;
            match m.data_parallel {
                true => learner
                    .with_data_parallel(vec![device.clone(), second.clone()])
                    .map_err(|e| e.to_string()),
                false => Ok(learner),
            }
        })
        .collect()
}

/// An update of `agents` learners, after a warm-up one.
fn update<B: AutodiffModelBackend>(
    config: &str,
    lora: bool,
    agents: usize,
    m: Modifiers,
    shape: Shape,
    weights: &Weights,
    meter: &mut dyn Meter,
) -> Result<Measured, String> {
    let device = Default::default();
    let base: Transformer<B> = load_base(weights, m, &device)?;
    let model = base.config().clone();
    let mut learners = learners(&base, lora, agents, m, shape)?;
    drop(base);
    let loss = LossConfig {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: None,
        kl_in_loss: None,
    };
    let batches = learners
        .iter()
        .enumerate()
        .map(|(i, l)| samples(l, shape, i as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let round = |learners: &mut [AgentLearner<B>]| -> Result<(), String> {
        for (learner, batch) in learners.iter_mut().zip(&batches) {
            learner
                .train_step(batch, &loss)
                .map_err(|e| e.to_string())?;
        }
        B::sync(&device).map_err(|e| format!("waiting for the device: {e:?}"))
    };
    round(&mut learners)?;
    meter.reset();
    let live_start = meter.live_now();
    let start = Instant::now();
    for _ in 0..MEASURED_ROUNDS {
        round(&mut learners)?;
    }
    let seconds = start.elapsed().as_secs_f64() / (MEASURED_ROUNDS * agents) as f64;
    let planned = predicted_update::<B>(&model, agents, lora, m, shape);
    Ok(Measured {
        config: config.to_string(),
        agents,
        lora,
        checkpointing: m.checkpointing,
        step_seconds: seconds,
        tokens_per_second: (shape.batch * shape.completion) as f64 / seconds,
        measured_bytes: meter.peak(),
        live_bytes: meter.live_peak(),
        predicted_bytes: planned.total,
        planned_tensor_bytes: planned.tensors,
        live_start_bytes: live_start,
        planned_phase_bytes: planned.update,
    })
}

/// The results as a markdown table, with each plan's error.
pub fn table(results: &[Measured]) -> String {
    let mut out = String::from(
        "| config | step s | tok/s | live peak GiB | plan's tensors GiB | peak measured GiB | plan GiB | plan error |\n|---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        let measured = r
            .measured_bytes
            .map_or("-".into(), |b| format!("{:.3}", b as f64 / GIB));
        let live = r
            .live_bytes
            .map_or("-".into(), |b| format!("{:.3}", b as f64 / GIB));
        let error = match (r.checkpointing, r.plan_error()) {
            (true, _) => "not planned (burn's checkpointing)".into(),
            (false, e) => e.map_or("-".into(), |e| format!("{:+.1}%", 100.0 * e)),
        };
        out.push_str(&format!(
            "| {} | {:.2} | {:.0} | {live} | {:.3} | {measured} | {:.3} | {error} |\n",
            r.config,
            r.step_seconds,
            r.tokens_per_second,
            r.planned_tensor_bytes as f64 / GIB,
            r.predicted_bytes as f64 / GIB,
        ));
    }
    out
}

/// The plan's bound: it must not be under the measured peak, nor more than
/// [`PLAN_SLACK`] over it (none where unmeasured, or under burn's
/// checkpointing, which the plan does not model).
pub fn within_bound(r: &Measured) -> Option<bool> {
    if r.checkpointing {
        return None;
    }
    r.plan_error().map(|e| (0.0..=PLAN_SLACK).contains(&e))
}

/// How far over the measured peak a plan may be (20%).
pub const PLAN_SLACK: f64 = 0.20;
