//! LoRA adapters loaded at run time, and the model a request names, as
//! each engine does it (vLLM: `serve/lora/api_router.py` and
//! `openai/models/serving.py`; SGLang: `http_server.py`,
//! `tokenizer_control_mixin.py` and `tokenizer_manager.py`, at the
//! contract's versions).

use std::path::{Path, PathBuf};

use mappa_model::{Cpu, Transformer};
use mappa_train::engine::contract::{contract, Message};
use mappa_train::engine::EngineKind;
use serde_json::{json, Value};

use super::{Answer, ApiError, Server};

impl Server {
    /// Checks an adapter request's body against the engine's schema.
    fn adapter_body<'a>(&self, message: Message, body: &'a Value) -> Result<&'a str, ApiError> {
        contract(self.api)
            .check(message, body)
            .map_err(ApiError::bad)?;
        Ok(body["lora_name"].as_str().unwrap_or_default())
    }

    /// The answer to an adapter request: vLLM's plain text, or SGLang's
    /// `{success, error_message, loaded_adapters}` (400 on failure).
    fn adapter_answer(&self, result: Result<String, String>) -> Result<Answer, ApiError> {
        match (self.api, result) {
            (EngineKind::Vllm, Ok(text)) => Ok(Answer::Text(text)),
            (EngineKind::Vllm, Err(e)) => Err(ApiError::bad(e)),
            (EngineKind::Sglang, Ok(_)) => {
                let loaded: serde_json::Map<String, Value> = self
                    .adapters
                    .iter()
                    .map(|(n, (_, p))| (n.clone(), json!(p.display().to_string())))
                    .collect();
                Ok(Answer::Json(json!({
                    "success": true, "error_message": null, "loaded_adapters": loaded,
                })))
            }
            (EngineKind::Sglang, Err(e)) => Err(ApiError::bad(e)),
        }
    }

    pub(super) fn load(&mut self, body: &Value) -> Result<Answer, ApiError> {
        let name = self.adapter_body(Message::LoadAdapterRequest, body)?;
        let path = body["lora_path"].as_str().unwrap_or_default();
        let result = if self.adapters.contains_key(name) {
            Err(match self.api {
                EngineKind::Vllm => format!("The lora adapter '{name}' has already been loaded."),
                EngineKind::Sglang => format!("LoRA with name {name} already exists."),
            })
        } else {
            self.load_from(name, Path::new(path))
                .map(|()| format!("Success: LoRA adapter '{name}' added successfully."))
        };
        self.adapter_answer(result)
    }

    fn load_from(&mut self, name: &str, path: &Path) -> Result<(), String> {
        let model = mappa_model::lora::load_adapters(self.base.model.clone(), path)
            .map_err(|e| format!("loading the adapter '{name}' from {}: {e}", path.display()))?;
        self.adapters
            .insert(name.to_string(), (model, path.to_path_buf()));
        self.seen.insert(name.to_string(), path.to_path_buf());
        eprintln!("mappa serve: loaded {name} from {}", path.display());
        Ok(())
    }

    pub(super) fn unload(&mut self, body: &Value) -> Result<Answer, ApiError> {
        let name = self.adapter_body(Message::UnloadAdapterRequest, body)?;
        if self.adapters.remove(name).is_none() {
            return match self.api {
                EngineKind::Vllm => Err(ApiError::not_found(format!(
                    "The lora adapter '{name}' cannot be found."
                ))),
                EngineKind::Sglang => self.adapter_answer(Err(format!(
                    "LoRA with name {name} does not exist. Loaded LoRAs: {:?}",
                    self.adapters.keys().collect::<Vec<_>>()
                ))),
            };
        }
        eprintln!("mappa serve: unloaded {name}");
        self.adapter_answer(Ok(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        )))
    }

    /// The adapter a completion request names (none: the base, also when
    /// it names none or the base), loaded, and the name the reply carries.
    pub(super) fn resolve(&mut self, body: &Value) -> Result<(Option<String>, String), ApiError> {
        let asked = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let adapter = match self.api {
            EngineKind::Vllm => (!asked.is_empty() && asked != self.name).then_some(asked),
            // `BASE:ADAPTER`; a name with no colon is the base.
            EngineKind::Sglang => asked
                .strip_prefix(&format!("{}:", self.name))
                .or_else(|| asked.split_once(':').map(|(_, a)| a))
                .filter(|a| !a.is_empty()),
        };
        let reply_name = match (self.api, adapter) {
            (EngineKind::Vllm, Some(adapter)) => adapter.to_string(),
            (EngineKind::Sglang, _) if !asked.is_empty() => asked.to_string(),
            _ => self.name.clone(),
        };
        let adapter = adapter.map(str::to_string);
        if let Some(name) = &adapter {
            if !self.adapters.contains_key(name) {
                self.missing_adapter(name)?;
            }
        }
        Ok((adapter, reply_name))
    }

    /// The model of [`Server::resolve`]'s adapter.
    pub(super) fn transformer(&self, adapter: Option<&String>) -> &Transformer<Cpu> {
        match adapter {
            Some(name) => &self.adapters[name].0,
            None => &self.base.model,
        }
    }

    /// A request for an adapter that is not loaded: vLLM's 404; SGLang's
    /// 400, unless it was loaded once, when it is loaded again from its
    /// path (and fails if the path is gone).
    fn missing_adapter(&mut self, name: &str) -> Result<(), ApiError> {
        match (self.api, self.seen.get(name).cloned()) {
            (EngineKind::Vllm, _) => Err(ApiError::not_found(format!(
                "The model `{name}` does not exist."
            ))),
            (EngineKind::Sglang, None) => Err(ApiError::bad(format!(
                "Got LoRA adapter that has never been loaded: {name}"
            ))),
            (EngineKind::Sglang, Some(path)) => {
                eprintln!("mappa serve: reloading evicted adapter {name}");
                self.load_from(name, &PathBuf::from(&path)).map_err(|e| {
                    ApiError::bad(format!(
                        "Failed to implicitly load LoRA adapter {name}: {e}"
                    ))
                })
            }
        }
    }
}
