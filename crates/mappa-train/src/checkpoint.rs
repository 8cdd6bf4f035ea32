//! Training checkpoints, one directory per save:
//!
//! ```text
//! <dir>/
//!   index.json                 sha256 of every other file (written last)
//!   state.json                 rollout step, dataset cursor, every RNG stream, caller's extras
//!   agents/<name>/config.json, model.safetensors   the policy, HF names and layout (f32)
//!   agents/<name>/adapter_config.json, adapter_model.safetensors
//!                                                    instead, for LoRA agents: the adapters (PEFT layout)
//!   agents/<name>/param_ids.json                    parameter ids (optimiser state is keyed by them)
//!   agents/<name>/optimizer.bin                      AdamW moments (burn record, full precision)
//!   agents/<name>/learner.json                       the schedule position (optimiser steps)
//! ```
//!
//! A save goes to `<dir>.partial` and is renamed into place, so an
//! interrupted save never replaces a good checkpoint. Loading checks every
//! file against the index first; a mismatch is an error naming the file.
//! Weights are stored in f32 and the optimiser in full precision, so a run
//! resumed from step k is bit-identical to an uninterrupted one on the CPU
//! backend. The frozen reference is not stored: it is the run's base model.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn::module::ParamId;
use burn::optim::Optimizer;
use burn::record::{BinFileRecorder, FullPrecisionSettings, Recorder};
use mappa_core::hash::sha256_file;
use mappa_core::rng::RngState;
use mappa_model::lora::{load_adapters, save_adapters};
use mappa_model::weights::{load_transformer, save_transformer};
use mappa_model::AutodiffModelBackend;
use mappa_model::StorageDtype;
use serde::{Deserialize, Serialize};

use crate::learner::AgentLearner;
use crate::params::{assign_param_ids, param_ids};
use crate::TrainError;

/// A named RNG stream's position, in a JSON-friendly form.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamState {
    /// The 32-byte seed, hex.
    pub seed: String,
    /// The position in 32-bit words (a decimal string: it is a u128).
    pub word_pos: String,
}

impl From<RngState> for StreamState {
    fn from(s: RngState) -> Self {
        Self {
            seed: s.seed.iter().map(|b| format!("{b:02x}")).collect(),
            word_pos: s.word_pos.to_string(),
        }
    }
}

impl StreamState {
    /// Back to an [`RngState`]; errors name the malformed field.
    pub fn to_rng_state(&self) -> Result<RngState, String> {
        if self.seed.len() != 64 {
            return Err(format!(
                "seed: expected 64 hex digits, found {} characters",
                self.seed.len()
            ));
        }
        let mut seed = [0u8; 32];
        for (i, byte) in seed.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&self.seed[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("seed: {:?} is not hex", &self.seed[2 * i..2 * i + 2]))?;
        }
        let word_pos = self
            .word_pos
            .parse()
            .map_err(|_| format!("word_pos: {:?} is not an integer", self.word_pos))?;
        Ok(RngState { seed, word_pos })
    }
}

/// Run-level state saved with the learners.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Rollout steps completed.
    pub step: usize,
    /// Position in the training set.
    pub dataset_cursor: u64,
    /// Every RNG stream of the run, by name.
    pub rng_streams: BTreeMap<String, StreamState>,
    /// Anything else the caller needs (e.g. the manifest hash).
    #[serde(default)]
    pub extra: serde_json::Value,
}

#[derive(Serialize, Deserialize)]
struct LearnerState {
    step: usize,
}

#[derive(Serialize, Deserialize)]
struct Index {
    files: BTreeMap<String, String>,
}

fn ck_err(path: &Path, message: impl std::fmt::Display) -> TrainError {
    TrainError::Checkpoint {
        path: path.display().to_string(),
        message: message.to_string(),
    }
}

fn write_json(path: &Path, value: &impl Serialize) -> Result<(), TrainError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| ck_err(path, e))?;
    std::fs::write(path, text).map_err(|e| ck_err(path, e))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| ck_err(path, e))?;
    serde_json::from_str(&text).map_err(|e| ck_err(path, e))
}

fn recorder() -> BinFileRecorder<FullPrecisionSettings> {
    BinFileRecorder::<FullPrecisionSettings>::new()
}

