//! Hostile experiment manifests (issue 15): structured edits and damaged
//! bytes of the shipped manifests (`experiments/*.toml`,
//! `fixtures/manifests/*.toml`). `Manifest::load` must return a manifest
//! whose numbers are usable, or an error naming the file (and the key, for
//! a single edit); it must never panic.
//!
//! Cases per run (fixed, so that CI runs a bounded number):
//!
//! | property | cases |
//! |---|---|
//! | `edited_manifests_load_or_name_the_file_and_key` | 384 |
//! | `damaged_manifest_bytes_are_errors_naming_the_file` | 128 |
//!
//! 512 cases in all, plus the plain regression test at the end.

use std::path::{Path, PathBuf};

use mappa_train::manifest::Manifest;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use toml::Value;

/// The shipped manifests, relative to the workspace root.
const MANIFESTS: [&str; 8] = [
    "experiments/aime.toml",
    "experiments/arith.toml",
    "experiments/dsbench.toml",
    "experiments/tabular.toml",
    "fixtures/manifests/tiny-arith.toml",
    "fixtures/manifests/tiny-arith-warm.toml",
    "fixtures/manifests/tiny-arith-lora.toml",
    "fixtures/manifests/tiny-tabular.toml",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// TOML values a careless or hostile file puts where another belongs.
fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Integer(-1)),
        Just(Value::Integer(0)),
        Just(Value::Integer(1)),
        Just(Value::Integer(i64::MAX)),
        Just(Value::Float(f64::NAN)),
        Just(Value::Float(f64::INFINITY)),
        Just(Value::Float(f64::NEG_INFINITY)),
        Just(Value::Float(-0.5)),
        Just(Value::Float(0.5)),
        Just(Value::Float(1e300)),
        Just(Value::Boolean(true)),
        Just(Value::String(String::new())),
        Just(Value::String("process".into())),
        Just(Value::String("generated_math".into())),
        Just(Value::String("../../../etc/passwd".into())),
        Just(Value::Array(vec![])),
        Just(Value::Array(vec![Value::Integer(1)])),
        Just(Value::Table(toml::Table::new())),
        "\\PC{0,12}".prop_map(Value::String),
    ]
}

/// Replaces (`Some`) or removes the value found by walking `steps` into
/// `v` (each step picks a key or an element; the walk stops at a leaf),
/// recording the keys walked through in `keys`.
fn mutate_at(v: &mut Value, steps: &[Index], new: Option<Value>, keys: &mut Vec<String>) {
    match (v, steps.split_first()) {
        (Value::Table(table), Some((step, rest))) if !table.is_empty() => {
            let key = table.keys().nth(step.index(table.len())).unwrap().clone();
            keys.push(key.clone());
            match (rest.is_empty(), new) {
                (true, Some(new)) => {
                    table.insert(key, new);
                }
                (true, None) => {
                    table.remove(&key);
                }
                (false, new) => mutate_at(table.get_mut(&key).unwrap(), rest, new, keys),
            }
        }
        (Value::Array(items), Some((step, rest))) if !items.is_empty() => {
            let i = step.index(items.len());
            match (rest.is_empty(), new) {
                (true, None) => {
                    items.remove(i);
                }
                (_, new) => mutate_at(&mut items[i], rest, new, keys),
            }
        }
        (leaf, _) => *leaf = new.unwrap_or(Value::Boolean(false)),
    }
}

