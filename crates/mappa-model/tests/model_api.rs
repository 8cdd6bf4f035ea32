//! The plain-Rust [`Model`] API as a client meets it, using only what
//! mappa-model exports: loading without tokenizer files, logits equal to the
//! tensor forward pass bit for bit, greedy decoding equal to `generate`
//! token for token, and token ids accepted as any `AsRef<[u32]>`.

mod common;

use std::path::Path;

use common::*;
use mappa_model::burn::prelude::*;
use mappa_model::{
    completion_logprobs, generate, generate_greedy, Checkpoint, GenerationConfig, Model, RngStream,
};

/// Copies the checkpoint `name` into a fresh directory without its tokenizer
/// files (and without `golden.json`): config and weights only.
fn copy_without_tokenizer(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(model_dir(name)).unwrap() {
        let path = entry.unwrap().path();
        let file = path.file_name().unwrap().to_str().unwrap();
        if file.starts_with("tokenizer")
            || file == "golden.json"
            || file == "special_tokens_map.json"
        {
            continue;
        }
        std::fs::copy(&path, dir.path().join(file)).unwrap();
    }
    assert!(!dir.path().join("tokenizer.json").exists());
    dir
}

fn load(dir: &Path) -> Model<TestBackend> {
    Model::load_on(dir, &Default::default())
        .unwrap_or_else(|e| panic!("loading {}: {e}", dir.display()))
}

/// The logits of `ids` through the tensor API, as `Transformer::forward` gives them.
fn forward_values(model: &Model<TestBackend>, ids: &[u32]) -> Vec<f32> {
    let input = Tensor::<TestBackend, 2, Int>::from_data(
        TensorData::new(ids.iter().map(|&t| t as i32).collect(), [1, ids.len()]),
        model.device(),
    );
    model
        .transformer()
        .forward(input)
        .into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .unwrap()
}

#[test]
fn model_load_needs_no_tokenizer_files() {
    for name in MODELS {
        let copy = copy_without_tokenizer(name);
        let err = match Checkpoint::<TestBackend>::load(copy.path(), &Default::default()) {
            Ok(_) => panic!("{name}: Checkpoint::load should need tokenizer.json"),
            Err(e) => e,
        };
        assert!(err.to_string().contains("tokenizer"), "{name}: {err}");

        let model = load(copy.path());
        let cpu = Model::load(copy.path()).unwrap();
        assert_eq!(cpu.vocab_size(), model.vocab_size());
        let ckpt = Checkpoint::<TestBackend>::load(&model_dir(name), &Default::default()).unwrap();
        let from_ckpt = Model::from(ckpt.model);
        let ids = &model_golden(name).logits[0].input_ids;
        assert_eq!(
            model.logits(ids).unwrap(),
            from_ckpt.logits(ids).unwrap(),
            "{name}: the copy without tokenizer loads the same weights"
        );
    }
}

#[test]
fn logits_equal_the_forward_pass_bit_for_bit() {
    for name in MODELS {
        let copy = copy_without_tokenizer(name);
        let model = load(copy.path());
        for case in &model_golden(name).logits {
            let logits = model.logits(&case.input_ids).unwrap();
            assert_eq!(logits.vocab, model.vocab_size());
            assert_eq!(logits.positions(), case.input_ids.len());
            let expected = forward_values(&model, &case.input_ids);
            // Bit for bit, NaN-safe.
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&logits.values), bits(&expected), "{name}");
            // And still HF's values, at the parity tolerance.
            let hf = case.logits.last().unwrap();
            assert!(max_abs_diff(logits.last(), hf) < 1e-4, "{name}");
        }
    }
}

#[test]
fn greedy_equals_generate_token_for_token() {
    for name in MODELS {
        let copy = copy_without_tokenizer(name);
        let model = load(copy.path());
        let golden = model_golden(name);
        let prompts: Vec<&[u32]> = golden
            .greedy
            .iter()
            .map(|c| c.prompt_ids.as_slice())
            .collect();
        let n = golden.greedy[0].max_new_tokens;
        let config = GenerationConfig::greedy(n);
        let mut rngs: Vec<RngStream> = (0..prompts.len() as u64).map(RngStream::from_u64).collect();
        let reference = generate(model.transformer(), None, &prompts, &mut rngs, &config).unwrap();
        let batched = generate_greedy(model.transformer(), None, &prompts, &config).unwrap();
        assert_eq!(batched, reference, "{name}: generate_greedy");
        for (prompt, r) in prompts.iter().zip(&reference) {
            let ids = model.greedy(prompt, n, None).unwrap();
            assert_eq!(ids, r.token_ids, "{name}: Model::greedy");

            // With an EOS id: the same prefix, ending at its first occurrence.
            let eos = r.token_ids[n / 2];
            let mut with_eos = config.clone();
            with_eos.eos_token_ids = vec![eos];
            let expected = generate(
                model.transformer(),
                None,
                &[prompt],
                &mut [RngStream::from_u64(0)],
                &with_eos,
            )
            .unwrap();
            let ids = model.greedy(prompt, n, Some(eos)).unwrap();
            assert_eq!(ids, expected[0].token_ids, "{name}: Model::greedy with eos");
            assert_eq!(ids.last(), Some(&eos));
        }
    }
}

#[test]
fn token_ids_pass_as_any_as_ref_u32() {
    let model = load(&model_dir("qwen3-tiny"));
    let m = model.transformer();
    let config = GenerationConfig::greedy(4);
    let owned: Vec<Vec<u32>> = vec![vec![131, 225, 28], vec![44, 147]];
    let borrowed: Vec<&[u32]> = owned.iter().map(Vec::as_slice).collect();
    let streams = || vec![RngStream::from_u64(1), RngStream::from_u64(2)];
    let a = generate(m, None, &owned, &mut streams(), &config).unwrap();
    let b = generate(m, None, &borrowed, &mut streams(), &config).unwrap();
    let c = generate(m, None, &[[131u32, 225, 28]], &mut streams()[..1], &config).unwrap();
    let d = generate(m, None, &owned[..1], &mut streams()[..1], &config).unwrap();
    assert_eq!(a, b);
    assert_eq!(c, d);

    let pairs_owned: Vec<(Vec<u32>, Vec<u32>)> = owned
        .iter()
        .zip(&a)
        .map(|(p, g)| (p.clone(), g.token_ids.clone()))
        .collect();
    let pairs_borrowed: Vec<(&[u32], &[u32])> = pairs_owned
        .iter()
        .map(|(p, c)| (p.as_slice(), c.as_slice()))
        .collect();
    let x = completion_logprobs(m, &pairs_owned, 1.0).unwrap().to_vecs();
    let y = completion_logprobs(m, &pairs_borrowed, 1.0)
        .unwrap()
        .to_vecs();
    assert_eq!(x, y);
}
