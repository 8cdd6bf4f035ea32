//! The memory plan of a run: for each device, the bytes of base weights,
//! adapters, gradients, optimiser state, saved activations at the longest
//! sequence and micro-batch, and the rollout KV cache, against the memory
//! the manifest declares (`[devices]`). `mappa reproduce NAME --dry-run`
//! and `mappa run` print it, and a plan that does not fit is refused with
//! its largest item named and what would make it fit.
//!
//! # The model of memory (f32 everywhere, as the trainer computes)
//!
//! - **Persistent** (held for the whole run, summed over a device's agents):
//!   the frozen base weights, once per distinct base and device (agents
//!   that load the same model share one copy: under LoRA they compute with
//!   it, under full fine-tuning it is their KL reference), each agent's own
//!   weights when fully fine-tuned or its adapters under LoRA, and AdamW's
//!   two moments of every trained parameter.
//! - **Update phase** (one agent at a time, so the largest agent counts):
//!   one gradient per trained parameter (all counted as live together with
//!   all activations: an upper bound, since the backward pass frees
//!   activations as it makes gradients), and the activations the autodiff
//!   graph saves for one micro-batch of `m` sequences of width
//!   `S = P + C` (prompt plus completion columns). Counted from the forward
//!   pass (`mappa_model::transformer`), per layer and token: the residual
//!   input, the two norms' outputs and the residual sum (4 `h`); the query
//!   and key through projection, QK-norm, rotary embedding and scaling, the
//!   values and the merged heads (5 `H d` + 5 `Hkv d`); gate, up and their
//!   SwiGLU product (3 `I`); and per layer and sequence the attention
//!   probabilities (`H S^2`). Once per micro-batch: the rotary tables
//!   (2 (`H` + `Hkv`) `d` per token), the additive attention bias
//!   (`H S^2` per sequence), the embeddings and final norm (3 `h` per
//!   token) and the completion columns' logits and log-softmax (2 `C V` per
//!   sequence). While one layer runs, its raw and biased attention scores
//!   (2 `H S^2` per sequence) are live too.
//! - **Rollout phase**: the KV cache of every sequence generated together
//!   (2 `L Hkv d` per token), with the logits of one decoding step.
//!
//! A device's peak is its persistent bytes plus the larger phase. The
//! estimate leaves out the allocator's slack and the program itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use mappa_model::{LoraConfig, TransformerConfig};

/// Bytes of one f32.
const F32: u64 = 4;
/// Bytes in a GiB.
pub const GIB: f64 = (1u64 << 30) as f64;

/// One agent, as the plan sees it.
#[derive(Debug, Clone)]
pub struct AgentShape {
    /// The agent's role.
    pub role: String,
    /// Its base model's architecture.
    pub model: TransformerConfig,
    /// Where its base model comes from (agents with the same one share it under LoRA).
    pub base: String,
    /// The device it trains on.
    pub device: usize,
    /// The longest prompt it sees, in tokens.
    pub prompt_tokens: usize,
}

/// What the plan needs besides the agents.
#[derive(Debug, Clone)]
pub struct PlanInputs {
    /// The agents.
    pub agents: Vec<AgentShape>,
    /// LoRA settings (none: full fine-tuning).
    pub lora: Option<LoraConfig>,
    /// Sequences per forward/backward pass.
    pub micro_batch: usize,
    /// Most new tokens per action.
    pub completion_tokens: usize,
    /// Sequences generated together by one agent (none: an inference
    /// engine generates them, elsewhere).
    pub rollout_batch: Option<usize>,
    /// Memory of each device, in bytes (none: not declared).
    pub capacity: Option<u64>,
    /// Number of devices.
    pub devices: usize,
    /// Bytes the inference engine reserves, by device.
    pub engine_reserve: BTreeMap<usize, u64>,
}

/// One line of a device's plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// What the bytes are for.
    pub what: String,
    /// How many.
    pub bytes: u64,
    /// Which phase holds them: persistent, update or rollout.
    pub phase: Phase,
}

/// When memory is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// For the whole run.
    Persistent,
    /// While one agent's update runs.
    Update,
    /// While an agent generates.
    Rollout,
}

