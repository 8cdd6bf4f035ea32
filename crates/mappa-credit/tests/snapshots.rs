//! Snapshots of the rewards and advantages each strategy and each scope give
//! on a fixed step: 4 trajectories, 3 agents, 2 prompt groups; beta 0.01, k1,
//! gamma 1. Stored in `snapshots/mappa-credit/` at the workspace root.

use mappa_credit::{
    CreditConfig, CreditStrategy, NormScope, SampleKey, ScoredAction, ScoredTrajectory,
};
use serde_json::{json, Value};

/// (group, outcome, [(agent, score)]).
type Trajectory = (usize, f64, &'static [(usize, f64)]);

/// Two prompts, a success and a failure each.
const TRAJECTORIES: [Trajectory; 4] = [
    (0, 1.0, &[(0, 8.0), (1, 6.0), (2, 9.0)]),
    (0, 0.0, &[(0, 3.0), (1, 5.0), (2, 2.0)]),
    (1, 1.0, &[(0, 7.0), (1, 4.0), (1, 8.0), (2, 10.0)]),
    (1, 0.0, &[(0, 5.0), (1, 2.0), (2, 1.0)]),
];

/// (old log-probs, reference log-probs, mask) per token; action k of the step
/// uses pattern k % 3. Pattern 2's first token is masked.
const TOKENS: [([f64; 3], [f64; 3], [bool; 3]); 3] = [
    ([-0.5, -1.2, -0.1], [-0.7, -1.0, -0.1], [true, true, true]),
    ([-2.0, -0.3, -0.8], [-1.5, -0.4, -1.1], [true, true, true]),
    ([-9.0, -0.6, -0.05], [-1.0, -0.9, -0.2], [false, true, true]),
];

const STRATEGIES: [(&str, CreditStrategy); 6] = [
    ("process", CreditStrategy::Process),
    ("outcome", CreditStrategy::Outcome),
    ("outcome_final_agent", CreditStrategy::OutcomeFinalAgent),
    ("mixed", CreditStrategy::Mixed { alpha: 0.5 }),
    (
        "discounted_outcome",
        CreditStrategy::DiscountedOutcome { gamma: 0.9 },
    ),
    ("min_form", CreditStrategy::MinForm),
];

const SCOPES: [(&str, NormScope); 5] = [
    ("per_agent_global", NormScope::PerAgentGlobal),
    ("all_agents_global", NormScope::AllAgentsGlobal),
    ("per_prompt_group", NormScope::PerPromptGroup),
    ("group_mean_then_global", NormScope::GroupMeanThenGlobal),
    ("none", NormScope::None),
];

fn trajectories() -> Vec<ScoredTrajectory> {
    TRAJECTORIES
        .iter()
        .map(|&(group, outcome, actions)| ScoredTrajectory {
            group,
            outcome,
            actions: actions
                .iter()
                .map(|&(agent, score)| ScoredAction { agent, score })
                .collect(),
        })
        .collect()
}

fn round(x: f64) -> f64 {
    // `+ 0.0` turns -0.0 into 0.0.
    (x * 1e6).round() / 1e6 + 0.0
}

fn rounded(xs: &[f64]) -> Vec<f64> {
    xs.iter().copied().map(round).collect()
}

/// The step under `config`: one entry per action (sample), with its tokens'
/// returns and advantages.
fn step(config: &CreditConfig) -> Value {
    let trajectories = trajectories();
    let (mut keys, mut rewards, mut returns, mut masks) = (vec![], vec![], vec![], vec![]);
    for t in &trajectories {
        for (a, r) in t.actions.iter().zip(config.rewards(t).unwrap()) {
            let (old, reference, mask) = &TOKENS[keys.len() % TOKENS.len()];
            let shaped = config.shape(r, old, reference, mask).unwrap();
            keys.push(SampleKey {
                agent: a.agent,
                group: t.group,
            });
            rewards.push(r);
            returns.push(shaped.returns);
            masks.push(mask.to_vec());
        }
    }
    let advantages = config
        .advantages(&keys, &rewards, &returns, &masks)
        .unwrap()
        .advantages;
    let samples: Vec<Value> = (0..keys.len())
        .map(|i| {
            json!({
                "agent": keys[i].agent,
                "group": keys[i].group,
                "reward": round(rewards[i]),
                "returns": rounded(&returns[i]),
                "advantages": rounded(&advantages[i]),
            })
        })
        .collect();
    json!({ "config": config, "samples": samples })
}

fn with_snapshot_dir(f: impl FnOnce()) {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../snapshots/mappa-credit"
    ));
    s.set_prepend_module_to_snapshot(false);
    s.bind(f);
}

#[test]
fn rewards_per_strategy() {
    with_snapshot_dir(|| {
        for (name, strategy) in STRATEGIES {
            let per_trajectory: Vec<Value> = trajectories()
                .iter()
                .map(|t| {
                    json!({
                        "group": t.group,
                        "outcome": t.outcome,
                        "agents": t.actions.iter().map(|a| a.agent).collect::<Vec<_>>(),
                        "rewards": rounded(&strategy.rewards(t).unwrap()),
                    })
                })
                .collect();
            let config = CreditConfig {
                strategy,
                ..CreditConfig::default()
            };
            insta::assert_json_snapshot!(
                format!("strategy_{name}"),
                json!({
                    "strategy": strategy.name(),
                    "trajectories": per_trajectory,
                    "per_agent_global_step": step(&config),
                })
            );
        }
    });
}

#[test]
fn advantages_per_scope() {
    with_snapshot_dir(|| {
        for (name, scope) in SCOPES {
            let config = CreditConfig {
                scope,
                ..CreditConfig::default()
            };
            insta::assert_json_snapshot!(format!("scope_{name}"), step(&config));
        }
    });
}
