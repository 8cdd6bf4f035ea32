//! `just bench-memory`: peak memory and step time of training steps, full
//! fine-tuning against LoRA adapters, one agent against three on one base,
//! and the inference phases, each configuration in a fresh process, next
//! to what the memory plan (`mappa_train::memory`) predicts for it
//! ([`mappa_benches::memory`]). Exits with an error when a plan is under
//! its measured peak or more than 20% over it.

use std::path::PathBuf;
use std::process::Command;

use burn::backend::autodiff::checkpoint::strategy::BalancedCheckpointing;
use burn::backend::Autodiff;
use clap::Parser;
use mappa_benches::counting::{Counting, CountingMeter};
use mappa_benches::memory::{self, Measured, ProcessMemory, Shape, Weights, PLAN_SLACK};
use mappa_model::kernels::alloc::Allocator;

/// Without checkpointing: every saved tensor is kept for the backward pass.
type Plain = Autodiff<mappa_model::backend::Cpu>;
/// burn's balanced checkpointing: outputs of memory-bound operations are
/// recomputed in the backward pass instead of kept.
type Checkpointed = Autodiff<mappa_model::backend::Cpu, BalancedCheckpointing>;

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
    /// The configurations, comma-separated (see `mappa_benches::memory`):
    /// `full-N`, `lora-N`, `logprob-N`, `generate-N`, each followed by any
    /// of `-ckpt`, `-layers`, `-fused`, `-bf16`, `-dp`.
    #[arg(long, value_delimiter = ',', default_value = memory::CONFIGS)]
    configs: Vec<String>,
}

impl Args {
    fn shape(&self) -> Shape {
        Shape {
            batch: self.batch,
            prompt: self.prompt,
            completion: self.completion,
        }
    }
}

fn child(config: &str, args: &Args) -> Result<Measured, String> {
    let mut meter = CountingMeter::new(&ALLOCATOR, Some(ProcessMemory::new()));
    let weights = Weights::Checkpoint(args.model.clone());
    let (_, _, modifiers) = memory::parse(config)?;
    match modifiers.checkpointing {
        true => memory::measure::<Checkpointed>(config, args.shape(), &weights, &mut meter),
        false => memory::measure::<Plain>(config, args.shape(), &weights, &mut meter),
    }
}

/// The `mappa` binary's allocator, counting the bytes it has out.
#[global_allocator]
static ALLOCATOR: Counting<Allocator> = Counting::new(Allocator);

fn main() {
    mappa_model::kernels::alloc::keep_freed_memory();
    let args = Args::parse();
    if let Some(config) = &args.child {
        match child(config, &args) {
            Ok(m) => println!("{}", serde_json::to_string(&m).expect("json")),
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let mut results = Vec::new();
    for config in &args.configs {
        eprintln!("== {config}");
        let out = Command::new(&exe)
            .args(["--child", config.as_str(), "--model"])
            .arg(&args.model)
            .args(["--batch", &args.batch.to_string()])
            .args(["--prompt", &args.prompt.to_string()])
            .args(["--completion", &args.completion.to_string()])
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
    print!("{}", memory::table(&results));
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&results).expect("json"))
            .expect("writing --out");
    }
    let outside: Vec<&str> = results
        .iter()
        .filter(|r| memory::within_bound(r) == Some(false))
        .map(|r| r.config.as_str())
        .collect();
    if !outside.is_empty() {
        eprintln!(
            "the plan is under the measured peak, or more than {:.0}% over it, for: {}",
            100.0 * PLAN_SLACK,
            outside.join(", ")
        );
        std::process::exit(1);
    }
}
