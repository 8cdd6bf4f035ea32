//! Scripted (simulated) coaches for generated tasks, with the same
//! [`ActionScore`] output as LLM coaches. Nothing here is an LLM: names,
//! rationales and raw replies all say "scripted". Two views, named in the
//! configuration (`view`, required):
//!
//! - `oracle` ([`oracle`]): every action is judged against the task's known
//!   solution (its intermediate values, the answer, required files, the
//!   achieved quality), whatever the action's input was: a per-agent
//!   correctness label with near-perfect blame.
//! - `input-only` ([`input_only`]): each action of the arith workflow is
//!   judged from its input alone, by a coach that re-derives the right
//!   action and slips as the agents do (`slip_rate`), sometimes blames a
//!   faithful relay of a wrong input (`blame_leak`), and favours short
//!   plans (`short_plan_bias`); only the last agent's coach may see the
//!   answer (`coach_sees_ground_truth`).
//! - `task-tied` ([`input_only`] too): the input-only coach, but its
//!   derivation is drawn once per task and role, with a slip probability
//!   that grows with the instance's difficulty (`difficulty_weight`, the
//!   feature the warm-start teacher tilts the agents' slips by), and blame
//!   leaks by its own derivation, not by the answer: a coach that tends to
//!   fail on the instances where the agents fail.
//!
//! - `free-text` ([`free_text`]): what a small pretrained model writes in
//!   the MathChat roles on generated arithmetic, read the way its next
//!   agent must read it (the plan's expression and stated value, the number
//!   a program printed, the final answer) and judged against what the
//!   action's input implies; its verdicts are flipped at `slip_rate`.
//!
//! The view's verdict becomes a quality `q` in [0, 1] (input-only: 1 when
//! judged right, 0.15 when not), and the score is
//! `5 + discrimination * (10 q - 5) + bias + noise`, clamped to [0, 10].
//! Noise is Gaussian, drawn from a stream named after the action's content,
//! so a score does not depend on batch order. Presets set noise and
//! discrimination: `weak` (std 2.5, 0.4), `medium` (1.2, 0.75), `strong`
//! (0.4, 1.0). Each score carries an audit ([`crate::context::Audit`]) of
//! the verdict against the truth (did the agent do its own part right, given
//! its input), from which runs report the coach's accuracy per role.

pub mod free_text;
mod input_only;
mod oracle;

pub use oracle::CARRIED_FORWARD;

use std::collections::BTreeMap;
use std::sync::Mutex;

use mappa_core::hash::sha256_hex;
use mappa_core::rng::SeedTree;
use serde::{Deserialize, Serialize};

use mappa_env::slips::{SlipKind, MAX_DIFFICULTY_WEIGHT};

use crate::context::{ActionContext, ActionScore, Audit, KnownSolution};
use crate::{Coach, CoachError, CoachReport, SharedCounts};
use free_text::FreeText;
use input_only::{InputOnly, TaskTied};
use oracle::{carried_forward, quality};

/// The quality an input-only coach gives an action it judged wrong.
const JUDGED_WRONG: f64 = 0.15;

/// What a scripted coach knows when it judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum View {
    /// The task's known solution, for every action.
    Oracle,
    /// The action's input only (the arith workflow); the answer only for the
    /// last agent, and only when `coach_sees_ground_truth`.
    InputOnly,
    /// As `InputOnly`, with its derivation drawn once per task and tilted
    /// by difficulty, and blame decided by its own derivation.
    TaskTied,
    /// A pretrained model's free text in the MathChat roles, judged by the
    /// numbers each action states against what its input implies.
    FreeText,
}

impl View {
    /// The view's name (`oracle`, `input-only`, `task-tied`).
    pub fn name(self) -> &'static str {
        match self {
            View::Oracle => "oracle",
            View::InputOnly => "input-only",
            View::TaskTied => "task-tied",
            View::FreeText => "free-text",
        }
    }
}

/// Named coach-quality presets, for coach-quality ablations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strength {
    /// Noisy and compressed toward 5.
    Weak,
    /// In between.
    Medium,
    /// Nearly exact.
    Strong,
}

