//! `mappa serve`: a checkpoint behind the part of vLLM's OpenAI-compatible
//! API that engine rollouts use (`mappa_train::engine`), on the CPU
//! backend. It stands in for vLLM where there is no GPU: the engine
//! protocol's test server, and a way to serve a small model to
//! `mappa eval --remote-url` or a coach.
//!
//! Endpoints (as vLLM names and answers them):
//! - `POST /v1/completions`: one prompt (token ids or text); `model` is the
//!   base's served name or a loaded adapter's; `max_tokens`,
//!   `temperature`, `top_p`, `top_k`, `seed`, `stop_token_ids`,
//!   `logprobs: 0` (the sampled tokens' log-probs) and
//!   `return_tokens_as_token_ids`. Sampling fields it does not implement
//!   are refused by name, never ignored.
//! - `POST /v1/chat/completions`: the same, from `messages` through the
//!   checkpoint's chat template.
//! - `POST /v1/load_lora_adapter` (`lora_name`, `lora_path`: a PEFT
//!   directory) and `POST /v1/unload_lora_adapter` (`lora_name`).
//! - `GET /v1/models`, `GET /health`.
//!
//! One request is served at a time, each generated alone, so a completion
//! depends only on its request: with a seed, the same request always gets
//! the same tokens, bit for bit what mappa's in-process policy samples with
//! `rollout.request_seeds = "u64"` and `rollout.max_batch = 1`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use mappa_core::rng::{RngStream, SeedTree};
use mappa_model::{
    generate, AttentionKind, ChatMessage, ChatRequest, Checkpoint, Cpu, FinishReason,
    GenerationConfig, SamplingConfig, Tokenizer, Transformer,
};
use serde_json::{json, Value};

/// `mappa serve MODEL_DIR`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A HF checkpoint directory: the base model every adapter applies to.
    pub model: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The name the base model is served as (default: the directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Seed of the streams of requests that bring no `seed`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// How the model computes attention: `dense` or `fused` (as the run's
    /// `train.attention`, for completions equal to its in-process ones).
    #[arg(long, default_value = "dense", value_parser = parse_attention)]
    pub attention: AttentionKind,
}

fn parse_attention(value: &str) -> Result<AttentionKind, String> {
    match value {
        "dense" => Ok(AttentionKind::Dense),
        "fused" => Ok(AttentionKind::Fused),
        other => Err(format!("expected dense or fused, got {other:?}")),
    }
}

/// An error answer: HTTP status, vLLM's error type, message.
struct ApiError(u16, &'static str, String);

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        ApiError(400, "BadRequestError", message.into())
    }

    fn not_found(message: impl Into<String>) -> Self {
        ApiError(404, "NotFoundError", message.into())
    }

    fn body(&self) -> String {
        json!({"error": {"message": self.2, "type": self.1, "param": null, "code": self.0}})
            .to_string()
    }
}

/// A success answer: JSON, or vLLM's plain-text acknowledgements.
enum Answer {
    Json(Value),
    Text(String),
}

/// The served base model and the adapters loaded on it.
struct Engine {
    name: String,
    root: PathBuf,
    base: Checkpoint<Cpu>,
    adapters: BTreeMap<String, (Transformer<Cpu>, PathBuf)>,
    seeds: SeedTree,
    requests: u64,
}

/// Serves until the process is stopped.
pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let device = Default::default();
    let mut base = Checkpoint::<Cpu>::load(&args.model, &device)
        .with_context(|| format!("loading the checkpoint `{}`", args.model.display()))?;
    base.model = base.model.with_attention(args.attention);
    let name = match &args.served_model_name {
        Some(name) => name.clone(),
        None => dir_name(&args.model),
    };
    let server = tiny_http::Server::http((args.host.as_str(), args.port))
        .map_err(|e| anyhow::anyhow!("listening on {}:{}: {e}", args.host, args.port))?;
    let address = server
        .server_addr()
        .to_ip()
        .context("the server has no IP address")?;
    eprintln!("mappa serve: {name} at http://{address}/v1 (CPU backend, one request at a time)");
    let mut engine = Engine {
        name,
        root: args.model.clone(),
        base,
        adapters: BTreeMap::new(),
        seeds: SeedTree::new(args.seed),
        requests: 0,
    };
    for mut request in server.incoming_requests() {
        let mut body = String::new();
        let answer = match request.as_reader().read_to_string(&mut body) {
            Ok(_) => engine.handle(request.method(), request.url(), &body),
            Err(e) => Err(ApiError::bad(format!("reading the body: {e}"))),
        };
        let (status, text, content_type) = match answer {
            Ok(Answer::Json(value)) => (200, value.to_string(), "application/json"),
            Ok(Answer::Text(text)) => (200, text, "text/plain"),
            Err(e) => (e.0, e.body(), "application/json"),
        };
        let header =
            tiny_http::Header::from_bytes("Content-Type", content_type).expect("a valid header");
        let response = tiny_http::Response::from_string(text)
            .with_status_code(status)
            .with_header(header);
        // A client that hung up is its own problem, not the server's.
        let _ = request.respond(response);
    }
    Ok(())
}

