//! Parity with HF transformers on the tiny fixture checkpoints (one per
//! family, covering both config layouts, tied and untied embeddings, sharded
//! bf16, f16 and f32 weights): logits, teacher-forced log-probs and greedy
//! continuations must match the golden values HF computed.

mod common;

use burn::prelude::*;
use common::*;
use mappa_core::RngStream;
use mappa_model::weights::{hf_tensors, load_transformer, save_transformer};
use mappa_model::{completion_logprobs, generate, GenerationConfig, StorageDtype, Transformer};

const TOLERANCE: f32 = 1e-4;

fn load(name: &str) -> Transformer<TestBackend> {
    load_transformer::<TestBackend>(&model_dir(name), &Default::default())
        .unwrap_or_else(|e| panic!("loading {name}: {e}"))
}

/// Largest difference between the model's logits and HF's on one golden input.
fn logits_diff(model: &Transformer<TestBackend>, case: &LogitsCase) -> f32 {
    let ids: Vec<i32> = case.input_ids.iter().map(|&t| t as i32).collect();
    let input = Tensor::<TestBackend, 2, Int>::from_data(
        TensorData::new(ids, [1, case.input_ids.len()]),
        &Default::default(),
    );
    let logits = model.forward(input).into_data().into_vec::<f32>().unwrap();
    let expected: Vec<f32> = case.logits.iter().flatten().copied().collect();
    max_abs_diff(&logits, &expected)
}

#[test]
fn logits_match_hf() {
    for name in MODELS {
        let model = load(name);
        let golden = model_golden(name);
        for case in &golden.logits {
            let diff = logits_diff(&model, case);
            assert!(diff < TOLERANCE, "{name}: logits differ from HF by {diff}");
        }
    }
}

#[test]
fn teacher_forced_logprobs_match_hf_batched_and_alone() {
    for name in MODELS {
        let model = load(name);
        let golden = model_golden(name);
        let pairs: Vec<(&[u32], &[u32])> = golden
            .teacher_forced
            .iter()
            .map(|c| (c.prompt_ids.as_slice(), c.completion_ids.as_slice()))
            .collect();
        let batched = completion_logprobs(&model, &pairs, 1.0).unwrap().to_vecs();
        for (i, case) in golden.teacher_forced.iter().enumerate() {
            let diff = max_abs_diff(&batched[i], &case.logprobs);
            assert!(
                diff < TOLERANCE,
                "{name} pair {i} (batched): log-probs differ from HF by {diff}"
            );
            let alone = completion_logprobs(&model, &pairs[i..=i], 1.0)
                .unwrap()
                .to_vecs();
            let diff = max_abs_diff(&alone[0], &case.logprobs);
            assert!(
                diff < TOLERANCE,
                "{name} pair {i} (alone): log-probs differ from HF by {diff}"
            );
        }
    }
}

#[test]
fn greedy_generation_matches_hf_batched_and_alone() {
    for name in MODELS {
        let model = load(name);
        let golden = model_golden(name);
        let n = golden.greedy[0].max_new_tokens;
        let prompts: Vec<Vec<u32>> = golden.greedy.iter().map(|c| c.prompt_ids.clone()).collect();
        let mut rngs: Vec<RngStream> = (0..prompts.len() as u64).map(RngStream::from_u64).collect();
        let batched = generate(
            &model,
            None,
            &prompts,
            &mut rngs,
            &GenerationConfig::greedy(n),
        )
        .unwrap();
        for (case, g) in golden.greedy.iter().zip(&batched) {
            assert_eq!(
                g.token_ids, case.output_ids,
                "{name} (batched), prompt {:?}, top-2 gap {}",
                case.prompt_ids, case.min_top2_gap
            );
            let alone = generate(
                &model,
                None,
                std::slice::from_ref(&case.prompt_ids),
                &mut [RngStream::from_u64(9)],
                &GenerationConfig::greedy(n),
            )
            .unwrap();
            assert_eq!(alone[0].token_ids, case.output_ids, "{name} (alone)");
            // The sampler's log-probs agree with a teacher-forced recomputation.
            let tf = completion_logprobs(&model, &[(&case.prompt_ids, &case.output_ids)], 1.0)
                .unwrap()
                .to_vecs();
            let diff = max_abs_diff(&tf[0], &g.logprobs);
            assert!(
                diff < TOLERANCE,
                "{name}: sampler and teacher-forced log-probs differ by {diff}"
            );
        }
    }
}

#[test]
fn fixture_checkpoints_round_trip_bit_identically() {
    for name in MODELS {
        let model = load(name);
        let dir = tempfile::tempdir().unwrap();
        save_transformer(&model, dir.path(), StorageDtype::F32).unwrap();
        let again = load_transformer::<TestBackend>(dir.path(), &Default::default()).unwrap();
        assert_eq!(again.config(), model.config(), "{name}");
        assert!(
            hf_tensors(&again) == hf_tensors(&model),
            "{name}: weights changed in the round trip"
        );
    }
}

/// The goldens are sensitive to what a loader most easily gets wrong: a
/// model read with the default RoPE theta, or without llama3 scaling, misses
/// them by far more than the tolerance.
#[test]
fn goldens_catch_wrong_rope_settings() {
    use mappa_model::weights::{load_from_set, SafetensorsSet};
    use mappa_model::TransformerConfig;
    for (name, mutate) in [
        (
            "qwen3-tiny",
            (|c: &mut TransformerConfig| c.rope.theta = 10_000.0) as fn(&mut TransformerConfig),
        ),
        ("llama-tiny", |c: &mut TransformerConfig| {
            c.rope.llama3_scaling = None
        }),
    ] {
        let dir = model_dir(name);
        let mut config = TransformerConfig::from_hf_file(&dir.join("config.json")).unwrap();
        mutate(&mut config);
        let set = SafetensorsSet::open_dir(&dir).unwrap();
        let model = load_from_set::<TestBackend>(config, &set, &Default::default()).unwrap();
        let case = &model_golden(name).logits[1];
        let diff = logits_diff(&model, case);
        assert!(
            diff > 100.0 * TOLERANCE,
            "{name}: a wrong RoPE setting moved logits by only {diff}"
        );
    }
}
