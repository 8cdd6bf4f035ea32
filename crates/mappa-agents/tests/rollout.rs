//! The arith workflow end to end with scripted policies, the real Python
//! sandbox and a scripted coach.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mappa_agents::{PolicyRequest, RolloutEngine, ScriptedPolicy, TaskInput, Trajectory, Workflow};
use mappa_env::math_tasks::{generate_mix, GeneratedProblem};
use mappa_env::sandbox::{find_python, Sandbox, SandboxConfig, Status};
use mappa_judge::scripted::{ScriptedCoach, ScriptedConfig, Strength, View};
use mappa_judge::{Coach, KnownSolution};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn sandbox() -> Sandbox {
    let mut config = SandboxConfig::with_python(
        find_python(Some(&workspace())).expect("run `just setup-python`"),
    );
    config.uid_base = 1_960_200_000;
    Sandbox::new(config).unwrap()
}

fn tasks(problems: &[GeneratedProblem]) -> Vec<TaskInput> {
    problems
        .iter()
        .enumerate()
        .map(|(group, p)| TaskInput {
            id: p.id.clone(),
            group,
            text: p.prompt.clone(),
            ground_truth: Some(p.answer.to_string()),
            solution: Some(KnownSolution {
                task_kind: "math".into(),
                answer: Some(p.answer.to_string()),
                checkpoints: p.steps.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect()
}

/// The problem a request is about, found by its statement in the first user message.
fn problem_of<'a>(
    by_text: &'a HashMap<String, GeneratedProblem>,
    request: &PolicyRequest,
) -> &'a GeneratedProblem {
    let user = &request.messages[1].content;
    by_text
        .iter()
        .find(|(text, _)| user.contains(text.as_str()))
        .map(|(_, p)| p)
        .expect("a known problem")
}

fn run(dir: &Path, problems: &[GeneratedProblem]) -> Vec<Trajectory> {
    let workflow = Workflow::load(&workspace().join("experiments/workflows/arith.toml")).unwrap();
    let by_text: Arc<HashMap<String, GeneratedProblem>> = Arc::new(
        problems
            .iter()
            .map(|p| (p.prompt.clone(), p.clone()))
            .collect(),
    );
    let (a, b) = (by_text.clone(), by_text.clone());
    let solver = ScriptedPolicy::new("arith-solver", move |r| problem_of(&a, r).steps.join(" "));
    let executor = ScriptedPolicy::new("arith-executor", move |r| {
        if r.messages.len() == 2 {
            format!(
                "Let me check.\n```python\n{}\n```",
                problem_of(&b, r).program
            )
        } else {
            "The program agrees; done.".into()
        }
    });
    let verifier = ScriptedPolicy::new("arith-verifier", |r| {
        let user = &r.messages[1].content;
        let printed = user
            .split("Its last code output:\n")
            .nth(1)
            .unwrap_or("")
            .lines()
            .next()
            .unwrap_or("")
            .trim();
        format!("The computation checks out: \\boxed{{{printed}}}")
    });
    let sandbox = sandbox();
    let engine = RolloutEngine::new(
        &workflow,
        vec![&solver, &executor, &verifier],
        &sandbox,
        dir,
    )
    .unwrap();
    engine.run(&tasks(problems), 2).unwrap()
}

fn scratch() -> tempfile::TempDir {
    mappa_env::sandbox::scratch_dir().unwrap()
}

#[test]
fn arith_rollout_runs_the_chain_with_the_python_tool() {
    let problems = generate_mix(3, 11);
    let dir = scratch();
    let trajectories = run(dir.path(), &problems);
    assert_eq!(trajectories.len(), 6);
    for t in &trajectories {
        let roles: Vec<(&str, usize)> = t
            .actions
            .iter()
            .map(|a| (a.role.as_str(), a.turn))
            .collect();
        assert_eq!(
            roles,
            [
                ("problem_solver", 0),
                ("code_executor", 0),
                ("code_executor", 1),
                ("verifier", 0)
            ]
        );
        let problem = problems.iter().find(|p| p.id == t.task_id).unwrap();
        let run_code = &t.actions[1];
        assert_eq!(
            run_code.tool_status,
            Some(Status::Ok),
            "{:?}",
            run_code.tool_observation
        );
        assert_eq!(
            run_code.tool_observation.as_deref().map(str::trim),
            Some(problem.answer.to_string().as_str())
        );
        assert!(
            t.actions[2].code.is_none(),
            "the turn ends at an action without code"
        );
        // The Verifier saw the Executor's output but not the Solver's.
        let verifier_input = &t.actions[3].messages[1].content;
        assert!(verifier_input.contains("The program agrees"));
        assert!(!verifier_input.contains(&problem.steps[0]));
        let final_output = t.final_output.as_deref().unwrap();
        assert!(
            mappa_env::math::grade_response(&problem.answer.to_string(), final_output, false)
                .correct
        );
    }
    // The same tasks again give the same trajectories (working directories aside).
    let again = run(scratch().path(), &problems);
    let strip = |ts: &[Trajectory]| {
        ts.iter()
            .map(|t| (t.task_id.clone(), t.actions.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(strip(&trajectories), strip(&again));
}

#[test]
fn the_scripted_coach_scores_every_action_from_the_known_solution() {
    let problems = generate_mix(2, 5);
    let dir = scratch();
    let trajectories = run(dir.path(), &problems);
    let workflow = Workflow::load(&workspace().join("experiments/workflows/arith.toml")).unwrap();
    let coach = ScriptedCoach::new(ScriptedConfig {
        noise_std: Some(0.0),
        ..ScriptedConfig::new(View::Oracle, Strength::Strong)
    })
    .unwrap();
    let all_tasks = tasks(&problems);
    for t in &trajectories {
        let task = all_tasks.iter().find(|x| x.id == t.task_id).unwrap();
        let contexts = t.coach_contexts(&workflow, task);
        assert_eq!(contexts.len(), 4);
        assert!(contexts[3].is_last_agent && !contexts[0].is_last_agent);
        let scores = coach.score_batch(&contexts).unwrap();
        assert!(
            scores[3].score >= 9.0,
            "the right boxed answer: {:?}",
            scores[3]
        );
        assert_eq!(scores[3].answer_correct, Some(true));
        assert!(scores.iter().all(|s| s.coach == "scripted-oracle-strong"));
    }
}
