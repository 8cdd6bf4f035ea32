//! The judging protocol shared by LLM coaches: render the rubric, look in
//! the cache, ask the model, parse; on a format failure re-prompt exactly
//! once with the bad reply in view; then fall back to the configured score,
//! counted per role.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::cache::{CacheMode, CoachCache};
use crate::context::{ActionContext, ActionScore};
use crate::parse::parse_reply;
use crate::rubric::{Message, RenderedPrompt, RubricSet};
use crate::{Coach, CoachError, CoachReport, RoleCounts, Usage};

/// Sampling settings sent with every request (they are part of the cache key).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GenerationParams {
    /// Sampling temperature; 0 means greedy.
    pub temperature: f64,
    /// Most tokens in a reply.
    pub max_tokens: u32,
}

/// A model's reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The reply text.
    pub text: String,
}

/// Why a backend gave no reply.
#[derive(Debug, Clone, PartialEq)]
pub enum BackendError {
    /// Retrying cannot help (authentication, unknown model, bad request): stop the run.
    Fatal(String),
    /// Every attempt failed (timeouts, 5xx, 429, broken bodies): the action gets the fallback.
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
    },
}

/// Something that answers chat messages: an HTTP endpoint or a local model.
pub trait ChatBackend: Send + Sync {
    /// The coach model's identity, part of the cache key (e.g. `gemini-2.5-flash`).
    fn model_id(&self) -> String;
    /// One reply to `messages`.
    fn complete(
        &self,
        messages: &[Message],
        params: &GenerationParams,
    ) -> Result<Completion, BackendError>;
    /// Requests, tokens and cost so far.
    fn usage(&self) -> Usage {
        Usage::default()
    }
}

/// Settings of an [`LlmCoach`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LlmSettings {
    /// Show the ground truth to the last agent's coach (the paper's setting).
    pub coach_sees_ground_truth: bool,
    /// Score used when no score could be parsed after the re-prompt, or the
    /// endpoint failed every attempt (the reference uses 5.0).
    pub fallback_score: f64,
    /// Sampling.
    pub temperature: f64,
    /// Most tokens per reply.
    pub max_tokens: u32,
    /// Most actions scored at once.
    pub max_concurrency: usize,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            coach_sees_ground_truth: true,
            fallback_score: 5.0,
            temperature: 0.0,
            max_tokens: 1024,
            max_concurrency: 8,
        }
    }
}

/// Text of the one re-prompt after a reply without the required lines.
pub fn format_reminder(asks_answer_correct: bool) -> String {
    let mut text = String::from(
        "Your reply above does not follow the required format. Reply again with a short analysis, \
         ending with a line of exactly this form:\nPROCESS_SCORE: <a number from 0 to 10>",
    );
    if asks_answer_correct {
        text.push_str("\nfollowed by a line of exactly this form:\nANSWER_CORRECT: <1 or 0>");
    }
    text
}

/// An LLM judge: rubric + backend + parser + cache.
pub struct LlmCoach<C: ChatBackend> {
    name: String,
    backend: C,
    rubrics: RubricSet,
    settings: LlmSettings,
    cache: Option<CoachCache>,
    counts: Mutex<BTreeMap<String, RoleCounts>>,
}

impl<C: ChatBackend> LlmCoach<C> {
    /// A coach named `name`; `cache` is `None` for mode `off`.
    pub fn new(
        name: impl Into<String>,
        backend: C,
        rubrics: RubricSet,
        settings: LlmSettings,
        cache: Option<CoachCache>,
    ) -> Result<Self, CoachError> {
        if !(0.0..=10.0).contains(&settings.fallback_score) {
            return Err(CoachError::Config(format!(
                "fallback_score = {}: expected a number in [0, 10]",
                settings.fallback_score
            )));
        }
        if settings.max_concurrency == 0 {
            return Err(CoachError::Config(
                "max_concurrency = 0: expected at least 1".into(),
            ));
        }
        Ok(Self {
            name: name.into(),
            backend,
            rubrics,
            settings,
            cache,
            counts: Mutex::new(BTreeMap::new()),
        })
    }

    /// The backend.
    pub fn backend(&self) -> &C {
        &self.backend
    }

    fn params(&self) -> GenerationParams {
        GenerationParams {
            temperature: self.settings.temperature,
            max_tokens: self.settings.max_tokens,
        }
    }

