//! Cross-backend parity: the same seeded model on the device and on the
//! CPU backend, its logits, greedy ids, per-token log-probs, one training
//! loss and every parameter's gradient; on a failure, the first layer
//! whose output differs.

use std::path::PathBuf;

use anyhow::Context;
use burn::module::AutodiffModule;
use burn::optim::GradientsParams;
use burn::prelude::*;
use mappa_model::weights::load_transformer;
use mappa_model::{
    completion_logprobs, generate_greedy, kernels, AutodiffModelBackend, Family, GenerationConfig,
    ModelBackend, Transformer, TransformerConfig,
};
use serde_json::json;

pub use mappa_benches::{random_tokens as tokens, to_tensor};

use super::compare::{self, Named, Tolerance};
use super::Outcome;

/// Where a checked model comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Weights drawn from a seeded stream on the host (the same on every
    /// backend).
    Random(TransformerConfig, u64),
    /// A HF checkpoint directory (the tiny fixtures).
    Checkpoint(PathBuf),
}

impl Source {
    /// The model on `device`.
    pub fn build<B: Backend>(&self, device: &B::Device) -> anyhow::Result<Transformer<B>> {
        match self {
            Source::Random(config, seed) => Ok(config.init(*seed, device)),
            Source::Checkpoint(dir) => load_transformer(dir, device)
                .with_context(|| format!("{}: loading the fixture model", dir.display())),
        }
    }
}

/// A seeded random Qwen3-shaped model: about 1M parameters, tied
/// embeddings, two query heads per key/value head.
pub fn random_qwen3() -> Source {
    let config = TransformerConfig::for_family(Family::Qwen3, 2048, 128, 384, 4, 4, 2, 32)
        .with_tie_word_embeddings(true)
        .with_max_position_embeddings(512);
    Source::Random(config, 17)
}

/// What one backend computed for the parity check.
struct Computed {
    logits: Vec<f32>,
    greedy: Vec<Vec<u32>>,
    logprobs: Vec<f32>,
    loss: f64,
    gradients: Named,
}

/// Rows of the checked batch, its length, and the greedy run's.
const ROWS: usize = 2;
const COLS: usize = 24;
const PROMPT: usize = 8;
const NEW_TOKENS: usize = 12;

fn greedy_config() -> GenerationConfig {
    let mut config = GenerationConfig::greedy(NEW_TOKENS);
    // Random weights: run to the full length, whatever is sampled.
    config.eos_token_ids = Vec::new();
    config
}

/// Logits, greedy ids, log-probs, loss and gradients of `model` on `ids`.
fn compute<B: AutodiffModelBackend>(
    model: &Transformer<B>,
    ids: &[Vec<u32>],
) -> anyhow::Result<Computed> {
    let device = model.device();
    let inference = model.valid();
    let logits = B::InnerBackend::run_step(|| {
        compare::host(inference.forward(to_tensor::<B::InnerBackend>(ids, &device)))
    });
    let prompts: Vec<&[u32]> = ids.iter().map(|r| &r[..PROMPT]).collect();
    let greedy = generate_greedy(&inference, None, &prompts, &greedy_config())?
        .into_iter()
        .map(|g| g.token_ids)
        .collect();
    let pairs: Vec<(&[u32], &[u32])> = ids.iter().map(|r| r.split_at(PROMPT)).collect();
    let logprobs = completion_logprobs(&inference, &pairs, 1.0)?
        .to_vecs()
        .concat();
    let (loss, gradients) = B::run_step(|| next_token_gradients(model, ids));
    Ok(Computed {
        logits,
        greedy,
        logprobs,
        loss,
        gradients,
    })
}

/// The mean next-token cross-entropy over `ids` and every parameter's
/// gradient of it.
fn next_token_gradients<B: AutodiffModelBackend>(
    model: &Transformer<B>,
    ids: &[Vec<u32>],
) -> (f64, Named) {
    let device = model.device();
    let inputs: Vec<Vec<u32>> = ids.iter().map(|r| r[..r.len() - 1].to_vec()).collect();
    let targets: Vec<Vec<u32>> = ids.iter().map(|r| r[1..].to_vec()).collect();
    let logits = model.forward(to_tensor::<B>(&inputs, &device));
    let picked = kernels::token_log_probs(logits, to_tensor::<B>(&targets, &device));
    let count = (inputs.len() * inputs[0].len()) as f64;
    let loss = -kernels::sum(picked) / count;
    let value: f64 = loss.clone().into_scalar().elem();
    let grads = GradientsParams::from_grads(loss.backward(), model);
    (value, compare::gradients(model, &grads))
}

