//! `just bench-memory`: peak memory and step time of training steps, full
//! fine-tuning against LoRA adapters, one agent against three on one base,
//! each configuration in a fresh process, next to what the memory plan
//! (`mappa_train::memory`) predicts for it.
//!
//! A child loads the model(s), builds the learners and runs one warm-up
//! update per agent (so that the allocator reaches its steady state and
//! the AdamW moments exist), then resets the kernel's peak-RSS counter
//! (`/proc/self/clear_refs`, 5) and runs one more update per agent. The
//! measured figure is that peak (`VmHWM`) less the process's resident size
//! before any model was loaded; the predicted one is the plan's held bytes
//! plus its update phase (no rollout or log-prob pass is in the window).
//!
//! Two more configurations check the plan's inference phases, without
//! autodiff: `logprob-N` (the log-probs of N sequences in one pass, as the
//! trainer's old and reference log-probs) and `generate-N` (N sequences
//! generated together, greedily, to the completion length); each is
//! measured after one warm-up call, against the weights plus the plan's
//! log-prob or rollout phase.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::Autodiff;
use burn::tensor::backend::DeviceOps;
use clap::Parser;
use mappa_core::RngStream;
use mappa_model::weights::load_transformer;
use mappa_model::{AutodiffModelBackend, LoraConfig, Transformer, TransformerConfig};
use mappa_train::config::BaseDtype;
use mappa_train::memory::{plan, AgentShape, Phase, PlanInputs, GIB};
use mappa_train::{AgentLearner, LossConfig, TrainConfig, TrainSample};
use serde::{Deserialize, Serialize};

/// Without checkpointing: every saved tensor is kept for the backward pass.
type Plain = Autodiff<mappa_model::backend::Cpu>;
/// burn's balanced checkpointing: outputs of memory-bound operations are
/// recomputed in the backward pass instead of kept.
type Checkpointed = Autodiff<mappa_model::backend::Cpu, BalancedCheckpointing>;
/// The CUDA backend (`--features cuda`): step times only.
#[cfg(feature = "cuda")]
type OnCuda = Autodiff<mappa_model::backend::Cuda>;

#[derive(Parser, Debug)]
struct Args {
    /// The checkpoint to train (default: SmolLM2-135M from `just models`).
    #[arg(long, default_value = mappa_benches::SMOL_DIR)]
    model: PathBuf,
    /// Run one configuration (see `--configs`) and print its JSON.
    #[arg(long)]
    child: Option<String>,
    /// Sequences per update (one micro-batch).
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Prompt tokens per sequence.
    #[arg(long, default_value_t = 64)]
    prompt: usize,
    /// Completion tokens per sequence.
    #[arg(long, default_value_t = 64)]
    completion: usize,
    /// Write the results here as JSON.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The configurations, comma-separated: `full-N` or `lora-N` (an update
    /// of N agents on one base), `logprob-N` and `generate-N` (inference
    /// phases of N sequences), each followed by any of `-ckpt` (burn's
    /// checkpointing), `-layers` (`train.recompute_layers`), `-fused`
    /// (`train.attention = "fused"`), `-bf16` (`train.base_dtype = "bf16"`,
    /// LoRA only), `-dp` (data-parallel over two devices, or one twice) and
    /// `-cuda` (the CUDA backend, in a build with `--features cuda`; step
    /// time only).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "full-1,lora-1,full-3,lora-3,full-1-ckpt,lora-1-ckpt,full-1-layers,lora-1-layers,lora-1-fused,lora-1-layers-fused,lora-1-bf16,lora-3-bf16,lora-1-layers-bf16,lora-1-dp,logprob-16,logprob-16-fused,generate-16,generate-16-fused"
    )]
    configs: Vec<String>,
}

/// One configuration's measurement.
#[derive(Debug, Serialize, Deserialize)]
struct Measured {
    config: String,
    agents: usize,
    lora: bool,
    checkpointing: bool,
    /// Seconds of one update (mean over agents).
    step_seconds: f64,
    /// Completion tokens trained per second.
    tokens_per_second: f64,
    /// Peak resident bytes during the measured updates, less the program's
    /// own (none on a GPU, whose memory the process's RSS does not show).
    measured_bytes: Option<u64>,
    /// The memory plan's peak for the same shapes.
    predicted_bytes: u64,
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in /proc/self/status"))
}

fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5")
        .expect("resetting the peak RSS (/proc/self/clear_refs)");
}

