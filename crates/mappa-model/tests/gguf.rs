//! GGUF against the `gguf` Python package and HF transformers
//! (`fixtures/gguf/`, made by `make_gguf_fixtures.py`): every supported
//! type dequantises bit for bit as gguf-py does, and a tiny mixed-type
//! Llama GGUF, converted to a HF checkpoint, gives the logits, greedy ids,
//! encodings and chat prompt that transformers gets loading the GGUF itself.

mod common;

use std::collections::BTreeMap;

use common::{fixtures, max_abs_diff, TestBackend};
use mappa_model::gguf::{convert::convert, GgmlType, GgufFile};
use mappa_model::{ChatMessage, ChatRequest, Checkpoint, Model, StorageDtype, Tokenizer};
use serde::Deserialize;

const TOLERANCE: f32 = 1e-4;

#[derive(Deserialize)]
struct QuantCase {
    #[serde(rename = "type")]
    ggml_type: String,
    dims: Vec<usize>,
    sha256: String,
    first: Vec<f32>,
}

#[test]
fn every_type_dequantises_as_gguf_py_does() {
    let dir = fixtures().join("gguf");
    let file = GgufFile::open(&dir.join("quants.gguf")).unwrap();
    let text = std::fs::read_to_string(dir.join("quants.json")).unwrap();
    let expected: BTreeMap<String, QuantCase> = serde_json::from_str(&text).unwrap();
    let mut seen = Vec::new();
    for (name, case) in &expected {
        let info = file
            .tensor(name)
            .unwrap_or_else(|| panic!("no tensor `{name}`"));
        assert_eq!(info.ggml_type.name(), case.ggml_type, "{name}");
        assert_eq!(info.dims, case.dims, "{name}");
        let values = file.dequantize(info);
        assert_eq!(&values[..case.first.len()], &case.first[..], "{name}");
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            mappa_core::hash::sha256_hex(&bytes),
            case.sha256,
            "{name}: not bit-identical"
        );
        seen.push(info.ggml_type);
    }
    seen.sort();
    let mut all = GgmlType::ALL.to_vec();
    all.sort();
    assert_eq!(seen, all, "the fixture covers every supported type");
}

#[derive(Deserialize)]
struct TinyGolden {
    sequences: Vec<Vec<u32>>,
    logits: Vec<Vec<Vec<f32>>>,
    greedy: Vec<u32>,
    encodings: BTreeMap<String, Vec<u32>>,
    chat_prompt: String,
}

#[test]
fn a_converted_gguf_matches_transformers_loading_it() {
    let dir = fixtures().join("gguf");
    let golden: TinyGolden =
        serde_json::from_str(&std::fs::read_to_string(dir.join("tiny-llama.json")).unwrap())
            .unwrap();
    let gguf = GgufFile::open(&dir.join("tiny-llama.gguf")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let converted = out.path().join("tiny");
    let summary = convert(&gguf, &converted, StorageDtype::F32).unwrap();
    assert_eq!(summary.config.num_layers, 2);
    assert!(!summary.config.tie_word_embeddings);
    assert_eq!(
        summary.stored_types.values().sum::<usize>(),
        gguf.tensors().len()
    );

    let model = Model::<TestBackend>::load_on(&converted, &Default::default()).unwrap();
    for (ids, expected) in golden.sequences.iter().zip(&golden.logits) {
        let logits = model.logits(ids).unwrap();
        let expected: Vec<f32> = expected.iter().flatten().copied().collect();
        let diff = max_abs_diff(&logits.values, &expected);
        assert!(
            diff < TOLERANCE,
            "logits differ from transformers' by {diff}"
        );
    }
    let prompt = &golden.greedy[..4];
    let new = model.greedy(prompt, golden.greedy.len() - 4, None).unwrap();
    assert_eq!(new, golden.greedy[4..]);

    let checkpoint = Checkpoint::<TestBackend>::load(&converted, &Default::default()).unwrap();
    for (text, ids) in &golden.encodings {
        assert_eq!(&checkpoint.tokenizer.encode(text).unwrap(), ids, "{text:?}");
        assert_eq!(&checkpoint.tokenizer.decode(ids, false).unwrap(), text);
    }
    assert_eq!(checkpoint.tokenizer.eos_token_ids(), &[2]);
    let template = checkpoint
        .chat_template
        .as_ref()
        .expect("the GGUF's chat template");
    let messages = [ChatMessage::user("What is 2+3?")];
    let rendered = template
        .render(&ChatRequest {
            messages: &messages,
            add_generation_prompt: true,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(rendered, golden.chat_prompt);

    // bf16 storage loads too, and a second conversion into the same place is refused.
    let bf16 = out.path().join("bf16");
    convert(&gguf, &bf16, StorageDtype::Bf16).unwrap();
    Model::<TestBackend>::load_on(&bf16, &Default::default()).unwrap();
    let err = convert(&gguf, &converted, StorageDtype::F32)
        .unwrap_err()
        .to_string();
    assert!(err.contains("exists and is not empty"), "{err}");
}

#[test]
fn files_that_cannot_be_converted_say_why() {
    // The quant fixture has tensors but no model metadata.
    let gguf = GgufFile::open(&fixtures().join("gguf/quants.gguf")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let err = convert(&gguf, &out.path().join("x"), StorageDtype::F32)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("quants.gguf") && err.contains("llama.embedding_length"),
        "{err}"
    );
    assert!(!out.path().join("x").exists());
}