impl Strength {
    /// (noise std, discrimination).
    fn preset(self) -> (f64, f64) {
        match self {
            Strength::Weak => (2.5, 0.4),
            Strength::Medium => (1.2, 0.75),
            Strength::Strong => (0.4, 1.0),
        }
    }

    /// The preset's name (`weak`, `medium`, `strong`).
    pub fn name(self) -> &'static str {
        match self {
            Strength::Weak => "weak",
            Strength::Medium => "medium",
            Strength::Strong => "strong",
        }
    }
}

/// Settings of a [`ScriptedCoach`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedConfig {
    /// What the coach knows (required: no view is the default).
    pub view: View,
    /// The preset.
    pub strength: Strength,
    /// Overrides the preset's noise standard deviation.
    #[serde(default)]
    pub noise_std: Option<f64>,
    /// Added to the score per task kind (e.g. `regression = 1.5` to simulate
    /// the paper's coach being lenient on regression).
    #[serde(default)]
    pub bias: BTreeMap<String, f64>,
    /// Seed of the noise streams.
    #[serde(default)]
    pub seed: u64,
    /// Judge each action against its own input as well: an action that
    /// carries forward the value it was handed (the last line of its input,
    /// less a `Label:` prefix) gets quality at least [`CARRIED_FORWARD`]
    /// even when that value was already wrong upstream, as a careful judge
    /// would not blame it for an earlier agent's mistake.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub judge_against_input: bool,
    /// Input-only and task-tied views: the probability that the coach's own
    /// derivation of the right action slips (`epsilon`); free-text view: the
    /// probability that a verdict is flipped.
    #[serde(default)]
    pub slip_rate: f64,
    /// Input-only view: the kind of slip it makes (the agents' kind).
    #[serde(default)]
    pub slips: SlipKind,
    /// Input-only view: the probability of blaming an action that
    /// faithfully relayed a wrong input (`b`).
    #[serde(default)]
    pub blame_leak: f64,
    /// Input-only view: added to the score of a plan shorter than the
    /// coach's own (`delta`): a bias toward the commonest mistake's look.
    #[serde(default)]
    pub short_plan_bias: f64,
    /// Task-tied view: how much the slip probability grows with the
    /// instance's difficulty (`w` in [`mappa_env::slips::slip_probability`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub difficulty_weight: f64,
}

/// For `skip_serializing_if`: settings at 0 stay out of the serialised form.
fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl ScriptedConfig {
    /// A coach of `view` and `strength`, every other setting at its default
    /// (seed 0, no bias, no slips, leak or short-plan bias).
    pub fn new(view: View, strength: Strength) -> Self {
        Self {
            view,
            strength,
            noise_std: None,
            bias: BTreeMap::new(),
            seed: 0,
            judge_against_input: false,
            slip_rate: 0.0,
            slips: SlipKind::default(),
            blame_leak: 0.0,
            short_plan_bias: 0.0,
            difficulty_weight: 0.0,
        }
    }

    /// Check ranges and that each setting belongs to the view; the error
    /// names the key.
    pub fn validate(&self) -> Result<(), String> {
        if self.noise_std.is_some_and(|s| !(s.is_finite() && s >= 0.0)) {
            return Err("scripted.noise_std: expected a number >= 0".into());
        }
        for (key, p) in [
            ("slip_rate", self.slip_rate),
            ("blame_leak", self.blame_leak),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!(
                    "scripted.{key} = {p}: expected a probability in [0, 1]"
                ));
            }
        }
        if !(0.0..=MAX_DIFFICULTY_WEIGHT).contains(&self.difficulty_weight) {
            return Err(format!(
                "scripted.difficulty_weight = {}: expected a number in [0, {MAX_DIFFICULTY_WEIGHT}]",
                self.difficulty_weight
            ));
        }
        if !self.short_plan_bias.is_finite() {
            return Err("scripted.short_plan_bias: expected a finite number".into());
        }
        let derivation_keys = self.blame_leak != 0.0
            || self.short_plan_bias != 0.0
            || self.slips != SlipKind::default();
        let input_only_keys = self.slip_rate != 0.0 || derivation_keys;
        match self.view {
            View::Oracle if input_only_keys => Err(
                "scripted: slip_rate, slips, blame_leak and short_plan_bias belong to \
                 view = \"input-only\", \"task-tied\" or (slip_rate) \"free-text\""
                    .into(),
            ),
            View::FreeText if derivation_keys => Err(
                "scripted: slips, blame_leak and short_plan_bias belong to view = \"input-only\" \
                 or \"task-tied\" (the free-text view flips verdicts at slip_rate)"
                    .into(),
            ),
            View::Oracle | View::InputOnly | View::FreeText if self.difficulty_weight != 0.0 => {
                Err("scripted: difficulty_weight belongs to view = \"task-tied\"".into())
            }
            View::InputOnly | View::TaskTied | View::FreeText if self.judge_against_input => Err(
                "scripted: judge_against_input belongs to view = \"oracle\" (the other views \
                 always judge against the input)"
                    .into(),
            ),
            _ => Ok(()),
        }
    }
}