/// Writes `text` as a manifest in a new temporary directory.
fn write(text: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.toml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

/// Fails the case unless every number a run computes with is finite.
fn check_numbers(m: &Manifest) -> Result<(), TestCaseError> {
    let t = &m.train;
    let mut numbers = vec![
        ("rollout.temperature", m.rollout.temperature),
        ("rollout.top_p", m.rollout.top_p),
        ("eval.temperature", m.eval.temperature),
        ("train.lr", t.lr),
        ("train.min_lr", t.min_lr),
        ("train.warmup_fraction", t.warmup_fraction),
        ("train.beta1", t.beta1),
        ("train.beta2", t.beta2),
        ("train.epsilon", t.epsilon),
        ("train.weight_decay", t.weight_decay),
        ("train.clip_low", t.clip_low),
        ("train.clip_high", t.clip_high),
        ("train.logprob_temperature", t.logprob_temperature),
    ];
    numbers.extend(t.grad_clip.map(|c| ("train.grad_clip", c)));
    numbers.extend(t.dual_clip.map(|c| ("train.dual_clip", c)));
    numbers.extend(t.lora.as_ref().map(|l| ("train.lora.alpha", l.alpha)));
    numbers.extend(
        m.devices
            .as_ref()
            .map(|d| ("devices.memory_gib", d.memory_gib)),
    );
    if let Some(e) = &m.rollout.engine {
        numbers.push(("rollout.engine.timeout_s", e.timeout_s));
        numbers.push(("rollout.engine.retry_for_s", e.retry_for_s));
    }
    for (name, x) in numbers {
        prop_assert!(x.is_finite(), "{} = {} was accepted", name, x);
    }
    prop_assert!(
        m.eval.temperature >= 0.0,
        "eval.temperature = {}",
        m.eval.temperature
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    /// Edited shipped manifests load with usable numbers, or fail naming the
    /// file; a single edit that fails is named by one of the keys leading to it.
    #[test]
    fn edited_manifests_load_or_name_the_file_and_key(
        manifest in select(MANIFESTS.to_vec()),
        edits in vec(
            (vec(any::<Index>(), 1..4), prop::option::weighted(0.8, hostile_value())),
            1..3,
        ),
    ) {
        let text = std::fs::read_to_string(root().join(manifest)).unwrap();
        let mut value = Value::Table(toml::from_str(&text).unwrap());
        let mut paths = Vec::new();
        for (steps, new) in &edits {
            let mut keys = Vec::new();
            mutate_at(&mut value, steps, new.clone(), &mut keys);
            paths.push(keys);
        }
        let (_dir, path) = write(toml::to_string(&value).unwrap().as_bytes());
        match Manifest::load(&path) {
            Ok(m) => check_numbers(&m)?,
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains(&path.display().to_string()), "{}", msg);
                if let [keys] = paths.as_slice() {
                    // `total_steps` is set from `rollout.steps`.
                    let named = keys.iter().any(|k| msg.contains(k.as_str()))
                        || (keys.iter().any(|k| k == "steps") && msg.contains("total_steps"));
                    prop_assert!(named, "error should name one of {:?}: {}", keys, msg);
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Flipped or cut bytes: the manifest loads or the error names the file.
    #[test]
    fn damaged_manifest_bytes_are_errors_naming_the_file(
        manifest in select(MANIFESTS.to_vec()),
        flips in vec((any::<Index>(), 1u8..), 0..4),
        cut in prop::option::weighted(0.3, any::<Index>()),
    ) {
        let mut bytes = std::fs::read(root().join(manifest)).unwrap();
        for (i, mask) in &flips {
            let n = bytes.len();
            bytes[i.index(n)] ^= mask;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let (_dir, path) = write(&bytes);
        match Manifest::load(&path) {
            Ok(m) => check_numbers(&m)?,
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(msg.contains(&path.display().to_string()), "{}", msg);
            }
        }
    }
}

/// `nan` and `inf` (TOML spells both) used to pass validation in
/// `eval.temperature`, `rollout.temperature` and several `[train]` fields;
/// each is now an error naming the file and the key.
#[test]
fn non_finite_numbers_are_refused() {
    let text = std::fs::read_to_string(root().join("fixtures/manifests/tiny-arith.toml")).unwrap();
    for (table, key, x) in [
        ("eval", "temperature", f64::NAN),
        ("rollout", "temperature", f64::INFINITY),
        ("train", "epsilon", f64::INFINITY),
        ("train", "weight_decay", f64::INFINITY),
        ("train", "clip_high", f64::INFINITY),
        ("train", "logprob_temperature", f64::INFINITY),
        ("train", "grad_clip", f64::INFINITY),
        ("train", "dual_clip", f64::INFINITY),
        ("devices", "memory_gib", f64::NAN),
    ] {
        let mut manifest: toml::Table = toml::from_str(&text).unwrap();
        manifest
            .entry(table)
            .or_insert_with(|| Value::Table(toml::Table::new()))
            .as_table_mut()
            .unwrap()
            .insert(key.into(), Value::Float(x));
        let (_dir, path) = write(toml::to_string(&manifest).unwrap().as_bytes());
        let err = Manifest::load(&path).unwrap_err().to_string();
        assert!(
            err.contains(&format!("{table}.{key}")) && err.contains("m.toml"),
            "{err}"
        );
    }
}
