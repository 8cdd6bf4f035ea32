//! The memory plan's phases against the bytes actually allocated: each
//! configuration of a small random Qwen3-shaped model (QK-norm, tied
//! embeddings) is measured with a counting global allocator, and each
//! phase the plan counts (an update, a log-prob pass, a rollout; tensors
//! only, before the allocator's reserve) must cover how far the live bytes
//! rise above those held when it starts, and not by much more. (`just
//! bench-memory` sets the whole plan against SmolLM2's peak resident size.)

use std::alloc::System;
use std::sync::Mutex;

use mappa_benches::counting::{Counting, CountingMeter};
use mappa_benches::memory::{measure, Shape, Weights};
use mappa_model::AutodiffModelBackend;

#[global_allocator]
static ALLOCATOR: Counting<System> = Counting::new(System);

/// One measurement at a time: the counters are the process's.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

type Cpu = burn::backend::Autodiff<mappa_model::backend::Cpu>;

/// The plan's phase and how far the live bytes rose in it.
fn planned_and_live<B: AutodiffModelBackend>(config: &str) -> (u64, u64) {
    let _guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut meter = CountingMeter::new(&ALLOCATOR, None);
    let shape = Shape {
        batch: 4,
        prompt: 32,
        completion: 32,
    };
    let weights = Weights::Random(mappa_benches::Size::M1.config());
    let m = measure::<B>(config, shape, &weights, &mut meter).expect(config);
    let live = m.live_bytes.expect("counted") - m.live_start_bytes.expect("counted");
    (m.planned_phase_bytes, live)
}

/// How far above the live bytes the plan's phase may be.
const SLACK: f64 = 0.30;

/// Bytes a phase may allocate beyond its tensors: scratch that is not a
/// tensor (gemm's packing buffers, the graph's bookkeeping), which the
/// plan's allocator reserve covers (its per-process and per-thread shares).
const SCRATCH: u64 = 1 << 20;

/// The phases: every configuration of `just bench-memory` but the
/// data-parallel one (`lora-1-dp`), whose two workers run on threads made
/// afresh at each update, so that their scratch falls inside the measured
/// phase (as much as SmolLM2's logits there: `just bench-memory` checks it
/// against the peak resident size, reserve included).
const CONFIGS: [&str; 10] = [
    "full-1",
    "lora-1",
    "full-1-layers",
    "lora-1-layers",
    "lora-1-fused",
    "lora-1-bf16",
    "lora-1-layers-bf16",
    "logprob-16",
    "logprob-16-fused",
    "generate-16",
];

#[test]
fn the_plans_phases_cover_the_live_bytes_and_not_by_much_more() {
    let mut report = Vec::new();
    for config in CONFIGS {
        let (planned, live) = planned_and_live::<Cpu>(config);
        let ratio = planned as f64 / live as f64;
        report.push(format!(
            "{config}: plan {planned} live {live} ({:+.1}%)",
            100.0 * (ratio - 1.0)
        ));
        assert!(
            planned + SCRATCH >= live && ratio <= 1.0 + SLACK,
            "{config}: the plan's phase is {planned} bytes, the live bytes rose by {live}\n{}",
            report.join("\n")
        );
    }
    println!("{}", report.join("\n"));
}