/// A simulated coach for generated tasks.
#[derive(Debug)]
pub struct ScriptedCoach {
    config: ScriptedConfig,
    name: String,
    seeds: SeedTree,
    sees_ground_truth: bool,
    counts: SharedCounts,
}

impl ScriptedCoach {
    /// A coach from its settings; the last agent's coach sees the ground
    /// truth (see [`ScriptedCoach::seeing_ground_truth`]).
    pub fn new(config: ScriptedConfig) -> Result<Self, CoachError> {
        config.validate().map_err(CoachError::Config)?;
        let name = format!("scripted-{}-{}", config.view.name(), config.strength.name());
        Ok(Self {
            seeds: SeedTree::new(config.seed),
            name,
            config,
            sees_ground_truth: true,
            counts: Mutex::new(BTreeMap::new()),
        })
    }

    /// Whether the last agent's coach may see the ground truth
    /// (`[coach.settings] coach_sees_ground_truth`; the input-only view
    /// honours it, the oracle sees everything anyway).
    pub fn seeing_ground_truth(mut self, sees: bool) -> Self {
        self.sees_ground_truth = sees;
        self
    }

    /// The view's verdict on one action: its quality, the account, the
    /// score offset, and the audit against the truth where the truth is
    /// defined (the arith workflows: did the agent do its part right, given
    /// its input). `key` names the action's streams.
    fn verdict(
        &self,
        ctx: &ActionContext,
        solution: &KnownSolution,
        key: &str,
    ) -> Result<(f64, String, f64, Option<Audit>), CoachError> {
        let mut judging = self
            .seeds
            .stream(&format!("scripted-coach/{key}/judgement"));
        match self.config.view {
            View::Oracle => {
                let (mut q, mut why) = quality(ctx, solution);
                if self.config.judge_against_input && q < CARRIED_FORWARD && carried_forward(ctx) {
                    q = CARRIED_FORWARD;
                    why.push_str("; carried its input forward");
                }
                let truth = InputOnly::exact(self.config.slips)
                    .judge(ctx, solution, &mut judging)
                    .ok();
                let audit = truth.map(|t| Audit {
                    judged_right: q >= 0.5,
                    truly_right: t.truly_right,
                });
                Ok((q, why, 0.0, audit))
            }
            View::InputOnly | View::TaskTied => {
                let tied = (self.config.view == View::TaskTied).then_some(TaskTied {
                    difficulty_weight: self.config.difficulty_weight,
                    seeds: self.seeds,
                });
                let coach = InputOnly {
                    slip_rate: self.config.slip_rate,
                    slips: self.config.slips,
                    blame_leak: self.config.blame_leak,
                    short_plan_bias: self.config.short_plan_bias,
                    sees_ground_truth: self.sees_ground_truth,
                    tied,
                };
                let j = coach.judge(ctx, solution, &mut judging)?;
                Ok(binary_verdict(j))
            }
            View::FreeText => {
                let coach = FreeText {
                    slip_rate: self.config.slip_rate,
                    sees_ground_truth: self.sees_ground_truth,
                };
                Ok(binary_verdict(coach.judge(ctx, solution, &mut judging)?))
            }
        }
    }

