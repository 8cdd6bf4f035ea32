//! Times the benchmark workloads and writes JSON rows in the schema of
//! `torch_bench.py`, for `benches/compare.py` (run by `just bench-vs-torch`)
//! and for the CPU backend comparison (`just bench-backends`). Each row also
//! holds `core_round_trip_ns`, how far apart the host ran two threads just
//! before it ([`mappa_benches::core_distance`]), and `cpu_loop_us`, how long
//! each CPU took for the same loop of arithmetic just before it
//! ([`mappa_benches::cpu_speed`]).

use clap::Parser;
use mappa_benches::*;
use mappa_model::weights::load_transformer;
use mappa_model::{AutodiffModelBackend, Transformer};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Time mappa's model workloads and print JSON rows")]
struct Args {
    /// Backend to run on: flex, or ndarray / cuda / wgpu / tch when built with that feature.
    #[arg(long, default_value = "flex")]
    backend: String,
    /// Configurations, comma-separated: 1m, 25m (random weights, batch 8),
    /// smol-b1, smol-b8 (SmolLM2-135M-Instruct from `--smol-dir`).
    #[arg(long, value_delimiter = ',', default_values = ["1m", "25m", "smol-b1", "smol-b8"])]
    configs: Vec<BenchConfig>,
    /// Workloads to run, comma-separated (forward, train_step, generate).
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = ["forward", "train_step", "generate"],
        default_values = ["forward", "train_step", "generate"]
    )]
    workloads: Vec<String>,
    /// The real model's directory (`just models` installs it).
    #[arg(long, default_value = SMOL_DIR)]
    smol_dir: std::path::PathBuf,
    /// Few repetitions, for a smoke test.
    #[arg(long)]
    quick: bool,
    /// Write the JSON here as well as to stdout.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// Cache-line round trips between two threads measured before each workload
/// (at most 100 ms of them): the `core_round_trip_ns` of its row.
const ROUND_TRIPS: u32 = 100_000;

/// Rounds of `cpu_speed`'s loop run on every CPU before each workload
/// (about a millisecond and a half on the Zen 4): the `cpu_loop_us` of its row.
const CPU_LOOP_ROUNDS: u32 = 400_000;

/// (warm-up, timed) iterations per configuration and workload, as in torch_bench.py.
fn iterations(config: BenchConfig, workload: &str, quick: bool) -> (usize, usize) {
    if quick {
        return (1, 2);
    }
    match (config, workload) {
        (BenchConfig::Sized(Size::M1), "forward" | "train_step") => (2, 10),
        (BenchConfig::Sized(Size::M1), _) => (1, 5),
        (BenchConfig::Sized(Size::M25), "forward") => (1, 5),
        (BenchConfig::Sized(Size::M25), "train_step") => (1, 4),
        (BenchConfig::Sized(Size::M25), _) => (1, 3),
        (BenchConfig::Sized(Size::M135 | Size::M500), _) => (1, 3),
        (BenchConfig::Smol { .. }, _) => (1, 3),
    }
}

/// A named workload, the tokens one run of it processes, and the run itself.
type Workload<'a> = (&'static str, usize, Box<dyn FnMut() + 'a>);

/// The inference model and the trainer of `config`: random weights, or the
/// real model loaded twice (the trainer's copy changes as it trains).
fn models<B: AutodiffModelBackend>(
    config: BenchConfig,
    smol_dir: &std::path::Path,
    device: &B::Device,
) -> (Transformer<B::InnerBackend>, Trainer<B>) {
    match config {
        BenchConfig::Sized(size) => {
            let config = size.config();
            (
                config.init::<B::InnerBackend>(0, device),
                Trainer::<B>::new(&config, device),
            )
        }
        BenchConfig::Smol { .. } => {
            let model = load_transformer::<B::InnerBackend>(smol_dir, device)
                .unwrap_or_else(|e| no_real_model(smol_dir, e));
            let trained = load_transformer::<B>(smol_dir, device)
                .unwrap_or_else(|e| no_real_model(smol_dir, e));
            (model, Trainer::from_model(trained))
        }
    }
}

fn no_real_model(dir: &std::path::Path, e: mappa_model::ModelError) -> ! {
    eprintln!(
        "{}: {e}\n(the smol-* configurations need the real model: run `just models`)",
        dir.display()
    );
    std::process::exit(1);
}