fn dir_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string())
}

impl Engine {
    fn handle(
        &mut self,
        method: &tiny_http::Method,
        url: &str,
        body: &str,
    ) -> Result<Answer, ApiError> {
        use tiny_http::Method::{Get, Post};
        let path = url.split('?').next().unwrap_or(url);
        let json = || -> Result<Value, ApiError> {
            serde_json::from_str(body).map_err(|e| ApiError::bad(format!("malformed JSON: {e}")))
        };
        match (method, path) {
            (Get, "/health") => Ok(Answer::Text(String::new())),
            (Get, "/v1/models") => Ok(Answer::Json(self.models())),
            (Post, "/v1/completions") => self.completion(&json()?, false),
            (Post, "/v1/chat/completions") => self.completion(&json()?, true),
            (Post, "/v1/load_lora_adapter") => self.load(&json()?),
            (Post, "/v1/unload_lora_adapter") => self.unload(&json()?),
            _ => Err(ApiError::not_found(format!("no route {method} {path}"))),
        }
    }

    fn models(&self) -> Value {
        let mut data = vec![json!({
            "id": self.name, "object": "model", "owned_by": "mappa",
            "root": self.root.display().to_string(), "parent": null,
        })];
        for (name, (_, path)) in &self.adapters {
            data.push(json!({
                "id": name, "object": "model", "owned_by": "mappa",
                "root": path.display().to_string(), "parent": self.name,
            }));
        }
        json!({"object": "list", "data": data})
    }

    fn load(&mut self, body: &Value) -> Result<Answer, ApiError> {
        let (Some(name), Some(path)) = (body["lora_name"].as_str(), body["lora_path"].as_str())
        else {
            return Err(ApiError::bad(
                "both 'lora_name' and 'lora_path' must be provided.",
            ));
        };
        if self.adapters.contains_key(name) {
            return Err(ApiError::bad(format!(
                "The lora adapter '{name}' has already been loaded."
            )));
        }
        let model = mappa_model::lora::load_adapters(self.base.model.clone(), Path::new(path))
            .map_err(|e| ApiError::bad(format!("loading the adapter '{name}' from {path}: {e}")))?;
        self.adapters
            .insert(name.to_string(), (model, PathBuf::from(path)));
        eprintln!("mappa serve: loaded {name} from {path}");
        Ok(Answer::Text(format!(
            "Success: LoRA adapter '{name}' added successfully."
        )))
    }

