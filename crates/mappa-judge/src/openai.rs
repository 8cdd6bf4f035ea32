//! OpenAI-compatible chat completions (`POST {base_url}/chat/completions`):
//! Gemini's OpenAI endpoint, OpenAI, vLLM, llama.cpp's server and Ollama all
//! speak it.
//!
//! Each request has a timeout. Timeouts, connection errors, broken bodies,
//! 408, 429 and 5xx are retried with capped exponential backoff and jitter
//! (half the step plus a random half), waiting at least the `Retry-After` of
//! a 429 or 503 (seconds or an HTTP date; `max_backoff_s` caps every wait),
//! up to `max_attempts` attempts. Other 4xx replies stop the run. A
//! requests-per-minute limit spaces request starts; the coach's concurrency
//! limit bounds requests in flight. The API key is read from the environment
//! variable the config names and is never stored, logged or cached.

use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use mappa_core::http::snippet;
use mappa_core::rng::{RngStream, SeedTree};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::llm::{BackendError, ChatBackend, Completion, GenerationParams};
use crate::{CoachError, Usage};
use mappa_core::chat::Message;

/// Settings of an OpenAI-compatible endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiConfig {
    /// Base URL, up to and without `/chat/completions`
    /// (e.g. `https://generativelanguage.googleapis.com/v1beta/openai`, `http://127.0.0.1:8000/v1`).
    pub base_url: String,
    /// Model name sent with each request (e.g. `gemini-2.5-flash`).
    pub model: String,
    /// Name of the environment variable holding the API key (`GEMINI_API_KEY`,
    /// `OPENAI_API_KEY`); none for local servers without authentication.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Per-request timeout in seconds (connect, send and read together).
    #[serde(default = "defaults::timeout_s")]
    pub timeout_s: f64,
    /// Most attempts per request (first try included).
    #[serde(default = "defaults::max_attempts")]
    pub max_attempts: u32,
    /// First backoff step in seconds; it doubles per attempt.
    #[serde(default = "defaults::initial_backoff_s")]
    pub initial_backoff_s: f64,
    /// Longest wait between attempts, `Retry-After` included.
    #[serde(default = "defaults::max_backoff_s")]
    pub max_backoff_s: f64,
    /// Most request starts per minute (none: unlimited).
    #[serde(default)]
    pub requests_per_minute: Option<f64>,
    /// USD per million prompt tokens, for the cost estimate.
    #[serde(default)]
    pub usd_per_million_prompt_tokens: f64,
    /// USD per million completion tokens, for the cost estimate.
    #[serde(default)]
    pub usd_per_million_completion_tokens: f64,
    /// Seed of the backoff jitter stream.
    #[serde(default)]
    pub seed: u64,
}

mod defaults {
    pub(super) fn timeout_s() -> f64 {
        120.0
    }
    pub(super) fn max_attempts() -> u32 {
        6
    }
    pub(super) fn initial_backoff_s() -> f64 {
        1.0
    }
    pub(super) fn max_backoff_s() -> f64 {
        60.0
    }
}

/// A client of one endpoint.
pub struct OpenAiBackend {
    config: OpenAiConfig,
    url: String,
    api_key: Option<String>,
    agent: ureq::Agent,
    next_start: Mutex<Instant>,
    jitter: Mutex<RngStream>,
    usage: Mutex<Usage>,
}

impl std::fmt::Debug for OpenAiBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("OpenAiBackend")
            .field("url", &self.url)
            .field("model", &self.config.model)
            .finish()
    }
}

impl OpenAiBackend {
    /// A client; reads the API key from the named environment variable.
    pub fn new(config: OpenAiConfig) -> Result<Self, CoachError> {
        Self::build(config, true)
    }

    /// A client for replaying a cache: it sends no request (a replay miss is
    /// an error before any), so it reads no API key and needs none.
    pub fn for_replay(config: OpenAiConfig) -> Result<Self, CoachError> {
        Self::build(config, false)
    }

