//! The burn model as a [`Policy`]: chat template, tokenizer, batched
//! KV-cache generation with one RNG stream per request (named by the
//! rollout engine), token ids and log-probs recorded for training.

use std::sync::Mutex;

use burn::prelude::*;
use mappa_agents::{AgentError, Message, Policy, PolicyOutput, PolicyRequest};
use mappa_core::rng::{RngStream, SeedTree};
use mappa_model::{
    generate, ChatMessage, ChatRequest, ChatTemplate, FinishReason, GenerationConfig, HfTokenizer,
    ModelBackend, Tokenizer, Transformer,
};
use serde::{Deserialize, Serialize};

/// How each request's sampler is seeded (`rollout.request_seeds`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RequestSeeds {
    /// The request's named stream itself (the default).
    #[default]
    Stream,
    /// A stream seeded by a non-negative signed 64-bit seed drawn from the
    /// request's named stream ([`crate::engine::request_seed`]): what vLLM's
    /// and SGLang's `seed` field takes. Rollouts by an engine always use it;
    /// set it for an in-process run to compare with one.
    Engine,
    /// A stream seeded by all 64 bits drawn from the request's named stream
    /// ([`crate::engine::request_seed_u64`]): how engine-style seeds were
    /// drawn before they were bounded to what engines accept (half of them
    /// are above `i64::MAX`, which vLLM and SGLang refuse). Kept so that
    /// in-process runs made with it replay; refused with an engine.
    U64,
}

/// The token ids of a chat prompt: the template rendered with the
/// generation prompt, then encoded.
pub fn render_prompt(
    template: &ChatTemplate,
    tokenizer: &HfTokenizer,
    messages: &[Message],
) -> mappa_model::Result<Vec<u32>> {
    let messages: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(&m.role, &m.content))
        .collect();
    let text = template.render(&ChatRequest {
        messages: &messages,
        add_generation_prompt: true,
        ..Default::default()
    })?;
    tokenizer.encode(&text)
}

/// One agent's model, generating.
pub struct ModelPolicy<'a, B: Backend> {
    name: String,
    model: Mutex<Transformer<B>>,
    tokenizer: &'a HfTokenizer,
    template: &'a ChatTemplate,
    generation: GenerationConfig,
    seeds: SeedTree,
    request_seeds: RequestSeeds,
    max_batch: Option<usize>,
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
            request_seeds: RequestSeeds::Stream,
            max_batch: None,
        }
    }

    /// Seeds each request's sampler as `request_seeds` says.
    pub fn with_request_seeds(mut self, request_seeds: RequestSeeds) -> Self {
        self.request_seeds = request_seeds;
        self
    }

    /// Generates at most `max_batch` sequences together (none: every
    /// request of a call in one batch). Bounds the KV cache and prompt-pass
    /// memory; other batch shapes change the last bits of the logits, so
    /// results differ from unbounded batches.
    pub fn with_max_batch(mut self, max_batch: Option<usize>) -> Self {
        self.max_batch = max_batch;
        self
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
            prompts.push(
                render_prompt(self.template, self.tokenizer, &request.messages)
                    .map_err(policy_err)?,
            );
        }
        let mut rngs: Vec<_> = requests
            .iter()
            .map(|r| match self.request_seeds {
                RequestSeeds::Stream => self.seeds.stream(&r.stream),
                RequestSeeds::Engine => {
                    RngStream::from_u64(crate::engine::request_seed(&self.seeds, &r.stream))
                }
                RequestSeeds::U64 => {
                    RngStream::from_u64(crate::engine::request_seed_u64(&self.seeds, &r.stream))
                }
            })
            .collect();
        let model = self.model.lock().unwrap_or_else(|e| e.into_inner());
        let chunk = self.max_batch.unwrap_or(prompts.len()).max(1);
        let mut generations = Vec::with_capacity(prompts.len());
        for (prompts, rngs) in prompts.chunks(chunk).zip(rngs.chunks_mut(chunk)) {
            generations.extend(
                generate(
                    &model,
                    Some(self.tokenizer),
                    prompts,
                    rngs,
                    &self.generation,
                )
                .map_err(policy_err)?,
            );
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_model::weights::load_transformer;
    use mappa_model::Cpu;
    use std::path::PathBuf;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen3-tiny")
    }

    fn requests() -> Vec<PolicyRequest> {
        ["Add 2 and 3.", "What is 7 times 8?", "Name a prime."]
            .iter()
            .enumerate()
            .map(|(i, text)| PolicyRequest {
                messages: vec![Message::new("user", *text)],
                stream: format!("test/{i}"),
            })
            .collect()
    }

    #[test]
    fn bounded_batches_are_the_unbounded_calls_on_each_chunk() {
        let model: Transformer<Cpu> = load_transformer(&fixture(), &Default::default()).unwrap();
        let tokenizer = HfTokenizer::from_dir(&fixture()).unwrap();
        let template = ChatTemplate::from_tokenizer(&tokenizer).unwrap();
        let policy = |max_batch| {
            ModelPolicy::new(
                "solver",
                model.clone(),
                &tokenizer,
                &template,
                GenerationConfig::greedy(6),
                SeedTree::new(3),
            )
            .with_max_batch(max_batch)
        };
        let all = requests();
        let bounded = policy(Some(2)).generate(&all).unwrap();
        let mut expected = policy(None).generate(&all[..2]).unwrap();
        expected.extend(policy(None).generate(&all[2..]).unwrap());
        assert_eq!(bounded.len(), 3);
        for (b, e) in bounded.iter().zip(&expected) {
            assert_eq!(b.prompt_ids, e.prompt_ids);
            assert_eq!(b.completion_ids, e.completion_ids);
            assert_eq!(b.logprobs, e.logprobs);
        }
    }
}