    fn unload(&mut self, body: &Value) -> Result<Answer, ApiError> {
        let Some(name) = body["lora_name"].as_str() else {
            return Err(ApiError::bad("'lora_name' must be provided."));
        };
        if self.adapters.remove(name).is_none() {
            return Err(ApiError::not_found(format!(
                "The lora adapter '{name}' cannot be found."
            )));
        }
        eprintln!("mappa serve: unloaded {name}");
        Ok(Answer::Text(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        )))
    }

    /// The model a request names: the base (also when it names none) or an adapter.
    fn model(&self, body: &Value) -> Result<(&Transformer<Cpu>, String), ApiError> {
        match body.get("model").and_then(Value::as_str) {
            None => Ok((&self.base.model, self.name.clone())),
            Some(name) if name == self.name => Ok((&self.base.model, self.name.clone())),
            Some(name) => match self.adapters.get(name) {
                Some((model, _)) => Ok((model, name.to_string())),
                None => Err(ApiError::not_found(format!(
                    "The model `{name}` does not exist."
                ))),
            },
        }
    }

    fn completion(&mut self, body: &Value, chat: bool) -> Result<Answer, ApiError> {
        refuse_unsupported(body)?;
        self.requests += 1;
        let number = self.requests;
        let tokenizer = &self.base.tokenizer;
        let prompt = if chat {
            let template = self
                .base
                .chat_template
                .as_ref()
                .ok_or_else(|| ApiError::bad("the served checkpoint has no chat template"))?;
            let messages = body["messages"]
                .as_array()
                .ok_or_else(|| ApiError::bad("'messages': expected a list"))?
                .iter()
                .map(|m| match (m["role"].as_str(), m["content"].as_str()) {
                    (Some(role), Some(content)) => Ok(ChatMessage::new(role, content)),
                    _ => Err(ApiError::bad(
                        "'messages': each needs a string 'role' and 'content'",
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?;
            let text = template
                .render(&ChatRequest {
                    messages: &messages,
                    add_generation_prompt: true,
                    ..Default::default()
                })
                .map_err(|e| ApiError::bad(e.to_string()))?;
            tokenizer
                .encode(&text)
                .map_err(|e| ApiError::bad(e.to_string()))?
        } else {
            prompt_ids(&body["prompt"], tokenizer)?
        };
        if let Some(&bad) = prompt
            .iter()
            .find(|&&id| id as usize >= tokenizer.vocab_size())
        {
            return Err(ApiError::bad(format!(
                "'prompt': token id {bad} is outside the vocabulary ({} ids)",
                tokenizer.vocab_size()
            )));
        }
        let field = |key: &str, default: f64| -> Result<f64, ApiError> {
            match body.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_f64()
                    .ok_or_else(|| ApiError::bad(format!("'{key}': expected a number"))),
            }
        };
        let max_tokens = field(
            if chat && body.get("max_completion_tokens").is_some() {
                "max_completion_tokens"
            } else {
                "max_tokens"
            },
            16.0,
        )?;
        let temperature = field("temperature", 1.0)?;
        let top_p = field("top_p", 1.0)?;
        let top_k = field("top_k", -1.0)?;
        if !(max_tokens >= 1.0 && max_tokens.fract() == 0.0) {
            return Err(ApiError::bad("'max_tokens': expected a positive integer"));
        }
        if !(temperature >= 0.0 && temperature.is_finite()) {
            return Err(ApiError::bad("'temperature': expected a number >= 0"));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad("'top_p': expected a number in (0, 1]"));
        }
        if !(top_k == -1.0 || (top_k >= 0.0 && top_k.fract() == 0.0)) {
            return Err(ApiError::bad(
                "'top_k': expected -1, 0 (off) or a positive integer",
            ));
        }
        let logprobs = match body.get("logprobs") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(v) if v.as_u64() == Some(0) || (chat && v.as_bool() == Some(true)) => true,
            Some(v) => {
                return Err(ApiError::bad(format!(
                    "'logprobs' = {v}: mappa serve returns the sampled tokens' log-probs only (logprobs: 0)"
                )))
            }
        };
        let as_ids = body["return_tokens_as_token_ids"]
            .as_bool()
            .unwrap_or(false);
        let mut eos = tokenizer.eos_token_ids().to_vec();
        if let Some(extra) = body.get("stop_token_ids").filter(|v| !v.is_null()) {
            let extra = extra
                .as_array()
                .and_then(|ids| {
                    ids.iter()
                        .map(|i| i.as_u64().map(|i| i as u32))
                        .collect::<Option<Vec<_>>>()
                })
                .ok_or_else(|| ApiError::bad("'stop_token_ids': expected a list of token ids"))?;
            eos.extend(extra);
        }
        let mut rng = match body.get("seed").filter(|v| !v.is_null()) {
            Some(seed) => RngStream::from_u64(
                seed.as_u64()
                    .ok_or_else(|| ApiError::bad("'seed': expected a non-negative integer"))?,
            ),
            None => self.seeds.stream(&format!("request-{number}")),
        };
        let (model, served) = self.model(body)?;
        let config = GenerationConfig {
            max_new_tokens: max_tokens as usize,
            sampling: SamplingConfig {
                temperature: temperature as f32,
                top_k: top_k.max(0.0) as usize,
                top_p: top_p as f32,
            },
            eos_token_ids: eos,
            stop_strings: Vec::new(),
        };
        let tok: &dyn Tokenizer = tokenizer;
        let generation = generate(
            model,
            Some(tok),
            std::slice::from_ref(&prompt),
            std::slice::from_mut(&mut rng),
            &config,
        )
        .map_err(|e| ApiError(500, "InternalServerError", e.to_string()))?
        .pop()
        .expect("one generation per prompt");
        let finish = match generation.finish {
            FinishReason::Length => "length",
            _ => "stop",
        };
        let usage = json!({
            "prompt_tokens": prompt.len(),
            "completion_tokens": generation.token_ids.len(),
            "total_tokens": prompt.len() + generation.token_ids.len(),
        });
        let token = |id: u32| -> String {
            if as_ids {
                format!("token_id:{id}")
            } else {
                tok.decode(&[id], false).unwrap_or_default()
            }
        };
        let choice = if chat {
            let logprobs = logprobs.then(|| {
                let content: Vec<Value> = generation
                    .token_ids
                    .iter()
                    .zip(&generation.logprobs)
                    .map(
                        |(&id, &lp)| json!({"token": token(id), "logprob": lp, "top_logprobs": []}),
                    )
                    .collect();
                json!({ "content": content })
            });
            json!({
                "index": 0,
                "message": {"role": "assistant", "content": generation.text},
                "logprobs": logprobs,
                "finish_reason": finish,
            })
        } else {
            let logprobs = logprobs.then(|| {
                json!({
                    "tokens": generation.token_ids.iter().map(|&id| token(id)).collect::<Vec<_>>(),
                    "token_logprobs": generation.logprobs,
                    "top_logprobs": null,
                    "text_offset": null,
                })
            });
            json!({
                "index": 0,
                "text": generation.text,
                "logprobs": logprobs,
                "finish_reason": finish,
            })
        };
        Ok(Answer::Json(json!({
            "id": format!("cmpl-{number}"),
            "object": if chat { "chat.completion" } else { "text_completion" },
            "model": served,
            "choices": [choice],
            "usage": usage,
        })))
    }
}

