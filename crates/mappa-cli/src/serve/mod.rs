//! `mappa serve`: a checkpoint behind the part of vLLM's or SGLang's API
//! that engine rollouts use (`mappa_train::engine`), on the CPU backend.
//! It stands in for either engine where there is no GPU: the engine
//! protocol's test server, and a way to serve a small model to
//! `mappa eval --remote-url` or a coach. `--api vllm` (the default) or
//! `--api sglang` picks whose surface it speaks:
//!
//! | | vLLM | SGLang |
//! |---|---|---|
//! | completions | `POST /v1/completions` | the same |
//! | adapters | `POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter` | `POST /load_lora_adapter`, `/unload_lora_adapter` |
//! | an adapter in a request | `model` = its name | `model` = `BASE:ADAPTER` |
//! | an adapter it does not have | 404 | 400; one unloaded but once loaded is loaded again from its path |
//! | version | `GET /version` | `GET /server_info` |
//!
//! and both: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`.
//!
//! A completion request is held to the engine's own definitions (the
//! committed contract, `mappa_train::engine::contract`): what its schemas
//! and probed bounds refuse is refused with 400, naming the field, as is a
//! prompt plus `max_tokens` beyond the served context; a field of the
//! engine's schema that mappa serve does not implement is refused unless
//! it holds the engine's default (the engine would honour it, and ignoring
//! it would change results). Fields outside the schema are ignored with a
//! warning, as the engines do. A completion that ends on a stop token (the
//! model's EOS or a `stop_token_ids` match) returns that token among its
//! ids and log-probs but not in its text, and ends as "stop" even on the
//! last token allowed, as both engines do.
//!
//! One request is served at a time, each generated alone, so a completion
//! depends only on its request: with a seed, the same request always gets
//! the same tokens, bit for bit what mappa's in-process policy samples with
//! `rollout.request_seeds = "engine"` and `rollout.max_batch = 1`.

mod adapters;
mod completion;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use mappa_core::rng::SeedTree;
use mappa_model::{AttentionKind, Checkpoint, Cpu, Transformer};
use mappa_train::engine::EngineKind;
use serde_json::{json, Value};

