//! The memory plan of a run: the bytes of base weights, adapters,
//! gradients, optimiser state, saved activations at the longest sequence
//! and micro-batch, the log-prob passes and the rollout KV cache, against
//! the device memory the manifest declares (`[devices] memory_gib`).
//! `mappa reproduce NAME --dry-run` and `mappa run` print it, and a plan
//! that does not fit is refused before anything is written, naming its
//! largest item and what would make it fit.
//!
//! One plan per device (`[devices] count`, `agents`): an agent's main
//! device holds what is listed below; each further device of a
//! data-parallel agent holds a replica (its weights, and under LoRA the
//! base they need, plus an update's gradients and one micro-batch's
//! activations; no optimiser state, log-prob pass or generation, which stay
//! on the main device). Agents run one after another.
//!
//! # The model of memory (f32 everywhere, as the trainer computes)
//!
//! With `S = P + C` (prompt plus completion columns), `h` hidden, `H` query
//! and `Hkv` key/value heads of `d`, `I` the MLP width, `V` the vocabulary
//! and `L` layers:
//!
//! - **Held** for the whole run: every distinct starting model once (roles
//!   that load the same checkpoint and seed share it: under LoRA they
//!   compute with it, under full fine-tuning it is their KL reference; a
//!   warm start gives each role its own), each agent's own weights when
//!   fully fine-tuned or its adapters under LoRA, and AdamW's two moments
//!   of every trained parameter.
//! - **Update** (one agent at a time, so the largest counts): one gradient
//!   per trained parameter and the activations the autodiff graph saves for
//!   one micro-batch of `m` sequences, all counted as live together (an
//!   upper bound: the backward pass frees activations as it makes
//!   gradients). Counted from the forward pass (`mappa_model::transformer`),
//!   per layer and token: the residual input, the two norms' outputs and
//!   the residual sum (4 `h`); the query and key through projection,
//!   QK-norm, rotary embedding and scaling, the values and the merged heads
//!   (5 `H d` + 5 `Hkv d`); gate, up and their SwiGLU product (3 `I`); per
//!   layer and sequence the attention probabilities (`H S^2`). Once per
//!   micro-batch: the rotary tables (2 (`H` + `Hkv`) `d` per token), the
//!   additive attention bias (`H S^2` per sequence), the embeddings and
//!   final norm (3 `h` per token) and the completion columns' logits and
//!   log-softmax (2 `C V` per sequence); while one layer runs, its scores
//!   (`H S^2` per sequence: the bias is added in place, since the product
//!   that makes the scores is not shared). With `train.recompute_layers`
//!   one layer's activations replace the `L` layers', plus `L + 3` hidden
//!   states per token (each layer's input, the last output, and the
//!   gradient arriving at a layer and leaving it). With `train.attention =
//!   "fused"` no `H S^2` term is held anywhere (the bias, scores and
//!   probabilities are replaced by each row's log-sum-exp, `H S` per
//!   sequence and layer), in updates, log-prob passes and generation; one
//!   block of scores is counted instead, as burn's default kernels (the GPU
//!   backends) hold it: 4 `Hkv B S` per sequence for blocks of `B` stacked
//!   query rows (`kernels::ATTENTION_BLOCK_ROWS`) in an update, 2 without
//!   a gradient. The dense attention bias is counted wherever it appears
//!   below as the GPU backends hold it. The CPU backend applies the mask
//!   in the softmax (`ModelBackend::MASKS_IN_SOFTMAX`) and holds no bias,
//!   and computes dense attention as one operation
//!   (`kernels::dense_attention`) that holds one key/value head's scores
//!   per thread, not a layer's, and keeps the probabilities only for a
//!   backward pass: so on the CPU the plan over-counts by `2 H S^2` per
//!   sequence in an update (the bias and a layer's scores) and by all
//!   three `H S^2` (`H P^2`) terms in log-prob passes and rollouts.
//! - **Log-prob passes** (no gradient): the rollout policy's and the
//!   reference's log-probs of all of an agent's actions of a step, in one
//!   batch of `N` sequences: the bias plus one layer's scores (biased in
//!   place) and probabilities (3 `H S^2` per sequence), the hidden
//!   state and one layer's MLP (`h` + 3 `I` per token), and the logits and
//!   log-softmax of the completion columns (2 `C V` per sequence).
//! - **Rollout**: the KV cache of every sequence an agent generates
//!   together (2 `L Hkv d` per token, for the larger of a training step's
//!   and an evaluation's batch), with the prompt pass's bias, scores and
//!   probabilities (3 `H P^2` per sequence), its hidden state and one
//!   layer's MLP (`h` + 3 `I` per token), and one step's logits.
//!
//! The peak is the held bytes plus the largest phase. The estimate leaves
//! out the allocator's slack and the program itself.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use mappa_model::{LoraConfig, TransformerConfig};

