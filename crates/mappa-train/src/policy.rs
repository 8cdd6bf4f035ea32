//! The burn model as a [`Policy`]: chat template, tokenizer, batched
//! KV-cache generation with one RNG stream per request (named by the
//! rollout engine), token ids and log-probs recorded for training.

use std::sync::Mutex;

use burn::prelude::*;
use mappa_agents::{AgentError, Message, Policy, PolicyOutput, PolicyRequest, ReplyFormat};
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
/// generation prompt, the reply's `prefix` after it, then encoded.
pub fn render_prompt(
    template: &ChatTemplate,
    tokenizer: &HfTokenizer,
    messages: &[Message],
    prefix: &str,
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
    tokenizer.encode(&(text + prefix))
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
                render_prompt(
                    self.template,
                    self.tokenizer,
                    &request.messages,
                    &request.reply.prefix,
                )
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
        let mut generations = Vec::with_capacity(prompts.len());
        for (range, reply) in batches(requests, self.max_batch) {
            generations.extend(
                generate(
                    &model,
                    Some(self.tokenizer),
                    &prompts[range.clone()],
                    &mut rngs[range],
                    &limited(&self.generation, reply),
                )
                .map_err(policy_err)?,
            );
        }
        Ok(prompts
            .into_iter()
            .zip(generations)
            .zip(requests)
            .map(|((prompt_ids, g), r)| PolicyOutput {
                text: r.reply.prefix.clone() + &g.text,
                prompt_ids,
                truncated: g.finish == FinishReason::Length,
                completion_ids: g.token_ids,
                logprobs: g.logprobs,
            })
            .collect())
    }
}

/// The batches `requests` are generated in: runs of requests with equal
/// reply formats, each cut into pieces of at most `max_batch` (none: no cut).
fn batches(
    requests: &[PolicyRequest],
    max_batch: Option<usize>,
) -> Vec<(std::ops::Range<usize>, &ReplyFormat)> {
    let cap = max_batch.unwrap_or(usize::MAX).max(1);
    let mut out: Vec<(std::ops::Range<usize>, &ReplyFormat)> = Vec::new();
    for (i, r) in requests.iter().enumerate() {
        match out.last_mut() {
            Some((range, reply)) if **reply == r.reply && range.len() < cap => range.end = i + 1,
            _ => out.push((i..i + 1, &r.reply)),
        }
    }
    out
}

/// `config` with an agent's own length limit and stop strings applied.
fn limited(config: &GenerationConfig, reply: &ReplyFormat) -> GenerationConfig {
    let mut config = config.clone();
    if let Some(n) = reply.max_new_tokens {
        config.max_new_tokens = n;
    }
    config.stop_strings.extend(reply.stop.iter().cloned());
    config
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
                reply: Default::default(),
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

    #[test]
    fn a_reply_format_prefixes_the_prompt_and_the_text_and_stops_early() {
        let model: Transformer<Cpu> = load_transformer(&fixture(), &Default::default()).unwrap();
        let tokenizer = HfTokenizer::from_dir(&fixture()).unwrap();
        let template = ChatTemplate::from_tokenizer(&tokenizer).unwrap();
        let policy = ModelPolicy::new(
            "solver",
            model,
            &tokenizer,
            &template,
            GenerationConfig::greedy(12),
            SeedTree::new(3),
        );
        let plain = policy.generate(&requests()).unwrap();
        // The prefix ends the prompt; the reply's text starts with it.
        let mut prefixed = requests();
        for r in &mut prefixed {
            r.reply.prefix = "Plan:".into();
        }
        let out = policy.generate(&prefixed).unwrap();
        for (o, r) in out.iter().zip(&prefixed) {
            let ids = render_prompt(&template, &tokenizer, &r.messages, "Plan:").unwrap();
            assert_eq!(o.prompt_ids, ids);
            assert!(o.text.starts_with("Plan:"), "{:?}", o.text);
        }
        // A shorter limit and a stop string: the first reply stops at its
        // second token's text, not truncated; the limit cuts the others.
        let first_two = tokenizer
            .decode(&plain[0].completion_ids[..2], false)
            .unwrap();
        let stop = first_two.trim_start().chars().last().unwrap().to_string();
        let mut limited = requests();
        for r in &mut limited {
            r.reply.max_new_tokens = Some(4);
            r.reply.stop = vec![stop.clone()];
        }
        let out = policy.generate(&limited).unwrap();
        assert!(out.iter().all(|o| o.completion_ids.len() <= 4));
        assert!(
            !out[0].truncated && out[0].completion_ids.len() <= 2,
            "{:?}",
            out[0]
        );
        assert_eq!(
            out[0].completion_ids,
            plain[0].completion_ids[..out[0].completion_ids.len()]
        );
    }

    #[test]
    fn requests_with_other_formats_go_in_other_batches() {
        let mut all = requests();
        all[2].reply.max_new_tokens = Some(3);
        let batches = batches(&all, None);
        let ranges: Vec<_> = batches.iter().map(|(r, _)| r.clone()).collect();
        assert_eq!(ranges, [0..2, 2..3]);
        let ranges: Vec<_> = super::batches(&all, Some(1))
            .into_iter()
            .map(|(r, _)| r)
            .collect();
        assert_eq!(ranges, [0..1, 1..2, 2..3]);
    }
}
