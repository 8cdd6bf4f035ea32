//! The judging protocol shared by LLM coaches: render the rubric, look in
//! the cache, ask the model, parse; on a format failure re-prompt exactly
//! once with the bad reply in view; then fall back to the configured score,
//! counted per role. A batch in which too many requests failed outright
//! (the coach is unreachable) stops, or waits for the coach, as configured
//! ([`OnOutage`]): a run never trains on a coach that did not answer.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cache::{CacheMode, CoachCache};
use crate::context::{ActionContext, ActionScore};
use crate::parse::parse_reply;
use crate::rubric::{Message, RenderedPrompt, RubricSet};
use crate::{Coach, CoachError, CoachReport, SharedCounts, Usage};

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
    /// The largest share of a batch's actions (one agent's actions in a
    /// training step; one `--batch` of `mappa coach score`) that may get the
    /// fallback because every request failed. Above it the coach counts as
    /// unreachable and [`LlmSettings::on_outage`] applies.
    pub max_failed_fraction: f64,
    /// What an unreachable coach does to the run.
    pub on_outage: OnOutage,
    /// With `on_outage = "wait"`: the longest wait for the coach to come
    /// back, in seconds, before stopping after all.
    pub max_outage_wait_s: f64,
    /// With `on_outage = "wait"`: seconds between asking again.
    pub outage_poll_s: f64,
}

impl Default for LlmSettings {
    fn default() -> Self {
        Self {
            coach_sees_ground_truth: true,
            fallback_score: 5.0,
            temperature: 0.0,
            max_tokens: 1024,
            max_concurrency: 8,
            max_failed_fraction: 0.05,
            on_outage: OnOutage::Stop,
            max_outage_wait_s: 3600.0,
            outage_poll_s: 30.0,
        }
    }
}

impl LlmSettings {
    /// Check ranges; the error names the key and what was expected.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.0..=10.0).contains(&self.fallback_score) {
            return Err(format!(
                "settings.fallback_score = {}: expected a number in [0, 10]",
                self.fallback_score
            ));
        }
        if self.max_concurrency == 0 {
            return Err("settings.max_concurrency = 0: expected at least 1".into());
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!(
                "settings.temperature = {}: expected a finite number >= 0",
                self.temperature
            ));
        }
        if !(0.0..=1.0).contains(&self.max_failed_fraction) {
            return Err(format!(
                "settings.max_failed_fraction = {}: expected a share in [0, 1]",
                self.max_failed_fraction
            ));
        }
        for (name, value) in [
            ("max_outage_wait_s", self.max_outage_wait_s),
            ("outage_poll_s", self.outage_poll_s),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(format!(
                    "settings.{name} = {value}: expected a number of seconds >= 0"
                ));
            }
        }
        Ok(())
    }
}

/// What a batch does when more than `max_failed_fraction` of its actions
/// got no answer from the coach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnOutage {
    /// Stop with [`CoachError::Unavailable`]; the answers already received
    /// are cached, and a training run resumes from its last checkpoint.
    #[default]
    Stop,
    /// Ask again for the failed actions every `outage_poll_s` seconds until
    /// the coach answers (the run continues as if nothing happened) or
    /// `max_outage_wait_s` has passed (then stop as with `stop`).
    Wait,
}

/// One action judged: the score, and whether it needed the re-prompt.
struct Judged {
    score: ActionScore,
    reprompted: bool,
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
    counts: SharedCounts,
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
        settings.validate().map_err(CoachError::Config)?;
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

    /// Count one action's final score for its role.
    fn tally(&self, role: &str, judged: &Judged) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let c = counts.entry(role.to_string()).or_default();
        let score = &judged.score;
        c.scored += 1;
        c.fallbacks += score.fallback as u64;
        c.request_failures += score.request_failed() as u64;
        c.reprompts += judged.reprompted as u64;
        c.cache_hits += score.cached as u64;
    }

    /// Score one action (without the outage policy, which applies to batches).
    pub fn score_one(&self, ctx: &ActionContext) -> Result<ActionScore, CoachError> {
        let judged = self.judge(ctx)?;
        self.tally(&ctx.role, &judged);
        Ok(judged.score)
    }

    /// Judge one action: the cache, else the coach; nothing counted.
    fn judge(&self, ctx: &ActionContext) -> Result<Judged, CoachError> {
        let prompt = self
            .rubrics
            .render(ctx, self.settings.coach_sees_ground_truth)?;
        let params = self.params();
        let key = crate::cache::cache_key(&self.backend.model_id(), &prompt, &params);
        if let Some(cache) = &self.cache {
            if let Some(mut hit) = cache.get(&key)? {
                hit.cached = true;
                return Ok(Judged {
                    score: hit,
                    reprompted: false,
                });
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
        Ok(Judged { score, reprompted })
    }

    /// Judge `contexts[i]` for each `i` of `which`, up to
    /// `max_concurrency` at a time; results in the order of `which`.
    fn judge_parallel(
        &self,
        contexts: &[ActionContext],
        which: &[usize],
    ) -> Vec<Result<Judged, CoachError>> {
        mappa_core::par::map_bounded(which, self.settings.max_concurrency, |&i| {
            self.judge(&contexts[i])
        })
    }

    /// Whether `failed` of `total` actions without an answer is more than
    /// the batch may have.
    fn too_many_failed(&self, failed: usize, total: usize) -> bool {
        failed as f64 > self.settings.max_failed_fraction * total as f64
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
            audit: None,
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
            audit: None,
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
                audit: None,
            }),
        }
    }
}

impl<C: ChatBackend> Coach for LlmCoach<C> {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&self, contexts: &[ActionContext]) -> Result<Vec<ActionScore>, CoachError> {
        let all: Vec<usize> = (0..contexts.len()).collect();
        let mut judged = self
            .judge_parallel(contexts, &all)
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        let started = Instant::now();
        loop {
            let failed: Vec<usize> = (0..judged.len())
                .filter(|&i| judged[i].score.request_failed())
                .collect();
            if !self.too_many_failed(failed.len(), judged.len()) {
                break;
            }
            let waited = started.elapsed().as_secs_f64();
            let poll = self.settings.outage_poll_s;
            if self.settings.on_outage == OnOutage::Stop
                || waited + poll > self.settings.max_outage_wait_s
            {
                let last = &judged[failed[0]].score;
                return Err(CoachError::Unavailable {
                    failed: failed.len(),
                    total: judged.len(),
                    max_failed_fraction: self.settings.max_failed_fraction,
                    waited_s: waited,
                    reason: last.fallback_reason.clone().unwrap_or_default(),
                });
            }
            eprintln!(
                "coach {}: {} of {} actions got no answer; asking again in {poll} s \
                 (on_outage = \"wait\", waited {waited:.0} of {} s)",
                self.name,
                failed.len(),
                judged.len(),
                self.settings.max_outage_wait_s
            );
            std::thread::sleep(Duration::from_secs_f64(poll));
            for (i, again) in failed.iter().zip(self.judge_parallel(contexts, &failed)) {
                judged[*i] = again?;
            }
        }
        for (ctx, j) in contexts.iter().zip(&judged) {
            self.tally(&ctx.role, j);
        }
        Ok(judged.into_iter().map(|j| j.score).collect())
    }

    fn report(&self) -> CoachReport {
        CoachReport::of(&self.name, &self.counts, self.backend.usage())
    }
}