/// Bytes of one f32.
const F32: f64 = 4.0;
/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// One agent, as the plan sees it.
#[derive(Debug, Clone)]
pub struct AgentShape {
    /// The agent's role.
    pub role: String,
    /// Its starting model's architecture.
    pub model: TransformerConfig,
    /// Which starting model it is: agents with equal keys share one copy.
    pub base: String,
    /// The longest prompt it sees, in tokens.
    pub prompt_tokens: usize,
    /// Sequences in one log-prob pass: its actions of a training step, or
    /// fewer when `train.logprob_batch_size` bounds the pass.
    pub actions_per_step: usize,
    /// Its update recomputes activations layer by layer
    /// (`train.recompute_layers`).
    pub recompute_layers: bool,
    /// Its model computes attention as one fused operation
    /// (`train.attention = "fused"`): no score matrix is held.
    pub fused_attention: bool,
    /// This device holds only a data-parallel replica of the agent (see
    /// the module docs).
    pub replica: bool,
}

/// What the plan needs besides the agents.
#[derive(Debug, Clone)]
pub struct PlanInputs {
    /// The agents.
    pub agents: Vec<AgentShape>,
    /// LoRA settings (none: full fine-tuning).
    pub lora: Option<LoraConfig>,
    /// The frozen base's linear weights are stored in bf16
    /// (`train.base_dtype = "bf16"`, LoRA only).
    pub bf16_base: bool,
    /// Sequences per forward/backward pass.
    pub micro_batch: usize,
    /// Most new tokens per action.
    pub completion_tokens: usize,
    /// Sequences an agent generates together: the larger of a training
    /// step's and an evaluation's, or fewer when `rollout.max_batch` bounds
    /// them; 0 when an inference engine generates (not on this device).
    pub rollout_batch: usize,
    /// The device's memory in bytes (none: not declared, not checked).
    pub capacity: Option<u64>,
    /// Bytes an inference engine on the same device takes
    /// (`[devices] engine_memory_gib`; 0: none there).
    pub engine_reservation: u64,
}

/// One line of the plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// What the bytes are for.
    pub what: String,
    /// How many (saturating: an absurd manifest gives `u64::MAX`, never a wrapped small number).
    pub bytes: u64,
    /// When they are held.
    pub phase: Phase,
}

/// When memory is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// For the whole run.
    Held,
    /// While one agent's update runs.
    Update,
    /// While the log-probs of one agent's actions are computed.
    Logprobs,
    /// While an agent generates.
    Rollout,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Held => "held",
            Phase::Update => "update",
            Phase::Logprobs => "logprob",
            Phase::Rollout => "rollout",
        }
    }
}

/// The plan of the run's device.
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    /// Its items.
    pub items: Vec<Item>,
    /// The declared memory, if any.
    pub capacity: Option<u64>,
    /// What the plan assumed (printed with it).
    pub assumptions: Vec<String>,
    lora: bool,
    micro_batch: usize,
}

/// Bytes of `floats` f32 values. The sizes are computed in f64 (exact
/// below 2^53, far beyond any real device) and saturate at `u64::MAX`, so
/// that an absurd manifest can never wrap around to a plan that fits.
fn bytes(floats: f64) -> u64 {
    let b = floats * F32;
    if b >= u64::MAX as f64 {
        u64::MAX
    } else {
        b as u64
    }
}

