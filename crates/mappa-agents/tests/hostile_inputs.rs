//! Hostile workflow files (issue 15): mutations of the shipped workflows
//! (`experiments/workflows/*.toml`) and hostile prompt and program
//! templates. `Workflow::load` must return the workflow or an error naming
//! the file (and the key, for a single edit); templates must render or fail,
//! never panic or hang.
//!
//! Cases per run (fixed, so that CI runs a bounded number):
//!
//! | property | cases |
//! |---|---|
//! | `edited_workflows_load_or_name_the_file_and_key` | 256 |
//! | `damaged_workflow_bytes_are_errors_naming_the_file` | 128 |
//! | `templates_render_or_fail_without_hanging` | 128 |
//!
//! 512 cases in all, plus the plain regression test at the end.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mappa_agents::workflow::{render_program, render_prompt, Upstream};
use mappa_agents::Workflow;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use toml::Value;

fn workflows() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/workflows")
}

const WORKFLOWS: [&str; 5] = [
    "mathchat",
    "arith",
    "dsbench",
    "arith-compact",
    "tabular-compact",
];

/// Jinja pieces, well-formed or not, hostile or not.
const TEMPLATE_PIECES: [&str; 18] = [
    "{{ task }}",
    "{{ output }}",
    "{{ output | tojson }}",
    "{{ files | join(', ') }}",
    "{% for f in files %}{{ f }}{% endfor %}",
    "{{ nothing }}",
    "{{ task.attr.attr }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "{{ 'x' * 100000000 }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% include 'prompt' %}",
    "{{ 1 / 0 }}",
    "{%",
    "}}",
    "{% if task %}",
    "{% endif %}",
    "plain text ",
];

/// TOML values a careless or hostile file puts where another belongs.
fn hostile_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Integer(-1)),
        Just(Value::Integer(0)),
        Just(Value::Integer(i64::MAX)),
        Just(Value::Float(f64::NAN)),
        Just(Value::Float(f64::INFINITY)),
        Just(Value::Boolean(true)),
        Just(Value::String(String::new())),
        Just(Value::String("a b/c".into())),
        Just(Value::String("python".into())),
        Just(Value::String("none".into())),
        Just(Value::String("problem_solver".into())),
        Just(Value::String("[".into())),
        Just(Value::String("**/*.csv".into())),
        Just(Value::Array(vec![])),
        Just(Value::Array(vec![Value::String("problem_solver".into())])),
        Just(Value::Array(vec![Value::Integer(1)])),
        Just(Value::Table(toml::Table::new())),
        select(TEMPLATE_PIECES.to_vec()).prop_map(|s| Value::String(s.into())),
        "\\PC{0,12}".prop_map(Value::String),
    ]
}

const TOP_KEYS: [&str; 7] = [
    "name",
    "description",
    "coach_domain",
    "task_suffix",
    "final_answer_from",
    "agents",
    "extra_key",
];

const AGENT_KEYS: [&str; 13] = [
    "role",
    "title",
    "system",
    "prompt",
    "sees",
    "tool",
    "max_actions",
    "stop_when_no_code",
    "stop_when_files_exist",
    "required_files",
    "pass_files",
    "program",
    "max_tokens",
];

