//! Parity with `peft` (fixtures/lora/, made by `make_lora_fixtures.py`): a
//! LoRA adapter saved by PEFT loads onto the fixture checkpoint, and the
//! completion log-probs, the same with the adapter off, and the gradient of
//! `-sum(log-probs)` with respect to every adapter matrix match PEFT's at 1e-4.

mod common;

use std::collections::BTreeMap;

use burn::backend::Autodiff;
use burn::module::Param;
use burn::prelude::*;
use common::*;
use mappa_model::lora::{load_adapters, save_adapters};
use mappa_model::weights::load_transformer;
use mappa_model::{completion_logprobs, Transformer};
use serde::Deserialize;

const TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct Grad {
    shape: Vec<usize>,
    values: Vec<f32>,
}

#[derive(Deserialize)]
struct Golden {
    prompt_ids: Vec<u32>,
    completion_ids: Vec<u32>,
    logprobs: Vec<f32>,
    reference_logprobs: Vec<f32>,
    loss: f32,
    grads: BTreeMap<String, Grad>,
}

type Ad = Autodiff<TestBackend>;

fn golden(name: &str) -> Golden {
    let path = fixtures().join("lora").join(name).join("golden.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn adapted(name: &str) -> Transformer<Ad> {
    let base = load_transformer::<Ad>(&model_dir(name), &Default::default()).unwrap();
    load_adapters(base, &fixtures().join("lora").join(name))
        .unwrap_or_else(|e| panic!("loading the {name} adapter: {e}"))
}

/// Every adapter matrix with its PEFT name.
fn adapter_params(model: &Transformer<Ad>) -> Vec<(String, Param<Tensor<Ad, 2>>)> {
    let mut out = Vec::new();
    for (i, layer) in model.layers.iter().enumerate() {
        let a = &layer.self_attn;
        let m = &layer.mlp;
        for (block, proj, dense) in [
            ("self_attn", "q_proj", &a.q_proj),
            ("self_attn", "k_proj", &a.k_proj),
            ("self_attn", "v_proj", &a.v_proj),
            ("self_attn", "o_proj", &a.o_proj),
            ("mlp", "gate_proj", &m.gate_proj),
            ("mlp", "up_proj", &m.up_proj),
            ("mlp", "down_proj", &m.down_proj),
        ] {
            let lora = dense.lora.as_ref().expect("every projection is adapted");
            let prefix = format!("base_model.model.model.layers.{i}.{block}.{proj}");
            out.push((format!("{prefix}.lora_A.weight"), lora.lora_a.clone()));
            out.push((format!("{prefix}.lora_B.weight"), lora.lora_b.clone()));
        }
    }
    out
}

#[test]
fn lora_logprobs_reference_and_gradients_match_peft() {
    for name in ["qwen3-tiny", "qwen2-tiny"] {
        let golden = golden(name);
        let model = adapted(name);
        let pairs = [(
            golden.prompt_ids.as_slice(),
            golden.completion_ids.as_slice(),
        )];

        let reference = completion_logprobs(&model.without_adapters(), &pairs, 1.0)
            .unwrap()
            .to_vecs();
        let diff = max_abs_diff(&reference[0], &golden.reference_logprobs);
        assert!(
            diff < TOLERANCE,
            "{name}: adapter-off log-probs differ from PEFT by {diff}"
        );

        let out = completion_logprobs(&model, &pairs, 1.0).unwrap();
        let logprobs = out.logprobs.clone().into_data().to_vec::<f32>().unwrap();
        let diff = max_abs_diff(&logprobs, &golden.logprobs);
        assert!(
            diff < TOLERANCE,
            "{name}: log-probs differ from PEFT by {diff}"
        );
        assert!(
            max_abs_diff(&logprobs, &golden.reference_logprobs) > 0.01,
            "{name}: the adapter must change the log-probs for this test to mean anything"
        );

        let loss = out.logprobs.sum().neg();
        let loss_value = loss.clone().into_scalar();
        assert!((loss_value - golden.loss).abs() < TOLERANCE * golden.loss.abs().max(1.0));
        let grads = loss.backward();
        let params = adapter_params(&model);
        assert_eq!(params.len(), golden.grads.len(), "{name}: adapter count");
        for (tensor, param) in params {
            let expected = &golden.grads[&tensor];
            let grad = param
                .grad(&grads)
                .unwrap_or_else(|| panic!("{tensor}: no gradient"));
            assert_eq!(grad.dims().to_vec(), expected.shape, "{tensor}");
            let values = grad.into_data().to_vec::<f32>().unwrap();
            let diff = max_abs_diff(&values, &expected.values);
            assert!(
                diff < TOLERANCE,
                "{name}: gradient of {tensor} differs from PEFT by {diff}"
            );
        }
        // The frozen base gets no gradient.
        assert!(model.layers[0]
            .self_attn
            .q_proj
            .weight
            .grad(&grads)
            .is_none());
    }
}

#[test]
fn saved_adapters_are_peft_files_with_the_same_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let model = adapted("qwen2-tiny");
    save_adapters(&model, dir.path(), "fixtures/models/qwen2-tiny").unwrap();
    let fixture = fixtures().join("lora/qwen2-tiny");
    let read = |dir: &std::path::Path| {
        let bytes = std::fs::read(dir.join("adapter_model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut names: Vec<(String, Vec<usize>, Vec<u8>)> = st
            .tensors()
            .into_iter()
            .map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec()))
            .collect();
        names.sort();
        names
    };
    // PEFT saved f32: every tensor comes back with the same name, shape and bytes.
    assert_eq!(read(dir.path()), read(&fixture));
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("adapter_config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(config["peft_type"], "LORA");
    assert_eq!(config["r"], 4);
}

#[test]
fn merged_adapters_give_the_adapted_logprobs() {
    let golden = golden("qwen3-tiny");
    let merged = adapted("qwen3-tiny").merge_adapters();
    let pairs = [(
        golden.prompt_ids.as_slice(),
        golden.completion_ids.as_slice(),
    )];
    let logprobs = completion_logprobs(&merged, &pairs, 1.0).unwrap().to_vecs();
    let diff = max_abs_diff(&logprobs[0], &golden.logprobs);
    assert!(
        diff < TOLERANCE,
        "merged log-probs differ from PEFT by {diff}"
    );
}