/// Parameters of `lora`'s adapters on a model of `model`'s shape.
pub fn lora_params(model: &TransformerConfig, lora: &LoraConfig) -> f64 {
    let n = |x: usize| x as f64;
    let (h, q, kv, i) = (
        n(model.hidden_size),
        n(model.num_heads) * n(model.head_dim),
        n(model.num_kv_heads) * n(model.head_dim),
        n(model.intermediate_size),
    );
    let per_layer: f64 = lora
        .targets
        .iter()
        .map(|t| match t.as_str() {
            "q_proj" | "o_proj" => h + q,
            "k_proj" | "v_proj" => h + kv,
            _ => h + i,
        })
        .sum();
    per_layer * n(lora.rank) * n(model.num_layers)
}

/// The shape numbers the formulas use, as f64 (no overflow from any manifest).
struct Dims {
    h: f64,
    heads: f64,
    kv_heads: f64,
    d: f64,
    i: f64,
    layers: f64,
    vocab: f64,
}

impl Dims {
    fn of(model: &TransformerConfig) -> Self {
        let n = |x: usize| x as f64;
        Self {
            h: n(model.hidden_size),
            heads: n(model.num_heads),
            kv_heads: n(model.num_kv_heads),
            d: n(model.head_dim),
            i: n(model.intermediate_size),
            layers: n(model.num_layers),
            vocab: n(model.vocab_size),
        }
    }
}

/// The linear weights of a bf16 base, in parameters: all of them (stored
/// at 2 bytes), one layer's plus the output head (widened together by a
/// recomputed layer's graph), and the largest single one (widened alone
/// without a graph; an MLP matrix is a third of a layer's).
struct Bf16Linear {
    all: f64,
    layer_and_head: f64,
    largest: f64,
}

impl Bf16Linear {
    fn of(model: &TransformerConfig) -> Self {
        let x = Dims::of(model);
        let (q, kv) = (x.heads * x.d, x.kv_heads * x.d);
        let per_layer = x.h * (q + 2.0 * kv) + q * x.h + 3.0 * x.h * x.i;
        let head = if model.tie_word_embeddings {
            0.0
        } else {
            x.vocab * x.h
        };
        Self {
            all: per_layer * x.layers + head,
            layer_and_head: per_layer + head,
            largest: head.max(per_layer / 3.0),
        }
    }
}

/// A bf16 base without a graph (inference): its bytes held, and the
/// largest weight widened to f32 while it is used.
pub fn bf16_base_inference_bytes(model: &TransformerConfig) -> (u64, u64) {
    let linear = Bf16Linear::of(model);
    (
        bytes(model.num_params() as f64 - linear.all / 2.0),
        bytes(linear.largest),
    )
}

/// The scores one block of fused attention holds: burn's default kernels
/// (the GPU backends) compute [`ATTENTION_BLOCK_ROWS`] stacked query rows of
/// a key/value head against every key at a time, with four tensors of that
/// size live in a backward pass (scores, probabilities, their gradients)
/// and two without (halve it). The CPU kernel holds one row per thread,
/// which this over-counts.
///
/// [`ATTENTION_BLOCK_ROWS`]: mappa_model::kernels::ATTENTION_BLOCK_ROWS
fn fused_block(x: &Dims, sequences: f64, s: f64) -> f64 {
    let rows = (mappa_model::kernels::ATTENTION_BLOCK_ROWS as f64).min(x.heads / x.kv_heads * s);
    4.0 * sequences * x.kv_heads * rows * s
}

