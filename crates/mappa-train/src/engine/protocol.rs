//! What mappa's engine client sends and reads, per engine API: the
//! completion request's body, the adapter requests, the endpoints, and the
//! reading of a completion reply. Pure functions of their inputs, so the
//! contract test (`tests/engine_contract.rs`) checks exactly the bodies a
//! run sends against the engines' own schemas ([`super::contract`]).
//!
//! Both engines are read from their code at the versions the contract
//! names (fixtures/engines/):
//! - **vLLM** selects an adapter by `model` = its `lora_name`, answers an
//!   unknown one with 404, takes `top_k: 0` as off, serves adapters under
//!   `/v1/load_lora_adapter` and its version at `/version`.
//! - **SGLang** selects an adapter by `model` = `BASE:ADAPTER`, answers an
//!   adapter it has never loaded with 400 ("has never been loaded"), takes
//!   `top_k: -1` as off, serves adapters under `/load_lora_adapter` (no
//!   `/v1`) and its version in `/server_info`.
//! - Both return the completion's token ids in `choices[0].token_ids` with
//!   `return_token_ids` (the explicit field; vLLM's `token_id:N` strings of
//!   `return_tokens_as_token_ids` are not used), the stop token that ended
//!   a completion (the model's EOS or a `stop_token_ids` match) included,
//!   with its log-prob; both report such a completion as `"stop"` even when
//!   the stop token was the last one allowed.
//! - vLLM answers a request it aborted (its server shutting down, SIGTERM)
//!   with HTTP 200, `finish_reason: "abort"` and the tokens generated so
//!   far ([`Answer::Aborted`]): a transient failure, never a completion.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use mappa_core::http::snippet;

/// Which engine's API `[rollout.engine]` speaks (`kind`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// vLLM's OpenAI-compatible server (`vllm serve`).
    #[default]
    Vllm,
    /// SGLang's server (`python -m sglang.launch_server`).
    Sglang,
}

/// An endpoint mappa's client calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// One completion.
    Completions,
    /// Load a LoRA adapter from a directory.
    LoadAdapter,
    /// Unload a LoRA adapter.
    UnloadAdapter,
    /// The served models (the base, then adapters).
    Models,
    /// The engine's version.
    Version,
}

impl EngineKind {
    /// Both kinds.
    pub const ALL: [EngineKind; 2] = [EngineKind::Vllm, EngineKind::Sglang];

    /// The name as in a manifest (`vllm`, `sglang`).
    pub fn key(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }

    /// The engine's name as people write it.
    pub fn display(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vLLM",
            EngineKind::Sglang => "SGLang",
        }
    }

    /// The URL of `endpoint`, from the API's base URL (`http://HOST:PORT/v1`):
    /// endpoints outside `/v1` hang off the server's root.
    pub fn url(self, base: &str, endpoint: Endpoint) -> String {
        let base = base.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        match (self, endpoint) {
            (_, Endpoint::Completions) => format!("{base}/completions"),
            (_, Endpoint::Models) => format!("{base}/models"),
            (EngineKind::Vllm, Endpoint::LoadAdapter) => format!("{base}/load_lora_adapter"),
            (EngineKind::Vllm, Endpoint::UnloadAdapter) => format!("{base}/unload_lora_adapter"),
            (EngineKind::Vllm, Endpoint::Version) => format!("{root}/version"),
            (EngineKind::Sglang, Endpoint::LoadAdapter) => format!("{root}/load_lora_adapter"),
            (EngineKind::Sglang, Endpoint::UnloadAdapter) => format!("{root}/unload_lora_adapter"),
            (EngineKind::Sglang, Endpoint::Version) => format!("{root}/server_info"),
        }
    }

    /// The `model` of a request for `adapter` on the base served as `base`.
    pub fn model_field(self, base: &str, adapter: &str) -> String {
        match self {
            EngineKind::Vllm => adapter.to_string(),
            EngineKind::Sglang => format!("{base}:{adapter}"),
        }
    }

    /// The `top_k` that samples from the whole vocabulary.
    fn top_k_off(self) -> i64 {
        match self {
            EngineKind::Vllm => 0,
            EngineKind::Sglang => -1,
        }
    }

    /// Whether an error reply says the adapter asked for is not loaded (an
    /// engine that restarted and lost it): vLLM's 404, SGLang's 400.
    pub fn is_unknown_adapter(self, status: u16, body: &str) -> bool {
        match self {
            EngineKind::Vllm => status == 404,
            EngineKind::Sglang => {
                status == 404
                    || (status == 400
                        && (body.contains("has never been loaded")
                            || body.contains("are not loaded")))
            }
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.key())
    }
}

