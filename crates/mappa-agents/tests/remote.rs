//! A served model as a policy: the MathChat workflow against a local
//! OpenAI-compatible server.

use std::path::Path;

use mappa_agents::{Policy, RemotePolicy, RolloutEngine, TaskInput, Workflow};
use mappa_env::sandbox::{find_python, Sandbox, SandboxConfig};
use mappa_judge::openai::OpenAiConfig;

/// Replies by role: the executor writes code once, the verifier answers 42.
fn serve() -> String {
    mappa_judge::testing::serve(|request| {
        let system = request.message(0);
        let content = if system.contains("Code Executor") && request.turns() == 2 {
            "```python\nprint(6 * 7)\n```"
        } else if system.contains("Verifier") {
            "The code printed 42, so \\boxed{42}."
        } else {
            "6 times 7 is 42."
        };
        mappa_judge::testing::Reply::content(content)
    })
}

#[test]
fn a_served_model_runs_the_mathchat_pipeline() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let workflow = Workflow::load(&root.join("experiments/workflows/mathchat.toml")).unwrap();
    let config: OpenAiConfig =
        toml::from_str(&format!("base_url = \"{}\"\nmodel = \"served\"", serve())).unwrap();
    let policy = RemotePolicy::new(config, 0.6, 256, 4).unwrap();
    assert_eq!(policy.name(), "remote:served");
    let mut sandbox_config =
        SandboxConfig::with_python(find_python(Some(&root)).expect("run `just setup-python`"));
    sandbox_config.uid_base = 1_960_500_000;
    let sandbox = Sandbox::new(sandbox_config).unwrap();
    let dir = mappa_env::sandbox::scratch_dir().unwrap();
    let engine = RolloutEngine::new(
        &workflow,
        vec![&policy, &policy, &policy],
        &sandbox,
        dir.path(),
    )
    .unwrap();
    let task = TaskInput {
        id: "six-sevens".into(),
        text: "What is 6 * 7?".into(),
        ..Default::default()
    };
    let trajectories = engine.run(&[task], 2).unwrap();
    for t in &trajectories {
        assert_eq!(t.actions[1].tool_observation.as_deref(), Some("42\n"));
        assert!(
            mappa_env::math::grade_response("42", t.final_output.as_deref().unwrap(), false)
                .correct
        );
        assert!(
            t.actions.iter().all(|a| a.completion_ids.is_empty()),
            "remote policies return text only"
        );
    }
}
