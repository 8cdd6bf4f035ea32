//! A mappa-model checkpoint as the judge, with the same prompts and parser
//! as the HTTP coach. The prompt goes through the checkpoint's chat
//! template; temperature 0 decodes greedily. Generation is serialised (one
//! action at a time per model).

use std::path::Path;
use std::sync::Mutex;

use burn::tensor::backend::Backend;
use mappa_core::hash::{sha256_file, sha256_hex};
use mappa_core::rng::SeedTree;
use mappa_model::ModelBackend;
use mappa_model::{
    generate, ChatMessage, ChatRequest, Checkpoint, GenerationConfig, SamplingConfig, Tokenizer,
};

use crate::llm::{BackendError, ChatBackend, Completion, GenerationParams};
use crate::{CoachError, Usage};
use mappa_core::chat::Message;

/// A local judge model.
pub struct LocalBackend<B: Backend> {
    checkpoint: Mutex<Checkpoint<B>>,
    model_id: String,
    seeds: SeedTree,
    usage: Mutex<Usage>,
}

impl<B: Backend> LocalBackend<B> {
    /// Load the checkpoint in `dir`. Its identity in cache keys is the sha256
    /// of its safetensors files, so changed weights never hit old entries.
    pub fn load(dir: &Path, device: &B::Device, seed: u64) -> Result<Self, CoachError> {
        let checkpoint =
            Checkpoint::<B>::load(dir, device).map_err(|e| CoachError::Local(e.to_string()))?;
        if checkpoint.chat_template.is_none() {
            return Err(CoachError::Local(format!(
                "{}: the tokenizer config has no chat template",
                dir.display()
            )));
        }
        let mut weights: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| CoachError::Local(format!("{}: {e}", dir.display())))?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .collect();
        weights.sort();
        let mut digests = String::new();
        for w in &weights {
            digests.push_str(&sha256_file(w).map_err(|e| CoachError::Local(e.to_string()))?);
        }
        Ok(Self {
            checkpoint: Mutex::new(checkpoint),
            model_id: format!("local:{}", sha256_hex(digests.as_bytes())),
            seeds: SeedTree::new(seed),
            usage: Mutex::new(Usage::default()),
        })
    }
}

impl<B: ModelBackend> ChatBackend for LocalBackend<B>
where
    Checkpoint<B>: Send,
{
    fn model_id(&self) -> String {
        self.model_id.clone()
    }

    fn complete(
        &self,
        messages: &[Message],
        params: &GenerationParams,
    ) -> Result<Completion, BackendError> {
        let fatal =
            |e: &dyn std::fmt::Display| BackendError::Fatal(format!("local coach model: {e}"));
        let chat: Vec<ChatMessage> = messages
            .iter()
            .map(|m| ChatMessage::new(&m.role, &m.content))
            .collect();
        let checkpoint = self.checkpoint.lock().unwrap_or_else(|e| e.into_inner());
        let template = checkpoint.chat_template.as_ref().expect("checked at load");
        let prompt = template
            .render(&ChatRequest {
                messages: &chat,
                add_generation_prompt: true,
                ..Default::default()
            })
            .map_err(|e| fatal(&e))?;
        let ids = checkpoint
            .tokenizer
            .encode(&prompt)
            .map_err(|e| fatal(&e))?;
        let sampling = if params.temperature <= 0.0 {
            SamplingConfig::greedy()
        } else {
            SamplingConfig::with_temperature(params.temperature as f32)
        };
        let config = GenerationConfig {
            max_new_tokens: params.max_tokens as usize,
            sampling,
            eos_token_ids: checkpoint.tokenizer.eos_token_ids().to_vec(),
            stop_strings: Vec::new(),
        };
        let mut rng = [self
            .seeds
            .stream(&format!("local-coach/{}", sha256_hex(prompt.as_bytes())))];
        let out = generate(
            &checkpoint.model,
            Some(&checkpoint.tokenizer),
            std::slice::from_ref(&ids),
            &mut rng,
            &config,
        )
        .map_err(|e| fatal(&e))?;
        let generation = out.into_iter().next().expect("one prompt, one generation");
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        usage.requests += 1;
        usage.prompt_tokens += ids.len() as u64;
        usage.completion_tokens += generation.token_ids.len() as u64;
        Ok(Completion {
            text: generation.text,
        })
    }

    fn usage(&self) -> Usage {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
