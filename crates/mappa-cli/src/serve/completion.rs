//! Completions and chat completions: a request read as the engine reads it
//! (its defaults for what the request leaves out), one generation, and the
//! reply as the engine writes it.

use mappa_core::rng::RngStream;
use mappa_model::{
    generate, ChatMessage, ChatRequest, FinishReason, Generation, GenerationConfig, ModelError,
    SamplingConfig, Tokenizer,
};
use mappa_train::engine::contract::{contract, Message};
use mappa_train::engine::EngineKind;
use serde_json::{json, Value};

use super::{Answer, ApiError, Server};

/// The completion request's fields mappa serve implements (both engines).
const IMPLEMENTED: [&str; 10] = [
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop_token_ids",
    "logprobs",
    "return_token_ids",
];

/// Fields that name or label a request and never change its completion.
const INERT: [&str; 6] = [
    "user",
    "request_id",
    "rid",
    "session_id",
    "extra_key",
    "custom_labels",
];

/// A request's sampling, with the engine's defaults for what it leaves out.
struct Params {
    max_tokens: usize,
    temperature: f64,
    top_p: f64,
    /// 0: off.
    top_k: usize,
    seed: Option<i64>,
    stop_token_ids: Vec<u32>,
    logprobs: bool,
    return_token_ids: bool,
}

/// `body[key]`, or the engine's default for it when unset (absent or null).
fn field<'a>(body: &'a Value, fields: &'a [(String, Option<Value>)], key: &str) -> &'a Value {
    match body.get(key) {
        Some(v) if !v.is_null() => v,
        _ => fields
            .iter()
            .find(|(f, _)| f == key)
            .and_then(|(_, d)| d.as_ref())
            .unwrap_or(&Value::Null),
    }
}

/// Whether `value` is what the engine takes when the field is unset: null
/// (unset), the default itself (numbers compared as numbers), or `false`
/// for an optional flag whose default is null (off).
fn is_default(value: &Value, default: Option<&Value>) -> bool {
    match (value, default) {
        (Value::Null, _) => true,
        (Value::Bool(false), Some(Value::Null)) => true,
        (v, Some(d)) => match (v.as_f64(), d.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => v == d,
        },
        (_, None) => false,
    }
}

/// `value` as an integer, as pydantic reads one (a float with no fraction
/// too), naming `key` when it is not one.
fn integer(key: &str, value: &Value) -> Result<Option<i64>, ApiError> {
    if value.is_null() {
        return Ok(None);
    }
    let whole = value
        .as_f64()
        .filter(|f| f.fract() == 0.0 && f.abs() < 9.2e18)
        .map(|f| f as i64);
    value
        .as_i64()
        .or(whole)
        .map(Some)
        .ok_or_else(|| ApiError::bad(format!("'{key}' = {value}: expected an integer")))
}

impl Params {
    /// Refuses, naming it, a field of the engine's schema that mappa serve
    /// does not implement and that is set to other than the engine's
    /// default; warns of fields outside the schema (the engines ignore
    /// them); then reads the sampling.
    fn read(api: EngineKind, body: &Value) -> Result<Self, ApiError> {
        let c = contract(api);
        let fields = c.request_fields();
        for (key, value) in body.as_object().into_iter().flatten() {
            let declared = fields.iter().find(|(f, _)| f == key);
            match declared {
                None => eprintln!("mappa serve: warning: '{key}' is not a field of {}'s completion request: ignored, as the engine ignores it", c.name()),
                Some(_) if IMPLEMENTED.contains(&key.as_str()) || INERT.contains(&key.as_str()) => {}
                Some((_, default)) if !is_default(value, default.as_ref()) => {
                    return Err(ApiError::bad(format!(
                        "'{key}' = {value}: mappa serve does not implement it ({}'s default: {})",
                        c.name(),
                        default.as_ref().map_or("none".into(), Value::to_string)
                    )))
                }
                Some(_) => {}
            }
        }
        let int = |key: &str| integer(key, field(body, fields, key));
        let float = |key: &str| field(body, fields, key).as_f64();
        let logprobs = match int("logprobs")? {
            None => false,
            Some(0) => true,
            Some(n) => {
                return Err(ApiError::bad(format!(
                    "'logprobs' = {n}: mappa serve returns the sampled tokens' log-probs only (logprobs: 0)"
                )))
            }
        };
        let stop_token_ids = match field(body, fields, "stop_token_ids").as_array() {
            None => Vec::new(),
            Some(ids) => ids
                .iter()
                .map(|id| {
                    integer("stop_token_ids", id)?
                        .and_then(|i| u32::try_from(i).ok())
                        .ok_or_else(|| {
                            ApiError::bad(format!(
                                "'stop_token_ids': token id {id} is outside the vocabulary"
                            ))
                        })
                })
                .collect::<Result<_, _>>()?,
        };
        Ok(Params {
            max_tokens: int("max_tokens")?.unwrap_or(16).max(1) as usize,
            temperature: float("temperature").unwrap_or(1.0),
            top_p: float("top_p").unwrap_or(1.0),
            top_k: int("top_k")?.unwrap_or(0).max(0) as usize,
            seed: int("seed")?,
            stop_token_ids,
            logprobs,
            return_token_ids: field(body, fields, "return_token_ids").as_bool() == Some(true),
        })
    }
}

