//! One whole training step of the arith workflow on the CPU backend, as the
//! pipeline runs it: three agents with their own tiny fixture models roll
//! out with the real Python tool, a scripted coach scores every action, the
//! process credit strategy gives rewards, and each agent's learner takes
//! one REINFORCE++ step on its own actions.

use std::os::unix::fs::PermissionsExt;

use burn::backend::Autodiff;
use burn::module::AutodiffModule;
use mappa_agents::{RolloutEngine, TaskInput, Workflow};
use mappa_core::rng::SeedTree;
use mappa_credit::CreditConfig;
use mappa_env::math_tasks::generate_mix;
use mappa_env::sandbox::{find_python, Sandbox, SandboxConfig};
use mappa_judge::scripted::{ScriptedCoach, ScriptedConfig, Strength};
use mappa_judge::{Coach, KnownSolution};
use mappa_model::weights::{hf_tensors, load_transformer};
use mappa_model::{ChatTemplate, GenerationConfig, HfTokenizer, SamplingConfig};
use mappa_tests::fixtures;
use mappa_train::{
    build_samples, loss_config, AgentLearner, ModelPolicy, RolloutAction, RolloutTrajectory,
    TrainConfig,
};

type B = Autodiff<mappa_model::backend::Cpu>;

#[test]
fn one_arith_step_trains_every_agent_on_its_own_actions() {
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

    let generation = GenerationConfig {
        max_new_tokens: 12,
        sampling: SamplingConfig::with_temperature(1.0),
        eos_token_ids: Vec::new(),
        stop_strings: Vec::new(),
    };
    let seeds = SeedTree::new(42);
    let policies: Vec<ModelPolicy<'_, mappa_model::backend::Cpu>> = learners
        .iter()
        .map(|l| {
            ModelPolicy::new(
                l.name(),
                l.policy().valid(),
                &tokenizer,
                &template,
                generation.clone(),
                seeds,
            )
        })
        .collect();
    let mut sandbox_config =
        SandboxConfig::with_python(find_python(Some(&root)).expect("run `just setup-python`"));
    sandbox_config.uid_base = 1_960_300_000;
    let sandbox = Sandbox::new(sandbox_config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let engine = RolloutEngine::new(
        &workflow,
        policies
            .iter()
            .map(|p| p as &dyn mappa_agents::Policy)
            .collect(),
        &sandbox,
        dir.path(),
    )
    .unwrap();
    let trajectories = engine.run(&tasks, 2).unwrap();
    assert_eq!(trajectories.len(), 4);

    let coach = ScriptedCoach::new(ScriptedConfig {
        strength: Strength::Medium,
        noise_std: None,
        bias: Default::default(),
        seed: 1,
        judge_against_input: false,
    })
    .unwrap();
    let mut rollout = Vec::new();
    for t in &trajectories {
        let task = tasks.iter().find(|x| x.id == t.task_id).unwrap();
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
                })
                .collect(),
        });
        // Every action carries what training needs.
        for a in &t.actions {
            assert!(!a.prompt_ids.is_empty());
            assert_eq!(a.completion_ids.len(), a.old_logprobs.len());
        }
    }

    let credit = CreditConfig::default();
    let samples = build_samples(&learners, &rollout, &credit).unwrap();
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
        let before = hf_tensors(learner.policy());
        let metrics = learner
            .train_step(&samples[agent], &loss_config(learner.config(), &credit))
            .unwrap();
        assert!(
            metrics.loss.is_finite() && metrics.grad_norm.is_finite(),
            "{metrics:?}"
        );
        if !metrics.skipped {
            assert_ne!(
                before,
                hf_tensors(learner.policy()),
                "agent {agent}'s weights moved"
            );
        }
    }
}