/// Bytes the autodiff graph holds for one micro-batch of `m` sequences of
/// `prompt + completion` columns, with every layer's activations saved or,
/// with `recompute_layers`, one layer's (see the module docs for what is
/// counted).
pub fn activation_bytes(
    model: &TransformerConfig,
    m: usize,
    prompt: usize,
    completion: usize,
    recompute_layers: bool,
    fused_attention: bool,
) -> u64 {
    let x = Dims::of(model);
    let (m, c) = (m as f64, completion as f64);
    let s = prompt as f64 + c;
    let tokens = m * s;
    // Fused: each row's log-sum-exp instead of its probabilities, and no
    // bias or scores.
    let attention = if fused_attention {
        0.0
    } else {
        m * x.heads * s * s
    };
    let lse = if fused_attention {
        m * x.heads * s
    } else {
        0.0
    };
    let block = if fused_attention {
        fused_block(&x, m, s)
    } else {
        0.0
    };
    let per_layer = tokens * (4.0 * x.h + 5.0 * x.heads * x.d + 5.0 * x.kv_heads * x.d + 3.0 * x.i)
        + attention
        + lse;
    let once = tokens * (2.0 * (x.heads + x.kv_heads) * x.d + 3.0 * x.h)
        + attention
        + 2.0 * m * c * x.vocab;
    let saved = if recompute_layers {
        // Each layer's input and the last output, the gradient arriving at
        // a layer and the one it passes on; one layer's graph at a time.
        (x.layers + 3.0) * tokens * x.h + per_layer
    } else {
        x.layers * per_layer
    };
    bytes(saved + once + attention + block)
}

/// Bytes live while the log-probs of `n` sequences are computed without a
/// gradient (see the module docs).
pub fn logprob_pass_bytes(
    model: &TransformerConfig,
    n: usize,
    prompt: usize,
    completion: usize,
    fused_attention: bool,
) -> u64 {
    let x = Dims::of(model);
    let (n, c) = (n as f64, completion as f64);
    let s = prompt as f64 + c;
    let attention = if fused_attention {
        fused_block(&x, n, s) / 2.0
    } else {
        n * x.heads * s * s
    };
    bytes(3.0 * attention + n * s * (x.h + 3.0 * x.i) + 2.0 * n * c * x.vocab)
}

/// Bytes live while `batch` sequences are generated: their KV cache for
/// `prompt + completion` columns, the prompt pass's attention tensors,
/// hidden state and MLP, and one step's logits.
pub fn rollout_bytes(
    model: &TransformerConfig,
    batch: usize,
    prompt: usize,
    completion: usize,
    fused_attention: bool,
) -> u64 {
    let x = Dims::of(model);
    let (b, p) = (batch as f64, prompt as f64);
    let prefill = if fused_attention {
        fused_block(&x, b, p) / 2.0
    } else {
        3.0 * b * x.heads * p * p
    };
    let kv = 2.0 * x.layers * x.kv_heads * x.d * b * (p + completion as f64);
    // The prompt pass's hidden state and one layer's MLP.
    let hidden = b * p * (x.h + 3.0 * x.i);
    bytes(kv + prefill + hidden + b * x.vocab)
}

/// Bytes for people: MiB below a GiB, else GiB.
fn gib(bytes: u64) -> String {
    if (bytes as f64) < GIB {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB)
    }
}