/// A completion's prompt: token ids (one list, or a list holding one), or text.
fn prompt_ids(prompt: &Value, tokenizer: &dyn Tokenizer) -> Result<Vec<u32>, ApiError> {
    let ids = |list: &Vec<Value>| -> Option<Vec<u32>> {
        list.iter()
            .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()))
            .collect()
    };
    match prompt {
        Value::String(text) => tokenizer
            .encode(text)
            .map_err(|e| ApiError::bad(e.to_string())),
        Value::Array(list) if list.len() == 1 && list[0].is_array() => {
            prompt_ids(&list[0], tokenizer)
        }
        Value::Array(list) if list.len() == 1 && list[0].is_string() => {
            prompt_ids(&list[0], tokenizer)
        }
        Value::Array(list) if !list.is_empty() && !list[0].is_array() && !list[0].is_string() => {
            ids(list).ok_or_else(|| ApiError::bad("'prompt': expected token ids (integers)"))
        }
        Value::Array(_) => Err(ApiError::bad(
            "'prompt': mappa serve takes one prompt per request",
        )),
        _ => Err(ApiError::bad(
            "'prompt': expected text or a list of token ids",
        )),
    }
}

/// Refuses, by name, request fields that would change sampling and that
/// mappa serve does not implement (a value equal to the default is fine).
fn refuse_unsupported(body: &Value) -> Result<(), ApiError> {
    let neutral: [(&str, Value); 10] = [
        ("n", json!(1)),
        ("best_of", json!(1)),
        ("stream", json!(false)),
        ("echo", json!(false)),
        ("presence_penalty", json!(0.0)),
        ("frequency_penalty", json!(0.0)),
        ("repetition_penalty", json!(1.0)),
        ("min_p", json!(0.0)),
        ("ignore_eos", json!(false)),
        ("min_tokens", json!(0)),
    ];
    for (key, default) in &neutral {
        if let Some(v) = body.get(*key).filter(|v| !v.is_null()) {
            let same = match (v.as_f64(), default.as_f64()) {
                (Some(a), Some(b)) => a == b,
                _ => v == default,
            };
            if !same {
                return Err(ApiError::bad(format!(
                    "'{key}' = {v}: mappa serve does not implement it (only {default})"
                )));
            }
        }
    }
    for key in ["stop", "logit_bias", "suffix", "tools", "response_format"] {
        let set = match body.get(key) {
            None | Some(Value::Null) => false,
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::String(s)) => !s.is_empty(),
            Some(_) => true,
        };
        if set {
            return Err(ApiError::bad(format!(
                "'{key}': mappa serve does not implement it"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_fields_it_cannot_honour_are_refused_by_name() {
        assert!(refuse_unsupported(&json!({"n": 1, "stream": false, "stop": []})).is_ok());
        for body in [
            json!({"n": 2}),
            json!({"repetition_penalty": 1.1}),
            json!({"stop": ["\n"]}),
            json!({"stream": true}),
        ] {
            let key = body.as_object().unwrap().keys().next().unwrap().clone();
            let err = refuse_unsupported(&body).unwrap_err();
            assert_eq!(err.0, 400);
            assert!(err.2.contains(&key), "{}", err.2);
        }
    }
}
