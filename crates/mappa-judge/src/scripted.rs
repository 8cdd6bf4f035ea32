//! Scripted (simulated) coaches for generated tasks: they score each action
//! from the task's known solution ([`KnownSolution`]) and the tool output,
//! with the same [`ActionScore`] output as LLM coaches. Nothing here is an
//! LLM: names, rationales and raw replies all say "scripted".
//!
//! The score is `5 + discrimination * (10 q - 5) + bias[task kind] + noise`,
//! clamped to [0, 10], where `q` in [0, 1] is the action's quality:
//! - a tool error (a traceback or `Error` in the tool output): 0.15;
//! - a required file missing from the saved files (blame along the chain): 0.1;
//! - all required files saved, with no answer or checkpoints to check: 0.85;
//! - otherwise 0.25, plus up to 0.5 for the solution's checkpoint values
//!   mentioned in the output or tool output; a final answer in `\boxed{}`
//!   gives 1.0 when right and at most 0.2 when wrong; the right answer
//!   stated without `\boxed{}` gives at least 0.8;
//! - when the task's achieved quality is known (tabular tasks), `0.3 + 0.7 quality`.
//!
//! Noise is Gaussian, drawn from a stream named after the action's content,
//! so a score does not depend on batch order. Presets set noise and
//! discrimination: `weak` (std 2.5, 0.4), `medium` (1.2, 0.75), `strong` (0.4, 1.0).

use std::collections::BTreeMap;
use std::sync::Mutex;

use mappa_core::hash::sha256_hex;
use mappa_core::rng::SeedTree;
use serde::{Deserialize, Serialize};

use crate::context::{ActionContext, ActionScore, KnownSolution};
use crate::{Coach, CoachError, CoachReport, RoleCounts};

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
}

/// The quality of an action that faithfully carried forward its input.
pub const CARRIED_FORWARD: f64 = 0.6;

/// A simulated coach for generated tasks.
#[derive(Debug)]
pub struct ScriptedCoach {
    config: ScriptedConfig,
    name: String,
    seeds: SeedTree,
    counts: Mutex<BTreeMap<String, RoleCounts>>,
}

impl ScriptedCoach {
    /// A coach from its settings.
    pub fn new(config: ScriptedConfig) -> Result<Self, CoachError> {
        if config
            .noise_std
            .is_some_and(|s| !(s.is_finite() && s >= 0.0))
        {
            return Err(CoachError::Config(
                "scripted.noise_std: expected a number >= 0".into(),
            ));
        }
        let name = format!("scripted-{}", config.strength.name());
        Ok(Self {
            seeds: SeedTree::new(config.seed),
            name,
            config,
            counts: Mutex::new(BTreeMap::new()),
        })
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
        let (mut quality, mut why) = quality(ctx, solution);
        if self.config.judge_against_input && quality < CARRIED_FORWARD && carried_forward(ctx) {
            quality = CARRIED_FORWARD;
            why.push_str("; carried its input forward");
        }
        let (default_noise, discrimination) = self.config.strength.preset();
        let noise_std = self.config.noise_std.unwrap_or(default_noise);
        let bias = self
            .config
            .bias
            .get(&solution.task_kind)
            .copied()
            .unwrap_or(0.0);
        let key = sha256_hex(serde_json::to_string(ctx).unwrap_or_default().as_bytes());
        let noise = noise_std * self.seeds.stream(&format!("scripted-coach/{key}")).normal();
        let raw = 5.0 + discrimination * (10.0 * quality - 5.0) + bias + noise;
        let score = (raw.clamp(0.0, 10.0) * 10.0).round() / 10.0;
        let answer_correct = match (
            &solution.answer,
            ctx.is_last_agent && ctx.ground_truth.is_some(),
        ) {
            (Some(answer), true) => {
                Some(mappa_env::math::grade_response(answer, &ctx.output, false).correct)
            }
            _ => None,
        };
        let rationale = format!(
            "[scripted coach: {}] quality {quality:.2} ({why}); bias {bias:+.2}; noise {noise:+.2}",
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
        })
    }
}

/// Whether the tool output shows a failure.
fn tool_failed(observation: Option<&str>) -> bool {
    observation.is_some_and(|o| {
        o.contains("Traceback")
            || o.split(|c: char| !c.is_alphanumeric())
                .any(|w| w.ends_with("Error"))
    })
}