    /// Score one action.
    pub fn score_one(&self, ctx: &ActionContext) -> Result<ActionScore, CoachError> {
        let solution = ctx.solution.as_ref().ok_or_else(|| {
            CoachError::Config(format!(
                "action {:?}: a scripted coach needs the task's known solution (`solution`), \
                 which only generated tasks have",
                ctx.id
            ))
        })?;
        let key = content_key(ctx);
        let (quality, why, action_bias, audit) = self.verdict(ctx, solution, &key)?;
        let (default_noise, discrimination) = self.config.strength.preset();
        let noise_std = self.config.noise_std.unwrap_or(default_noise);
        let bias = self
            .config
            .bias
            .get(&solution.task_kind)
            .copied()
            .unwrap_or(0.0)
            + action_bias;
        let noise = noise_std * self.seeds.stream(&format!("scripted-coach/{key}")).normal();
        let raw = 5.0 + discrimination * (10.0 * quality - 5.0) + bias + noise;
        let score = (raw.clamp(0.0, 10.0) * 10.0).round() / 10.0;
        let sees_answer = match self.config.view {
            View::Oracle => true,
            View::InputOnly | View::TaskTied | View::FreeText => self.sees_ground_truth,
        };
        let answer_correct = match (
            &solution.answer,
            sees_answer && ctx.is_last_agent && ctx.ground_truth.is_some(),
        ) {
            (Some(answer), true) => {
                Some(mappa_env::math::grade_response(answer, &ctx.output, false).correct)
            }
            _ => None,
        };
        let rationale = format!(
            "[scripted coach: {}, {}] quality {quality:.2} ({why}); bias {bias:+.2}; noise {noise:+.2}",
            self.config.view.name(),
            self.config.strength.name()
        );
        let mut raw_response = format!("{rationale}\nPROCESS_SCORE: {score}");
        if let Some(ok) = answer_correct {
            raw_response.push_str(&format!("\nANSWER_CORRECT: {}", ok as u8));
        }
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.entry(ctx.role.clone()).or_default().scored += 1;
        Ok(ActionScore {
            score,
            rationale,
            fallback: false,
            fallback_reason: None,
            answer_correct,
            raw_response,
            coach: self.name.clone(),
            template_sha256: String::new(),
            cached: false,
            audit,
        })
    }
}

/// A right-or-wrong verdict as (quality, account, score offset, audit):
/// quality 1 when judged right, [`JUDGED_WRONG`] when not.
fn binary_verdict(j: input_only::Judgement) -> (f64, String, f64, Option<Audit>) {
    let q = if j.judged_right { 1.0 } else { JUDGED_WRONG };
    let audit = Audit {
        judged_right: j.judged_right,
        truly_right: j.truly_right,
    };
    (q, j.why, j.bias, Some(audit))
}

/// The name of an action's random streams: the sha256 of its context,
/// without the solution's `plan` (added after the oracle's results were
/// published; leaving it out keeps those scores bit-identical).
fn content_key(ctx: &ActionContext) -> String {
    let mut keyed = ctx.clone();
    if let Some(solution) = keyed.solution.as_mut() {
        solution.plan = None;
    }
    sha256_hex(serde_json::to_string(&keyed).unwrap_or_default().as_bytes())
}