/// `mappa serve MODEL_DIR`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A HF checkpoint directory: the base model every adapter applies to.
    pub model: PathBuf,
    /// Whose API to speak: `vllm` or `sglang`.
    #[arg(long, default_value = "vllm", value_parser = parse_api)]
    pub api: EngineKind,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the address is printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The name the base model is served as (default: the directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// The longest prompt plus completion served, in tokens (vLLM's
    /// `--max-model-len`, SGLang's `--context-length`; default: the
    /// checkpoint's `max_position_embeddings`). A request beyond it is
    /// refused, as the engines refuse it.
    #[arg(long)]
    pub max_model_len: Option<usize>,
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

fn parse_api(value: &str) -> Result<EngineKind, String> {
    EngineKind::ALL
        .into_iter()
        .find(|k| k.key() == value)
        .ok_or_else(|| format!("expected vllm or sglang, got {value:?}"))
}

/// An error answer: HTTP status, the engine's error type, message.
struct ApiError(u16, &'static str, String);

impl ApiError {
    fn bad(message: impl Into<String>) -> Self {
        ApiError(400, "BadRequestError", message.into())
    }

    fn not_found(message: impl Into<String>) -> Self {
        ApiError(404, "NotFoundError", message.into())
    }

    /// The body as the engine writes it: vLLM nests it under `error`,
    /// SGLang does not.
    fn body(&self, api: EngineKind) -> String {
        let ApiError(code, kind, message) = self;
        match api {
            EngineKind::Vllm => {
                json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
            }
            EngineKind::Sglang => {
                json!({"object": "error", "message": message, "type": kind, "param": null, "code": code})
            }
        }
        .to_string()
    }
}

/// A success answer: JSON, or vLLM's plain-text acknowledgements.
enum Answer {
    Json(Value),
    Text(String),
}

/// The served base model and the adapters loaded on it.
struct Server {
    api: EngineKind,
    name: String,
    root: PathBuf,
    base: Checkpoint<Cpu>,
    /// Loaded adapters: name -> (model, directory).
    adapters: BTreeMap<String, (Transformer<Cpu>, PathBuf)>,
    /// Every adapter ever loaded (SGLang loads one that was unloaded again
    /// when a request names it).
    seen: BTreeMap<String, PathBuf>,
    seeds: SeedTree,
    requests: u64,
    /// The longest prompt plus completion served.
    max_model_len: usize,
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
    let listener = tiny_http::Server::http((args.host.as_str(), args.port))
        .map_err(|e| anyhow::anyhow!("listening on {}:{}: {e}", args.host, args.port))?;
    let address = listener
        .server_addr()
        .to_ip()
        .context("the server has no IP address")?;
    eprintln!(
        "mappa serve: {name} at http://{address}/v1 ({}'s API, CPU backend, one request at a time)",
        args.api.display()
    );
    let mut server = Server::new(args.api, name, args.model.clone(), base, args.seed);
    if let Some(len) = args.max_model_len {
        server.max_model_len = len;
    }
    for mut request in listener.incoming_requests() {
        let mut body = String::new();
        let answer = match request.as_reader().read_to_string(&mut body) {
            Ok(_) => server.handle(request.method(), request.url(), &body),
            Err(e) => Err(ApiError::bad(format!("reading the body: {e}"))),
        };
        let (status, text, content_type) = match answer {
            Ok(Answer::Json(value)) => (200, value.to_string(), "application/json"),
            Ok(Answer::Text(text)) => (200, text, "text/plain"),
            Err(e) => (e.0, e.body(server.api), "application/json"),
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

impl Server {
    fn new(api: EngineKind, name: String, root: PathBuf, base: Checkpoint<Cpu>, seed: u64) -> Self {
        let max_model_len = base.model.config().max_position_embeddings;
        Server {
            max_model_len,
            api,
            name,
            root,
            base,
            adapters: BTreeMap::new(),
            seen: BTreeMap::new(),
            seeds: SeedTree::new(seed),
            requests: 0,
        }
    }

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
        let (sglang, vllm) = (self.api == EngineKind::Sglang, self.api == EngineKind::Vllm);
        match (method, path) {
            (Get, "/health") => Ok(Answer::Text(String::new())),
            (Get, "/v1/models") => Ok(Answer::Json(self.models())),
            (Get, "/version") if vllm => Ok(Answer::Json(self.version())),
            (Get, "/server_info") if sglang => Ok(Answer::Json(self.version())),
            (Post, "/v1/completions") => self.completion(&json()?),
            (Post, "/v1/chat/completions") => self.chat(&json()?),
            (Post, "/v1/load_lora_adapter") if vllm => self.load(&json()?),
            (Post, "/v1/unload_lora_adapter") if vllm => self.unload(&json()?),
            (Post, "/load_lora_adapter") if sglang => self.load(&json()?),
            (Post, "/unload_lora_adapter") if sglang => self.unload(&json()?),
            _ => Err(ApiError::not_found(format!(
                "no route {method} {path} in {}'s API",
                self.api.display()
            ))),
        }
    }

    /// vLLM's `/version` or SGLang's `/server_info`, naming mappa serve
    /// (which always honours request seeds, as SGLang does with
    /// `--enable-deterministic-inference`).
    fn version(&self) -> Value {
        let mut info = json!({"version": env!("CARGO_PKG_VERSION"), "server": "mappa serve"});
        if self.api == EngineKind::Sglang {
            info["enable_deterministic_inference"] = json!(true);
        }
        info
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_model::Tokenizer;
    use mappa_train::engine::contract::{contract, Message};
    use mappa_train::engine::protocol::parse_completion;

    fn workspace() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    fn server(api: EngineKind) -> Server {
        let root = workspace().join("fixtures/models/qwen3-tiny");
        let base = Checkpoint::<Cpu>::load(&root, &Default::default()).unwrap();
        Server::new(api, "qwen3-tiny".into(), root, base, 0)
    }

    /// POSTs `body` to `path`: the status and the JSON (or text) answer.
    fn post(server: &mut Server, path: &str, body: &Value) -> (u16, Value) {
        match server.handle(&tiny_http::Method::Post, path, &body.to_string()) {
            Ok(Answer::Json(v)) => (200, v),
            Ok(Answer::Text(t)) => (200, json!(t)),
            Err(e) => (e.0, json!(e.2)),
        }
    }

    fn probes(api: EngineKind) -> Vec<Value> {
        let path = workspace().join(&contract(api).folder).join("probes.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn what_the_engine_refuses_is_refused_and_what_it_takes_is_served_or_named() {
        for api in EngineKind::ALL {
            let mut server = server(api);
            for probe in probes(api) {
                let mut body = probe["body"].clone();
                body["model"] = json!("qwen3-tiny");
                let (status, answer) = post(&mut server, "/v1/completions", &body);
                let accepted = probe["accepted"].as_bool().unwrap();
                let name = &probe["name"];
                if !accepted {
                    assert_eq!(status, 400, "{api} {name}: the engine refuses it: {answer}");
                } else if status != 200 {
                    // Stricter than the engine only where it says so, or
                    // for a token no model has (the engine fails later).
                    let message = answer.as_str().unwrap();
                    assert!(
                        message.contains("does not implement")
                            || message.contains("outside the vocabulary"),
                        "{api} {name}: {message}"
                    );
                } else {
                    contract(api)
                        .check(Message::CompletionResponse, &answer)
                        .unwrap_or_else(|e| panic!("{api} {name}: {e}"));
                }
            }
        }
    }

    #[test]
    fn a_stop_token_ends_a_completion_as_the_engines_end_it() {
        for api in EngineKind::ALL {
            let mut server = server(api);
            let top_k = if api == EngineKind::Vllm { 0 } else { -1 };
            let body = |seed: u64, max: usize, stop: Vec<u32>| {
                json!({"model": "qwen3-tiny", "prompt": [5, 6, 7], "max_tokens": max,
                       "temperature": 1.0, "top_p": 1.0, "top_k": top_k, "seed": seed,
                       "stop_token_ids": stop, "logprobs": 0, "return_token_ids": true})
            };
            // A seed whose first three tokens differ and do not end it.
            let (seed, ids) = (0..100)
                .find_map(|seed| {
                    let (_, free) = post(&mut server, "/v1/completions", &body(seed, 3, vec![]));
                    let ids = free["choices"][0]["token_ids"].as_array().unwrap().clone();
                    let distinct = ids.len() == 3 && ids[0] != ids[2] && ids[1] != ids[2];
                    (distinct && free["choices"][0]["finish_reason"] == "length")
                        .then_some((seed, ids))
                })
                .expect("a seed with three distinct tokens");
            let third = ids[2].as_u64().unwrap() as u32;
            // The third token stops it, on the last token allowed.
            let (status, reply) = post(&mut server, "/v1/completions", &body(seed, 3, vec![third]));
            assert_eq!(status, 200, "{reply}");
            contract(api)
                .check(Message::CompletionResponse, &reply)
                .unwrap();
            let choice = &reply["choices"][0];
            assert_eq!(choice["finish_reason"], "stop", "{api}: {reply}");
            assert_eq!(choice["token_ids"], json!(ids[..3]), "{api}");
            assert_eq!(
                choice["logprobs"]["token_logprobs"]
                    .as_array()
                    .unwrap()
                    .len(),
                3
            );
            let stop_field = if api == EngineKind::Vllm {
                "stop_reason"
            } else {
                "matched_stop"
            };
            assert_eq!(choice[stop_field], json!(third), "{api}");
            let two = server
                .base
                .tokenizer
                .decode(
                    &[
                        ids[0].as_u64().unwrap() as u32,
                        ids[1].as_u64().unwrap() as u32,
                    ],
                    true,
                )
                .unwrap();
            assert_eq!(
                choice["text"],
                json!(two),
                "{api}: the stop token is not in the text"
            );
            let completion = parse_completion(&reply.to_string(), "qwen3-tiny", &[third])
                .unwrap()
                .finished()
                .unwrap();
            assert!(!completion.truncated);
        }
    }

    #[test]
    fn fields_it_does_not_implement_are_refused_by_name_unless_default() {
        for api in EngineKind::ALL {
            let mut server = server(api);
            let base = json!({"model": "qwen3-tiny", "prompt": [5, 6], "max_tokens": 2, "n": 1, "stream": false});
            assert_eq!(post(&mut server, "/v1/completions", &base).0, 200);
            for (key, value) in [
                ("n", json!(2)),
                ("presence_penalty", json!(0.5)),
                ("ignore_eos", json!(true)),
                ("logprobs", json!(3)),
            ] {
                let mut body = base.clone();
                body[key] = value;
                let (status, message) = post(&mut server, "/v1/completions", &body);
                assert_eq!(status, 400, "{api} {key}");
                assert!(
                    message.as_str().unwrap().contains(&format!("'{key}'")),
                    "{message}"
                );
            }
        }
        // vLLM's token-id strings: mappa reads `return_token_ids` instead.
        let mut server = server(EngineKind::Vllm);
        let body = json!({"prompt": [5], "return_tokens_as_token_ids": true, "logprobs": 0});
        let (status, message) = post(&mut server, "/v1/completions", &body);
        assert_eq!(status, 400);
        assert!(
            message
                .as_str()
                .unwrap()
                .contains("'return_tokens_as_token_ids'"),
            "{message}"
        );
    }

    #[test]
    fn chat_completions_render_the_template_and_refuse_what_they_cannot_honour() {
        let mut server = server(EngineKind::Vllm);
        let body = json!({"model": "qwen3-tiny", "messages": [{"role": "user", "content": "2+3?"}],
                          "max_completion_tokens": 3, "seed": 1, "logprobs": true});
        let (status, reply) = post(&mut server, "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["object"], "chat.completion");
        let content = reply["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap();
        assert_eq!(
            content.len(),
            reply["usage"]["completion_tokens"].as_u64().unwrap() as usize
        );
        assert!(content.len() <= 3);
        let mut two = body.clone();
        two["n"] = json!(2);
        let (status, message) = post(&mut server, "/v1/chat/completions", &two);
        assert_eq!(status, 400);
        assert!(message.as_str().unwrap().contains("'n'"), "{message}");
    }

    #[test]
    fn integers_written_as_floats_are_read_and_bad_values_named_not_dropped() {
        let mut server = server(EngineKind::Vllm);
        let ask = |server: &mut Server, extra: Value| {
            let mut body = json!({"prompt": [5, 6], "max_tokens": 4, "seed": 3,
                                  "logprobs": 0, "return_token_ids": true});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            post(server, "/v1/completions", &body)
        };
        let (_, plain) = ask(&mut server, json!({}));
        let (_, floats) = ask(&mut server, json!({"max_tokens": 4.0, "seed": 3.0}));
        assert_eq!(
            plain["choices"][0]["token_ids"],
            floats["choices"][0]["token_ids"]
        );
        for (extra, field) in [
            (json!({"max_tokens": 1_000_000_000_000u64}), "'max_tokens'"),
            (json!({"max_tokens": 2.5}), "'max_tokens'"),
            (
                json!({"stop_token_ids": [4_294_967_301u64]}),
                "'stop_token_ids'",
            ),
            (json!({"stop_token_ids": [-1]}), "'stop_token_ids'"),
            (json!({"prompt": []}), "'prompt'"),
        ] {
            let (status, message) = ask(&mut server, extra.clone());
            assert_eq!(status, 400, "{extra}: {message}");
            assert!(
                message.as_str().unwrap().contains(field),
                "{extra}: {message}"
            );
        }
        // vLLM's factory default and an unset flag's false are defaults.
        let (status, reply) = ask(
            &mut server,
            json!({"bad_words": [], "return_tokens_as_token_ids": false}),
        );
        assert_eq!(status, 200, "{reply}");
    }

    #[test]
    fn chat_requests_are_held_to_the_completion_bounds_and_unknown_fields_named() {
        let mut server = server(EngineKind::Vllm);
        let chat = |extra: Value| {
            let mut body =
                json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
            for (k, v) in extra.as_object().unwrap() {
                body[k] = v.clone();
            }
            body
        };
        for (extra, field) in [
            (json!({"temperature": -1}), "'temperature'"),
            (json!({"top_p": 0}), "'top_p'"),
            (json!({"max_tokens": "2"}), "'max_tokens'"),
            (
                json!({"chat_template_kwargs": {"enable_thinking": false}}),
                "'chat_template_kwargs'",
            ),
        ] {
            let (status, message) = post(&mut server, "/v1/chat/completions", &chat(extra.clone()));
            assert_eq!(status, 400, "{extra}: {message}");
            assert!(
                message.as_str().unwrap().contains(field),
                "{extra}: {message}"
            );
        }
    }

    #[test]
    fn sglang_loads_an_unloaded_adapter_again_but_not_one_it_never_had() {
        let mut server = server(EngineKind::Sglang);
        let adapter = workspace().join("fixtures/lora/qwen3-tiny");
        let request = |name: &str| json!({"model": format!("qwen3-tiny:{name}"), "prompt": [5, 6], "max_tokens": 2});
        let (status, message) = post(&mut server, "/v1/completions", &request("a"));
        assert_eq!(status, 400);
        assert!(
            message.as_str().unwrap().contains("never been loaded"),
            "{message}"
        );
        let load = json!({"lora_name": "a", "lora_path": adapter.display().to_string()});
        assert_eq!(
            post(&mut server, "/v1/load_lora_adapter", &load).0,
            404,
            "not SGLang's path"
        );
        let (status, answer) = post(&mut server, "/load_lora_adapter", &load);
        assert_eq!(
            (status, &answer["success"]),
            (200, &json!(true)),
            "{answer}"
        );
        assert_eq!(
            post(
                &mut server,
                "/unload_lora_adapter",
                &json!({"lora_name": "a"})
            )
            .0,
            200
        );
        let (status, reply) = post(&mut server, "/v1/completions", &request("a"));
        assert_eq!(status, 200, "{reply}");
        assert_eq!(reply["model"], "qwen3-tiny:a");
        let (status, _) = post(
            &mut server,
            "/unload_lora_adapter",
            &json!({"lora_name": "b"}),
        );
        assert_eq!(status, 400);
    }
}
