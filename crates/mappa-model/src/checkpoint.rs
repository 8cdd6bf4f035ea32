//! A whole HF checkpoint directory as one value: the model, its tokenizer
//! and its chat template. This is what an agent is made of, and what a
//! trained agent is saved back to.

use std::path::Path;

use burn::prelude::*;

use crate::chat::ChatTemplate;
use crate::error::{ModelError, Result};
use crate::tokenizer::{HfTokenizer, Tokenizer};
use crate::transformer::Transformer;
use crate::weights::{load_transformer, save_transformer, StorageDtype};

/// Tokenizer files copied along when a checkpoint is saved.
const TOKENIZER_FILES: [&str; 4] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    "special_tokens_map.json",
];

/// A loaded checkpoint.
pub struct Checkpoint<B: Backend> {
    /// The language model.
    pub model: Transformer<B>,
    /// Its tokenizer.
    pub tokenizer: HfTokenizer,
    /// Its chat template, when `tokenizer_config.json` has one.
    pub chat_template: Option<ChatTemplate>,
}

impl<B: Backend> Checkpoint<B> {
    /// Loads `config.json`, the safetensors weights and the tokenizer files of `dir`.
    pub fn load(dir: &Path, device: &B::Device) -> Result<Self> {
        let model = load_transformer(dir, device)?;
        let tokenizer = HfTokenizer::from_dir(dir)?;
        let chat_template = match tokenizer.chat_template() {
            Some(_) => Some(ChatTemplate::from_tokenizer(&tokenizer)?),
            None => None,
        };
        if tokenizer.vocab_size() > model.config().vocab_size {
            return Err(ModelError::tokenizer(
                Some(tokenizer.path()),
                format!(
                    "has {} tokens but the model's vocab_size is {}",
                    tokenizer.vocab_size(),
                    model.config().vocab_size
                ),
            ));
        }
        Ok(Self {
            model,
            tokenizer,
            chat_template,
        })
    }

    /// Saves the model as a HF checkpoint in `dir` and copies the tokenizer
    /// files beside it, so that `dir` loads here and in HF transformers.
    pub fn save(&self, dir: &Path, dtype: StorageDtype) -> Result<()> {
        save_transformer(&self.model, dir, dtype)?;
        let source = self.tokenizer.path().parent().unwrap_or(Path::new("."));
        if source == dir {
            return Ok(());
        }
        for name in TOKENIZER_FILES {
            let from = source.join(name);
            if from.exists() {
                let bytes =
                    std::fs::read(&from).map_err(|e| ModelError::io("cannot read", &from, e))?;
                mappa_core::fs::write_atomic(&dir.join(name), &bytes)?;
            }
        }
        Ok(())
    }
}