impl Server {
    /// `POST /v1/completions`, held to the engine's contract.
    pub(super) fn completion(&mut self, body: &Value) -> Result<Answer, ApiError> {
        contract(self.api)
            .check(Message::CompletionRequest, body)
            .map_err(ApiError::bad)?;
        let params = Params::read(self.api, body)?;
        let prompt = prompt_ids(&body["prompt"], &self.base.tokenizer)?;
        let (generation, served) = self.generate(body, &prompt, &params)?;
        let choice = self.completion_choice(&generation, &prompt, &params);
        Ok(Answer::Json(self.reply(
            served,
            "text_completion",
            choice,
            &prompt,
            &generation,
        )))
    }

    /// `POST /v1/chat/completions`: the same, from `messages` through the
    /// checkpoint's chat template. Chat requests are not in the contract:
    /// their sampling fields are held to the completion request's schema
    /// and bounds (the engines share them), the chat-only fields mappa
    /// serve reads are `messages`, `max_completion_tokens` and `logprobs`
    /// (a flag), and any other field that is not a completion field is
    /// refused by name (the engine might honour it: a chat template's
    /// arguments, tools).
    pub(super) fn chat(&mut self, body: &Value) -> Result<Answer, ApiError> {
        let mut request = body.clone();
        let object = request
            .as_object_mut()
            .ok_or_else(|| ApiError::bad("the body: expected a JSON object"))?;
        let max = object.remove("max_completion_tokens");
        if let Some(max) = max.filter(|v| !v.is_null()) {
            object.insert("max_tokens".into(), max);
        }
        let logprobs = match object.remove("logprobs") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => false,
            Some(Value::Bool(true)) => true,
            Some(v) => {
                return Err(ApiError::bad(format!(
                    "'logprobs' = {v}: expected true or false"
                )))
            }
        };
        object.remove("messages");
        let fields = contract(self.api).request_fields();
        if let Some(key) = object.keys().find(|k| !fields.iter().any(|(f, _)| f == *k)) {
            return Err(ApiError::bad(format!(
                "'{key}': mappa serve does not implement it in chat completions"
            )));
        }
        // The completion schema needs a prompt; the template makes it.
        let mut checked = request.clone();
        checked["prompt"] = json!([0]);
        contract(self.api)
            .check(Message::CompletionRequest, &checked)
            .map_err(ApiError::bad)?;
        let params = Params::read(self.api, &request)?;
        let prompt = self.chat_prompt(body)?;
        let (generation, served) = self.generate(&request, &prompt, &params)?;
        let tok = &self.base.tokenizer;
        let content: Vec<Value> = generation
            .token_ids
            .iter()
            .zip(&generation.logprobs)
            .map(|(&id, &lp)| json!({"token": tok.decode(&[id], false).unwrap_or_default(), "logprob": lp, "top_logprobs": []}))
            .collect();
        let choice = json!({
            "index": 0,
            "message": {"role": "assistant", "content": self.text(&generation)},
            "logprobs": logprobs.then(|| json!({ "content": content })),
            "finish_reason": finish_reason(&generation),
        });
        Ok(Answer::Json(self.reply(
            served,
            "chat.completion",
            choice,
            &prompt,
            &generation,
        )))
    }

    fn chat_prompt(&self, body: &Value) -> Result<Vec<u32>, ApiError> {
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
        self.base
            .tokenizer
            .encode(&text)
            .map_err(|e| ApiError::bad(e.to_string()))
    }

    /// One generation for `prompt` with the model `body` names; the reply's
    /// model name beside it.
    fn generate(
        &mut self,
        body: &Value,
        prompt: &[u32],
        params: &Params,
    ) -> Result<(Generation, String), ApiError> {
        let vocab = self.base.tokenizer.vocab_size();
        if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::bad(format!(
                "'prompt': token id {bad} is outside the vocabulary ({vocab} ids)"
            )));
        }
        let context = self.max_model_len;
        if prompt.len() + params.max_tokens > context {
            return Err(ApiError::bad(format!(
                "'max_tokens' = {}: the served context is {context} tokens (--max-model-len), \
                 and the prompt has {} (prompt + max_tokens must fit, as the engines require)",
                params.max_tokens,
                prompt.len()
            )));
        }
        let (adapter, served) = self.resolve(body)?;
        self.requests += 1;
        let mut rng = match params.seed {
            // Two's complement: each signed seed its own stream.
            Some(seed) => RngStream::from_u64(seed as u64),
            None => self.seeds.stream(&format!("request-{}", self.requests)),
        };
        let mut eos = self.base.tokenizer.eos_token_ids().to_vec();
        eos.extend(&params.stop_token_ids);
        let config = GenerationConfig {
            max_new_tokens: params.max_tokens,
            sampling: SamplingConfig {
                temperature: params.temperature as f32,
                top_k: params.top_k,
                top_p: params.top_p as f32,
            },
            eos_token_ids: eos,
            stop_strings: Vec::new(),
        };
        let tok: &dyn Tokenizer = &self.base.tokenizer;
        let generation = generate(
            self.transformer(adapter.as_ref()),
            Some(tok),
            std::slice::from_ref(&prompt.to_vec()),
            std::slice::from_mut(&mut rng),
            &config,
        )
        .map_err(|e| match e {
            ModelError::Input(m) => ApiError::bad(m),
            other => ApiError(500, "InternalServerError", other.to_string()),
        })?
        .pop()
        .expect("one generation per prompt");
        Ok((generation, served))
    }

    /// The completion's text: its tokens without the stop token that ended
    /// it, special tokens skipped (the engines' default).
    fn text(&self, generation: &Generation) -> String {
        let ids = &generation.token_ids;
        let end = match generation.finish {
            FinishReason::Length => ids.len(),
            _ => ids.len().saturating_sub(1),
        };
        self.base
            .tokenizer
            .decode(&ids[..end], true)
            .unwrap_or_default()
    }

    fn completion_choice(&self, generation: &Generation, prompt: &[u32], params: &Params) -> Value {
        let tok = &self.base.tokenizer;
        let tokens: Vec<String> = generation
            .token_ids
            .iter()
            .map(|&id| tok.decode(&[id], false).unwrap_or_default())
            .collect();
        let offsets: Vec<usize> = tokens
            .iter()
            .scan(0, |at, t| {
                let start = *at;
                *at += t.len();
                Some(start)
            })
            .collect();
        let logprobs = params.logprobs.then(|| {
            json!({
                "text_offset": offsets,
                "token_logprobs": generation.logprobs,
                "tokens": tokens,
                "top_logprobs": vec![Value::Null; tokens.len()],
            })
        });
        let stop = (generation.finish != FinishReason::Length)
            .then(|| generation.token_ids.last().copied())
            .flatten();
        let mut choice = json!({
            "index": 0,
            "text": self.text(generation),
            "logprobs": logprobs,
            "finish_reason": finish_reason(generation),
        });
        match self.api {
            // vLLM: the matched stop_token_ids entry; null for the model's EOS.
            EngineKind::Vllm => {
                let model_eos = stop.is_some_and(|s| tok.eos_token_ids().contains(&s));
                choice["stop_reason"] = json!(stop.filter(|_| !model_eos));
            }
            EngineKind::Sglang => choice["matched_stop"] = json!(stop),
        }
        if params.return_token_ids {
            choice["token_ids"] = json!(generation.token_ids);
            choice["prompt_token_ids"] = json!(prompt);
        }
        choice
    }

    fn reply(
        &self,
        served: String,
        object: &str,
        choice: Value,
        prompt: &[u32],
        generation: &Generation,
    ) -> Value {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        json!({
            "id": format!("cmpl-{}", self.requests),
            "object": object,
            "created": created,
            "model": served,
            "choices": [choice],
            "usage": {
                "prompt_tokens": prompt.len(),
                "completion_tokens": generation.token_ids.len(),
                "total_tokens": prompt.len() + generation.token_ids.len(),
            },
        })
    }
}

fn finish_reason(generation: &Generation) -> &'static str {
    match generation.finish {
        FinishReason::Length => "length",
        _ => "stop",
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
        Value::Array(list) if list.len() == 1 && (list[0].is_array() || list[0].is_string()) => {
            prompt_ids(&list[0], tokenizer)
        }
        Value::Array(list) if !list.is_empty() && !list[0].is_array() && !list[0].is_string() => {
            if let Some(bad) = list.iter().find(|v| v.is_i64() && !v.is_u64()) {
                // The engine's own checks may let it through; no model has it.
                return Err(ApiError::bad(format!(
                    "'prompt': token id {bad} is outside the vocabulary ({} ids)",
                    tokenizer.vocab_size()
                )));
            }
            ids(list).ok_or_else(|| ApiError::bad("'prompt': expected token ids (integers)"))
        }
        Value::Array(list) if list.is_empty() || list[0].as_array().is_some_and(Vec::is_empty) => {
            Err(ApiError::bad("'prompt': the prompt is empty"))
        }
        Value::Array(_) => Err(ApiError::bad(
            "'prompt': mappa serve takes one prompt per request",
        )),
        _ => Err(ApiError::bad(
            "'prompt': expected text or a list of token ids",
        )),
    }
}