fn run<B: AutodiffModelBackend>(
    name: &str,
    args: &Args,
    device: &B::Device,
) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for &bench in &args.configs {
        let (model, mut trainer) = models::<B>(bench, &args.smol_dir, device);
        let config = model.config().clone();
        let batch = bench.batch();
        let ids = random_tokens(config.vocab_size, batch, SEQ, 1);
        let tokens = to_tensor::<B::InnerBackend>(&ids, device);
        let train_tokens = to_tensor::<B>(&ids, device);
        let prompts = random_tokens(config.vocab_size, batch, PROMPT, 2);
        let workloads: [Workload<'_>; 3] = [
            (
                "forward",
                batch * SEQ,
                Box::new(|| {
                    forward(&model, &tokens);
                }),
            ),
            (
                "train_step",
                batch * SEQ,
                Box::new(|| {
                    trainer.step(&train_tokens);
                }),
            ),
            (
                "generate",
                batch * NEW_TOKENS,
                Box::new(|| {
                    generate_greedy(&model, &prompts);
                }),
            ),
        ];
        for (workload, tokens_per_iter, f) in workloads {
            if !args.workloads.iter().any(|w| w == workload) {
                continue;
            }
            let (warmup, iters) = iterations(bench, workload, args.quick);
            // Where the host runs the two threads right now (it moves them).
            let round_trip_ns = core_distance::core_round_trip_ns(
                ROUND_TRIPS,
                std::time::Duration::from_millis(100),
            );
            // How fast each CPU computes right now (the host slows one at times).
            let cpu_loop_us = cpu_speed::cpu_loop_us(CPU_LOOP_ROUNDS);
            let started_unix_s = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64());
            let median = median_seconds(warmup, iters, f);
            let row = json!({
                "impl": format!("burn-{name}"),
                "config": bench.name(),
                "params": config.num_params(),
                "workload": workload,
                "tokens_per_iter": tokens_per_iter,
                "median_s": median,
                "tokens_per_s": tokens_per_iter as f64 / median,
                "iters": iters,
                "core_round_trip_ns": round_trip_ns,
                "cpu_loop_us": cpu_loop_us,
                "started_unix_s": started_unix_s,
                "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
                "versions": {"burn": "0.21.0"},
            });
            eprintln!(
                "{name} {:>7} {workload:<10} {:>10.0} tok/s  (cores' round trip {round_trip_ns:.0} ns; \
                 each CPU's loop {} us)",
                bench.name(),
                tokens_per_iter as f64 / median,
                cpu_loop_us
                    .iter()
                    .map(|us| format!("{us:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            rows.push(row);
        }
    }
    rows
}

// As the `mappa` binary allocates.
#[global_allocator]
static ALLOCATOR: mappa_model::kernels::alloc::Allocator = mappa_model::kernels::alloc::Allocator;

fn main() {
    mappa_model::kernels::alloc::keep_freed_memory();
    let args = Args::parse();
    let rows = match args.backend.as_str() {
        "flex" => run::<mappa_model::backend::CpuAutodiff>("flex", &args, &Default::default()),
        #[cfg(feature = "ndarray")]
        "ndarray" => {
            run::<Autodiff<mappa_model::backend::NdArray>>("ndarray", &args, &Default::default())
        }
        #[cfg(feature = "cuda")]
        "cuda" => run::<burn::backend::Autodiff<mappa_model::backend::Cuda>>(
            "cuda",
            &args,
            &Default::default(),
        ),
        #[cfg(feature = "tch")]
        "tch" => run::<burn::backend::Autodiff<mappa_model::backend::LibTorch>>(
            "tch",
            &args,
            &Default::default(),
        ),
        #[cfg(feature = "wgpu")]
        "wgpu" => run::<burn::backend::Autodiff<mappa_model::backend::Wgpu>>(
            "wgpu",
            &args,
            &Default::default(),
        ),
        other => {
            let built: Vec<&str> = [
                (true, "flex"),
                (cfg!(feature = "ndarray"), "ndarray"),
                (cfg!(feature = "cuda"), "cuda"),
                (cfg!(feature = "wgpu"), "wgpu"),
                (cfg!(feature = "tch"), "tch"),
            ]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect();
            eprintln!(
                "backend `{other}` is not available in this build (built: {}; enable the cargo feature of the same name)",
                built.join(", ")
            );
            std::process::exit(2);
        }
    };
    let text = serde_json::to_string_pretty(&rows).expect("rows serialise");
    if let Some(path) = &args.out {
        mappa_core::fs::write_atomic(path, text.as_bytes()).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1);
        });
    }
    println!("{text}");
}
