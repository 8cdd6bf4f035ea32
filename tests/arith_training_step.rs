//! One whole training step of the arith workflow on the CPU backend, as the
//! pipeline runs it, on actions a reviewer can judge: three agents with
//! their own tiny fixture models act through a teacher-forced policy (a
//! script writes each reply; the agent's tokenizer and chat template turn
//! prompt and reply into token ids ending in EOS, so no action is
//! truncated), the Code Executor's program runs in the real Python
//! sandbox, the Verifier's answer is graded, a scripted coach scores every
//! action, the process credit strategy gives rewards, and each agent's
//! learner takes one REINFORCE++ step on its own actions. The step must
//! update every agent's weights.

use burn::backend::Autodiff;
use mappa_agents::{
    Policy, PolicyOutput, PolicyRequest, RolloutEngine, ScriptedPolicy, TaskInput, Workflow,
};
use mappa_credit::CreditConfig;
use mappa_env::math_tasks::{generate_mix, GeneratedProblem};
use mappa_env::sandbox::{find_python, Sandbox, SandboxConfig, Status};
use mappa_judge::scripted::{ScriptedCoach, ScriptedConfig, Strength, View};
use mappa_judge::{Coach, KnownSolution};
use mappa_model::weights::{hf_tensors, load_transformer};
use mappa_model::{ChatTemplate, HfTokenizer, Tokenizer};
use mappa_tests::fixtures;
use mappa_train::sft::encode_demonstration;
use mappa_train::{
    build_samples, loss_config, AgentLearner, RolloutAction, RolloutTrajectory, TrainConfig,
};

type B = Autodiff<mappa_model::backend::Cpu>;

/// A scripted reply, tokenised as the agent's model would see and emit it.
struct TeacherForced<'a> {
    script: ScriptedPolicy,
    tokenizer: &'a HfTokenizer,
    template: &'a ChatTemplate,
}

impl Policy for TeacherForced<'_> {
    fn name(&self) -> String {
        self.script.name()
    }

    fn generate(
        &self,
        requests: &[PolicyRequest],
    ) -> Result<Vec<PolicyOutput>, mappa_agents::AgentError> {
        let replies = self.script.generate(requests)?;
        requests
            .iter()
            .zip(replies)
            .map(|(r, reply)| {
                let (prompt_ids, completion_ids) =
                    encode_demonstration(&r.messages, &reply.text, self.tokenizer, self.template)
                        .map_err(|e| mappa_agents::AgentError::Policy(e.to_string()))?;
                Ok(PolicyOutput {
                    logprobs: vec![0.0; completion_ids.len()],
                    prompt_ids,
                    completion_ids,
                    truncated: false,
                    text: reply.text,
                })
            })
            .collect()
    }
}

/// The problem a request is about.
fn problem_of<'p>(problems: &'p [GeneratedProblem], r: &PolicyRequest) -> &'p GeneratedProblem {
    let user = &r.messages[1].content;
    problems
        .iter()
        .find(|p| user.contains(p.statement()))
        .expect("the prompt names its problem")
}