/// Builds the plan.
pub fn plan(inputs: &PlanInputs) -> MemoryPlan {
    let mut items = Vec::new();
    let mut bases_seen = BTreeSet::new();
    // Updates, log-prob passes and rollouts run one agent at a time: each
    // phase counts its largest agent.
    let mut largest: Vec<(Phase, String, u64, u64)> = Vec::new();
    let mut keep = |phase: Phase, role: &str, main: u64, extra: u64| match largest
        .iter_mut()
        .find(|(p, ..)| *p == phase)
    {
        Some(entry) if entry.2.saturating_add(entry.3) >= main.saturating_add(extra) => {}
        Some(entry) => *entry = (phase, role.to_string(), main, extra),
        None => largest.push((phase, role.to_string(), main, extra)),
    };
    for agent in &inputs.agents {
        let params = agent.model.num_params() as f64;
        // A bf16 base: its linear weights at 2 bytes, each widened to f32
        // when used: one at a time without a graph, and kept by the graph
        // of an update (every layer's, or one layer's when recomputing).
        let bf16 = inputs.bf16_base && inputs.lora.is_some();
        let (narrowed, widened_update, widened_pass) = if bf16 {
            let linear = Bf16Linear::of(&agent.model);
            let update = if agent.recompute_layers {
                linear.layer_and_head
            } else {
                linear.all
            };
            (linear.all / 2.0, update, linear.largest)
        } else {
            (0.0, 0.0, 0.0)
        };
        // A fully trained replica computes with its own weights; its KL
        // reference stays on the main device.
        let needs_base = !agent.replica || inputs.lora.is_some();
        if needs_base && bases_seen.insert(agent.base.clone()) {
            let what = match (&inputs.lora, bf16) {
                (Some(_), true) => {
                    format!("base weights {} (frozen, linear ones in bf16)", agent.base)
                }
                (Some(_), false) => format!("base weights {} (frozen)", agent.base),
                (None, _) => format!("reference weights {} (frozen)", agent.base),
            };
            items.push(Item {
                what,
                bytes: bytes(params - narrowed),
                phase: Phase::Held,
            });
        }
        let replica = if agent.replica { " (replica)" } else { "" };
        let trained = match &inputs.lora {
            Some(lora) => {
                let adapters = lora_params(&agent.model, lora);
                items.push(Item {
                    what: format!(
                        "{}: LoRA adapters (rank {}){replica}",
                        agent.role, lora.rank
                    ),
                    bytes: bytes(adapters),
                    phase: Phase::Held,
                });
                adapters
            }
            None => {
                items.push(Item {
                    what: format!("{}: weights (fully trained){replica}", agent.role),
                    bytes: bytes(params),
                    phase: Phase::Held,
                });
                params
            }
        };
        if !agent.replica {
            items.push(Item {
                what: format!("{}: AdamW moments", agent.role),
                bytes: bytes(2.0 * trained),
                phase: Phase::Held,
            });
        }
        let (p, c) = (agent.prompt_tokens, inputs.completion_tokens);
        keep(
            Phase::Update,
            &agent.role,
            activation_bytes(
                &agent.model,
                inputs.micro_batch,
                p,
                c,
                agent.recompute_layers,
                agent.fused_attention,
            )
            .saturating_add(bytes(widened_update)),
            bytes(trained),
        );
        if agent.replica {
            continue;
        }
        keep(
            Phase::Logprobs,
            &agent.role,
            logprob_pass_bytes(
                &agent.model,
                agent.actions_per_step,
                p,
                c,
                agent.fused_attention,
            )
            .saturating_add(bytes(widened_pass)),
            0,
        );
        if inputs.rollout_batch > 0 {
            keep(
                Phase::Rollout,
                &agent.role,
                rollout_bytes(
                    &agent.model,
                    inputs.rollout_batch,
                    p,
                    c,
                    agent.fused_attention,
                )
                .saturating_add(bytes(widened_pass)),
                0,
            );
        }
    }
    for (phase, role, main, extra) in largest {
        let what = match phase {
            Phase::Update => {
                items.push(Item {
                    what: format!("{role}: gradients (largest update)"),
                    bytes: extra,
                    phase,
                });
                let widened = if inputs.bf16_base && inputs.lora.is_some() {
                    " and f32 copies of the bf16 weights"
                } else {
                    ""
                };
                format!(
                    "{role}: saved activations (micro-batch {}){widened}",
                    inputs.micro_batch
                )
            }
            Phase::Logprobs => {
                let n = inputs
                    .agents
                    .iter()
                    .find(|a| a.role == role)
                    .map_or(0, |a| a.actions_per_step);
                format!("{role}: log-prob pass, {n} sequences at a time (no gradient)")
            }
            Phase::Rollout => format!(
                "{role}: generation of {} sequences (KV cache, prompt pass)",
                inputs.rollout_batch
            ),
            Phase::Held => unreachable!("held items are pushed directly"),
        };
        items.push(Item {
            what,
            bytes: main,
            phase,
        });
    }
    if inputs.engine_reservation > 0 {
        items.push(Item {
            what: "the inference engine on this device ([devices] engine_memory_gib)".into(),
            bytes: inputs.engine_reservation,
            phase: Phase::Held,
        });
    }
    let longest = inputs
        .agents
        .iter()
        .map(|a| a.prompt_tokens)
        .max()
        .unwrap_or(0);
    let weights = if inputs.bf16_base && inputs.lora.is_some() {
        "the base's linear weights in bf16, everything else in f32 (adapters, gradients, AdamW state, computation)"
    } else {
        "f32 weights, gradients and AdamW state"
    };
    let mut assumptions = vec![format!(
        "{weights}; sequences of up to {} prompt + {} completion tokens",
        longest, inputs.completion_tokens
    )];
    if inputs.rollout_batch == 0 {
        assumptions.push(
            "generation by the inference engine ([rollout.engine]), in memory of its own".into(),
        );
    }
    MemoryPlan {
        items,
        capacity: inputs.capacity,
        assumptions,
        lora: inputs.lora.is_some(),
        micro_batch: inputs.micro_batch,
    }
}