/// Every file beneath `root`, as sorted `/`-separated relative paths.
fn files_beneath(root: &Path) -> Result<Vec<String>, TrainError> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<String>) -> Result<(), TrainError> {
        for entry in std::fs::read_dir(dir).map_err(|e| ck_err(dir, e))? {
            let entry = entry.map_err(|e| ck_err(dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if prefix.is_empty() {
                name
            } else {
                format!("{prefix}/{name}")
            };
            if entry.path().is_dir() {
                walk(&entry.path(), &rel, out)?;
            } else {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(root, "", &mut out)?;
    out.sort();
    Ok(out)
}

/// Save `learners` and `state` to `dir` (replacing an older checkpoint there).
pub fn save_checkpoint<B: AutodiffModelBackend>(
    dir: &Path,
    learners: &[&AgentLearner<B>],
    state: &TrainerState,
) -> Result<(), TrainError> {
    let partial = PathBuf::from(format!("{}.partial", dir.display()));
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| ck_err(&partial, e))?;
    }
    for learner in learners {
        let agent_dir = partial.join("agents").join(learner.name());
        std::fs::create_dir_all(&agent_dir).map_err(|e| ck_err(&agent_dir, e))?;
        match learner.policy().lora_config() {
            // The frozen base is the run's base model, like the reference.
            Some(_) => save_adapters(learner.policy(), &agent_dir, learner.base_model()),
            None => save_transformer(learner.policy(), &agent_dir, StorageDtype::F32),
        }
        .map_err(|e| ck_err(&agent_dir, e))?;
        let ids: Vec<String> = param_ids(learner.policy())
            .into_iter()
            .map(ParamId::serialize)
            .collect();
        write_json(&agent_dir.join("param_ids.json"), &ids)?;
        let optimizer_path = agent_dir.join("optimizer");
        Recorder::<B>::record(
            &recorder(),
            learner.optimizer().to_record(),
            optimizer_path.clone(),
        )
        .map_err(|e| ck_err(&optimizer_path, e))?;
        write_json(
            &agent_dir.join("learner.json"),
            &LearnerState {
                step: learner.step(),
            },
        )?;
    }
    write_json(&partial.join("state.json"), state)?;
    let mut files = BTreeMap::new();
    for rel in files_beneath(&partial)? {
        let path = partial.join(&rel);
        files.insert(rel, sha256_file(&path).map_err(|e| ck_err(&path, e))?);
    }
    write_json(&partial.join("index.json"), &Index { files })?;

    let old = PathBuf::from(format!("{}.old", dir.display()));
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(|e| ck_err(dir, e))?;
    }
    std::fs::rename(&partial, dir).map_err(|e| ck_err(dir, e))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| ck_err(&old, e))?;
    }
    Ok(())
}

/// Check every file of the checkpoint in `dir` against its index.
pub fn verify_checkpoint(dir: &Path) -> Result<(), TrainError> {
    let index: Index = read_json(&dir.join("index.json"))?;
    for (rel, expected) in &index.files {
        let path = dir.join(rel);
        if !path.exists() {
            return Err(ck_err(&path, "listed in index.json but missing"));
        }
        let found = sha256_file(&path).map_err(|e| ck_err(&path, e))?;
        if &found != expected {
            return Err(ck_err(&path, format!("sha256 {found} does not match index.json ({expected}): the file is corrupt or was changed")));
        }
    }
    Ok(())
}

/// Restore `learners` (built as for a fresh run: same names, configs and
/// base model) from the checkpoint in `dir`; returns the run-level state.
pub fn load_checkpoint<B: AutodiffModelBackend>(
    dir: &Path,
    learners: &mut [AgentLearner<B>],
) -> Result<TrainerState, TrainError> {
    verify_checkpoint(dir)?;
    for learner in learners.iter_mut() {
        let agent_dir = dir.join("agents").join(learner.name());
        if !agent_dir.is_dir() {
            return Err(ck_err(
                &agent_dir,
                format!("no saved state for agent {}", learner.name()),
            ));
        }
        let device = learner.policy().device();
        let model = match learner.policy().lora_config() {
            Some(_) => load_adapters(learner.policy().without_adapters(), &agent_dir),
            None => load_transformer::<B>(&agent_dir, &device)
                .map(|m| m.with_attention(learner.policy().attention())),
        }
        .map_err(|e| ck_err(&agent_dir, e))?;
        let ids_path = agent_dir.join("param_ids.json");
        let ids: Vec<String> = read_json(&ids_path)?;
        let ids: Vec<ParamId> = ids
            .iter()
            .map(|s| {
                ParamId::try_deserialize(s)
                    .ok_or_else(|| ck_err(&ids_path, format!("bad parameter id {s:?}")))
            })
            .collect::<Result<_, _>>()?;
        let model = assign_param_ids(model, &ids).map_err(|e| ck_err(&ids_path, e))?;
        let optimizer_path = agent_dir.join("optimizer");
        let record = Recorder::<B>::load(&recorder(), optimizer_path.clone(), &device)
            .map_err(|e| ck_err(&agent_dir.join("optimizer.bin"), e))?;
        let LearnerState { step } = read_json(&agent_dir.join("learner.json"))?;
        let (policy, optimizer, position) = learner.parts_mut();
        *policy = model;
        *optimizer = optimizer.clone().load_record(record);
        *position = step;
    }
    read_json(&dir.join("state.json"))
}
