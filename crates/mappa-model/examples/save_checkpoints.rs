//! Saves each fixture checkpoint with mappa, in f32 and in bf16, and beside
//! each saved directory writes `mappa_logits.json`: the logits mappa computes
//! after loading that directory back, on the golden inputs. Used by
//! `just hf-roundtrip`, whose Python half loads the same directories in HF
//! transformers and compares.
//!
//! Usage: `cargo run --release -p mappa-model --example save_checkpoints -- OUT_DIR`

use std::path::{Path, PathBuf};

use burn::prelude::*;
use mappa_model::backend::Cpu;
use mappa_model::{Checkpoint, StorageDtype};
use serde_json::{json, Value};

const MODELS: [&str; 3] = ["qwen3-tiny", "qwen2-tiny", "llama-tiny"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: save_checkpoints OUT_DIR")?,
    );
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models");
    let device = Default::default();
    for name in MODELS {
        let source = fixtures.join(name);
        let ckpt = Checkpoint::<Cpu>::load(&source, &device)?;
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(source.join("golden.json"))?)?;
        for dtype in [StorageDtype::F32, StorageDtype::Bf16] {
            let dir = out.join(format!("{name}-{}", dtype.torch_name()));
            ckpt.save(&dir, dtype)?;
            let reloaded = Checkpoint::<Cpu>::load(&dir, &device)?;
            let mut cases = Vec::new();
            for case in golden["logits"]
                .as_array()
                .ok_or("golden.json: no logits")?
            {
                let ids: Vec<i32> = serde_json::from_value(case["input_ids"].clone())?;
                let n = ids.len();
                let input =
                    Tensor::<Cpu, 2, Int>::from_data(TensorData::new(ids.clone(), [1, n]), &device);
                let logits = reloaded
                    .model
                    .forward(input)
                    .into_data()
                    .into_vec::<f32>()?;
                cases.push(json!({"input_ids": ids, "logits": logits}));
            }
            std::fs::write(
                dir.join("mappa_logits.json"),
                serde_json::to_string(&cases)?,
            )?;
            println!("saved {}", dir.display());
        }
    }
    Ok(())
}