/// The device's model against the CPU's: `D` on `device`, `R` (the CPU
/// backend) on `reference`.
pub fn check<D: AutodiffModelBackend, R: AutodiffModelBackend>(
    source: &Source,
    device: &D::Device,
    reference: &R::Device,
    tol: &Tolerance,
) -> anyhow::Result<Outcome> {
    let on_device: Transformer<D> = source.build(device)?;
    let on_cpu: Transformer<R> = source.build(reference)?;
    let ids = tokens(on_cpu.config().vocab_size, ROWS, COLS, 23);
    let d = compute(&on_device, &ids)?;
    let r = compute(&on_cpu, &ids)?;
    let logits = compare::rel_max(&d.logits, &r.logits);
    let greedy = greedy_verdict(&on_cpu, &ids, &d.greedy, &r.greedy, tol);
    let logprobs = compare::max_abs(&d.logprobs, &r.logprobs);
    let loss = compare::rel(d.loss, r.loss);
    let norm = |g: &Named| {
        g.iter()
            .flat_map(|(_, v)| v)
            .map(|x| (*x as f64).powi(2))
            .sum::<f64>()
            .sqrt()
    };
    let grad_norm = compare::rel(norm(&d.gradients), norm(&r.gradients));
    // In the order the backward pass makes them (last layer first): a
    // device's error in layer k's backward pass reaches the gradients of
    // layer k and of every layer before it, not those after.
    let backward = |g: &Named| -> Named { g.iter().rev().cloned().collect() };
    let (gradient, first_gradient) = compare::first_over(
        &backward(&d.gradients),
        &backward(&r.gradients),
        tol.gradient,
    );
    let mut failures = Vec::new();
    if logits > tol.logits {
        failures.push(format!(
            "logits differ by {logits:.2e}; {}",
            first_layer(&on_device.valid(), &on_cpu.valid(), &ids, tol.logits)
        ));
    }
    if let Err(why) = &greedy {
        failures.push(why.clone());
    }
    if logprobs > tol.logprobs {
        failures.push(format!("log-probs differ by {logprobs:.2e}"));
    }
    if loss > tol.loss || grad_norm > tol.grad_norm {
        failures.push(format!(
            "loss differs by {loss:.2e}, gradient norm by {grad_norm:.2e}"
        ));
    }
    if let Some(name) = first_gradient {
        failures.push(format!(
            "the first gradient that differs, in backward order: {name}"
        ));
    }
    Ok(Outcome::from_failures(
        failures,
        json!({
            "logits_rel_max": logits,
            "greedy_ids": greedy.as_ref().map_or_else(|e| e.clone(), |ok| ok.clone()),
            "logprobs_max_abs": logprobs,
            "loss_rel": loss,
            "grad_norm_rel": grad_norm,
            "gradient_worst_rel_l2": gradient,
        }),
        serde_json::to_value(tol)?,
        format!(
            "{} parameters, {ROWS}x{COLS} tokens",
            on_cpu.config().num_params()
        ),
    ))
}

/// Greedy ids equal, or first unequal where the CPU's two best tokens are
/// closer than the logits' tolerance (a tie neither side is wrong to
/// break either way).
fn greedy_verdict<R: AutodiffModelBackend>(
    on_cpu: &Transformer<R>,
    ids: &[Vec<u32>],
    device: &[Vec<u32>],
    cpu: &[Vec<u32>],
    tol: &Tolerance,
) -> Result<String, String> {
    let first = device
        .iter()
        .zip(cpu)
        .enumerate()
        .find_map(|(row, (a, b))| {
            a.iter()
                .zip(b)
                .position(|(x, y)| x != y)
                .map(|col| (row, col))
        });
    let Some((row, col)) = first else {
        return Ok("equal".into());
    };
    let context: Vec<u32> = [&ids[row][..PROMPT], &cpu[row][..col]].concat();
    let logits = compare::host(
        on_cpu
            .valid()
            .forward(to_tensor(std::slice::from_ref(&context), &on_cpu.device())),
    );
    let vocab = on_cpu.config().vocab_size;
    let mut last: Vec<f32> = logits[logits.len() - vocab..].to_vec();
    let scale = last.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
    last.sort_by(|a, b| b.total_cmp(a));
    let margin = (last[0] - last[1]) as f64;
    let what = format!(
        "row {row} differs from new token {col} (device {}, CPU {}); the CPU's top-two margin there is {margin:.2e}",
        device[row][col], cpu[row][col]
    );
    if margin <= tol.logits * scale.max(1e-6) {
        Ok(format!("{what}: a tie within the logits' tolerance"))
    } else {
        Err(what)
    }
}

