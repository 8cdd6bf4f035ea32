//! Peak memory on the device against the memory plan: `just
//! bench-memory`'s configurations ([`mappa_benches::memory`]) with random
//! weights of SmolLM2-135M's config (real weights would not fit the GPU
//! bundle, and the bytes depend only on the shapes), each measured in a
//! fresh `mappa doctor` process. The plan must be an upper bound: at least
//! the measured peak and at most 20% over it.

use std::path::Path;
use std::process::Command;

use mappa_benches::memory::{self, Measured, Shape, Weights, PLAN_SLACK};
use mappa_model::{AutodiffModelBackend, Family, TransformerConfig};
use mappa_train::memory::GIB;
use serde_json::json;

use super::{Outcome, Size};

/// SmolLM2-135M's config (HuggingFaceTB/SmolLM2-135M's config.json).
pub fn smollm2_config() -> TransformerConfig {
    TransformerConfig::for_family(Family::Llama, 49152, 576, 1536, 30, 9, 3, 64)
        .with_tie_word_embeddings(true)
        .with_max_position_embeddings(8192)
}

/// The configurations measured: `bench-memory`'s at full size; at small
/// size (the CPU's default, for CI) the plain update and inference phases
/// of a 25m-parameter model.
pub fn configs(size: Size) -> Vec<String> {
    match size {
        Size::Full => memory::CONFIGS.split(',').map(String::from).collect(),
        Size::Small => [
            "full-1",
            "lora-1",
            "lora-1-layers",
            "logprob-16",
            "generate-16",
        ]
        .map(String::from)
        .to_vec(),
    }
}

/// The weights of `size`'s memory checks.
pub fn weights(size: Size) -> Weights {
    match size {
        Size::Full => Weights::Random(smollm2_config()),
        Size::Small => Weights::Random(mappa_benches::Size::M25.config()),
    }
}

/// Runs one configuration here (in a child process) on backend `B`.
pub fn child<B: AutodiffModelBackend>(
    config: &str,
    size: Size,
    meter: &mut dyn memory::Meter,
) -> Result<Measured, String> {
    memory::measure::<B>(config, Shape::default(), &weights(size), meter)
}

/// Runs `config` in a fresh `mappa doctor` process and checks the plan
/// against what it measured.
pub fn check(exe: &Path, backend: &str, config: &str, size: Size) -> anyhow::Result<Outcome> {
    let out = Command::new(exe)
        .args(["doctor", "--backend", backend, "--size", size.name()])
        .args(["--child", &format!("memory:{config}")])
        .output()?;
    if !out.status.success() {
        anyhow::bail!(
            "the measuring process failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let m: Measured = serde_json::from_slice(&out.stdout)?;
    let tolerance = json!({"plan_over_measured": [0.0, PLAN_SLACK]});
    let measured = serde_json::to_value(&m)?;
    let gib = |b: u64| b as f64 / GIB;
    let Some(error) = m.plan_error() else {
        return Ok(Outcome::skipped(
            measured,
            tolerance,
            format!(
                "this backend's memory cannot be read here; plan {:.3} GiB",
                gib(m.predicted_bytes)
            ),
        ));
    };
    let detail = format!(
        "measured {:.3} GiB, plan {:.3} GiB ({:+.1}%), {:.0} tok/s",
        gib(m.measured_bytes.unwrap_or_default()),
        gib(m.predicted_bytes),
        100.0 * error,
        m.tokens_per_second
    );
    let failures = match memory::within_bound(&m) {
        Some(true) => Vec::new(),
        _ if error < 0.0 => vec!["the plan is under the measured peak".into()],
        _ => vec![format!(
            "the plan is more than {:.0}% over the measured peak",
            100.0 * PLAN_SLACK
        )],
    };
    Ok(Outcome::from_failures(
        failures, measured, tolerance, detail,
    ))
}
