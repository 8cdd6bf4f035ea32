//! A model served elsewhere (vLLM, SGLang, llama.cpp, Ollama, or a hosted
//! API) as a [`Policy`], through the OpenAI-compatible chat endpoint, so that
//! a large model can be evaluated in the same pipelines. It returns text
//! only (no token ids or log-probs), so it cannot be trained.

use mappa_judge::llm::{BackendError, ChatBackend, GenerationParams};
use mappa_judge::openai::{OpenAiBackend, OpenAiConfig};

use crate::policy::{Policy, PolicyOutput, PolicyRequest};
use crate::AgentError;

/// A remote, evaluation-only policy.
pub struct RemotePolicy {
    backend: OpenAiBackend,
    params: GenerationParams,
    concurrency: usize,
}

impl RemotePolicy {
    /// A policy calling `config`'s endpoint with the given sampling, at most
    /// `concurrency` requests at once. Timeouts, retries and rate limits are
    /// the coach client's (see `mappa_judge::openai`).
    pub fn new(
        config: OpenAiConfig,
        temperature: f64,
        max_tokens: u32,
        concurrency: usize,
    ) -> Result<Self, AgentError> {
        let backend = OpenAiBackend::new(config).map_err(|e| AgentError::Policy(e.to_string()))?;
        Ok(Self {
            backend,
            params: GenerationParams {
                temperature,
                max_tokens,
            },
            concurrency: concurrency.max(1),
        })
    }

    fn one(&self, request: &PolicyRequest) -> Result<PolicyOutput, AgentError> {
        let params = GenerationParams {
            max_tokens: request
                .reply
                .max_new_tokens
                .map_or(self.params.max_tokens, |n| n.min(u32::MAX as usize) as u32),
            ..self.params
        };
        if !request.reply.stop.is_empty() || !request.reply.prefix.is_empty() {
            return Err(AgentError::Policy(format!(
                "{}: the workflow's `stop` ({:?}) and `reply_prefix` ({:?}) cannot be sent \
                 through a chat endpoint: remove them to evaluate this workflow remotely",
                self.name(),
                request.reply.stop,
                request.reply.prefix
            )));
        }
        match self.backend.complete(&request.messages, &params) {
            Ok(c) => Ok(PolicyOutput {
                text: c.text,
                prompt_ids: Vec::new(),
                completion_ids: Vec::new(),
                logprobs: Vec::new(),
                truncated: false,
            }),
            Err(BackendError::Fatal(m)) => Err(AgentError::Policy(m)),
            Err(BackendError::Exhausted { attempts, last }) => Err(AgentError::Policy(format!(
                "{} failed after {attempts} attempts: {last}",
                self.name()
            ))),
        }
    }
}

impl Policy for RemotePolicy {
    fn name(&self) -> String {
        format!("remote:{}", self.backend.model_id())
    }

    fn generate(&self, requests: &[PolicyRequest]) -> Result<Vec<PolicyOutput>, AgentError> {
        mappa_core::par::map_bounded(requests, self.concurrency, |r| self.one(r))
            .into_iter()
            .collect()
    }
}