/// How an engine policy samples (the rollout's settings).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSampling {
    /// Most new tokens per completion.
    pub max_tokens: usize,
    /// Softmax temperature (0: greedy).
    pub temperature: f64,
    /// Nucleus sampling mass (1: off).
    pub top_p: f64,
}

/// One completion request, as the client builds it.
#[derive(Debug, Clone, PartialEq)]
pub struct CompletionRequest<'a> {
    /// The `model` field ([`EngineKind::model_field`]).
    pub model: &'a str,
    /// The prompt's token ids.
    pub prompt_ids: &'a [u32],
    /// The sampling settings.
    pub sampling: &'a EngineSampling,
    /// The request's seed ([`super::request_seed`]: at most `i64::MAX`).
    pub seed: u64,
    /// Token ids that end a completion (the tokenizer's EOS ids).
    pub stop_token_ids: &'a [u32],
}

/// The body of `POST /v1/completions` for `request`: one prompt as token
/// ids, the rollout's sampling with top-k off, the request's seed, the
/// sampled tokens' log-probs (`logprobs: 0`) and their ids
/// (`return_token_ids`).
pub fn completion_body(kind: EngineKind, request: &CompletionRequest<'_>) -> Value {
    json!({
        "model": request.model,
        "prompt": request.prompt_ids,
        "max_tokens": request.sampling.max_tokens,
        "temperature": request.sampling.temperature,
        "top_p": request.sampling.top_p,
        "top_k": kind.top_k_off(),
        "seed": request.seed,
        "stop_token_ids": request.stop_token_ids,
        "logprobs": 0,
        "return_token_ids": true,
    })
}

/// The body that loads the adapter in `path` as `name` (both engines).
pub fn load_adapter_body(name: &str, path: &str) -> Value {
    json!({ "lora_name": name, "lora_path": path })
}

/// The body that unloads the adapter `name` (both engines).
pub fn unload_adapter_body(name: &str) -> Value {
    json!({ "lora_name": name })
}

/// A completion as the trainer records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The new token ids, an ending stop token included.
    pub token_ids: Vec<u32>,
    /// The engine's log-prob of each.
    pub logprobs: Vec<f32>,
    /// Cut at `max_tokens` (not ended by a stop token).
    pub truncated: bool,
}

/// What a completion reply holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// A completion that ended (a stop token or the length limit).
    Finished(Completion),
    /// The engine aborted the request after `generated` tokens
    /// (`finish_reason: "abort"`: vLLM shutting down answers the requests
    /// in flight so). A transient failure: ask again with the same seed,
    /// and never train on the partial tokens.
    Aborted {
        /// Tokens generated before the abort.
        generated: usize,
    },
}

impl Answer {
    /// The completion, if the request finished.
    pub fn finished(self) -> Option<Completion> {
        match self {
            Answer::Finished(c) => Some(c),
            Answer::Aborted { .. } => None,
        }
    }
}

