//! The real SmolLM2-135M-Instruct (installed by `just models`, converted from
//! its GGUF by mappa) against HF transformers loading the same GGUF itself
//! (`fixtures/smol/parity.json`, made by `make_smol_parity.py`): prompt
//! encodings, last-position logits, teacher-forced log-probs and greedy
//! continuations.
//!
//! The model is not in the repository: without `models/SmolLM2-135M-Instruct`
//! (or `MAPPA_SMOL_DIR`) these tests print that they were skipped and pass;
//! `just test-real-model` installs the model and runs them.

mod common;

use std::path::PathBuf;

use common::{fixtures, max_abs_diff, TestBackend};
use mappa_model::{completion_logprobs, Checkpoint, Model, Tokenizer};
use serde::Deserialize;

const TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct Golden {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    top_ids: Vec<u32>,
    top_logits: Vec<f32>,
    prompt_logprobs: Vec<f32>,
    greedy: Vec<u32>,
}

/// The converted model's directory, or `None` (with a note) when it is not installed.
fn smol_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("MAPPA_SMOL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| fixtures().join("../models/SmolLM2-135M-Instruct"));
    if dir.join("config.json").exists() {
        Some(dir)
    } else {
        eprintln!(
            "skipped: no real model at `{}` (run `just models`)",
            dir.display()
        );
        None
    }
}

fn golden() -> Golden {
    let text = std::fs::read_to_string(fixtures().join("smol/parity.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

#[test]
fn smol_matches_transformers_on_the_same_gguf() {
    let Some(dir) = smol_dir() else { return };
    let golden = golden();
    let checkpoint = Checkpoint::<TestBackend>::load(&dir, &Default::default()).unwrap();
    for case in &golden.cases {
        assert_eq!(checkpoint.tokenizer.encode(&case.text).unwrap(), case.ids);
    }
    let model = Model::new(checkpoint.model);
    for (i, case) in golden.cases.iter().enumerate() {
        let logits = model.logits(&case.ids).unwrap();
        let last = logits.last();
        let ours: Vec<f32> = case.top_ids.iter().map(|&t| last[t as usize]).collect();
        let diff = max_abs_diff(&ours, &case.top_logits);
        eprintln!(
            "prompt {i}: top-{} logits differ from transformers' by {diff:.2e}",
            ours.len()
        );
        assert!(diff < TOLERANCE, "prompt {i}: logits differ by {diff}");
        let new = model.greedy(&case.ids, case.greedy.len(), None).unwrap();
        assert_eq!(new, case.greedy, "prompt {i}: greedy continuation");
    }
    let pairs: Vec<(&[u32], &[u32])> = golden
        .cases
        .iter()
        .map(|c| (&c.ids[..1], &c.ids[1..]))
        .collect();
    let logprobs = completion_logprobs(model.transformer(), &pairs, 1.0)
        .unwrap()
        .to_vecs();
    for (i, (ours, case)) in logprobs.iter().zip(&golden.cases).enumerate() {
        let diff = max_abs_diff(ours, &case.prompt_logprobs);
        eprintln!("prompt {i}: teacher-forced log-probs differ by {diff:.2e}");
        assert!(diff < TOLERANCE, "prompt {i}: log-probs differ by {diff}");
    }
}
