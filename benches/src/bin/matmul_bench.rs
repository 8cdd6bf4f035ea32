//! Times the matrix products of a training step (`mappa_benches::products`)
//! through mappa's CPU matrix product, and writes JSON rows that
//! `torch_matmul.py` reads to time the same products in PyTorch
//! (`just bench-matmul`).

use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::prelude::*;
use burn::tensor::Distribution;
use clap::Parser;
use mappa_benches::products::{training_step_products, Layout, Product};
use mappa_benches::{median_seconds, BenchConfig, SEQ, SMOL_DIR};
use mappa_model::backend::Cpu;
use mappa_model::{kernels, ModelBackend, TransformerConfig};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Time the matrix products of a training step and print JSON rows")]
struct Args {
    /// Configurations, comma-separated: 1m, 25m, smol-b1, smol-b8 (the last
    /// two read SmolLM2-135M-Instruct's config.json from `--smol-dir`).
    #[arg(long, value_delimiter = ',', default_values = ["1m", "25m", "smol-b8"])]
    configs: Vec<BenchConfig>,
    /// The real model's directory (`just models` installs it).
    #[arg(long, default_value = SMOL_DIR)]
    smol_dir: PathBuf,
    /// Few repetitions, for a smoke test.
    #[arg(long)]
    quick: bool,
    /// Write the JSON here as well as to stdout.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// The model config of a benchmark configuration.
fn model_config(config: BenchConfig, smol_dir: &Path) -> TransformerConfig {
    match config {
        BenchConfig::Sized(size) => size.config(),
        BenchConfig::Smol { .. } => {
            let file = smol_dir.join("config.json");
            TransformerConfig::from_hf_file(&file).unwrap_or_else(|e| {
                eprintln!(
                    "matmul_bench: cannot read the real model's config {}: {e}\n\
                     (`just models` installs it; or leave smol-b1 / smol-b8 out of --configs)",
                    file.display()
                );
                std::process::exit(1);
            })
        }
    }
}

/// The factors of `product` in its layout, random, on the CPU backend.
fn factors(product: &Product) -> (Tensor<Cpu, 2>, Tensor<Cpu, 2>) {
    let (m, k, n) = (product.m, product.k, product.n);
    let device = Default::default();
    let random =
        |shape: [usize; 2]| Tensor::<Cpu, 2>::random(shape, Distribution::Default, &device);
    match product.layout {
        Layout::XWt => (random([m, k]), random([n, k]).transpose()),
        Layout::XW => (random([m, k]), random([k, n])),
        Layout::XtW => (random([k, m]).transpose(), random([k, n])),
    }
}

/// The median time of `f` and the timed runs it took: the counts follow
/// the first run's time (about 0.3 s of timed runs, 3 to 50, after one more
/// untimed run), the rule `torch_matmul.py` uses too.
fn timed(quick: bool, mut f: impl FnMut()) -> (f64, usize) {
    let start = Instant::now();
    f();
    let first = start.elapsed().as_secs_f64();
    let iters = if quick {
        2
    } else {
        ((0.3 / first.max(1e-9)) as usize).clamp(3, 50)
    };
    (median_seconds(1, iters, f), iters)
}

// As the `mappa` binary allocates.
#[global_allocator]
static ALLOCATOR: kernels::alloc::Allocator = kernels::alloc::Allocator;

fn main() {
    kernels::alloc::keep_freed_memory();
    let args = Args::parse();
    let threads = rayon::current_num_threads();
    let mut rows = Vec::new();
    for &bench in &args.configs {
        let config = model_config(bench, &args.smol_dir);
        let tokens = bench.batch() * SEQ;
        let (mut step_flop, mut step_seconds) = (0.0, 0.0);
        for product in training_step_products(&config, tokens) {
            let (lhs, rhs) = factors(&product);
            let (median, iters) = timed(args.quick, || {
                // As the model runs its products: inside a step.
                Cpu::run_step(|| drop(kernels::matmul(lhs.clone(), rhs.clone())));
            });
            let gflops = product.flop() / median / 1e9;
            eprintln!(
                "{:>7} {:<24} {:<6} {:>5}x{:>5}x{:>5} {gflops:>7.1} GFLOP/s",
                bench.name(),
                product.name,
                product.layout.name(),
                product.m,
                product.k,
                product.n
            );
            step_flop += product.flop() * product.count as f64;
            step_seconds += median * product.count as f64;
            rows.push(json!({
                "impl": "burn-flex",
                "config": bench.name(),
                "workload": format!("{} ({})", product.name, product.layout.name()),
                "layout": product.layout.name(),
                "m": product.m,
                "k": product.k,
                "n": product.n,
                "count": product.count,
                "median_s": median,
                "gflop_per_s": gflops,
                "iters": iters,
                "threads": threads,
            }));
        }
        eprintln!(
            "{:>7} all products of a training step: {:.1} ms, {:.1} GFLOP/s",
            bench.name(),
            step_seconds * 1e3,
            step_flop / step_seconds / 1e9
        );
        rows.push(json!({
            "impl": "burn-flex",
            "config": bench.name(),
            "workload": "all products of a training step",
            "median_s": step_seconds,
            "gflop_per_s": step_flop / step_seconds / 1e9,
            "threads": threads,
        }));
    }
    let text = serde_json::to_string_pretty(&rows).expect("rows serialise");
    println!("{text}");
    if let Some(out) = &args.out {
        mappa_core::fs::write_atomic(out, format!("{text}\n").as_bytes()).unwrap_or_else(|e| {
            eprintln!("matmul_bench: cannot write {}: {e}", out.display());
            std::process::exit(1);
        });
    }
}