/// Reads a completion reply to a request whose `model` was `asked`: the
/// reply must name the same model (a reply from another adapter version is
/// refused, never trained on), carry `choices[0].token_ids` and as many
/// log-probs. It is truncated when cut at the length limit and its last
/// token is not one of `stop_token_ids`.
pub fn parse_completion(text: &str, asked: &str, stop_token_ids: &[u32]) -> Result<Answer, String> {
    let reply: Value = serde_json::from_str(text)
        .map_err(|e| format!("malformed JSON reply ({e}): {}", snippet(text)))?;
    let served = reply["model"].as_str().unwrap_or("");
    if served != asked {
        return Err(format!(
            "the engine answered as `{served}` when asked for `{asked}`: refusing a \
             completion from another adapter version"
        ));
    }
    let choice = &reply["choices"][0];
    let ids = choice["token_ids"].as_array().ok_or_else(|| {
        format!(
            "no choices[0].token_ids in the reply (the engine must support \
             `return_token_ids`: vLLM 0.10.2 or newer, SGLang 0.5.23 or newer): {}",
            snippet(text)
        )
    })?;
    let token_ids = ids
        .iter()
        .map(|t| {
            t.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| format!("expected a token id, got {t}"))
        })
        .collect::<Result<Vec<u32>, String>>()?;
    let values = choice["logprobs"]["token_logprobs"]
        .as_array()
        .ok_or_else(|| {
            format!(
                "no choices[0].logprobs.token_logprobs in the reply: {}",
                snippet(text)
            )
        })?;
    let logprobs = values
        .iter()
        .map(|v| {
            v.as_f64()
                .map(|v| v as f32)
                .ok_or_else(|| format!("expected a log-prob, got {v}"))
        })
        .collect::<Result<Vec<f32>, String>>()?;
    if logprobs.len() != token_ids.len() {
        return Err(format!(
            "{} token ids but {} log-probs in the reply",
            token_ids.len(),
            logprobs.len()
        ));
    }
    let ended_on_stop = token_ids.last().is_some_and(|t| stop_token_ids.contains(t));
    let truncated = match choice["finish_reason"].as_str() {
        Some("length") => !ended_on_stop,
        Some("stop") => false,
        Some("abort") => {
            return Ok(Answer::Aborted {
                generated: token_ids.len(),
            })
        }
        other => return Err(format!("unexpected finish_reason {other:?}")),
    };
    Ok(Answer::Finished(Completion {
        token_ids,
        logprobs,
        truncated,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_follow_each_engine() {
        let base = "http://h:8000/v1/";
        let v = EngineKind::Vllm;
        let s = EngineKind::Sglang;
        assert_eq!(
            v.url(base, Endpoint::LoadAdapter),
            "http://h:8000/v1/load_lora_adapter"
        );
        assert_eq!(
            s.url(base, Endpoint::LoadAdapter),
            "http://h:8000/load_lora_adapter"
        );
        assert_eq!(v.url(base, Endpoint::Version), "http://h:8000/version");
        assert_eq!(s.url(base, Endpoint::Version), "http://h:8000/server_info");
        assert_eq!(
            s.url(base, Endpoint::Completions),
            "http://h:8000/v1/completions"
        );
        assert_eq!(s.model_field("Qwen/Q", "a-v1"), "Qwen/Q:a-v1");
        assert_eq!(v.model_field("Qwen/Q", "a-v1"), "a-v1");
        assert!(s.is_unknown_adapter(400, "Got LoRA adapter that has never been loaded: x"));
        assert!(!s.is_unknown_adapter(400, "top_k must be -1 (disable)"));
        assert!(v.is_unknown_adapter(404, ""));
        assert!(!v.is_unknown_adapter(400, "has never been loaded"));
    }

    fn reply(ids: &[u32], finish: &str) -> String {
        json!({"model": "m", "choices": [{"index": 0, "text": "",
            "token_ids": ids, "finish_reason": finish,
            "logprobs": {"token_logprobs": vec![-0.5; ids.len()]}}]})
        .to_string()
    }

    fn finished(text: &str, stop: &[u32]) -> Completion {
        parse_completion(text, "m", stop)
            .unwrap()
            .finished()
            .unwrap()
    }

    #[test]
    fn a_completion_is_truncated_only_when_cut_before_a_stop_token() {
        let stop = [2];
        assert!(!finished(&reply(&[4, 2], "stop"), &stop).truncated);
        assert!(finished(&reply(&[4, 5], "length"), &stop).truncated);
        // A stop token that lands on the length limit ended the completion.
        assert!(!finished(&reply(&[4, 2], "length"), &stop).truncated);
        // An aborted request is not a completion, whatever it generated.
        assert_eq!(
            parse_completion(&reply(&[4, 2], "abort"), "m", &stop),
            Ok(Answer::Aborted { generated: 2 })
        );
        let err = parse_completion(&reply(&[4], "error"), "m", &stop).unwrap_err();
        assert!(err.contains("error"), "{err}");
    }

    #[test]
    fn replies_without_token_ids_or_from_another_model_are_refused() {
        let err = parse_completion(&reply(&[4], "stop"), "other", &[]).unwrap_err();
        assert!(err.contains("refusing"), "{err}");
        let no_ids = json!({"model": "m", "choices": [{"finish_reason": "stop",
            "logprobs": {"tokens": ["token_id:4"], "token_logprobs": [-1.0]}}]});
        let err = parse_completion(&no_ids.to_string(), "m", &[]).unwrap_err();
        assert!(err.contains("return_token_ids"), "{err}");
        let short = json!({"model": "m", "choices": [{"finish_reason": "stop",
            "token_ids": [4, 5], "logprobs": {"token_logprobs": [-1.0]}}]});
        let err = parse_completion(&short.to_string(), "m", &[]).unwrap_err();
        assert!(err.contains("2 token ids but 1 log-probs"), "{err}");
    }
}
