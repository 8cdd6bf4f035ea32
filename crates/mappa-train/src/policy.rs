//! The burn model as a [`Policy`]: chat template, tokenizer, batched
//! KV-cache generation with one RNG stream per request (named by the
//! rollout engine), token ids and log-probs recorded for training.

use std::sync::Mutex;

use burn::prelude::*;
use mappa_agents::{AgentError, Policy, PolicyOutput, PolicyRequest};
use mappa_core::rng::SeedTree;
use mappa_model::{
    generate, ChatMessage, ChatRequest, ChatTemplate, FinishReason, GenerationConfig, HfTokenizer,
    ModelBackend, Tokenizer, Transformer,
};

/// One agent's model, generating.
pub struct ModelPolicy<'a, B: Backend> {
    name: String,
    model: Mutex<Transformer<B>>,
    tokenizer: &'a HfTokenizer,
    template: &'a ChatTemplate,
    generation: GenerationConfig,
    seeds: SeedTree,
}

impl<'a, B: Backend> ModelPolicy<'a, B> {
    /// A policy generating with `model` (for a learner: `learner.policy().valid()`).
    /// EOS ids default to the tokenizer's when `generation` names none.
    pub fn new(
        name: impl Into<String>,
        model: Transformer<B>,
        tokenizer: &'a HfTokenizer,
        template: &'a ChatTemplate,
        mut generation: GenerationConfig,
        seeds: SeedTree,
    ) -> Self {
        if generation.eos_token_ids.is_empty() {
            generation.eos_token_ids = tokenizer.eos_token_ids().to_vec();
        }
        Self {
            name: name.into(),
            model: Mutex::new(model),
            tokenizer,
            template,
            generation,
            seeds,
        }
    }
}

impl<B: ModelBackend> Policy for ModelPolicy<'_, B>
where
    Transformer<B>: Send,
{
    fn name(&self) -> String {
        self.name.clone()
    }

    fn generate(&self, requests: &[PolicyRequest]) -> Result<Vec<PolicyOutput>, AgentError> {
        let policy_err =
            |e: mappa_model::ModelError| AgentError::Policy(format!("{}: {e}", self.name));
        let mut prompts = Vec::with_capacity(requests.len());
        for request in requests {
            let messages: Vec<ChatMessage> = request
                .messages
                .iter()
                .map(|m| ChatMessage::new(&m.role, &m.content))
                .collect();
            let text = self
                .template
                .render(&ChatRequest {
                    messages: &messages,
                    add_generation_prompt: true,
                    ..Default::default()
                })
                .map_err(policy_err)?;
            prompts.push(self.tokenizer.encode(&text).map_err(policy_err)?);
        }
        let mut rngs: Vec<_> = requests
            .iter()
            .map(|r| self.seeds.stream(&r.stream))
            .collect();
        let model = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let generations = generate(
            &model,
            Some(self.tokenizer),
            &prompts,
            &mut rngs,
            &self.generation,
        )
        .map_err(policy_err)?;
        Ok(prompts
            .into_iter()
            .zip(generations)
            .map(|(prompt_ids, g)| PolicyOutput {
                text: g.text,
                prompt_ids,
                truncated: g.finish == FinishReason::Length,
                completion_ids: g.token_ids,
                logprobs: g.logprobs,
            })
            .collect())
    }
}
