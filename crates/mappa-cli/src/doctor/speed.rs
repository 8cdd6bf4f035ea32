//! Throughput on the device: the workloads of `just bench-vs-torch`
//! (`mappa_benches`: a forward pass, a training step, KV-cache generation;
//! the same shapes as `benches/torch_bench.py`) at a few model sizes, as
//! tokens per second and model FLOPs utilisation against the device's
//! stated dense peak.
//!
//! Model FLOPs per token follow PaLM's convention (Chowdhery et al. 2022,
//! appendix B): `2 N + 4 L H d S` for a forward pass over `S` tokens
//! (attention counted without halving for the causal mask), three times
//! that for a training step, and `2 N + 4 L H d c` per generated token at
//! mean context `c`; `N` counts the parameters that multiply activations
//! (the output head's included, the embedding lookup's not).

use mappa_benches::{
    forward, generate_greedy, median_seconds, random_tokens, to_tensor, Size, Trainer, BATCH,
    NEW_TOKENS, PROMPT, SEQ,
};
use mappa_model::{AutodiffModelBackend, Transformer, TransformerConfig};
use serde_json::{json, Value};

use super::Outcome;

/// Dense peaks of a GPU's datasheet, in FLOP/s.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peak {
    /// The device it is for, as the datasheet names it.
    pub device: &'static str,
    /// FP32 on CUDA cores (no tensor cores).
    pub fp32: f64,
    /// BF16 on tensor cores, dense (half the "with sparsity" figure).
    pub bf16_dense: f64,
}

/// NVIDIA's datasheets (H100 Tensor Core GPU, H200 Tensor Core GPU), dense
/// figures, matched by the driver's device name.
const PEAKS: &[(&str, Peak)] = &[
    (
        "H100 PCIe",
        Peak {
            device: "NVIDIA H100 PCIe",
            fp32: 51.2e12,
            bf16_dense: 756.0e12,
        },
    ),
    (
        "H100 NVL",
        Peak {
            device: "NVIDIA H100 NVL",
            fp32: 60.0e12,
            bf16_dense: 835.0e12,
        },
    ),
    (
        "H100",
        Peak {
            device: "NVIDIA H100 SXM5",
            fp32: 66.9e12,
            bf16_dense: 989.4e12,
        },
    ),
    (
        "H200",
        Peak {
            device: "NVIDIA H200 SXM",
            fp32: 66.9e12,
            bf16_dense: 989.4e12,
        },
    ),
    (
        "A100",
        Peak {
            device: "NVIDIA A100 SXM4",
            fp32: 19.5e12,
            bf16_dense: 312.0e12,
        },
    ),
];

/// The stated peak of a device by its name (the first entry it contains).
pub fn peak_of(name: &str) -> Option<Peak> {
    PEAKS
        .iter()
        .find(|(key, _)| name.contains(key))
        .map(|(_, peak)| *peak)
}

/// Parameters that multiply activations (see the module docs).
fn matmul_params(config: &TransformerConfig) -> f64 {
    let all = config.num_params() as f64;
    let embeddings = (config.vocab_size * config.hidden_size) as f64;
    if config.tie_word_embeddings {
        all
    } else {
        all - embeddings
    }
}

/// Model FLOPs per token of a forward pass over `context` tokens.
fn forward_flops(config: &TransformerConfig, context: f64) -> f64 {
    let attention = 4.0 * (config.num_layers * config.num_heads * config.head_dim) as f64 * context;
    2.0 * matmul_params(config) + attention
}

/// One workload's line: tokens/s, model FLOP/s and utilisation.
fn line(
    size: Size,
    config: &TransformerConfig,
    workload: &str,
    tokens: usize,
    seconds: f64,
    flops_per_token: f64,
    peak: Option<Peak>,
) -> Value {
    let flops = flops_per_token * tokens as f64 / seconds;
    json!({
        "config": size.name(),
        "params": config.num_params(),
        "workload": workload,
        "tokens_per_iter": tokens,
        "median_s": seconds,
        "tokens_per_s": tokens as f64 / seconds,
        "model_tflop_per_s": flops / 1e12,
        "mfu_fp32": peak.map(|p| flops / p.fp32),
        "mfu_bf16_dense": peak.map(|p| flops / p.bf16_dense),
    })
}

