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
//! The plan is meant as an upper bound of the device's peak, within 20%
//! (`just bench-memory` and `mappa doctor` check both sides). Each phase
//! counts the tensors live together at its largest moment, as the code
//! computes them; `benches/tests/plan_covers_live.rs` checks every phase
//! against the bytes a counting allocator sees. With `S = P + C` (prompt
//! plus completion columns), `h` hidden, `H` query and `Hkv` key/value
//! heads of `d`, `I` the MLP width, `V` the vocabulary and `L` layers:
//!
//! - **Held** for the whole run: every distinct starting model once (roles
//!   that load the same checkpoint and seed share it: under LoRA they
//!   compute with it, under full fine-tuning it is their KL reference; a
//!   warm start gives each role its own), each agent's own weights when
//!   fully fine-tuned or its adapters under LoRA, and AdamW's two moments
//!   of every trained parameter.
//! - **Update** (one agent at a time, so the largest counts) of one
//!   micro-batch of `m` sequences: the largest of its stages.
//!   - The start of the backward pass: what every layer's graph saves
//!     (per token the layer's input, the two norms' outputs and the
//!     residual sum, 4 `h`; the rotated queries and keys, the values and
//!     the merged heads, 2 `H d` + 2 `Hkv d`; QK-norm's inputs where the
//!     model has it, `H d` + `Hkv d`; gate, up and their product, 3 `I`;
//!     each adapter's low-rank product; per sequence the attention
//!     probabilities, `H S^2`, or under fused attention each row's
//!     log-sum-exp and the output), the final norm's input and output (2
//!     `h` per token), the completion logits (`C V` per sequence: one on
//!     the CPU, whose kernel writes their gradient in place unless the head
//!     is trained; three under the default kernels) and, fully trained, the
//!     head's gradient (`V h`).
//!   - With `train.recompute_layers`: the head's graph first, over each
//!     layer's kept input (`L + 1` hidden states per token); then one
//!     layer's graph at a time, with the gradients arriving at and leaving
//!     it, while the weights' gradients gather.
//!   - The optimiser's step: every gradient, and AdamW's temporaries of the
//!     largest trained tensor (two of its size).
//!
//!   Under burn's default kernels (the GPU backends) a layer also holds
//!   the dense additive bias and its scores (2 `H S^2` per sequence), or a
//!   fused block of scores (4 `Hkv B S` per sequence for blocks of `B`
//!   stacked query rows, `kernels::ATTENTION_BLOCK_ROWS`); the CPU backend
//!   applies the mask in the softmax and holds one head's or one row's
//!   scores per thread ([`Kernels`]).
//! - **Log-prob passes** (no gradient): the rollout policy's and the
//!   reference's log-probs of all of an agent's actions of a step, in one
//!   batch of `N` sequences: the larger of a layer (the hidden state and
//!   its norm with either attention's inputs and output or the MLP's three
//!   tensors, plus the default kernels' bias, scores and probabilities, 3
//!   `H S^2` per sequence) and the head (two hidden states per token and
//!   the completion logits, twice under the default kernels' composed
//!   log-softmax).
//! - **Rollout**: the KV cache of every sequence an agent generates
//!   together (2 `L Hkv d` per token, for the larger of a training step's
//!   and an evaluation's batch), with the prompt pass's bias, scores and
//!   probabilities (3 `H P^2` per sequence), its hidden state and one
//!   layer's MLP (`h` + 3 `I` per token), and one step's logits.
//! - **Load** (a bf16 base only): the base in f32 before its linear
//!   weights are narrowed, when no AdamW moment exists yet.
//!
//! The tensors' peak is the held bytes plus the largest phase. On top
//! comes the **allocator's reserve**: memory freed and kept for reuse, and
//! the holes between live blocks. On the CPU, mimalloc keeps every freed
//! page (`mappa_kernels::alloc`) in heaps per thread: [`RESERVE_FRACTION`]
//! of the tensors plus [`RESERVE_PER_PROCESS`] and [`RESERVE_PER_THREAD`]
//! per thread of the backend. These were chosen on a 25M-parameter model
//! (`mappa doctor --size small`'s memory checks at 1, 2, 4 and 8 threads,
//! the smallest shares with every measured peak under the plan) and then
//! tested on SmolLM2-135M (`just bench-memory`); the results are in
//! `docs/experiments/lora.md`. The GPU backends' pools are reserved with
//! the same fraction, not yet measured: `mappa doctor --backend cuda`
//! checks it.

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
    /// The kernels of the device's backend.
    pub kernels: Kernels,
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
    /// While a base is loaded in f32, before its linear weights are
    /// narrowed to bf16.
    Load,
    /// The allocator's reserve ([`reserve_for`]), held with
    /// everything else.
    Reserve,
}