/// Whether `value` appears in `text` as a whole token: not inside a longer
/// word or number (`51` is not in `512`, `51.5` or `0.51`).
fn mentions(text: &str, value: &str) -> bool {
    let value = value.trim();
    !value.is_empty()
        && text.match_indices(value).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let mut after = text[at + value.len()..].chars();
            let (next, next2) = (after.next(), after.next());
            let before_ok = before.is_none_or(|c| !c.is_alphanumeric() && c != '.');
            let decimal = next == Some('.') && next2.is_some_and(|c| c.is_ascii_digit());
            let after_ok = next.is_none_or(|c| !c.is_alphanumeric()) && !decimal;
            before_ok && after_ok
        })
}

/// Whether the action restates the value it was handed: the last line of
/// its input, less a `Label:` prefix (a plan to execute, an output to report).
fn carried_forward(ctx: &ActionContext) -> bool {
    let Some(last) = ctx.agent_input.lines().rev().find(|l| !l.trim().is_empty()) else {
        return false;
    };
    let value = last.split_once(": ").map_or(last, |(_, v)| v).trim();
    let seen = format!(
        "{}\n{}",
        ctx.output,
        ctx.tool_observation.as_deref().unwrap_or("")
    );
    !tool_failed(ctx.tool_observation.as_deref()) && mentions(&seen, value)
}

/// The action's quality in [0, 1] and a short account of it.
fn quality(ctx: &ActionContext, solution: &KnownSolution) -> (f64, String) {
    let observation = ctx.tool_observation.as_deref();
    if tool_failed(observation) {
        return (0.15, "the tool output shows an error".into());
    }
    let saved = ctx
        .files
        .as_ref()
        .map(|f| f.saved.as_slice())
        .unwrap_or_default();
    let missing: Vec<&str> = solution
        .required_files
        .iter()
        .filter(|f| !saved.contains(f))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        return (
            0.1,
            format!("required files missing: {}", missing.join(", ")),
        );
    }
    if let Some(q) = solution.quality {
        let q = q.clamp(0.0, 1.0);
        return (0.3 + 0.7 * q, format!("task quality {q:.2} of the optimum"));
    }
    if solution.checkpoints.is_empty() && solution.answer.is_none() {
        return match solution.required_files.is_empty() {
            true => (0.5, "nothing known to check against".into()),
            false => (0.85, "required files saved".into()),
        };
    }
    let seen = format!("{}\n{}", ctx.output, observation.unwrap_or(""));
    let mut q = 0.25;
    let mut why = Vec::new();
    if !solution.checkpoints.is_empty() {
        let hits = solution
            .checkpoints
            .iter()
            .filter(|c| mentions(&seen, c))
            .count();
        q += 0.5 * hits as f64 / solution.checkpoints.len() as f64;
        why.push(format!("checkpoints {hits}/{}", solution.checkpoints.len()));
    }
    if let Some(answer) = &solution.answer {
        let grade = mappa_env::math::grade_response(answer, &ctx.output, false);
        if grade.extracted.is_some() {
            if grade.correct {
                q = 1.0;
                why.push("boxed answer right".into());
            } else {
                q = q.min(0.2);
                why.push("boxed answer wrong".into());
            }
        } else if mentions(&seen, answer) {
            q = q.max(0.8);
            why.push("answer stated".into());
        } else {
            why.push("answer not reached".into());
        }
    }
    (q, why.join(", "))
}

impl Coach for ScriptedCoach {
    fn name(&self) -> &str {
        &self.name
    }

    fn score_batch(&self, contexts: &[ActionContext]) -> Result<Vec<ActionScore>, CoachError> {
        contexts.iter().map(|c| self.score_one(c)).collect()
    }

    fn report(&self) -> CoachReport {
        CoachReport {
            coach: self.name.clone(),
            roles: self
                .counts
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            usage: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileLists;

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
            strength,
            noise_std: None,
            bias: BTreeMap::new(),
            seed: 1,
            judge_against_input: false,
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
            strength: Strength::Weak,
            noise_std: Some(0.0),
            bias,
            seed: 1,
            judge_against_input: false,
        })
        .unwrap()
        .score_one(&ctx)
        .unwrap();
        let unbiased = ScriptedCoach::new(ScriptedConfig {
            strength: Strength::Weak,
            noise_std: Some(0.0),
            bias: BTreeMap::new(),
            seed: 1,
            judge_against_input: false,
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
            strength: Strength::Strong,
            noise_std: Some(0.0),
            bias: BTreeMap::new(),
            seed: 1,
            judge_against_input: false,
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
}