impl Coach for ScriptedCoach {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&self, contexts: &[ActionContext]) -> Result<Vec<ActionScore>, CoachError> {
        contexts.iter().map(|c| self.score_one(c)).collect()
    }

    fn report(&self) -> CoachReport {
        CoachReport::of(&self.name, &self.counts, Default::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileLists;
    use oracle::mentions;

    fn math_ctx(output: &str, observation: Option<&str>) -> ActionContext {
        ActionContext {
            id: "t/solver/0".into(),
            task: "Compute (17 * 3) mod 7.".into(),
            role: "problem_solver".into(),
            agent_input: "Solve.".into(),
            output: output.into(),
            tool_observation: observation.map(str::to_string),
            solution: Some(KnownSolution {
                task_kind: "math".into(),
                answer: Some("2".into()),
                checkpoints: vec!["51".into()],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn coach(strength: Strength) -> ScriptedCoach {
        ScriptedCoach::new(ScriptedConfig {
            seed: 1,
            ..ScriptedConfig::new(View::Oracle, strength)
        })
        .unwrap()
    }

    #[test]
    fn strong_coach_ranks_right_above_partial_above_wrong_above_errors() {
        let c = coach(Strength::Strong);
        let s = |out: &str, obs: Option<&str>| c.score_one(&math_ctx(out, obs)).unwrap().score;
        let right = s("17*3 = 51, and 51 mod 7 = 2, so \\boxed{2}", None);
        let partial = s("17*3 = 51, then reduce", None);
        let wrong = s("\\boxed{5}", None);
        let error = s(
            "print(17*3 % 7)",
            Some("Traceback (most recent call last):\nNameError: x"),
        );
        assert!(
            right > partial && partial > wrong && wrong >= error - 1.0,
            "{right} {partial} {wrong} {error}"
        );
        assert!(right >= 8.5 && error <= 3.0, "{right} {error}");
    }

    #[test]
    fn scores_are_deterministic_labelled_and_biased_by_kind() {
        let c = coach(Strength::Weak);
        let ctx = math_ctx("so \\boxed{2}", None);
        let a = c.score_one(&ctx).unwrap();
        assert_eq!(a, c.score_one(&ctx).unwrap());
        assert!(a.coach.contains("scripted") && a.raw_response.contains("scripted"));
        let mut bias = BTreeMap::new();
        bias.insert("math".to_string(), -3.0);
        let biased = ScriptedCoach::new(ScriptedConfig {
            noise_std: Some(0.0),
            bias,
            seed: 1,
            ..ScriptedConfig::new(View::Oracle, Strength::Weak)
        })
        .unwrap()
        .score_one(&ctx)
        .unwrap();
        let unbiased = ScriptedCoach::new(ScriptedConfig {
            noise_std: Some(0.0),
            seed: 1,
            ..ScriptedConfig::new(View::Oracle, Strength::Weak)
        })
        .unwrap()
        .score_one(&ctx)
        .unwrap();
        assert!((unbiased.score - biased.score - 3.0).abs() < 1e-9);
    }

    #[test]
    fn missing_required_files_blame_the_agent_that_should_have_saved_them() {
        let c = coach(Strength::Strong);
        let mut ctx = math_ctx("done", None);
        ctx.role = "data_engineer".into();
        ctx.solution = Some(KnownSolution {
            task_kind: "classification".into(),
            required_files: vec!["X_train.pkl".into(), "X_test.pkl".into()],
            ..Default::default()
        });
        ctx.files = Some(FileLists {
            available: vec!["train.csv".into()],
            saved: vec!["X_train.pkl".into()],
        });
        let low = c.score_one(&ctx).unwrap();
        assert!(
            low.score <= 2.0 && low.rationale.contains("X_test.pkl"),
            "{low:?}"
        );
        ctx.files.as_mut().unwrap().saved.push("X_test.pkl".into());
        assert!(c.score_one(&ctx).unwrap().score > low.score + 3.0);
    }

    #[test]
    fn mentions_needs_whole_tokens() {
        assert!(mentions("the value is 51.", "51"));
        assert!(!mentions("the value is 512", "51"));
        assert!(!mentions("x = 51.5", "51"));
        assert!(mentions("(51)", "51"));
    }

    #[test]
    fn judged_against_input_a_faithful_relay_of_a_wrong_value_is_not_blamed() {
        let mut config = ScriptedConfig {
            noise_std: Some(0.0),
            seed: 1,
            ..ScriptedConfig::new(View::Oracle, Strength::Strong)
        };
        let relay = |output: &str| ActionContext {
            agent_input: "[system]\nBox the printed answer.\n\n[user]\nOutput:\n5".into(),
            role: "verifier".into(),
            ..math_ctx(output, None)
        };
        let plain = ScriptedCoach::new(config.clone()).unwrap();
        config.judge_against_input = true;
        let in_context = ScriptedCoach::new(config).unwrap();
        let score = |c: &ScriptedCoach, out: &str| c.score_one(&relay(out)).unwrap().score;
        // Upstream printed 5 (wrong; the answer is 2): boxing it is faithful.
        assert!(score(&plain, "\\boxed{5}") < 3.0);
        assert_eq!(score(&in_context, "\\boxed{5}"), 10.0 * CARRIED_FORWARD);
        // Changing what it was handed is not.
        assert!(score(&in_context, "\\boxed{50}") < 3.0);
        // The right answer stays right.
        assert_eq!(score(&in_context, "\\boxed{2}"), 10.0);
        // The first agent's input ends with the task, which it does not restate.
        assert!(!carried_forward(&math_ctx("\\boxed{5}", None)));
    }

    /// An arith action for the input-only coach: a Problem Solver's plan
    /// for `(12 - 7) * 5 + 1`.
    fn plan_ctx(plan: &str, n: usize) -> ActionContext {
        ActionContext {
            id: format!("t{n}/problem_solver"),
            task: format!("Compute (12 - 7) * 5 + 1. [{n}]"),
            role: "problem_solver".into(),
            agent_input: "[user]\nCompute (12 - 7) * 5 + 1.".into(),
            output: format!("Plan: {plan}"),
            solution: Some(KnownSolution {
                task_kind: "small_arithmetic".into(),
                answer: Some("26".into()),
                plan: Some("(12 - 7) * 5 + 1".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_input_only_coach_is_named_audited_and_as_accurate_as_its_slip_rate() {
        let coach = ScriptedCoach::new(ScriptedConfig {
            slip_rate: 0.2,
            slips: SlipKind::Structural,
            ..ScriptedConfig::new(View::InputOnly, Strength::Strong)
        })
        .unwrap();
        assert_eq!(coach.name(), "scripted-input-only-strong");
        let scores: Vec<ActionScore> = (0..400)
            .map(|n| coach.score_one(&plan_ctx("(12 - 7) * 5 + 1", n)).unwrap())
            .collect();
        assert!(scores[0]
            .rationale
            .starts_with("[scripted coach: input-only, strong]"));
        let agree = scores.iter().filter(|s| s.audit.unwrap().agrees()).count();
        // Right plans are judged wrong exactly when the coach slips: about 20%.
        assert!((280..=360).contains(&agree), "{agree} of 400");
        let high = scores.iter().filter(|s| s.score >= 8.0).count();
        assert_eq!(high, agree, "judged right <=> a high score");
    }

    #[test]
    fn settings_belong_to_their_view() {
        let e = ScriptedCoach::new(ScriptedConfig {
            slip_rate: 0.1,
            ..ScriptedConfig::new(View::Oracle, Strength::Strong)
        })
        .unwrap_err();
        assert!(e.to_string().contains("input-only"), "{e}");
        let e = ScriptedCoach::new(ScriptedConfig {
            judge_against_input: true,
            ..ScriptedConfig::new(View::InputOnly, Strength::Strong)
        })
        .unwrap_err();
        assert!(e.to_string().contains("oracle"), "{e}");
        let e = ScriptedCoach::new(ScriptedConfig {
            blame_leak: 1.5,
            ..ScriptedConfig::new(View::InputOnly, Strength::Strong)
        })
        .unwrap_err();
        assert!(e.to_string().contains("blame_leak"), "{e}");
        let missing: Result<ScriptedConfig, _> = toml::from_str("strength = \"strong\"");
        assert!(
            missing.unwrap_err().to_string().contains("view"),
            "no default view"
        );
    }
}
