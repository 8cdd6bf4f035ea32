//! The rendered coach prompt of every role, pinned by insta snapshots in
//! `snapshots/mappa-judge/` (review changes with `cargo insta review`).

use mappa_judge::rubric::RubricSet;
use mappa_judge::{ActionContext, FileLists};

fn math_action(role: &str) -> ActionContext {
    ActionContext {
        id: format!("t0/{role}/0"),
        task: "Find the remainder when $2^{10}$ is divided by $7$.".into(),
        role: role.into(),
        agent_input: "You are the team's member. Solve the problem step by step.".into(),
        output: "2^3 = 8 = 1 mod 7, so 2^10 = 2^9 * 2 = 2 mod 7. \\boxed{2}".into(),
        tool_observation: (role == "code_executor").then(|| "2\n".to_string()),
        ground_truth: Some("2".into()),
        is_last_agent: role == "verifier",
        ..Default::default()
    }
}

fn data_action(role: &str) -> ActionContext {
    ActionContext {
        id: format!("t0/{role}/0"),
        task: "Predict `Survived` for each passenger in test.csv; metric: accuracy.".into(),
        role: role.into(),
        agent_input: "Write Python to do your part of the pipeline.".into(),
        output: "```python\nimport pandas as pd\n...\n```".into(),
        tool_observation: Some("saved\n".into()),
        files: Some(FileLists {
            available: vec![
                "train.csv".into(),
                "test.csv".into(),
                "sample_submission.csv".into(),
            ],
            saved: vec![
                "X_train.pkl".into(),
                "y_train.pkl".into(),
                "X_test.pkl".into(),
            ],
        }),
        ground_truth: Some("accuracy = 0.81 (fair: 0.81)".into()),
        is_last_agent: role == "analyst",
        ..Default::default()
    }
}

fn render(domain: &str, ctx: &ActionContext) -> String {
    let prompt = RubricSet::builtin(domain)
        .unwrap()
        .render(ctx, true)
        .unwrap();
    let mut text = format!(
        "template_sha256: {}\nasks_answer_correct: {}\n",
        prompt.template_sha256, prompt.asks_answer_correct
    );
    for m in &prompt.messages {
        text.push_str(&format!("\n===== {} =====\n{}\n", m.role, m.content));
    }
    text
}

#[test]
fn every_role_renders_as_pinned() {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../snapshots/mappa-judge"
    ));
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for role in ["problem_solver", "code_executor", "verifier"] {
            insta::assert_snapshot!(
                format!("rubric_mathchat_{role}"),
                render("mathchat", &math_action(role))
            );
        }
        for role in ["data_engineer", "modeler", "analyst"] {
            insta::assert_snapshot!(
                format!("rubric_dsbench_{role}"),
                render("dsbench", &data_action(role))
            );
        }
    });
}
