//! Times the benchmark workloads and writes JSON rows in the schema of
//! `torch_bench.py`, for `benches/compare.py` (run by `just bench-vs-torch`)
//! and for the CPU backend comparison (`just bench-backends`).

use std::time::Instant;

use clap::Parser;
use mappa_benches::*;
use mappa_model::AutodiffModelBackend;
use serde_json::json;

#[derive(Parser)]
#[command(about = "Time mappa's model workloads and print JSON rows")]
struct Args {
    /// Backend to run on: flex, or ndarray / cuda / wgpu when built with that feature.
    #[arg(long, default_value = "flex")]
    backend: String,
    /// Model sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values = ["1m", "25m"])]
    configs: Vec<Size>,
    /// Workloads to run, comma-separated (forward, train_step, generate).
    #[arg(long, value_delimiter = ',', default_values = ["forward", "train_step", "generate"])]
    workloads: Vec<String>,
    /// Few repetitions, for a smoke test.
    #[arg(long)]
    quick: bool,
    /// Write the JSON here as well as to stdout.
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

/// (warm-up, timed) iterations per workload and size, as in torch_bench.py.
fn iterations(size: Size, workload: &str, quick: bool) -> (usize, usize) {
    if quick {
        return (1, 2);
    }
    match (size, workload) {
        (Size::M1, "forward") | (Size::M1, "train_step") => (2, 10),
        (Size::M1, _) => (1, 5),
        (Size::M25, "forward") => (1, 5),
        (Size::M25, "train_step") => (1, 4),
        (Size::M25, _) => (1, 3),
    }
}

/// A named workload, the tokens one run of it processes, and the run itself.
type Workload<'a> = (&'static str, usize, Box<dyn FnMut() + 'a>);

fn median_seconds(warmup: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..warmup {
        f();
    }
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn run<B: AutodiffModelBackend>(
    name: &str,
    args: &Args,
    device: &B::Device,
) -> Vec<serde_json::Value> {
    let mut rows = Vec::new();
    for &size in &args.configs {
        let config = size.config();
        let model = config.init::<B::InnerBackend>(0, device);
        let ids = random_tokens(config.vocab_size, BATCH, SEQ, 1);
        let tokens = to_tensor::<B::InnerBackend>(&ids, device);
        let mut trainer = Trainer::<B>::new(&config, device);
        let train_tokens = to_tensor::<B>(&ids, device);
        let prompts = random_tokens(config.vocab_size, BATCH, PROMPT, 2);
        let workloads: [Workload<'_>; 3] = [
            (
                "forward",
                BATCH * SEQ,
                Box::new(|| {
                    forward(&model, &tokens);
                }),
            ),
            (
                "train_step",
                BATCH * SEQ,
                Box::new(|| {
                    trainer.step(&train_tokens);
                }),
            ),
            (
                "generate",
                BATCH * NEW_TOKENS,
                Box::new(|| {
                    generate_greedy(&model, &prompts);
                }),
            ),
        ];
        for (workload, tokens_per_iter, f) in workloads {
            if !args.workloads.iter().any(|w| w == workload) {
                continue;
            }
            let (warmup, iters) = iterations(size, workload, args.quick);
            let median = median_seconds(warmup, iters, f);
            let row = json!({
                "impl": format!("burn-{name}"),
                "config": size.name(),
                "params": config.num_params(),
                "workload": workload,
                "tokens_per_iter": tokens_per_iter,
                "median_s": median,
                "tokens_per_s": tokens_per_iter as f64 / median,
                "iters": iters,
                "threads": std::thread::available_parallelism().map_or(1, |n| n.get()),
                "versions": {"burn": "0.21.0"},
            });
            eprintln!(
                "{name} {:>3} {workload:<10} {:>10.0} tok/s",
                size.name(),
                tokens_per_iter as f64 / median
            );
            rows.push(row);
        }
    }
    rows
}

fn main() {
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