    fn build(config: OpenAiConfig, read_key: bool) -> Result<Self, CoachError> {
        let bad = |field: &str, expected: &str| {
            CoachError::Config(format!("openai.{field}: expected {expected}"))
        };
        if !(config.timeout_s.is_finite() && config.timeout_s > 0.0) {
            return Err(bad("timeout_s", "a positive number of seconds"));
        }
        if config.max_attempts == 0 {
            return Err(bad("max_attempts", "at least 1"));
        }
        if !(config.initial_backoff_s >= 0.0 && config.max_backoff_s >= config.initial_backoff_s) {
            return Err(bad("max_backoff_s", "a number >= initial_backoff_s >= 0"));
        }
        if config
            .requests_per_minute
            .is_some_and(|r| !(r.is_finite() && r > 0.0))
        {
            return Err(bad("requests_per_minute", "a positive number"));
        }
        let base = config.base_url.trim_end_matches('/');
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(bad("base_url", "an http:// or https:// URL"));
        }
        let api_key = mappa_core::http::api_key_from_env(
            config.api_key_env.as_deref().filter(|_| read_key),
            "openai.api_key_env",
        )
        .map_err(CoachError::Config)?;
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs_f64(config.timeout_s))
            .build();
        Ok(Self {
            url: format!("{base}/chat/completions"),
            api_key,
            agent,
            next_start: Mutex::new(Instant::now()),
            jitter: Mutex::new(SeedTree::new(config.seed).stream("coach-backoff-jitter")),
            usage: Mutex::new(Usage::default()),
            config,
        })
    }

    /// Wait for the next request slot allowed by `requests_per_minute`.
    fn wait_for_slot(&self) {
        let Some(rpm) = self.config.requests_per_minute else {
            return;
        };
        let interval = Duration::from_secs_f64(60.0 / rpm);
        let start = {
            let mut next = self.next_start.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*next).max(Instant::now());
            *next = start + interval;
            start
        };
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
    }

    /// The wait before attempt `attempt + 1`.
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let step = self.config.initial_backoff_s * 2f64.powi(attempt.saturating_sub(1) as i32);
        let capped = step.min(self.config.max_backoff_s);
        let u = self
            .jitter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .uniform();
        let jittered = capped * (0.5 + 0.5 * u);
        let wait = retry_after.map_or(jittered, |r| r.as_secs_f64().max(jittered));
        Duration::from_secs_f64(wait.min(self.config.max_backoff_s))
    }

    fn record(&self, body: &Value) {
        let mut usage = self.usage.lock().unwrap_or_else(|e| e.into_inner());
        let tokens = |k: &str| body["usage"][k].as_u64().unwrap_or(0);
        let (p, c) = (tokens("prompt_tokens"), tokens("completion_tokens"));
        usage.prompt_tokens += p;
        usage.completion_tokens += c;
        usage.estimated_cost_usd += (p as f64 * self.config.usd_per_million_prompt_tokens
            + c as f64 * self.config.usd_per_million_completion_tokens)
            / 1e6;
    }

    /// One HTTP attempt: the reply, or (retryable?, message, Retry-After).
    fn attempt(&self, body: &str) -> Result<String, (bool, String, Option<Duration>)> {
        self.wait_for_slot();
        self.usage
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .requests += 1;
        let mut request = self
            .agent
            .post(&self.url)
            .set("Content-Type", "application/json");
        if let Some(key) = &self.api_key {
            request = request.set("Authorization", &format!("Bearer {key}"));
        }
        match request.send_string(body) {
            Ok(response) => {
                let text = response
                    .into_string()
                    .map_err(|e| (true, format!("reading the body: {e}"), None))?;
                let value: Value = serde_json::from_str(&text).map_err(|e| {
                    (
                        true,
                        format!("malformed JSON body ({e}): {}", snippet(&text)),
                        None,
                    )
                })?;
                self.record(&value);
                match value["choices"][0]["message"]["content"].as_str() {
                    Some(content) => Ok(content.to_string()),
                    None => Err((
                        true,
                        format!("no choices[0].message.content in {}", snippet(&text)),
                        None,
                    )),
                }
            }
            Err(ureq::Error::Status(code, response)) => {
                let retry_after = response.header("Retry-After").and_then(parse_retry_after);
                let text = response.into_string().unwrap_or_default();
                let retryable = code == 408 || code == 429 || code >= 500;
                let retry_after = if code == 429 || code == 503 {
                    retry_after
                } else {
                    None
                };
                Err((
                    retryable,
                    format!("HTTP {code} from {}: {}", self.url, snippet(&text)),
                    retry_after,
                ))
            }
            Err(ureq::Error::Transport(t)) => Err((true, t.to_string(), None)),
        }
    }
}