impl Phase {
    fn label(self) -> &'static str {
        match self {
            Phase::Held => "held",
            Phase::Update => "update",
            Phase::Logprobs => "logprob",
            Phase::Rollout => "rollout",
            Phase::Load => "load",
            Phase::Reserve => "reserve",
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
    saturating(floats * F32)
}

/// `x` as a whole number of bytes, `u64::MAX` at or beyond it.
fn saturating(x: f64) -> u64 {
    if x >= u64::MAX as f64 {
        u64::MAX
    } else {
        x as u64
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
    qk_norm: bool,
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
            qk_norm: model.qk_norm,
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

/// How the device's backend computes attention and log-probs, which sets
/// what a pass holds besides its saved tensors, and how its allocator
/// keeps memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernels {
    /// The CPU backend's own (`ModelBackend::MASKS_IN_SOFTMAX`) on this
    /// many threads: dense attention is one operation that applies the mask
    /// in the softmax and holds one key/value head's scores per thread (no
    /// bias, no layer's scores), fused attention one row per thread, and a
    /// token's log-prob is read off the logits in one pass (no log-softmax
    /// tensor).
    Cpu {
        /// The backend's threads (each keeps freed memory of its own).
        threads: usize,
    },
    /// burn's default operations (the GPU backends): a dense additive bias
    /// shared by the layers, one layer's scores and probabilities, fused
    /// attention in blocks of [`ATTENTION_BLOCK_ROWS`] query rows, and the
    /// log-softmax composed of operations (the logits shifted by their
    /// maximum: a second logits-sized tensor, a third in a backward pass).
    ///
    /// [`ATTENTION_BLOCK_ROWS`]: mappa_model::kernels::ATTENTION_BLOCK_ROWS
    Default,
}

impl Kernels {
    /// The kernels of backend `B` in this process: the CPU backend's own
    /// where it applies the mask in the softmax (only the CPU backend
    /// does), on [`crate::machine::threads`] threads.
    pub fn of<B: mappa_model::ModelBackend>() -> Self {
        if B::MASKS_IN_SOFTMAX {
            Kernels::Cpu {
                threads: crate::machine::threads(),
            }
        } else {
            Kernels::Default
        }
    }
}

/// The allocator's reserve as a fraction of the tensors' bytes (see the
/// module docs).
pub const RESERVE_FRACTION: f64 = 0.2;
/// The CPU allocator's reserve per process, in bytes.
pub const RESERVE_PER_PROCESS: u64 = 48 << 20;
/// The CPU allocator's reserve per thread of the backend, in bytes.
pub const RESERVE_PER_THREAD: u64 = 12 << 20;

/// One pass: `n` sequences of `s` columns, `c` of them completion columns
/// whose logits are computed.
#[derive(Clone, Copy)]
struct Pass {
    n: f64,
    s: f64,
    c: f64,
}

impl Pass {
    fn new(n: usize, prompt: usize, completion: usize) -> Self {
        Self {
            n: n as f64,
            s: (prompt + completion) as f64,
            c: completion as f64,
        }
    }

    fn tokens(self) -> f64 {
        self.n * self.s
    }

    /// One logits-sized tensor: the completion columns over the vocabulary.
    fn logits(self, x: &Dims) -> f64 {
        self.n * self.c * x.vocab
    }
}

/// The scores one block of fused attention holds under burn's default
/// kernels: [`ATTENTION_BLOCK_ROWS`] stacked query rows of a key/value head
/// against every key, four tensors of that size with a gradient (scores,
/// probabilities and their gradients), two without.
///
/// [`ATTENTION_BLOCK_ROWS`]: mappa_model::kernels::ATTENTION_BLOCK_ROWS
fn fused_block(x: &Dims, pass: Pass, gradient: bool) -> f64 {
    let rows =
        (mappa_model::kernels::ATTENTION_BLOCK_ROWS as f64).min(x.heads / x.kv_heads * pass.s);
    let tensors = if gradient { 4.0 } else { 2.0 };
    tensors * pass.n * x.kv_heads * rows * pass.s
}

/// What attention holds while one layer runs, beyond what it saves: the
/// default kernels' bias and a layer's scores (and, without a gradient,
/// probabilities), or a fused block; nothing to speak of on the CPU.
fn attention_transient(x: &Dims, pass: Pass, fused: bool, kernels: Kernels, gradient: bool) -> f64 {
    match (kernels, fused) {
        (Kernels::Cpu { .. }, _) => 0.0,
        (Kernels::Default, true) => fused_block(x, pass, gradient),
        (Kernels::Default, false) => {
            let tensors = if gradient { 2.0 } else { 3.0 };
            tensors * pass.n * x.heads * pass.s * pass.s
        }
    }
}

/// What one layer's graph saves for a backward pass, in floats: per token
/// the layer's input, the two norms' outputs and the residual sum (4 `h`),
/// the rotated queries and keys, the values and the merged heads (2 `H d` +
/// 2 `Hkv d`), the inputs of QK-norm where the model has it (`H d` + `Hkv
/// d`), gate, up and their SwiGLU product (3 `I`), each adapter's low-rank
/// product (its rank); per sequence the attention probabilities (`H S^2`),
/// or under fused attention each row's log-sum-exp (`H S`) and the output
/// (`H d` per token).
fn layer_saved(x: &Dims, pass: Pass, adapter_ranks: f64, fused: bool) -> f64 {
    let (q, kv) = (x.heads * x.d, x.kv_heads * x.d);
    let qk_norm = if x.qk_norm { q + kv } else { 0.0 };
    let (output, attention) = if fused {
        (q, pass.n * x.heads * pass.s)
    } else {
        (0.0, pass.n * x.heads * pass.s * pass.s)
    };
    let per_token = 4.0 * x.h + 2.0 * q + 2.0 * kv + qk_norm + 3.0 * x.i + adapter_ranks + output;
    pass.tokens() * per_token + attention
}

/// What an update trains, for the plan's update formulas.
#[derive(Debug, Clone, Copy)]
pub struct Training {
    /// Trained parameters (all gradients, once all exist).
    pub params: f64,
    /// The largest trained tensor (AdamW's temporaries are its size).
    pub largest: f64,
    /// The sum of the adapters' ranks in one layer (0: full fine-tuning).
    pub adapter_ranks: f64,
    /// The output head (or tied embeddings) is trained: its gradient is
    /// made at the start of the backward pass.
    pub head: bool,
}

impl Training {
    /// Full fine-tuning of `model`.
    pub fn full(model: &TransformerConfig) -> Self {
        let x = Dims::of(model);
        Self {
            params: model.num_params() as f64,
            largest: (x.vocab * x.h).max(x.i * x.h),
            adapter_ranks: 0.0,
            head: true,
        }
    }

    /// `lora`'s adapters on `model`.
    pub fn lora(model: &TransformerConfig, lora: &LoraConfig) -> Self {
        let x = Dims::of(model);
        let rank = lora.rank as f64;
        Self {
            params: lora_params(model, lora),
            largest: rank * x.h.max(x.i).max(x.heads * x.d),
            adapter_ranks: rank * lora.targets.len() as f64,
            head: false,
        }
    }
}

/// The shapes and options of one update.
#[derive(Debug, Clone, Copy)]
pub struct UpdateShape {
    /// Sequences per micro-batch.
    pub micro_batch: usize,
    /// Prompt columns.
    pub prompt: usize,
    /// Completion columns.
    pub completion: usize,
    /// `train.recompute_layers`.
    pub recompute_layers: bool,
    /// `train.attention = "fused"`.
    pub fused_attention: bool,
    /// The device's kernels.
    pub kernels: Kernels,
}

/// Bytes an update of one micro-batch holds at its peak beyond the held
/// weights and optimiser state (see the module docs): the largest of its
/// stages, each counting what is live together.
pub fn update_bytes(model: &TransformerConfig, training: Training, shape: UpdateShape) -> u64 {
    let x = Dims::of(model);
    let pass = Pass::new(shape.micro_batch, shape.prompt, shape.completion);
    let tokens = pass.tokens();
    let saved = layer_saved(&x, pass, training.adapter_ranks, shape.fused_attention);
    let transient = attention_transient(&x, pass, shape.fused_attention, shape.kernels, true);
    // The head: the final norm's input and output, the completion logits
    // (with their gradient, made in place on the CPU unless the head is
    // trained; with the shifted logits under the default kernels) and the
    // head's own gradient.
    let logits = match (shape.kernels, training.head) {
        (Kernels::Cpu { .. }, false) => 1.0,
        (Kernels::Cpu { .. }, true) => 2.0,
        (Kernels::Default, _) => 3.0,
    } * pass.logits(&x);
    let head_gradient = if training.head { x.vocab * x.h } else { 0.0 };
    let head = 2.0 * tokens * x.h + logits + head_gradient;
    let optimiser = training.params + 2.0 * training.largest;
    let stages = if shape.recompute_layers {
        // Each layer's input is kept; the head's graph runs first, then one
        // layer's graph at a time, with the gradient arriving at a layer
        // and the one it passes on, while the weights' gradients gather.
        let inputs = x.layers * tokens * x.h;
        let one_layer = inputs + saved + transient + 2.0 * tokens * x.h + training.params;
        [inputs + tokens * x.h + head, one_layer, optimiser]
    } else {
        [x.layers * saved + transient + head, 0.0, optimiser]
    };
    bytes(stages.into_iter().fold(0.0, f64::max))
}

/// Bytes live while the log-probs of `n` sequences are computed without a
/// gradient (see the module docs): the larger of one layer's pass and the
/// head's.
pub fn logprob_pass_bytes(
    model: &TransformerConfig,
    n: usize,
    prompt: usize,
    completion: usize,
    fused_attention: bool,
    kernels: Kernels,
) -> u64 {
    let x = Dims::of(model);
    let pass = Pass::new(n, prompt, completion);
    // The hidden state and its norm, with either the queries, keys, values
    // and attention output, or the MLP's gate, up and product.
    let (q, kv) = (x.heads * x.d, x.kv_heads * x.d);
    let widest = (2.0 * q + 2.0 * kv).max(3.0 * x.i);
    let layer = pass.tokens() * (2.0 * x.h + widest)
        + attention_transient(&x, pass, fused_attention, kernels, false);
    let copies = match kernels {
        Kernels::Cpu { .. } => 1.0,
        Kernels::Default => 2.0,
    };
    let head = 2.0 * pass.tokens() * x.h + copies * pass.logits(&x);
    bytes(layer.max(head))
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
    kernels: Kernels,
) -> u64 {
    let x = Dims::of(model);
    let prefill = Pass::new(batch, prompt, 0);
    let (b, p) = (batch as f64, prompt as f64);
    let attention = match (kernels, fused_attention) {
        (Kernels::Default, true) => fused_block(&x, prefill, false),
        // The CPU's dense kernel holds less; counted as the default's.
        (_, false) => 3.0 * b * x.heads * p * p,
        (Kernels::Cpu { .. }, true) => 0.0,
    };
    let kv = 2.0 * x.layers * x.kv_heads * x.d * b * (p + completion as f64);
    // The prompt pass's hidden state and one layer's MLP.
    let hidden = b * p * (x.h + 3.0 * x.i);
    bytes(kv + attention + hidden + b * x.vocab)
}

/// Bytes for people: MiB below a GiB, else GiB.
fn gib(bytes: u64) -> String {
    if (bytes as f64) < GIB {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB)
    }
}

/// The f32 copies a bf16 base adds to each phase of an agent, in floats
/// (all zero for an f32 base).
struct Bf16Costs {
    /// The linear weights' bytes saved by storing them in bf16.
    narrowed: f64,
    /// Widened copies an update's graph keeps.
    update: f64,
    /// The one weight widened at a time without a graph.
    pass: f64,
}

impl Bf16Costs {
    fn of(inputs: &PlanInputs, agent: &AgentShape) -> Self {
        if !(inputs.bf16_base && inputs.lora.is_some()) {
            return Self {
                narrowed: 0.0,
                update: 0.0,
                pass: 0.0,
            };
        }
        let linear = Bf16Linear::of(&agent.model);
        Self {
            narrowed: linear.all / 2.0,
            update: if agent.recompute_layers {
                linear.layer_and_head
            } else {
                linear.all
            },
            pass: linear.largest,
        }
    }
}

/// The largest agent of each phase: phases run one agent at a time.
#[derive(Default)]
struct Largest(Vec<(Phase, String, u64)>);

impl Largest {
    fn keep(&mut self, phase: Phase, role: &str, bytes: u64) {
        match self.0.iter_mut().find(|(p, ..)| *p == phase) {
            Some(entry) if entry.2 >= bytes => {}
            Some(entry) => *entry = (phase, role.to_string(), bytes),
            None => self.0.push((phase, role.to_string(), bytes)),
        }
    }
}

/// Pushes what `agent` holds for the whole run: its base (once per
/// distinct base), its weights or adapters, its AdamW moments; returns the
/// moments' bytes.
fn held_items(
    inputs: &PlanInputs,
    agent: &AgentShape,
    bf16: &Bf16Costs,
    bases_seen: &mut BTreeSet<String>,
    items: &mut Vec<Item>,
) -> u64 {
    let params = agent.model.num_params() as f64;
    let mut hold = |what: String, floats: f64| {
        items.push(Item {
            what,
            bytes: bytes(floats),
            phase: Phase::Held,
        })
    };
    // A fully trained replica computes with its own weights; its KL
    // reference stays on the main device.
    let needs_base = !agent.replica || inputs.lora.is_some();
    if needs_base && bases_seen.insert(agent.base.clone()) {
        let what = match (&inputs.lora, bf16.narrowed > 0.0) {
            (Some(_), true) => format!("base weights {} (frozen, linear ones in bf16)", agent.base),
            (Some(_), false) => format!("base weights {} (frozen)", agent.base),
            (None, _) => format!("reference weights {} (frozen)", agent.base),
        };
        hold(what, params - bf16.narrowed);
    }
    let replica = if agent.replica { " (replica)" } else { "" };
    let trained = match &inputs.lora {
        Some(lora) => {
            let adapters = lora_params(&agent.model, lora);
            let what = format!(
                "{}: LoRA adapters (rank {}){replica}",
                agent.role, lora.rank
            );
            hold(what, adapters);
            adapters
        }
        None => {
            hold(
                format!("{}: weights (fully trained){replica}", agent.role),
                params,
            );
            params
        }
    };
    if agent.replica {
        return 0;
    }
    hold(format!("{}: AdamW moments", agent.role), 2.0 * trained);
    bytes(2.0 * trained)
}

/// Offers `agent`'s update, log-prob pass and rollout to `largest`.
fn phases_of(inputs: &PlanInputs, agent: &AgentShape, bf16: &Bf16Costs, largest: &mut Largest) {
    let training = match &inputs.lora {
        Some(lora) => Training::lora(&agent.model, lora),
        None => Training::full(&agent.model),
    };
    let (p, c) = (agent.prompt_tokens, inputs.completion_tokens);
    let (fused, kernels) = (agent.fused_attention, inputs.kernels);
    let shape = UpdateShape {
        micro_batch: inputs.micro_batch,
        prompt: p,
        completion: c,
        recompute_layers: agent.recompute_layers,
        fused_attention: fused,
        kernels,
    };
    let update = update_bytes(&agent.model, training, shape).saturating_add(bytes(bf16.update));
    largest.keep(Phase::Update, &agent.role, update);
    if agent.replica {
        return;
    }
    let n = agent.actions_per_step;
    let pass = logprob_pass_bytes(&agent.model, n, p, c, fused, kernels);
    largest.keep(
        Phase::Logprobs,
        &agent.role,
        pass.saturating_add(bytes(bf16.pass)),
    );
    if inputs.rollout_batch > 0 {
        let rollout = rollout_bytes(&agent.model, inputs.rollout_batch, p, c, fused, kernels);
        largest.keep(
            Phase::Rollout,
            &agent.role,
            rollout.saturating_add(bytes(bf16.pass)),
        );
    }
}

/// The line of a phase's largest agent.
fn phase_item(inputs: &PlanInputs, phase: Phase, role: String, bytes: u64) -> Item {
    let what = match phase {
        Phase::Update => {
            let widened = if inputs.bf16_base && inputs.lora.is_some() {
                ", f32 copies of the bf16 weights"
            } else {
                ""
            };
            format!(
                "{role}: update of a micro-batch of {} at its peak (saved activations, logits, gradients{widened})",
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
        // The Load phase's "role" is the base loaded.
        Phase::Load => {
            format!("loading base {role} in f32, before its linear weights are narrowed to bf16")
        }
        Phase::Held | Phase::Reserve => unreachable!("not a phase of one agent"),
    };
    Item { what, bytes, phase }
}

/// What the plan assumed, printed with it.
fn assumptions(inputs: &PlanInputs) -> Vec<String> {
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
    let kernels = match inputs.kernels {
        Kernels::Cpu { threads } => format!("the CPU backend's kernels on {threads} threads"),
        Kernels::Default => "burn's default kernels (GPU backends)".to_string(),
    };
    let mut assumptions = vec![format!(
        "{weights}; sequences of up to {} prompt + {} completion tokens; {kernels}",
        longest, inputs.completion_tokens
    )];
    if inputs.rollout_batch == 0 {
        assumptions.push(
            "generation by the inference engine ([rollout.engine]), in memory of its own".into(),
        );
    }
    assumptions
}

/// Builds the plan.
pub fn plan(inputs: &PlanInputs) -> MemoryPlan {
    let mut items = Vec::new();
    let mut bases_seen = BTreeSet::new();
    let mut largest = Largest::default();
    let (mut moments, mut narrowed) = (0u64, (0u64, ""));
    for agent in &inputs.agents {
        let bf16 = Bf16Costs::of(inputs, agent);
        moments = moments.saturating_add(held_items(
            inputs,
            agent,
            &bf16,
            &mut bases_seen,
            &mut items,
        ));
        phases_of(inputs, agent, &bf16, &mut largest);
        narrowed = narrowed.max((bytes(bf16.narrowed), agent.base.as_str()));
    }
    // A bf16 base is loaded in f32 and then narrowed, before the optimiser
    // makes any AdamW moment (at its first step).
    if narrowed.0 > moments {
        largest.keep(Phase::Load, narrowed.1, narrowed.0 - moments);
    }
    for (phase, role, bytes) in largest.0 {
        items.push(phase_item(inputs, phase, role, bytes));
    }
    let mut plan = MemoryPlan {
        items,
        capacity: inputs.capacity,
        assumptions: assumptions(inputs),
        lora: inputs.lora.is_some(),
        micro_batch: inputs.micro_batch,
    };
    let reserve = reserve_for(plan.peak(), inputs.kernels);
    let per_thread = match inputs.kernels {
        Kernels::Cpu { threads } => format!(
            " + {} + {} per thread x {threads}",
            gib(RESERVE_PER_PROCESS),
            gib(RESERVE_PER_THREAD)
        ),
        Kernels::Default => String::new(),
    };
    plan.items.push(Item {
        what: format!(
            "allocator reserve ({:.0}% of the above{per_thread}: freed memory the allocator keeps)",
            100.0 * RESERVE_FRACTION
        ),
        bytes: reserve,
        phase: Phase::Reserve,
    });
    if inputs.engine_reservation > 0 {
        plan.items.push(Item {
            what: "the inference engine on this device ([devices] engine_memory_gib)".into(),
            bytes: inputs.engine_reservation,
            phase: Phase::Held,
        });
    }
    plan
}

/// The allocator's reserve for `bytes` of tensors on `kernels`' backend
/// ([`RESERVE_FRACTION`]; on the CPU also [`RESERVE_PER_PROCESS`] and
/// [`RESERVE_PER_THREAD`]).
pub fn reserve_for(bytes: u64, kernels: Kernels) -> u64 {
    let fraction = saturating(bytes as f64 * RESERVE_FRACTION);
    let fixed = match kernels {
        Kernels::Cpu { threads } => {
            RESERVE_PER_PROCESS.saturating_add(RESERVE_PER_THREAD.saturating_mul(threads as u64))
        }
        Kernels::Default => 0,
    };
    fraction.saturating_add(fixed)
}

impl MemoryPlan {
    /// The bytes of one phase's items.
    pub fn phase(&self, phase: Phase) -> u64 {
        self.items
            .iter()
            .filter(|i| i.phase == phase)
            .fold(0u64, |sum, i| sum.saturating_add(i.bytes))
    }

    /// The held bytes and the allocator's reserve plus the largest phase.
    pub fn peak(&self) -> u64 {
        let phases = [Phase::Update, Phase::Logprobs, Phase::Rollout, Phase::Load];
        let largest = phases.iter().map(|&p| self.phase(p)).max().unwrap_or(0);
        self.phase(Phase::Held)
            .saturating_add(self.phase(Phase::Reserve))
            .saturating_add(largest)
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
            kernels: Kernels::Default,
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

    fn update(model: &TransformerConfig, training: Training, m: usize, s: usize) -> u64 {
        let shape = UpdateShape {
            micro_batch: m,
            prompt: s / 2,
            completion: s / 2,
            recompute_layers: false,
            fused_attention: false,
            kernels: Kernels::Cpu { threads: 2 },
        };
        update_bytes(model, training, shape)
    }

    #[test]
    fn activations_grow_with_the_micro_batch_and_the_square_of_the_sequence() {
        let model = qwen3_4b();
        let lora = Training::lora(&model, &LoraConfig::new(32, 64.0));
        let a1 = update(&model, lora, 1, 1024);
        assert_eq!(update(&model, lora, 2, 1024), 2 * a1);
        let a4 = update(&model, lora, 1, 4096);
        assert!(a4 > 4 * a1 && a4 < 16 * a1);
        let with = |recompute_layers, fused_attention| UpdateShape {
            micro_batch: 1,
            prompt: 512,
            completion: 512,
            recompute_layers,
            fused_attention,
            kernels: Kernels::Cpu { threads: 2 },
        };
        // Layer by layer: one layer's graph instead of every layer's.
        let r1 = update_bytes(&model, lora, with(true, false));
        assert!(r1 < a1 / 4, "{r1} against {a1}");
        // Fused attention: linear in the sequence length.
        let f1 = update_bytes(&model, lora, with(false, true));
        let f4 = update_bytes(
            &model,
            lora,
            UpdateShape {
                prompt: 2048,
                completion: 2048,
                ..with(false, true)
            },
        );
        assert!(f1 < a1 && f4 < 4 * f1 + f1 / 10, "{f1} {f4}");
    }

    #[test]
    fn a_full_update_holds_every_gradient_at_least_and_the_head_gradient_with_the_activations() {
        let model = qwen3_4b();
        let full = Training::full(&model);
        let x = Dims::of(&model);
        // One short sequence: the optimiser's step (all gradients, AdamW's
        // temporaries of the largest tensor) is the peak.
        let short = update(&model, full, 1, 16);
        assert_eq!(short, bytes(full.params + 2.0 * full.largest));
        // Long sequences: the activations, with the head's gradient made
        // at the start of the backward pass.
        let long = update(&model, full, 4, 4096);
        let lora = Training {
            head: false,
            ..full
        };
        assert!(long > update(&model, lora, 4, 4096) + bytes(x.vocab * x.h) - 1);
    }

    #[test]
    fn the_allocator_reserve_is_a_fraction_of_the_tensors_and_on_the_cpu_a_share_per_thread() {
        let gib = 1u64 << 30;
        assert_eq!(reserve_for(10 * gib, Kernels::Default), 2 * gib);
        assert_eq!(
            reserve_for(10 * gib, Kernels::Cpu { threads: 4 }),
            2 * gib + RESERVE_PER_PROCESS + 4 * RESERVE_PER_THREAD
        );
        let cpu = |threads| {
            let mut i = inputs(Some(LoraConfig::new(32, 64.0)));
            i.kernels = Kernels::Cpu { threads };
            plan(&i)
        };
        assert_eq!(cpu(8).peak() - cpu(2).peak(), 6 * RESERVE_PER_THREAD);
        assert!(cpu(2)
            .render()
            .contains("allocator reserve (20% of the above"));
    }

    #[test]
    fn loading_a_bf16_base_holds_it_in_f32_before_any_adamw_moment_exists() {
        let mut i = inputs(Some(LoraConfig::new(32, 64.0)));
        i.bf16_base = true;
        i.micro_batch = 0;
        i.rollout_batch = 0;
        i.agents.iter_mut().for_each(|a| a.actions_per_step = 0);
        let p = plan(&i);
        let moments: u64 = p
            .items
            .iter()
            .filter(|i| i.what.contains("AdamW"))
            .map(|i| i.bytes)
            .sum();
        let narrowed = bytes(Bf16Linear::of(&qwen3_4b()).all / 2.0);
        assert_eq!(p.phase(Phase::Load), narrowed - moments);
        assert!(p.render().contains("loading base qwen3-4b in f32"));
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
