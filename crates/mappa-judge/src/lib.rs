//! The coach: per-action process rewards from AI feedback (docs/METHOD.md section 3).
//!
//! After every agent action a [`Coach`] reads the action in context
//! ([`ActionContext`]) and returns an [`ActionScore`]: a 0-10 score, a short
//! rationale, whether a fallback was used, and the raw reply.
//!
//! - [`rubric`]: the coach prompts, as template files per domain and role.
//! - [`parse`]: `PROCESS_SCORE: x` and `ANSWER_CORRECT: 0|1`.
//! - [`llm`]: the judging protocol shared by LLM coaches (one re-prompt on a
//!   format failure, then a counted fallback), over any [`llm::ChatBackend`].
//! - [`openai`]: OpenAI-compatible chat completions (Gemini, OpenAI, vLLM,
//!   llama.cpp, Ollama) with timeouts, retries, rate limits and cost.
//! - `local` (feature `local-model`): a mappa-model checkpoint as the judge.
//! - [`scripted`]: simulated coaches for generated tasks, scoring from the
//!   known solution; their names and outputs say "scripted".
//! - [`cache`]: the SQLite record/replay cache.
//! - `testing` (feature `testing`): a local OpenAI-compatible server for tests.
//! - [`config`]: the coach configuration (a `COACH.toml` for `mappa coach
//!   score`, or a manifest's `[coach]`; docs/coach.md).

#![warn(missing_docs)]

pub mod cache;
pub mod config;
pub mod context;
pub mod llm;
#[cfg(feature = "local-model")]
pub mod local;
pub mod openai;
pub mod parse;
pub mod rubric;
pub mod scripted;
#[cfg(feature = "testing")]
pub mod testing;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use context::{
    ActionContext, ActionScore, Audit, ErrorTable, FallbackKind, FileLists, GroundTruth,
    KnownSolution,
};

/// Scores actions.
pub trait Coach: Send + Sync {
    /// A name for reports and score records (scripted coaches contain "scripted").
    fn name(&self) -> &str;
    /// One score per context, in order.
    fn score_batch(&self, contexts: &[ActionContext]) -> Result<Vec<ActionScore>, CoachError>;
    /// What happened so far: scores and fallbacks per role, cache use, tokens, cost.
    fn report(&self) -> CoachReport;
}

/// Errors that stop scoring (a bad reply is a counted fallback, not an error).
#[derive(Debug, thiserror::Error)]
pub enum CoachError {
    /// Bad configuration or rubric.
    #[error("coach configuration: {0}")]
    Config(String),
    /// The endpoint refused the request in a way retries cannot fix (401, 404, ...).
    #[error("coach request refused: {0}")]
    Refused(String),
    /// Replay mode met an action that is not in the cache.
    #[error("replay: no cached score for action {action:?} (role {role}), cache key {key}")]
    ReplayMiss {
        /// The action's id.
        action: String,
        /// The action's role.
        role: String,
        /// The cache key.
        key: String,
    },
    /// The cache failed.
    #[error("coach cache {path}: {message}")]
    Cache {
        /// The cache file.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The local judge model failed.
    #[error("local coach model: {0}")]
    Local(String),
    /// Too many of a batch's actions got no answer: the coach is
    /// unreachable (`[coach.settings] max_failed_fraction`, `on_outage`).
    #[error(
        "the coach did not answer {failed} of {total} actions (more than max_failed_fraction = \
         {max_failed_fraction}; waited {waited_s:.0} s); last failure: {reason}. Nothing was \
         scored with a stand-in and every answer received is cached: check the endpoint \
         (base_url, network, quota) and run again (a training run: `mappa run MANIFEST --resume \
         RUN_DIR`), or set `[coach.settings] on_outage = \"wait\"` to wait for the coach"
    )]
    Unavailable {
        /// Actions whose every request failed.
        failed: usize,
        /// Actions in the batch.
        total: usize,
        /// The configured limit.
        max_failed_fraction: f64,
        /// Seconds waited for the coach to come back (0 with `on_outage = "stop"`).
        waited_s: f64,
        /// The last failure, as the fallback reason says it.
        reason: String,
    },
}

/// Counts for one role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RoleCounts {
    /// Actions scored.
    pub scored: u64,
    /// Of which with the fallback score (for any reason).
    pub fallbacks: u64,
    /// Of those, fallbacks because every request failed (the coach never
    /// answered); the rest are malformed answers.
    #[serde(default)]
    pub request_failures: u64,
    /// Of which needed the format re-prompt.
    pub reprompts: u64,
    /// Of which came from the cache.
    pub cache_hits: u64,
}

/// Token use and estimated cost of an HTTP coach.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// HTTP requests sent (retries included).
    pub requests: u64,
    /// Prompt tokens reported by the endpoint.
    pub prompt_tokens: u64,
    /// Completion tokens reported by the endpoint.
    pub completion_tokens: u64,
    /// Estimated cost in USD from the configured prices (0 when none are set).
    pub estimated_cost_usd: f64,
}

/// What a coach did so far.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CoachReport {
    /// The coach's name.
    pub coach: String,
    /// Counts per role.
    pub roles: BTreeMap<String, RoleCounts>,
    /// Token use and cost (HTTP coaches).
    pub usage: Usage,
}

/// Counts per role as coaches keep them, behind a lock shared by scoring threads.
pub(crate) type SharedCounts = std::sync::Mutex<BTreeMap<String, RoleCounts>>;

impl CoachReport {
    /// A report of `coach`'s `counts` so far, with `usage`.
    pub(crate) fn of(coach: &str, counts: &SharedCounts, usage: Usage) -> Self {
        Self {
            coach: coach.to_string(),
            roles: counts.lock().unwrap_or_else(|e| e.into_inner()).clone(),
            usage,
        }
    }

    /// Fallbacks over all roles.
    pub fn total_fallbacks(&self) -> u64 {
        self.roles.values().map(|r| r.fallbacks).sum()
    }

    /// Fallbacks because requests failed, over all roles.
    pub fn total_request_failures(&self) -> u64 {
        self.roles.values().map(|r| r.request_failures).sum()
    }
}
