//! `mappa merge-lora`: a PEFT adapter folded into its base gives a plain
//! checkpoint that computes what PEFT computed with the adapter on.

mod common;

use common::*;
use mappa_model::{completion_logprobs, Checkpoint, Cpu};

#[test]
fn merge_lora_writes_a_checkpoint_that_computes_the_adapted_model() {
    let dir = scratch();
    let out = dir.path().join("merged");
    let fixtures = workspace().join("fixtures");
    let printed = succeeds(
        mappa()
            .arg("merge-lora")
            .arg(fixtures.join("models/qwen3-tiny"))
            .arg(fixtures.join("lora/qwen3-tiny"))
            .arg(&out),
    );
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(printed.contains("rank-4 adapter"), "{printed}");

    let golden: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures.join("lora/qwen3-tiny/golden.json")).unwrap(),
    )
    .unwrap();
    let ids = |key: &str| -> Vec<u32> {
        golden[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    let merged = Checkpoint::<Cpu>::load(&out, &Default::default()).unwrap();
    let pairs = [(ids("prompt_ids"), ids("completion_ids"))];
    let logprobs = completion_logprobs(&merged.model, &pairs, 1.0)
        .unwrap()
        .to_vecs();
    for (ours, theirs) in logprobs[0]
        .iter()
        .zip(golden["logprobs"].as_array().unwrap())
    {
        let theirs = theirs.as_f64().unwrap() as f32;
        assert!(
            (ours - theirs).abs() < 1e-4,
            "{ours} against PEFT's {theirs}"
        );
    }

    // Writing over the base is refused.
    let err = fails(
        mappa()
            .arg("merge-lora")
            .arg(fixtures.join("models/qwen3-tiny"))
            .arg(fixtures.join("lora/qwen3-tiny"))
            .arg(fixtures.join("models/qwen3-tiny")),
    );
    assert!(err.contains("would overwrite its base"), "{err}");
}
