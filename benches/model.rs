//! criterion benches of the model: forward, training step and KV-cache
//! generation, for the ~1M and ~26M parameter configs, on the default CPU
//! backend (`flex`). Throughput is reported in tokens.

// `criterion_group!` defines a public function without docs.
#![allow(missing_docs)] // criterion's macros generate undocumented items

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use mappa_benches::*;
use mappa_model::backend::{Cpu, CpuAutodiff};

fn benches(c: &mut Criterion) {
    let device = Default::default();
    for size in Size::ALL {
        let config = size.config();
        let model = config.init::<Cpu>(0, &device);
        let ids = random_tokens(config.vocab_size, BATCH, SEQ, 1);
        let tokens = to_tensor::<Cpu>(&ids, &device);
        let mut group = c.benchmark_group(format!("model-{}", size.name()));
        group.sample_size(10);
        group.throughput(Throughput::Elements((BATCH * SEQ) as u64));
        group.bench_function("forward", |b| b.iter(|| forward(&model, &tokens)));

        let mut trainer = Trainer::<CpuAutodiff>::new(&config, &device);
        let train_tokens = to_tensor::<CpuAutodiff>(&ids, &device);
        group.bench_function("train_step", |b| b.iter(|| trainer.step(&train_tokens)));

        let prompts = random_tokens(config.vocab_size, BATCH, PROMPT, 2);
        group.throughput(Throughput::Elements((BATCH * NEW_TOKENS) as u64));
        group.bench_function("generate", |b| b.iter(|| generate_greedy(&model, &prompts)));
        group.finish();
    }
}

criterion_group!(model, benches);
criterion_main!(model);