/// One device's items and peak.
#[derive(Debug, Clone)]
pub struct DevicePlan {
    /// Device index.
    pub device: usize,
    /// Its items.
    pub items: Vec<Item>,
    /// Its declared memory, if any.
    pub capacity: Option<u64>,
}

impl DevicePlan {
    fn phase(&self, phase: Phase) -> u64 {
        self.items
            .iter()
            .filter(|i| i.phase == phase)
            .map(|i| i.bytes)
            .sum()
    }

    /// Persistent bytes plus the larger of the update and rollout phases.
    pub fn peak(&self) -> u64 {
        self.phase(Phase::Persistent) + self.phase(Phase::Update).max(self.phase(Phase::Rollout))
    }
}

/// The plan of every device.
#[derive(Debug, Clone)]
pub struct MemoryPlan {
    /// Per device.
    pub devices: Vec<DevicePlan>,
    /// What the plan assumed (stated with it).
    pub assumptions: Vec<String>,
    lora: bool,
    micro_batch: usize,
}

/// Parameters of `config`'s adapters on a model of `model`'s shape.
pub fn lora_params(model: &TransformerConfig, lora: &LoraConfig) -> u64 {
    let (h, q, kv, i) = (
        model.hidden_size,
        model.num_heads * model.head_dim,
        model.num_kv_heads * model.head_dim,
        model.intermediate_size,
    );
    let per_layer: usize = lora
        .targets
        .iter()
        .map(|t| match t.as_str() {
            "q_proj" | "o_proj" => h + q,
            "k_proj" | "v_proj" => h + kv,
            _ => h + i,
        })
        .sum();
    (per_layer * lora.rank * model.num_layers) as u64
}

/// Bytes the autodiff graph holds for one micro-batch of `m` sequences of
/// `prompt + completion` columns (see the module docs for what is counted).
pub fn activation_bytes(
    model: &TransformerConfig,
    m: usize,
    prompt: usize,
    completion: usize,
) -> u64 {
    let (m, s, c) = (m as u64, (prompt + completion) as u64, completion as u64);
    let h = model.hidden_size as u64;
    let (heads, kv_heads, d) = (
        model.num_heads as u64,
        model.num_kv_heads as u64,
        model.head_dim as u64,
    );
    let i = model.intermediate_size as u64;
    let layers = model.num_layers as u64;
    let tokens = m * s;
    let attention = m * heads * s * s;
    let per_layer = tokens * (4 * h + 5 * heads * d + 5 * kv_heads * d + 3 * i) + attention;
    let once = tokens * (2 * (heads + kv_heads) * d + 3 * h)
        + attention
        + 2 * m * c * model.vocab_size as u64;
    let live_scores = 2 * attention;
    F32 * (layers * per_layer + once + live_scores)
}

/// Bytes of the KV cache for `batch` sequences of `tokens` columns.
pub fn kv_cache_bytes(model: &TransformerConfig, batch: usize, tokens: usize) -> u64 {
    F32 * 2
        * (model.num_layers * model.num_kv_heads * model.head_dim) as u64
        * (batch * tokens) as u64
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / GIB)
}