    fn count(&self, role: &str, f: impl FnOnce(&mut RoleCounts)) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        f(counts.entry(role.to_string()).or_default());
    }

    /// Score one action.
    pub fn score_one(&self, ctx: &ActionContext) -> Result<ActionScore, CoachError> {
        let prompt = self
            .rubrics
            .render(ctx, self.settings.coach_sees_ground_truth)?;
        let params = self.params();
        let key = crate::cache::cache_key(&self.backend.model_id(), &prompt, &params);
        if let Some(cache) = &self.cache {
            if let Some(mut hit) = cache.get(&key)? {
                hit.cached = true;
                self.count(&ctx.role, |c| {
                    c.scored += 1;
                    c.cache_hits += 1;
                    c.fallbacks += hit.fallback as u64;
                });
                return Ok(hit);
            }
            if cache.mode() == CacheMode::Replay {
                return Err(CoachError::ReplayMiss {
                    action: ctx.id.clone(),
                    role: ctx.role.clone(),
                    key,
                });
            }
        }
        let (score, reprompted) = self.ask(&prompt, &params)?;
        self.count(&ctx.role, |c| {
            c.scored += 1;
            c.fallbacks += score.fallback as u64;
            c.reprompts += reprompted as u64;
        });
        // Only the coach's answers are recorded: a request that failed is
        // asked again next time, never replayed as if the coach had said it.
        if let (Some(cache), false) = (&self.cache, score.request_failed()) {
            cache.put(
                &key,
                &self.backend.model_id(),
                &prompt.template_sha256,
                &score,
            )?;
        }
        Ok(score)
    }

    /// Ask, re-prompt once on a format failure, then fall back.
    fn ask(
        &self,
        prompt: &RenderedPrompt,
        params: &GenerationParams,
    ) -> Result<(ActionScore, bool), CoachError> {
        let needs_answer = prompt.asks_answer_correct;
        let mut messages = prompt.messages.clone();
        let first = match self.backend.complete(&messages, params) {
            Ok(c) => c.text,
            Err(e) => return Ok((self.fallback(prompt, String::new(), e)?, false)),
        };
        let parsed = parse_reply(&first);
        if parsed.is_complete(needs_answer) {
            return Ok((self.scored(prompt, first, parsed), false));
        }
        messages.push(Message::new("assistant", first.clone()));
        messages.push(Message::new("user", format_reminder(needs_answer)));
        let second = match self.backend.complete(&messages, params) {
            Ok(c) => c.text,
            Err(e) => return Ok((self.fallback(prompt, first, e)?, true)),
        };
        let parsed = parse_reply(&second);
        if parsed.score.is_some() {
            return Ok((self.scored(prompt, second, parsed), true));
        }
        let score = ActionScore {
            score: self.settings.fallback_score,
            rationale: String::new(),
            fallback: true,
            fallback_reason: Some("format".into()),
            answer_correct: None,
            raw_response: second,
            coach: self.name.clone(),
            template_sha256: prompt.template_sha256.clone(),
            cached: false,
        };
        Ok((score, true))
    }

    fn scored(
        &self,
        prompt: &RenderedPrompt,
        raw: String,
        parsed: crate::parse::ParsedReply,
    ) -> ActionScore {
        ActionScore {
            score: parsed.score.expect("checked by the caller"),
            rationale: parsed.rationale,
            fallback: false,
            fallback_reason: None,
            answer_correct: parsed.answer_correct.filter(|_| prompt.asks_answer_correct),
            raw_response: raw,
            coach: self.name.clone(),
            template_sha256: prompt.template_sha256.clone(),
            cached: false,
        }
    }

    fn fallback(
        &self,
        prompt: &RenderedPrompt,
        raw: String,
        error: BackendError,
    ) -> Result<ActionScore, CoachError> {
        match error {
            BackendError::Fatal(message) => Err(CoachError::Refused(message)),
            BackendError::Exhausted { attempts, last } => Ok(ActionScore {
                score: self.settings.fallback_score,
                rationale: String::new(),
                fallback: true,
                fallback_reason: Some(format!("request-failed after {attempts} attempts: {last}")),
                answer_correct: None,
                raw_response: raw,
                coach: self.name.clone(),
                template_sha256: prompt.template_sha256.clone(),
                cached: false,
            }),
        }
    }
}

impl<C: ChatBackend> Coach for LlmCoach<C> {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&self, contexts: &[ActionContext]) -> Result<Vec<ActionScore>, CoachError> {
        let results: Vec<Mutex<Option<Result<ActionScore, CoachError>>>> =
            contexts.iter().map(|_| Mutex::new(None)).collect();
        let next = AtomicUsize::new(0);
        let workers = self.settings.max_concurrency.min(contexts.len());
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(ctx) = contexts.get(i) else { break };
                    let result = self.score_one(ctx);
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                });
            }
        });
        results
            .into_iter()
            .map(|r| {
                r.into_inner()
                    .unwrap_or_else(|e| e.into_inner())
                    .expect("every action was scored")
            })
            .collect()
    }

    fn report(&self) -> CoachReport {
        CoachReport {
            coach: self.name.clone(),
            roles: self
                .counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            usage: self.backend.usage(),
        }
    }
}