impl MemoryPlan {
    /// The bytes of one phase's items.
    pub fn phase(&self, phase: Phase) -> u64 {
        self.items
            .iter()
            .filter(|i| i.phase == phase)
            .fold(0u64, |sum, i| sum.saturating_add(i.bytes))
    }

    /// The held bytes plus the largest phase.
    pub fn peak(&self) -> u64 {
        let phases = [Phase::Update, Phase::Logprobs, Phase::Rollout];
        let largest = phases.iter().map(|&p| self.phase(p)).max().unwrap_or(0);
        self.phase(Phase::Held).saturating_add(largest)
    }

    /// The plan as a table.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let capacity = self
            .capacity
            .map(|c| format!(" of {}", gib(c)))
            .unwrap_or_else(|| " (no [devices] memory_gib declared)".into());
        let _ = writeln!(out, "  peak {}{}", gib(self.peak()), capacity);
        for item in &self.items {
            let _ = writeln!(
                out,
                "    {:>11}  {:<7}  {}",
                gib(item.bytes),
                item.phase.label(),
                item.what
            );
        }
        for a in &self.assumptions {
            let _ = writeln!(out, "  assumed: {a}");
        }
        out
    }

    /// Errors when the peak exceeds the declared memory, naming the
    /// largest item and what would make the plan fit.
    pub fn check(&self) -> Result<(), String> {
        let Some(capacity) = self.capacity else {
            return Ok(());
        };
        let peak = self.peak();
        if peak <= capacity {
            return Ok(());
        }
        let largest = self
            .items
            .iter()
            .max_by_key(|i| i.bytes)
            .expect("a plan over capacity has items");
        let mut fixes = Vec::new();
        if !self.lora {
            fixes.push(
                "LoRA adapters on a frozen base ([train.lora]): no per-agent weights or full optimiser state"
                    .to_string(),
            );
        }
        match largest.phase {
            Phase::Update if self.micro_batch > 1 => fixes.push(format!(
                "a smaller train.micro_batch_size (activations scale with it; now {})",
                self.micro_batch
            )),
            Phase::Logprobs => fixes.push(
                "fewer actions per step (rollout.prompts_per_step, samples_per_prompt)".into(),
            ),
            Phase::Rollout => fixes.push(
                "fewer sequences generated together (rollout.max_batch), or an inference engine to generate ([rollout.engine])"
                    .into(),
            ),
            _ => {}
        }
        if largest.phase != Phase::Held {
            fixes.push("a smaller rollout.max_new_tokens (attention memory grows with the square of the sequence)".into());
        }
        fixes.push("the agents spread over more devices ([devices] count and agents)".into());
        fixes.push("a device with more memory".into());
        Err(format!(
            "the memory plan does not fit: peak {} against {}; the largest item is {} ({}). What would make it fit: {}",
            gib(peak),
            gib(capacity),
            largest.what,
            gib(largest.bytes),
            fixes.join("; ")
        ))
    }
}

/// The plans of a run's devices (those that hold anything), by index.
#[derive(Debug, Clone)]
pub struct DevicePlans {
    /// Each device's index and plan.
    pub devices: Vec<(usize, MemoryPlan)>,
}

impl DevicePlans {
    /// The largest peak of any device.
    pub fn peak(&self) -> u64 {
        self.devices
            .iter()
            .map(|(_, p)| p.peak())
            .max()
            .unwrap_or(0)
    }