/// Builds the plan.
pub fn plan(inputs: &PlanInputs) -> MemoryPlan {
    let mut devices: Vec<DevicePlan> = (0..inputs.devices.max(1))
        .map(|device| DevicePlan {
            device,
            items: Vec::new(),
            capacity: inputs.capacity,
        })
        .collect();
    let mut bases_seen = std::collections::BTreeSet::new();
    // The update phase holds one agent's gradients and activations at a
    // time: keep each device's largest.
    let mut update: BTreeMap<usize, (u64, u64, String)> = BTreeMap::new();
    let mut rollout: BTreeMap<usize, (u64, String)> = BTreeMap::new();
    for agent in &inputs.agents {
        let d = agent.device.min(devices.len() - 1);
        let items = &mut devices[d].items;
        let params = agent.model.num_params() as u64;
        // The frozen base: under LoRA every agent computes with it; under
        // full fine-tuning it is the agents' KL reference once their
        // updates have replaced their own weights. Agents that load the same
        // model share it (one copy per device).
        if bases_seen.insert((d, agent.base.clone())) {
            let name = std::path::Path::new(&agent.base)
                .file_name()
                .map_or(agent.base.clone(), |n| n.to_string_lossy().into_owned());
            let what = match inputs.lora {
                Some(_) => format!("base weights {name} (shared, frozen)"),
                None => format!("reference weights {name} (shared, frozen)"),
            };
            items.push(Item {
                what,
                bytes: F32 * params,
                phase: Phase::Persistent,
            });
        }
        let trained = match &inputs.lora {
            Some(lora) => {
                let adapters = lora_params(&agent.model, lora);
                items.push(Item {
                    what: format!("{}: LoRA adapters (rank {})", agent.role, lora.rank),
                    bytes: F32 * adapters,
                    phase: Phase::Persistent,
                });
                adapters
            }
            None => {
                items.push(Item {
                    what: format!("{}: weights (fully trained)", agent.role),
                    bytes: F32 * params,
                    phase: Phase::Persistent,
                });
                params
            }
        };
        items.push(Item {
            what: format!("{}: AdamW moments", agent.role),
            bytes: 2 * F32 * trained,
            phase: Phase::Persistent,
        });
        let activations = activation_bytes(
            &agent.model,
            inputs.micro_batch,
            agent.prompt_tokens,
            inputs.completion_tokens,
        );
        let grads = F32 * trained;
        let entry = update.entry(d).or_insert((0, 0, String::new()));
        if grads + activations > entry.0 + entry.1 {
            *entry = (grads, activations, agent.role.clone());
        }
        if let Some(batch) = inputs.rollout_batch {
            let kv = kv_cache_bytes(
                &agent.model,
                batch,
                agent.prompt_tokens + inputs.completion_tokens,
            ) + F32 * (batch * agent.model.vocab_size) as u64;
            let entry = rollout.entry(d).or_insert((0, String::new()));
            if kv > entry.0 {
                *entry = (kv, agent.role.clone());
            }
        }
    }
    for (d, (grads, activations, role)) in update {
        devices[d].items.push(Item {
            what: format!("{role}: gradients (largest update on the device)"),
            bytes: grads,
            phase: Phase::Update,
        });
        devices[d].items.push(Item {
            what: format!(
                "{role}: saved activations (micro-batch {})",
                inputs.micro_batch
            ),
            bytes: activations,
            phase: Phase::Update,
        });
    }
    for (d, (kv, role)) in rollout {
        devices[d].items.push(Item {
            what: format!(
                "{role}: rollout KV cache ({} sequences)",
                inputs.rollout_batch.unwrap_or(0)
            ),
            bytes: kv,
            phase: Phase::Rollout,
        });
    }
    for (&d, &bytes) in &inputs.engine_reserve {
        if let Some(device) = devices.get_mut(d) {
            device.items.push(Item {
                what: "inference engine (reserved)".into(),
                bytes,
                phase: Phase::Persistent,
            });
        }
    }
    let mut assumptions = Vec::new();
    let longest = inputs
        .agents
        .iter()
        .map(|a| a.prompt_tokens)
        .max()
        .unwrap_or(0);
    assumptions.push(format!(
        "f32 weights, gradients and AdamW state; sequences of up to {} prompt + {} completion tokens",
        longest, inputs.completion_tokens
    ));
    if inputs.rollout_batch.is_none() {
        assumptions.push("rollouts are generated by an inference engine (no KV cache here)".into());
    }
    MemoryPlan {
        devices,
        assumptions,
        lora: inputs.lora.is_some(),
        micro_batch: inputs.micro_batch,
    }
}