/// `Retry-After`: delay-seconds or an HTTP date.
fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

impl ChatBackend for OpenAiBackend {
    fn model_id(&self) -> String {
        self.config.model.clone()
    }

    fn complete(
        &self,
        messages: &[Message],
        params: &GenerationParams,
    ) -> Result<Completion, BackendError> {
        let body = json!({
            "model": self.config.model,
            "messages": messages,
            "temperature": params.temperature,
            "max_tokens": params.max_tokens,
        })
        .to_string();
        let mut last = String::new();
        for attempt in 1..=self.config.max_attempts {
            match self.attempt(&body) {
                Ok(text) => return Ok(Completion { text }),
                Err((false, message, _)) => return Err(BackendError::Fatal(message)),
                Err((true, message, retry_after)) => {
                    last = message;
                    if attempt < self.config.max_attempts {
                        std::thread::sleep(self.backoff(attempt, retry_after));
                    }
                }
            }
        }
        Err(BackendError::Exhausted {
            attempts: self.config.max_attempts,
            last,
        })
    }

    fn usage(&self) -> Usage {
        self.usage.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(parse_retry_after("2"), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(" 0.5 "), Some(Duration::from_millis(500)));
        let soon = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(30));
        let d = parse_retry_after(&soon).unwrap();
        assert!(
            d > Duration::from_secs(25) && d <= Duration::from_secs(30),
            "{d:?}"
        );
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn backoff_doubles_is_jittered_capped_and_honours_retry_after() {
        let config = OpenAiConfig {
            base_url: "http://127.0.0.1:1/v1".into(),
            model: "m".into(),
            api_key_env: None,
            timeout_s: 1.0,
            max_attempts: 5,
            initial_backoff_s: 1.0,
            max_backoff_s: 5.0,
            requests_per_minute: None,
            usd_per_million_prompt_tokens: 0.0,
            usd_per_million_completion_tokens: 0.0,
            seed: 7,
        };
        let b = OpenAiBackend::new(config).unwrap();
        for attempt in 1..=6u32 {
            let step = (2f64.powi(attempt as i32 - 1)).min(5.0);
            let d = b.backoff(attempt, None).as_secs_f64();
            assert!(d >= step * 0.5 && d <= step, "attempt {attempt}: {d}");
        }
        assert_eq!(
            b.backoff(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            b.backoff(1, Some(Duration::from_secs(300))),
            Duration::from_secs(5)
        );
    }

    #[test]
    fn a_missing_key_variable_is_named_not_guessed() {
        let config: OpenAiConfig = toml::from_str(
            "base_url = 'https://example.invalid/v1'\nmodel = 'm'\napi_key_env = 'MAPPA_TEST_SURELY_UNSET_KEY'",
        )
        .unwrap();
        let err = OpenAiBackend::new(config).unwrap_err().to_string();
        assert!(err.contains("MAPPA_TEST_SURELY_UNSET_KEY"), "{err}");
    }
}