/// The three workloads at `size` on `device`, each the median of `iters`
/// runs after one warm-up, in the rows `benches/compare.py` reads.
pub fn check<B: AutodiffModelBackend>(
    size: Size,
    device: &B::Device,
    device_name: &str,
    iters: usize,
) -> anyhow::Result<Outcome> {
    let peak = peak_of(device_name);
    let rows = time_workloads::<B>(size, device, iters, peak);
    let finite = rows.iter().all(|r| {
        r["tokens_per_s"]
            .as_f64()
            .is_some_and(|t| t.is_finite() && t > 0.0)
    });
    let failures = match finite {
        true => Vec::new(),
        false => vec!["a workload's throughput is not a positive number".into()],
    };
    let detail = describe(&rows, peak, device_name);
    Ok(Outcome::from_failures(
        failures,
        Value::Array(rows),
        json!("measured, no threshold: a positive, finite throughput"),
        detail,
    ))
}

/// The rows of the forward pass, generation and the training step.
fn time_workloads<B: AutodiffModelBackend>(
    size: Size,
    device: &B::Device,
    iters: usize,
    peak: Option<Peak>,
) -> Vec<Value> {
    let config = size.config();
    let model: Transformer<B::InnerBackend> = config.init(0, device);
    let ids = random_tokens(config.vocab_size, BATCH, SEQ, 1);
    let tokens = to_tensor::<B::InnerBackend>(&ids, device);
    let prompts = random_tokens(config.vocab_size, BATCH, PROMPT, 2);
    let row = |workload: &str, tokens: usize, seconds: f64, per_token: f64| {
        line(size, &config, workload, tokens, seconds, per_token, peak)
    };
    let mut rows = Vec::new();
    let seconds = median_seconds(1, iters, || {
        forward(&model, &tokens);
    });
    rows.push(row(
        "forward",
        BATCH * SEQ,
        seconds,
        forward_flops(&config, SEQ as f64),
    ));
    let seconds = median_seconds(1, iters, || {
        generate_greedy(&model, &prompts);
    });
    let context = (PROMPT + NEW_TOKENS / 2) as f64;
    rows.push(row(
        "generate",
        BATCH * NEW_TOKENS,
        seconds,
        forward_flops(&config, context),
    ));
    drop(model);
    let mut trainer = Trainer::<B>::new(&config, device);
    let train_tokens = to_tensor::<B>(&ids, device);
    let seconds = median_seconds(1, iters, || {
        trainer.step(&train_tokens);
    });
    let per_token = 3.0 * forward_flops(&config, SEQ as f64);
    rows.push(row("train_step", BATCH * SEQ, seconds, per_token));
    rows
}

/// One line for people: each workload's tokens/s and utilisation, and the
/// peaks used.
fn describe(rows: &[Value], peak: Option<Peak>, device_name: &str) -> String {
    let summary: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {:.0} tok/s{}",
                r["workload"].as_str().unwrap_or_default(),
                r["tokens_per_s"].as_f64().unwrap_or_default(),
                r["mfu_fp32"].as_f64().map_or(String::new(), |m| format!(
                    " ({:.1}% of FP32 peak)",
                    100.0 * m
                ))
            )
        })
        .collect();
    let peak_named = match peak {
        Some(p) => format!(
            "peaks: {} datasheet, FP32 {:.1} TFLOP/s, BF16 dense {:.1} TFLOP/s",
            p.device,
            p.fp32 / 1e12,
            p.bf16_dense / 1e12
        ),
        None => format!("no stated peak for {device_name:?}: utilisation not computed"),
    };
    format!("{}; {peak_named}", summary.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peaks_are_found_by_the_drivers_names_and_flops_follow_the_convention() {
        assert_eq!(
            peak_of("NVIDIA H100 80GB HBM3").unwrap().device,
            "NVIDIA H100 SXM5"
        );
        assert_eq!(peak_of("NVIDIA H100 PCIe").unwrap().fp32, 51.2e12);
        assert_eq!(peak_of("NVIDIA H200").unwrap().bf16_dense, 989.4e12);
        assert_eq!(peak_of("AMD EPYC 9R14"), None);
        // Tied 25m: every parameter multiplies (the head is the embedding).
        let config = Size::M25.config();
        let n = config.num_params() as f64;
        let attention = 4.0 * (7 * 8 * 64) as f64 * 128.0;
        assert_eq!(forward_flops(&config, 128.0), 2.0 * n + attention);
    }
}