impl MemoryPlan {
    /// The plan as a table per device.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for device in &self.devices {
            let capacity = device
                .capacity
                .map(|c| format!(" of {}", gib(c)))
                .unwrap_or_else(|| " (no [devices] memory declared)".into());
            let _ = writeln!(
                out,
                "  device {}: peak {}{}",
                device.device,
                gib(device.peak()),
                capacity
            );
            for item in &device.items {
                let phase = match item.phase {
                    Phase::Persistent => "held",
                    Phase::Update => "update",
                    Phase::Rollout => "rollout",
                };
                let _ = writeln!(
                    out,
                    "    {:>10}  {:<7}  {}",
                    gib(item.bytes),
                    phase,
                    item.what
                );
            }
        }
        for a in &self.assumptions {
            let _ = writeln!(out, "  assumed: {a}");
        }
        out
    }

    /// Errors when a device's peak exceeds its declared memory, naming the
    /// largest item and what would make the plan fit.
    pub fn check(&self) -> Result<(), String> {
        for device in &self.devices {
            let Some(capacity) = device.capacity else {
                continue;
            };
            let peak = device.peak();
            if peak <= capacity {
                continue;
            }
            let largest = device
                .items
                .iter()
                .max_by_key(|i| i.bytes)
                .expect("a device over capacity has items");
            let mut fixes = Vec::new();
            if !self.lora {
                fixes.push(
                    "LoRA adapters on one shared frozen base ([train.lora]): no per-agent weights, references or full optimiser state"
                        .to_string(),
                );
            }
            if largest.phase == Phase::Update && self.micro_batch > 1 {
                fixes.push(format!(
                    "a smaller train.micro_batch_size (activations scale with it; now {})",
                    self.micro_batch
                ));
            }
            if largest.phase == Phase::Update {
                fixes.push("a smaller rollout.max_new_tokens (attention activations grow with the square of the sequence)".into());
            }
            if largest.phase == Phase::Rollout {
                fixes.push(
                    "rollouts from an inference engine on another device ([devices] engine)".into(),
                );
            }
            fixes.push("more or larger devices ([devices] count, memory_gib, agents)".into());
            return Err(format!(
                "the memory plan does not fit device {}: peak {} against {}; the largest item is {} ({}). What would make it fit: {}",
                device.device,
                gib(peak),
                gib(capacity),
                largest.what,
                gib(largest.bytes),
                fixes.join("; ")
            ));
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
                    device: 0,
                    prompt_tokens: 512 + i * 1024,
                })
                .collect(),
            lora,
            micro_batch: 1,
            completion_tokens: 1024,
            rollout_batch: None,
            capacity: Some(80 << 30),
            devices: 1,
            engine_reserve: BTreeMap::new(),
        }
    }

    #[test]
    fn lora_counts_the_shared_base_once_and_full_finetuning_per_agent() {
        let full = plan(&inputs(None));
        let lora = plan(&inputs(Some(LoraConfig::new(16, 32.0))));
        let params = qwen3_4b().num_params() as u64;
        let weights = |p: &MemoryPlan| -> u64 {
            p.devices[0]
                .items
                .iter()
                .filter(|i| i.what.contains("weights") || i.what.contains("reference"))
                .map(|i| i.bytes)
                .sum()
        };
        // Three trained copies and the one shared reference, against one base.
        assert_eq!(weights(&full), 4 * 4 * params);
        assert_eq!(weights(&lora), 4 * params);
        assert!(full.check().is_err());
        let err = full.check().unwrap_err();
        assert!(err.contains("LoRA"), "{err}");
    }

    #[test]
    fn lora_parameter_count_matches_the_projection_shapes() {
        let model = qwen3_4b();
        // q: 2560 -> 4096; k, v: 2560 -> 1024; o: 4096 -> 2560; MLP: 2560 <-> 9728.
        let per_rank_layer = (2560 + 4096) * 2 + (2560 + 1024) * 2 + (2560 + 9728) * 3;
        assert_eq!(
            lora_params(&model, &LoraConfig::new(8, 16.0)),
            (per_rank_layer * 8 * 36) as u64
        );
    }

    #[test]
    fn activations_grow_with_the_micro_batch_and_the_square_of_the_sequence() {
        let model = qwen3_4b();
        let a1 = activation_bytes(&model, 1, 512, 512);
        assert_eq!(activation_bytes(&model, 2, 512, 512), 2 * a1);
        let a4 = activation_bytes(&model, 1, 2048, 2048);
        assert!(a4 > 4 * a1 && a4 < 16 * a1);
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
}