fn lora() -> LoraConfig {
    LoraConfig::new(16, 32.0)
}

fn samples<B: AutodiffModelBackend>(
    learner: &AgentLearner<B>,
    args: &Args,
    vocab: usize,
    seed: u64,
) -> Vec<TrainSample> {
    let mut rng = RngStream::from_u64(seed);
    let mut ids =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.below(vocab as u64) as u32).collect() };
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..args.batch)
        .map(|_| (ids(args.prompt), ids(args.completion)))
        .collect();
    let refs: Vec<(&[u32], &[u32])> = pairs
        .iter()
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let old = learner.policy_logprobs(&refs).expect("log-probs");
    let reference = learner.reference_logprobs(&refs).expect("log-probs");
    pairs
        .into_iter()
        .zip(old)
        .zip(reference)
        .enumerate()
        .map(
            |(i, (((prompt, completion), old_logprobs), ref_logprobs))| {
                let a = if i % 2 == 0 { 1.0 } else { -1.0 };
                TrainSample {
                    mask: vec![true; completion.len()],
                    advantages: vec![a; completion.len()],
                    prompt,
                    completion,
                    old_logprobs,
                    ref_logprobs,
                    reward: a as f64,
                }
            },
        )
        .collect()
}

/// The checkpoint, frozen and stored in bf16 with `-bf16`.
fn load_base<B: mappa_model::ModelBackend>(
    args: &Args,
    modifiers: Modifiers,
    device: &B::Device,
) -> Transformer<B> {
    let model = load_transformer(&args.model, device)
        .unwrap_or_else(|e| panic!("{}: {e} (run `just models`)", args.model.display()));
    base_dtype(modifiers)
        .store(model)
        .expect("a frozen base in bf16")
}

fn base_dtype(modifiers: Modifiers) -> BaseDtype {
    if modifiers.bf16_base {
        BaseDtype::Bf16
    } else {
        BaseDtype::F32
    }
}

fn attention(modifiers: Modifiers) -> mappa_model::AttentionKind {
    if modifiers.fused_attention {
        mappa_model::AttentionKind::Fused
    } else {
        mappa_model::AttentionKind::Dense
    }
}

fn predicted(
    model: &TransformerConfig,
    agents: usize,
    lora: bool,
    modifiers: Modifiers,
    args: &Args,
) -> u64 {
    let inputs = PlanInputs {
        agents: (0..agents)
            .map(|i| AgentShape {
                role: format!("agent{i}"),
                model: model.clone(),
                base: "base".into(),
                prompt_tokens: args.prompt,
                actions_per_step: args.batch,
                recompute_layers: modifiers.recompute_layers,
                fused_attention: modifiers.fused_attention,
                replica: false,
            })
            .collect(),
        lora: lora.then(self::lora),
        bf16_base: modifiers.bf16_base,
        micro_batch: args.batch / workers(modifiers),
        completion_tokens: args.completion,
        rollout_batch: args.batch,
        capacity: None,
        engine_reservation: 0,
    };
    // What the measured window holds: the held bytes and one update (per
    // worker: data-parallel workers on the CPU share its memory; their
    // replicas share the weights' storage).
    let plan = plan(&inputs);
    plan.phase(Phase::Held) + workers(modifiers) as u64 * plan.phase(Phase::Update)
}

/// Workers of an update: two with `-dp`, else one.
fn workers(modifiers: Modifiers) -> usize {
    if modifiers.data_parallel {
        2
    } else {
        1
    }
}

/// What a configuration's suffixes ask for.
#[derive(Debug, Clone, Copy, Default)]
struct Modifiers {
    /// `-ckpt`: burn's `BalancedCheckpointing`.
    checkpointing: bool,
    /// `-layers`: `train.recompute_layers`.
    recompute_layers: bool,
    /// `-fused`: `train.attention = "fused"`.
    fused_attention: bool,
    /// `-bf16`: `train.base_dtype = "bf16"` (LoRA only).
    bf16_base: bool,
    /// `-cuda`: the CUDA backend.
    cuda: bool,
    /// `-dp`: each update data-parallel over two devices (devices 0 and 1
    /// where the backend has two, else device 0 twice), one micro-batch of
    /// half the sequences each, gradients summed by burn's collective.
    data_parallel: bool,
}