/// One edit of a workflow file.
#[derive(Debug, Clone)]
enum Edit {
    /// Set (`Some`) or remove a top-level key.
    Top(&'static str, Option<Value>),
    /// Set or remove a key of one agent.
    Agent(Index, &'static str, Option<Value>),
}

fn edit() -> impl Strategy<Value = Edit> {
    let value = || prop::option::weighted(0.75, hostile_value());
    prop_oneof![
        1 => (select(TOP_KEYS.to_vec()), value()).prop_map(|(k, v)| Edit::Top(k, v)),
        3 => (any::<Index>(), select(AGENT_KEYS.to_vec()), value())
            .prop_map(|(i, k, v)| Edit::Agent(i, k, v)),
    ]
}

/// Sets or removes `key` in `table`.
fn put(table: &mut toml::Table, key: &str, value: &Option<Value>) {
    match value {
        Some(v) => {
            table.insert(key.to_string(), v.clone());
        }
        None => {
            table.remove(key);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Edited shipped workflows load, or fail naming the file; a single edit
    /// that fails is named (or the key that refers to it).
    #[test]
    fn edited_workflows_load_or_name_the_file_and_key(
        name in select(WORKFLOWS.to_vec()),
        edits in vec(edit(), 1..4),
    ) {
        let text = std::fs::read_to_string(workflows().join(format!("{name}.toml"))).unwrap();
        let mut table: toml::Table = toml::from_str(&text).unwrap();
        for edit in &edits {
            match edit {
                Edit::Top(key, value) => put(&mut table, key, value),
                Edit::Agent(i, key, value) => {
                    if let Some(Value::Array(agents)) = table.get_mut("agents") {
                        if !agents.is_empty() {
                            let n = agents.len();
                            if let Value::Table(agent) = &mut agents[i.index(n)] {
                                put(agent, key, value);
                            }
                        }
                    }
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
        if let Err(e) = Workflow::load(&path) {
            let msg = e.to_string();
            prop_assert!(msg.contains(&path.display().to_string()), "{}", msg);
            if let [edit] = edits.as_slice() {
                let key = match edit {
                    Edit::Top(k, _) | Edit::Agent(_, k, _) => *k,
                };
                // A changed role is an error where another key refers to it;
                // a tool taken away, where a stop condition or program needs it.
                let refs: &[&str] = match key {
                    "role" => &["sees", "final_answer_from"],
                    "tool" | "stop_when_no_code" | "stop_when_files_exist" => &["tool", "stop conditions"],
                    "agents" => &["agent"],
                    "sees" => &["prompt"],
                    _ => &[],
                };
                prop_assert!(
                    msg.contains(key) || refs.iter().any(|r| msg.contains(r)),
                    "error should name `{}`: {}", key, msg
                );
            }
        }
    }

    /// Flipped or cut bytes: the file loads or the error names it.
    #[test]
    fn damaged_workflow_bytes_are_errors_naming_the_file(
        name in select(WORKFLOWS.to_vec()),
        flips in vec((any::<Index>(), 1u8..), 0..4),
        cut in prop::option::weighted(0.3, any::<Index>()),
    ) {
        let mut bytes = std::fs::read(workflows().join(format!("{name}.toml"))).unwrap();
        for (i, mask) in &flips {
            let n = bytes.len();
            bytes[i.index(n)] ^= mask;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, &bytes).unwrap();
        if let Err(e) = Workflow::load(&path) {
            let msg = e.to_string();
            prop_assert!(msg.contains(&path.display().to_string()), "{}", msg);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Prompt and program templates of hostile pieces, with hostile
    /// variables: they render or fail, within seconds (fuel bounds loops,
    /// recursion and growing strings).
    #[test]
    fn templates_render_or_fail_without_hanging(
        pieces in vec(select(TEMPLATE_PIECES.to_vec()), 0..6),
        task in "\\PC{0,40}",
        files in vec("\\PC{0,10}", 0..3),
        output in "\\PC{0,40}",
    ) {
        let template = pieces.concat();
        let start = std::time::Instant::now();
        let _ = render_program(&template, &output);
        let workflow = Workflow::load(&workflows().join("mathchat.toml")).unwrap();
        let mut agent = workflow.agents[2].clone();
        agent.prompt = template;
        let upstream = BTreeMap::from([(
            agent.sees[0].clone(),
            Upstream { output: output.clone(), outputs: vec![output], tool_output: "N/A".into() },
        )]);
        let _ = render_prompt(&agent, &task, &files, &upstream);
        prop_assert!(start.elapsed().as_secs() < 20, "took {:?}", start.elapsed());
    }
}

/// A prompt looping 10^10 times used to hang `Workflow::load` (which renders
/// every prompt to check it); it now runs out of fuel, and the error names
/// the file and the agent's prompt.
#[test]
fn runaway_prompt_is_an_error_not_a_hang() {
    let text = std::fs::read_to_string(workflows().join("arith-compact.toml")).unwrap();
    let mut table: toml::Table = toml::from_str(&text).unwrap();
    let Some(Value::Array(agents)) = table.get_mut("agents") else {
        panic!("agents")
    };
    let Value::Table(first) = &mut agents[0] else {
        panic!("agent")
    };
    first.insert("prompt".into(), Value::String(TEMPLATE_PIECES[7].into()));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("w.toml");
    std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
    let err = Workflow::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("w.toml")
            && err.contains("agents[0] (problem_solver).prompt")
            && err.contains("fuel"),
        "{err}"
    );
}