/// The arith workflow's three roles, scripted: a plan, a program and then a
/// report of its output, a boxed answer (wrong in the second sample, so
/// that outcomes differ).
fn scripts(problems: &[GeneratedProblem]) -> Vec<ScriptedPolicy> {
    let (p1, p2, p3) = (problems.to_vec(), problems.to_vec(), problems.to_vec());
    vec![
        ScriptedPolicy::new("solver", move |r| {
            format!("Compute {}.", problem_of(&p1, r).expression())
        }),
        ScriptedPolicy::new("executor", move |r| {
            let p = problem_of(&p2, r);
            if r.messages.iter().any(|m| m.content.contains("Output")) {
                format!("The program printed {}.", p.answer)
            } else {
                format!("```python\n{}print({})\n```", p.preamble(), p.expression())
            }
        }),
        ScriptedPolicy::new("verifier", move |r| {
            let p = problem_of(&p3, r);
            let answer = if r.stream.contains("/s1/") {
                p.answer + 1
            } else {
                p.answer
            };
            format!("\\boxed{{{answer}}}")
        }),
    ]
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom
fn one_arith_step_trains_every_agent_on_its_own_untruncated_actions() {
    let root = fixtures().join("..");
    let model_dir = fixtures().join("models/qwen3-tiny");
    let workflow = Workflow::load(&root.join("experiments/workflows/arith.toml")).unwrap();
    let tokenizer = HfTokenizer::from_dir(&model_dir).unwrap();
    let template = ChatTemplate::from_tokenizer(&tokenizer).unwrap();
    let config = TrainConfig {
        lr: 1e-3,
        min_lr: 1e-4,
        warmup_fraction: 0.0,
        total_steps: 2,
        micro_batch_size: 4,
        ..Default::default()
    };
    let mut learners: Vec<AgentLearner<B>> = workflow
        .agents
        .iter()
        .map(|a| {
            AgentLearner::new(
                &a.role,
                load_transformer::<B>(&model_dir, &Default::default()).unwrap(),
                config.clone(),
            )
            .unwrap()
        })
        .collect();

    let problems = generate_mix(2, 3);
    let tasks: Vec<TaskInput> = problems
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
        .collect();
    let policies: Vec<TeacherForced<'_>> = scripts(&problems)
        .into_iter()
        .map(|script| TeacherForced {
            script,
            tokenizer: &tokenizer,
            template: &template,
        })
        .collect();
    let mut sandbox_config =
        SandboxConfig::with_python(find_python(Some(&root)).expect("run `just setup-python`"));
    sandbox_config.uid_base = 1_960_300_000;
    let sandbox = Sandbox::new(sandbox_config).unwrap();
    let dir = mappa_env::sandbox::scratch_dir().unwrap();
    let engine = RolloutEngine::new(
        &workflow,
        policies.iter().map(|p| p as &dyn Policy).collect(),
        &sandbox,
        dir.path(),
    )
    .unwrap();
    let trajectories = engine.run(&tasks, 2).unwrap();
    assert_eq!(trajectories.len(), 4);

    let coach = ScriptedCoach::new(ScriptedConfig {
        seed: 1,
        ..ScriptedConfig::new(View::Oracle, Strength::Medium)
    })
    .unwrap();
    let eos = tokenizer.eos_token_ids()[0];
    let mut outcomes = Vec::new();
    let mut rollout = Vec::new();
    for t in &trajectories {
        let task = tasks.iter().find(|x| x.id == t.task_id).unwrap();
        // Real actions: ending in EOS, and the program ran and printed the answer.
        for a in &t.actions {
            assert!(
                !a.truncated && a.completion_ids.last() == Some(&eos),
                "{a:?}"
            );
        }
        let ran = t.actions.iter().find(|a| a.code.is_some()).unwrap();
        assert_eq!(ran.tool_status, Some(Status::Ok), "{ran:?}");
        assert!(ran
            .tool_observation
            .as_deref()
            .unwrap()
            .contains(task.ground_truth.as_deref().unwrap()));
        let scores = coach
            .score_batch(&t.coach_contexts(&workflow, task))
            .unwrap();
        let outcome = t
            .final_output
            .as_deref()
            .map(|o| {
                mappa_env::math::grade_response(task.ground_truth.as_deref().unwrap(), o, false)
                    .correct as u8 as f64
            })
            .unwrap_or(0.0);
        outcomes.push(outcome);
        rollout.push(RolloutTrajectory {
            group: t.group,
            outcome,
            actions: t
                .actions
                .iter()
                .zip(&scores)
                .map(|(a, s)| RolloutAction {
                    agent: a.agent,
                    prompt: &a.prompt_ids,
                    completion: &a.completion_ids,
                    truncated: a.truncated,
                    score: s.score,
                    rollout_logprobs: Some(&a.old_logprobs),
                })
                .collect(),
        });
    }
    assert_eq!(
        outcomes,
        [1.0, 0.0, 1.0, 0.0],
        "sample 1's Verifier is wrong"
    );

    let credit = CreditConfig::default();
    let samples = build_samples(&learners, &rollout, &credit).unwrap().samples;
    for (agent, learner) in learners.iter_mut().enumerate() {
        let actions: usize = trajectories
            .iter()
            .map(|t| t.actions.iter().filter(|a| a.agent == agent).count())
            .sum();
        assert_eq!(
            samples[agent].len(),
            actions,
            "agent {agent} trains on exactly its own actions"
        );
        assert!(
            samples[agent].iter().all(|s| s.mask.iter().all(|m| *m)),
            "no token of agent {agent} is masked"
        );
        let before = hf_tensors(learner.policy());
        let metrics = learner
            .train_step(&samples[agent], &loss_config(learner.config(), &credit))
            .unwrap();
        assert!(!metrics.skipped, "agent {agent}: {metrics:?}");
        assert!(
            metrics.loss.is_finite() && metrics.grad_norm > 0.0 && metrics.grad_norm.is_finite(),
            "{metrics:?}"
        );
        assert_ne!(
            before,
            hf_tensors(learner.policy()),
            "agent {agent}'s weights moved"
        );
    }
}