fn child(config: &str, args: &Args) -> Measured {
    let mut parts = config.split('-');
    let kind = parts.next().unwrap_or_default();
    let n: usize = parts
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{config}: expected KIND-N[-MODIFIER...]"));
    let mut modifiers = Modifiers::default();
    for modifier in parts {
        match modifier {
            "ckpt" => modifiers.checkpointing = true,
            "layers" => modifiers.recompute_layers = true,
            "fused" => modifiers.fused_attention = true,
            "bf16" => modifiers.bf16_base = true,
            "cuda" => modifiers.cuda = true,
            "dp" => modifiers.data_parallel = true,
            other => {
                panic!("{config}: unknown modifier {other:?} (ckpt, layers, fused, bf16, dp, cuda)")
            }
        }
    }
    match kind {
        "logprob" | "generate" => inference(config, n, kind == "generate", modifiers, args),
        "full" | "lora" if modifiers.cuda => {
            #[cfg(feature = "cuda")]
            return measure::<OnCuda>(config, kind == "lora", n, modifiers, args);
            #[cfg(not(feature = "cuda"))]
            panic!("{config}: this build has no CUDA backend (build with --features cuda)");
        }
        "full" | "lora" if modifiers.checkpointing => {
            measure::<Checkpointed>(config, kind == "lora", n, modifiers, args)
        }
        "full" | "lora" => measure::<Plain>(config, kind == "lora", n, modifiers, args),
        other => panic!("{config}: unknown kind {other:?} (full, lora, logprob, generate)"),
    }
}

/// One inference phase of `n` sequences: a log-prob pass, or generation.
fn inference(
    config: &str,
    n: usize,
    generating: bool,
    modifiers: Modifiers,
    args: &Args,
) -> Measured {
    use mappa_model::{completion_logprobs, generate_greedy, GenerationConfig};
    let own = status_kib("VmRSS:") * 1024;
    let model: Transformer<mappa_model::Cpu> = load_base(args, modifiers, &Default::default());
    let model = model.with_attention(attention(modifiers));
    let shape = model.config().clone();
    let mut rng = RngStream::from_u64(7);
    let mut ids = |len: usize| -> Vec<u32> {
        (0..len)
            .map(|_| rng.below(shape.vocab_size as u64) as u32)
            .collect()
    };
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = (0..n)
        .map(|_| (ids(args.prompt), ids(args.completion)))
        .collect();
    let prompts: Vec<Vec<u32>> = pairs.iter().map(|(p, _)| p.clone()).collect();
    let mut config_gen = GenerationConfig::greedy(args.completion);
    // Random prompts: run to the full length, whatever is sampled.
    config_gen.eos_token_ids = Vec::new();
    let run = || {
        if generating {
            generate_greedy(&model, None, &prompts, &config_gen).expect("generation");
        } else {
            completion_logprobs(&model, &pairs, 1.0).expect("log-probs");
        }
    };
    run();
    reset_peak();
    let start = Instant::now();
    run();
    let seconds = start.elapsed().as_secs_f64();
    let peak = (status_kib("VmHWM:") * 1024).saturating_sub(own);
    let x = &shape;
    let phase = if generating {
        mappa_train::memory::rollout_bytes(
            x,
            n,
            args.prompt,
            args.completion,
            modifiers.fused_attention,
        )
    } else {
        mappa_train::memory::logprob_pass_bytes(
            x,
            n,
            args.prompt,
            args.completion,
            modifiers.fused_attention,
        )
    };
    Measured {
        config: config.to_string(),
        agents: 1,
        lora: false,
        checkpointing: false,
        step_seconds: seconds,
        tokens_per_second: (n * args.completion) as f64 / seconds,
        measured_bytes: Some(peak),
        predicted_bytes: if modifiers.bf16_base {
            let (held, widened) = mappa_train::memory::bf16_base_inference_bytes(&shape);
            held + widened + phase
        } else {
            4 * shape.num_params() as u64 + phase
        },
    }
}