/// The first decoder layer whose output (through the final norm) differs
/// by more than `tolerance` ([`compare::rel_max`]).
fn first_layer<D: ModelBackend, R: ModelBackend>(
    device: &Transformer<D>,
    cpu: &Transformer<R>,
    ids: &[Vec<u32>],
    tolerance: f64,
) -> String {
    let layers = cpu.layers.len();
    let embeddings = compare::rel_max(&hidden_after(device, 0, ids), &hidden_after(cpu, 0, ids));
    if embeddings > tolerance {
        return format!("already the embeddings differ ({embeddings:.2e})");
    }
    for k in 1..=layers {
        let d = compare::rel_max(&hidden_after(device, k, ids), &hidden_after(cpu, k, ids));
        if d > tolerance {
            return format!(
                "the first layer whose output differs is layer {} ({d:.2e})",
                k - 1
            );
        }
    }
    "every layer's output agrees: the output head differs".into()
}

/// The hidden states after the first `layers` decoder layers (and the
/// final norm).
fn hidden_after<B: ModelBackend>(
    model: &Transformer<B>,
    layers: usize,
    ids: &[Vec<u32>],
) -> Vec<f32> {
    let mut truncated = model.clone();
    truncated.layers.truncate(layers);
    let pad = vec![0; ids.len()];
    let window = mappa_model::transformer::Window {
        pad_left: &pad,
        start: 0,
        len: ids[0].len(),
    };
    B::run_step(|| {
        compare::host(truncated.forward_hidden(to_tensor::<B>(ids, &model.device()), &window, None))
    })
}

/// A model trained one step on the device, saved as a HF checkpoint in
/// `dir` with its logits on the device (`mappa_logits.json`: per row, the
/// input ids and the flattened logits), for transformers to load and
/// compare (the GPU bundle's `hf_parity.py`). Passes when mappa loads the
/// checkpoint back and computes the same logits, bit for bit.
pub fn export_hf<D: AutodiffModelBackend>(
    source: &Source,
    device: &D::Device,
    dir: &std::path::Path,
) -> anyhow::Result<Outcome> {
    use mappa_model::weights::save_transformer;
    let model = super::step::trained::<D>(source, super::step::Variant::default(), device)?;
    save_transformer(&model, dir, mappa_model::StorageDtype::F32)?;
    let ids = tokens(model.config().vocab_size, ROWS, COLS, 29);
    let logits = |m: &Transformer<D::InnerBackend>| -> Vec<Vec<f32>> {
        ids.iter()
            .map(|row| compare::host(m.forward(to_tensor(std::slice::from_ref(row), device))))
            .collect()
    };
    let saved = logits(&model);
    let cases: Vec<serde_json::Value> = ids
        .iter()
        .zip(&saved)
        .map(|(row, l)| json!({"input_ids": row, "logits": l}))
        .collect();
    mappa_core::fs::write_atomic(
        &dir.join("mappa_logits.json"),
        serde_json::to_string(&cases)?.as_bytes(),
    )?;
    let reloaded: Transformer<D::InnerBackend> = load_transformer(dir, device)?;
    let same = logits(&reloaded) == saved;
    let failures = match same {
        true => Vec::new(),
        false => vec!["the checkpoint loaded back computes other logits".into()],
    };
    Ok(Outcome::from_failures(
        failures,
        json!({"reloaded_logits_equal": same, "checkpoint": dir.display().to_string()}),
        json!({"reloaded": "identical bits", "transformers": compare::F32}),
        format!(
            "{} (transformers compares in the GPU bundle's run.sh)",
            dir.display()
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_model::backend::CpuAutodiff;

    /// The check passes the CPU against itself, and fails a model whose
    /// third layer was changed, naming that layer.
    #[test]
    fn a_changed_layer_is_found() {
        let device = Default::default();
        let source = random_qwen3();
        let same =
            check::<CpuAutodiff, CpuAutodiff>(&source, &device, &device, &compare::F32).unwrap();
        assert!(same.passed(), "{same:?}");
        let ids = tokens(2048, ROWS, COLS, 23);
        let good: Transformer<CpuAutodiff> = source.build(&device).unwrap();
        let mut bad = good.clone();
        bad.layers[2] = random_qwen3_other_layer(2);
        let r = compute(&good, &ids).unwrap();
        let d = compute(&bad, &ids).unwrap();
        assert!(compare::rel_max(&d.logits, &r.logits) > compare::F32.logits);
        let found = first_layer(&bad.valid(), &good.valid(), &ids, compare::F32.logits);
        assert!(found.contains("layer 2 "), "{found}");
    }

    fn random_qwen3_other_layer(i: usize) -> mappa_model::transformer::DecoderLayer<CpuAutodiff> {
        let Source::Random(config, _) = random_qwen3() else {
            unreachable!()
        };
        let other: Transformer<CpuAutodiff> = config.init(99, &Default::default());
        other.layers[i].clone()
    }
}
