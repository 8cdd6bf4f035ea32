//! A mappa-model checkpoint as the judge, with the same prompts and parser
//! as the HTTP coach. The prompt goes through the checkpoint's chat
//! template; temperature 0 decodes greedily. Generation is serialised (one
//! action at a time per model).
//!
//! A small judge rarely ends its reply with the score line the rubric asks
//! for (SmolLM2-135M-Instruct: none of 164 replies in a run). With
//! `reply_prefix` (e.g. `"PROCESS_SCORE:"`) every reply is made to begin
//! with that text: it is appended after the chat template's generation
//! prompt, the model continues it, and the parser reads prefix and
//! continuation together. The reply then carries no analysis; the re-prompt
//! and fallback still apply when the continuation is not a number.

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
    reply_prefix: String,
    seeds: SeedTree,
    usage: Mutex<Usage>,
}

impl<B: Backend> LocalBackend<B> {
    /// Load the checkpoint in `dir`; every reply begins with `reply_prefix`
    /// (empty: a free reply). Its identity in cache keys is the sha256 of its
    /// safetensors files (and the prefix, when there is one), so changed
    /// weights or a changed prefix never hit old entries.
    pub fn load(
        dir: &Path,
        device: &B::Device,
        seed: u64,
        reply_prefix: &str,
    ) -> Result<Self, CoachError> {
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
        let mut model_id = format!("local:{}", sha256_hex(digests.as_bytes()));
        if !reply_prefix.is_empty() {
            model_id.push_str(&format!(" reply_prefix={reply_prefix:?}"));
        }
        Ok(Self {
            checkpoint: Mutex::new(checkpoint),
            model_id,
            reply_prefix: reply_prefix.to_string(),
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
            .map_err(|e| fatal(&e))?
            + &self.reply_prefix;
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
            text: format!("{}{}", self.reply_prefix, generation.text),
        })
    }

    fn usage(&self) -> Usage {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_model::backend::Cpu;

    fn tiny() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen3-tiny")
    }

    #[test]
    fn a_reply_prefix_begins_the_reply_and_changes_the_cache_identity() {
        let device = Default::default();
        let free = LocalBackend::<Cpu>::load(&tiny(), &device, 0, "").unwrap();
        let prefixed = LocalBackend::<Cpu>::load(&tiny(), &device, 0, "PROCESS_SCORE:").unwrap();
        assert!(!free.model_id().contains("reply_prefix"));
        assert_ne!(free.model_id(), prefixed.model_id());
        let params = GenerationParams {
            temperature: 0.0,
            max_tokens: 3,
        };
        let messages = [Message::new("user", "Score this.")];
        let reply = prefixed.complete(&messages, &params).unwrap().text;
        assert!(reply.starts_with("PROCESS_SCORE:"), "{reply:?}");
        // The prefix is part of the prompt the model continues.
        free.complete(&messages, &params).unwrap();
        assert!(prefixed.usage().prompt_tokens > free.usage().prompt_tokens);
    }
}
