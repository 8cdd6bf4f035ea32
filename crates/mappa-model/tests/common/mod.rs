//! Helpers shared by the fixture-based integration tests: paths and golden files.

#![allow(dead_code)] // each test binary uses its own part of these helpers

use std::path::PathBuf;

use serde::Deserialize;

/// The backend the parity tests run on: CUDA, wgpu or LibTorch (on the CPU)
/// when the crate is built with that feature (`just parity-cuda`,
/// `just parity-wgpu`, `just parity-tch`), else the CPU backend.
#[cfg(feature = "cuda")]
pub(crate) type TestBackend = mappa_model::backend::Cuda;
/// The backend the parity tests run on (see the CUDA variant).
#[cfg(all(feature = "wgpu", not(feature = "cuda")))]
pub(crate) type TestBackend = mappa_model::backend::Wgpu;
/// The backend the parity tests run on (see the CUDA variant).
#[cfg(all(feature = "tch", not(any(feature = "wgpu", feature = "cuda"))))]
pub(crate) type TestBackend = mappa_model::backend::LibTorch;
/// The backend the parity tests run on (see the CUDA variant).
#[cfg(not(any(feature = "wgpu", feature = "cuda", feature = "tch")))]
pub(crate) type TestBackend = mappa_model::backend::Cpu;

/// The repository's `fixtures/` directory.
pub(crate) fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// A fixture checkpoint directory.
pub(crate) fn model_dir(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

/// The fixture checkpoints, one per family.
pub(crate) const MODELS: [&str; 3] = ["qwen3-tiny", "qwen2-tiny", "llama-tiny"];

#[derive(Debug, Deserialize)]
pub(crate) struct LogitsCase {
    pub input_ids: Vec<u32>,
    pub logits: Vec<Vec<f32>>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct TeacherForcedCase {
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct GreedyCase {
    pub prompt_ids: Vec<u32>,
    pub max_new_tokens: usize,
    pub output_ids: Vec<u32>,
    pub min_top2_gap: f32,
}

/// `fixtures/models/NAME/golden.json`, computed by HF transformers.
#[derive(Debug, Deserialize)]
pub(crate) struct ModelGolden {
    pub logits: Vec<LogitsCase>,
    pub teacher_forced: Vec<TeacherForcedCase>,
    pub greedy: Vec<GreedyCase>,
}

pub(crate) fn model_golden(name: &str) -> ModelGolden {
    let path = model_dir(name).join("golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Largest absolute difference between two equally long slices.
pub(crate) fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}