fn measure<B: AutodiffModelBackend>(
    config: &str,
    lora: bool,
    agents: usize,
    modifiers: Modifiers,
    args: &Args,
) -> Measured {
    let own = status_kib("VmRSS:") * 1024;
    let device = Default::default();
    let base: Transformer<B> = load_base(args, modifiers, &device);
    let model_config = base.config().clone();
    let second = match B::device_count(device.id().type_id) {
        0 | 1 => device.clone(),
        _ => mappa_train::data_parallel::devices_of_box::<B>(&device, 2)
            .expect("devices 0 and 1")
            .remove(1),
    };
    let train = TrainConfig {
        lr: 1e-5,
        micro_batch_size: args.batch / workers(modifiers),
        lora: lora.then(self::lora),
        recompute_layers: mappa_train::config::Recompute::All(modifiers.recompute_layers),
        attention: attention(modifiers),
        base_dtype: base_dtype(modifiers),
        ..Default::default()
    };
    let mut learners: Vec<AgentLearner<B>> = (0..agents)
        .map(|i| {
            // Every agent starts from the one loaded base (shared storage).
            let mut policy = base.clone();
            if lora {
                policy = policy
                    .with_lora(&self::lora(), &mut RngStream::from_u64(i as u64))
                    .expect("LoRA");
            }
            let learner =
                AgentLearner::new(format!("agent{i}"), policy, train.clone()).expect("learner");
            match modifiers.data_parallel {
                true => learner
                    .with_data_parallel(vec![device.clone(), second.clone()])
                    .expect("devices"),
                false => learner,
            }
        })
        .collect();
    drop(base);
    let loss = LossConfig {
        clip_low: 0.2,
        clip_high: 0.2,
        dual_clip: None,
        kl_in_loss: None,
    };
    let vocab = model_config.vocab_size;
    let batches: Vec<Vec<TrainSample>> = learners
        .iter()
        .enumerate()
        .map(|(i, l)| samples(l, args, vocab, i as u64))
        .collect();
    for (learner, batch) in learners.iter_mut().zip(&batches) {
        learner.train_step(batch, &loss).expect("warm-up update");
    }
    reset_peak();
    let start = Instant::now();
    for (learner, batch) in learners.iter_mut().zip(&batches) {
        learner.train_step(batch, &loss).expect("update");
    }
    B::sync(&device).expect("waiting for the device");
    let seconds = start.elapsed().as_secs_f64() / agents as f64;
    let on_cpu = !config.ends_with("-cuda");
    let peak = on_cpu.then(|| (status_kib("VmHWM:") * 1024).saturating_sub(own));
    Measured {
        config: config.to_string(),
        agents,
        lora,
        checkpointing: modifiers.checkpointing,
        step_seconds: seconds,
        tokens_per_second: (args.batch * args.completion) as f64 / seconds,
        measured_bytes: peak,
        predicted_bytes: predicted(&model_config, agents, lora, modifiers, args),
    }
}

// As the `mappa` binary allocates.
#[global_allocator]
static ALLOCATOR: mappa_model::kernels::alloc::Allocator = mappa_model::kernels::alloc::Allocator;

fn main() {
    mappa_model::kernels::alloc::keep_freed_memory();
    let args = Args::parse();
    if let Some(config) = &args.child {
        println!(
            "{}",
            serde_json::to_string(&child(config, &args)).expect("json")
        );
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let mut results = Vec::new();
    for config in &args.configs {
        eprintln!("== {config}");
        let out = Command::new(&exe)
            .args(["--child", config.as_str(), "--model"])
            .arg(&args.model)
            .args([
                "--batch",
                &args.batch.to_string(),
                "--prompt",
                &args.prompt.to_string(),
                "--completion",
                &args.completion.to_string(),
            ])
            .output()
            .expect("running a child");
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            std::process::exit(1);
        }
        let m: Measured = serde_json::from_slice(&out.stdout).expect("child JSON");
        results.push(m);
    }
    println!(
        "model {}, batch {} x ({} prompt + {} completion) tokens, LoRA rank 16 on all projections",
        args.model.display(),
        args.batch,
        args.prompt,
        args.completion
    );
    println!("| config | step s | tok/s | peak measured GiB | plan GiB | plan error |");
    println!("|---|---:|---:|---:|---:|---:|");
    for m in &results {
        let (measured, error) = match m.measured_bytes {
            Some(b) => (
                format!("{:.3}", b as f64 / GIB),
                format!(
                    "{:+.1}%",
                    100.0 * (m.predicted_bytes as f64 / b as f64 - 1.0)
                ),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "| {} | {:.2} | {:.0} | {measured} | {:.3} | {error} |",
            m.config,
            m.step_seconds,
            m.tokens_per_second,
            m.predicted_bytes as f64 / GIB,
        );
    }
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&results).expect("json"))
            .expect("writing --out");
    }
}