    /// Every device's plan as a table (a single device 0 without a heading).
    pub fn render(&self) -> String {
        match self.devices.as_slice() {
            [(0, plan)] => plan.render(),
            devices => devices
                .iter()
                .map(|(index, plan)| {
                    let body: String = plan.render().lines().map(|l| format!("  {l}\n")).collect();
                    format!("  device {index}:\n{body}")
                })
                .collect(),
        }
    }

    /// The first device whose plan does not fit, named, with what would
    /// make it fit.
    pub fn check(&self) -> Result<(), String> {
        for (index, plan) in &self.devices {
            plan.check().map_err(|e| match self.devices.len() {
                1 => e,
                _ => format!("device {index}: {e}"),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_model::Family;

    /// Qwen3-4B's shape (its config.json).
    fn qwen3_4b() -> TransformerConfig {
        TransformerConfig::for_family(Family::Qwen3, 151_936, 2560, 9728, 36, 32, 8, 128)
            .with_tie_word_embeddings(true)
    }

    fn inputs(lora: Option<LoraConfig>) -> PlanInputs {
        PlanInputs {
            agents: ["solver", "executor", "verifier"]
                .iter()
                .enumerate()
                .map(|(i, role)| AgentShape {
                    role: role.to_string(),
                    model: qwen3_4b(),
                    base: "qwen3-4b".into(),
                    prompt_tokens: 512 + i * 1024,
                    actions_per_step: 2,
                    recompute_layers: false,
                    fused_attention: false,
                    replica: false,
                })
                .collect(),
            lora,
            bf16_base: false,
            micro_batch: 1,
            completion_tokens: 1024,
            rollout_batch: 2,
            capacity: Some(80 << 30),
            engine_reservation: 0,
        }
    }

    #[test]
    fn a_replica_holds_its_weights_and_one_update_but_no_optimiser_log_probs_or_rollouts() {
        for lora in [None, Some(LoraConfig::new(32, 64.0))] {
            let mut replicas = inputs(lora.clone());
            replicas.agents.truncate(1);
            let main = plan(&replicas);
            replicas.agents[0].replica = true;
            let replica = plan(&replicas);
            let has = |p: &MemoryPlan, what: &str| p.items.iter().any(|i| i.what.contains(what));
            assert!(has(&main, "AdamW") && !has(&replica, "AdamW"));
            assert_eq!(replica.phase(Phase::Update), main.phase(Phase::Update));
            assert_eq!(
                replica.phase(Phase::Logprobs) + replica.phase(Phase::Rollout),
                0
            );
            // Under LoRA the replica computes with the base; fully trained,
            // it computes with its own weights (the reference stays home).
            assert_eq!(has(&replica, "base weights"), lora.is_some());
            assert!(!has(&replica, "reference weights"));
        }
    }

    #[test]
    fn an_engine_on_the_same_device_is_held_memory() {
        let mut inputs = inputs(Some(LoraConfig::new(32, 64.0)));
        let without = plan(&inputs);
        inputs.engine_reservation = 24 << 30;
        let with = plan(&inputs);
        assert_eq!(with.peak() - without.peak(), 24 << 30);
        assert!(with.render().contains("inference engine on this device"));
    }

    #[test]
    fn a_bf16_base_halves_the_linear_weights_and_an_update_widens_them() {
        let lora = Some(LoraConfig::new(32, 64.0));
        let f32_plan = plan(&inputs(lora.clone()));
        let mut bf16 = inputs(lora);
        bf16.bf16_base = true;
        let bf16_plan = plan(&bf16);
        let linear = Bf16Linear::of(&qwen3_4b()).all;
        let held = |p: &MemoryPlan| p.phase(Phase::Held) as f64;
        assert_eq!(
            held(&f32_plan) - held(&bf16_plan),
            bytes(linear / 2.0) as f64
        );
        // Without recomputation the update's graph keeps every widened weight.
        let update = |p: &MemoryPlan| p.phase(Phase::Update) as f64;
        assert_eq!(update(&bf16_plan) - update(&f32_plan), bytes(linear) as f64);
        for agent in &mut bf16.agents {
            agent.recompute_layers = true;
        }
        let recomputed = plan(&bf16);
        assert!(update(&recomputed) < update(&bf16_plan));
    }

    fn weights(plan: &MemoryPlan) -> u64 {
        plan.items
            .iter()
            .filter(|i| i.what.contains("weights"))
            .map(|i| i.bytes)
            .sum()
    }

    #[test]
    fn a_shared_base_is_counted_once_and_full_weights_per_agent() {
        let params = qwen3_4b().num_params() as u64;
        // Three trained copies and the one shared reference, against one base.
        assert_eq!(weights(&plan(&inputs(None))), 4 * 4 * params);
        assert_eq!(
            weights(&plan(&inputs(Some(LoraConfig::new(16, 32.0))))),
            4 * params
        );
        // Bases that differ (a warm start per role) are each counted.
        let mut own = inputs(Some(LoraConfig::new(16, 32.0)));
        for a in &mut own.agents {
            a.base = a.role.clone();
        }
        assert_eq!(weights(&plan(&own)), 3 * 4 * params);
        let err = plan(&inputs(None)).check().unwrap_err();
        assert!(err.contains("LoRA"), "{err}");
    }

    #[test]
    fn lora_parameter_count_matches_the_projection_shapes() {
        let model = qwen3_4b();
        // q: 2560 -> 4096; k, v: 2560 -> 1024; o: 4096 -> 2560; MLP: 2560 <-> 9728.
        let per_rank_layer = (2560 + 4096) * 2 + (2560 + 1024) * 2 + (2560 + 9728) * 3;
        assert_eq!(
            lora_params(&model, &LoraConfig::new(8, 16.0)),
            (per_rank_layer * 8 * 36) as f64
        );
    }

    #[test]
    fn activations_grow_with_the_micro_batch_and_the_square_of_the_sequence() {
        let model = qwen3_4b();
        let a1 = activation_bytes(&model, 1, 512, 512, false, false);
        assert_eq!(activation_bytes(&model, 2, 512, 512, false, false), 2 * a1);
        let a4 = activation_bytes(&model, 1, 2048, 2048, false, false);
        assert!(a4 > 4 * a1 && a4 < 16 * a1);
        // Layer by layer: one layer's graph instead of every layer's.
        let r1 = activation_bytes(&model, 1, 512, 512, true, false);
        assert!(r1 < a1 / 4, "{r1} against {a1}");
        // Fused attention: linear in the sequence length.
        let f1 = activation_bytes(&model, 1, 512, 512, false, true);
        let f4 = activation_bytes(&model, 1, 2048, 2048, false, true);
        assert!(f1 < a1 && f4 < 4 * f1 + f1 / 10, "{f1} {f4}");
    }

    #[test]
    fn an_overfull_device_names_its_largest_item_and_the_fixes() {
        let mut big = inputs(Some(LoraConfig::new(16, 32.0)));
        big.micro_batch = 8;
        big.completion_tokens = 4096;
        let err = plan(&big).check().unwrap_err();
        assert!(err.contains("saved activations"), "{err}");
        assert!(err.contains("micro_batch_size"), "{err}");
        assert!(!err.contains("[train.lora]"), "LoRA is already on: {err}");
        big.capacity = None;
        assert!(
            plan(&big).check().is_ok(),
            "no declared memory, nothing to check"
        );
    }

    #[test]
    fn many_actions_make_the_log_prob_pass_the_largest_phase() {
        let mut many = inputs(Some(LoraConfig::new(16, 32.0)));
        for a in &mut many.agents {
            a.actions_per_step = 256;
        }
        let err = plan(&many).check().unwrap_err();
        assert!(
            err.contains("log-prob pass, 256 sequences at a time"),
            "{err}"
        );
        assert!(err.contains("fewer actions per step"), "{err}");
    }

    #[test]
    fn absurd_sizes_saturate_instead_of_wrapping_to_a_fit() {
        let mut absurd = inputs(Some(LoraConfig::new(usize::MAX / 2, 1.0)));
        absurd.completion_tokens = usize::MAX / 4;
        let plan = plan(&absurd);
        assert_eq!(plan.peak(), u64::MAX);
        assert!(plan.check().is_err());
    }
}
