//! `data.kind = "generated_math"`: generated AIME-format problems
//! (`mappa_env::math_tasks`), train and held-out sets drawn from separate
//! seeds and checked disjoint; graded on the boxed answer. Its teacher,
//! `arith`, writes the arith workflow's plan -> program -> boxed answer and
//! slips at a set rate per role.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use mappa_agents::{PolicyRequest, ScriptedPolicy, TaskInput};
use mappa_core::rng::SeedTree;
use mappa_env::datasets::normalize_problem_text;
use mappa_env::math_tasks::{generate_mix_of, GeneratedProblem, Tier};
use mappa_judge::KnownSolution;
use serde::{Deserialize, Serialize};

use super::{expect_roles, settings_boilerplate, AnswerGrader, TaskFamily, TaskSet, Teacher, WarmStart};
use mappa_env::slips::{rate_for, slip, SlipKind, MAX_DIFFICULTY_WEIGHT};
use crate::TrainError;

/// The most problems of one tier a split draws before giving up: the
/// smallest tier (`one_step`) has 703 distinct problems, and the generator
/// stops with a panic when asked for more of a tier than exist.
const MAX_DRAWN_PER_TIER: usize = 600;

/// Generated problems: how many, from which seed, and what agents and a
/// scripted coach see of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratedMath {
    /// Training problems.
    pub train: usize,
    /// Held-out problems.
    pub eval: usize,
    /// Generator seed (the held-out set uses a seed derived from it).
    pub seed: u64,
    /// What a scripted coach looks for in an action: the solution's
    /// intermediate values (`steps`, the default) or the solving Python
    /// expression (`expression`).
    #[serde(default)]
    pub coach_checkpoints: CheckpointKind,
    /// Keep the "put your final answer within \\boxed{}" instruction in
    /// the task text (default true; compact workflows drop it).
    #[serde(default = "yes")]
    pub instruction: bool,
    /// Which tiers to draw from, cycled (default: all).
    #[serde(default)]
    pub tiers: Option<Vec<Tier>>,
    /// Grade an unboxed final answer too (the text after the last "the
    /// answer is", else the last number), for small models that rarely write
    /// `\boxed{}`. Off by default: the paper grades the boxed answer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub answer_fallbacks: bool,
    /// Draw training and held-out problems from one part of the problem
    /// space only ([`Split`]), so that problems looked at while choosing
    /// settings never reach a registered run's held-out set, whatever the
    /// seeds. None (the default): the whole space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<Split>,
}

/// A fixed partition of the generated problems by their text's sha256
/// (normalised as in the overlap checks): a quarter for choosing settings,
/// the rest for registered runs. Seeds pick problems within a part; no
/// seed reaches the other part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Split {
    /// The quarter whose hash's first byte is a multiple of 4.
    Validation,
    /// The other three quarters.
    Test,
}

impl Split {
    /// Whether `problem` belongs to this part.
    pub fn holds(self, problem: &GeneratedProblem) -> bool {
        let hash = mappa_core::hash::sha256_hex(normalize_problem_text(&problem.prompt).as_bytes());
        let first = u8::from_str_radix(&hash[..2], 16).expect("sha256 hex");
        first.is_multiple_of(4) == (self == Split::Validation)
    }

    /// Its name in a manifest.
    pub fn name(self) -> &'static str {
        match self {
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }
}

fn yes() -> bool {
    true
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a scripted coach checks actions against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// The canonical solution steps' values.
    #[default]
    Steps,
    /// The Python expression that computes the answer.
    Expression,
}

impl GeneratedMath {
    fn tiers(&self) -> &[Tier] {
        self.tiers.as_deref().unwrap_or(&Tier::ALL)
    }

    /// `n` problems under `seed` from the manifest's split, none of them in
    /// `exclude` (normalised texts): the first `n` of the tiers' mix that
    /// qualify. A split too small for `n` is an error naming it.
    fn draw_from_split(
        &self,
        split: Split,
        n: usize,
        seed: u64,
        exclude: &HashSet<String>,
    ) -> Result<Vec<GeneratedProblem>, TrainError> {
        // A quarter (validation) or three quarters (test) of the mix
        // belong to the split; draw with a margin, then more if short.
        let mut want = match split {
            Split::Validation => 4 * (n + exclude.len()) + 32,
            Split::Test => (n + exclude.len()) * 3 / 2 + 32,
        };
        let per_tier_cap = MAX_DRAWN_PER_TIER * self.tiers().len().max(1);
        loop {
            let drawn: Vec<GeneratedProblem> = generate_mix_of(self.tiers(), want.min(per_tier_cap), seed)
                .into_iter()
                .filter(|p| split.holds(p) && !exclude.contains(&normalize_problem_text(&p.prompt)))
                .take(n)
                .collect();
            if drawn.len() == n {
                return Ok(drawn);
            }
            if want >= per_tier_cap {
                return Err(TrainError::Config(format!(
                    "data.split = \"{}\": the tiers {:?} do not have {n} distinct problems in this \
                     split under seed {seed}{}: ask for fewer, or add a tier with more problems",
                    split.name(),
                    self.tiers().iter().map(|t| t.name()).collect::<Vec<_>>(),
                    if exclude.is_empty() { String::new() } else { format!(" besides the {} training problems", exclude.len()) }
                )));
            }
            want += want / 4;
        }
    }

    /// What agents see of a problem: the whole prompt (with the
    /// boxed-answer instruction) or only the statement.
    fn text(&self, p: &GeneratedProblem) -> String {
        if self.instruction {
            p.prompt.clone()
        } else {
            p.statement().to_string()
        }
    }

    /// A problem as the rollout engine receives it; the known solution
    /// (for scripted coaches) carries the tier as the task kind, so that a
    /// scripted coach can be biased per tier.
    fn task(&self, group: usize, p: &GeneratedProblem) -> TaskInput {
        TaskInput {
            id: p.id.clone(),
            group,
            text: self.text(p),
            ground_truth: Some(p.answer.to_string()),
            solution: Some(KnownSolution {
                task_kind: p.tier.name().into(),
                answer: Some(p.answer.to_string()),
                checkpoints: match self.coach_checkpoints {
                    CheckpointKind::Steps => p.steps.clone(),
                    CheckpointKind::Expression => vec![p.expression().to_string()],
                },
                plan: Some(p.expression().to_string()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

impl TaskFamily for GeneratedMath {
    settings_boilerplate!();

    fn held_out(&self) -> Option<usize> {
        Some(self.eval)
    }

    fn load(&self, _data_dir: &Path) -> Result<TaskSet, TrainError> {
        let no_exclusions = HashSet::new();
        let train = match self.split {
            Some(split) => self.draw_from_split(split, self.train, self.seed, &no_exclusions)?,
            None => generate_mix_of(self.tiers(), self.train, self.seed),
        };
        let seen: HashSet<String> = train
            .iter()
            .map(|p| normalize_problem_text(&p.prompt))
            .collect();
        let eval_seed = SeedTree::new(self.seed)
            .stream("data/eval-seed")
            .next_u64();
        let eval = match self.split {
            Some(split) => self.draw_from_split(split, self.eval, eval_seed, &seen)?,
            // Draw extra and drop any that repeat a training problem.
            None => generate_mix_of(self.tiers(), self.eval * 2 + 8, eval_seed)
                .into_iter()
                .filter(|p| !seen.contains(&normalize_problem_text(&p.prompt)))
                .take(self.eval)
                .collect(),
        };
        if eval.len() < self.eval {
            return Err(TrainError::Config(format!(
                "data: only {} held-out problems disjoint from training",
                eval.len()
            )));
        }
        let tasks = |problems: &[GeneratedProblem]| {
            problems
                .iter()
                .enumerate()
                .map(|(i, p)| self.task(i, p))
                .collect()
        };
        Ok(TaskSet {
            train: tasks(&train),
            eval: tasks(&eval),
            grader: Box::new(AnswerGrader {
                fallbacks: self.answer_fallbacks,
            }),
        })
    }

    fn metric(&self) -> &'static str {
        "Accuracy is the rate of right final answers."
    }

    fn describe(&self) -> String {
        format!(
            "generated AIME-format problems (simulated; {} for training, {} held out)",
            self.train, self.eval
        )
    }

    /// The `arith` teacher: a pool of generated problems of its own (none
    /// held out), one demonstration per problem.
    fn teacher(
        &self,
        warm: &WarmStart,
        roles: &[String],
        held_out: &[TaskInput],
        _data_dir: &Path,
    ) -> Result<Teacher, TrainError> {
        if warm.teacher != "arith" {
            return Err(TrainError::Config(format!(
                "warm_start.teacher = {:?}: generated_math tasks have the \"arith\" teacher",
                warm.teacher
            )));
        }
        expect_roles(&warm.teacher, roles, &ARITH_CHAINS)?;
        if !(0.0..=MAX_DIFFICULTY_WEIGHT).contains(&warm.difficulty_weight) {
            return Err(TrainError::Config(format!(
                "warm_start.difficulty_weight = {}: expected a number in [0, {MAX_DIFFICULTY_WEIGHT}]",
                warm.difficulty_weight
            )));
        }
        // Demonstrations repeated over the RL training problems would teach
        // the models to recall those problems rather than to copy numbers.
        let held_out: HashSet<String> = held_out
            .iter()
            .map(|t| normalize_problem_text(&t.text))
            .collect();
        let pool_seed = SeedTree::new(self.seed)
            .stream("warm-start/pool")
            .next_u64();
        let problems: Vec<GeneratedProblem> = generate_mix_of(
            self.tiers(),
            warm.demonstrations + held_out.len(),
            pool_seed,
        )
        .into_iter()
        .filter(|p| !held_out.contains(&normalize_problem_text(&p.prompt)))
        .take(warm.demonstrations)
        .collect();
        let tasks = problems
            .iter()
            .enumerate()
            .map(|(group, p)| TaskInput {
                id: p.id.clone(),
                group,
                text: self.text(p),
                ..Default::default()
            })
            .collect();
        let policies = arith_teacher(
            Arc::new(problems),
            roles,
            &warm.error_rates,
            (warm.slips, warm.difficulty_weight),
            SeedTree::new(warm.sft.seed),
        );
        Ok(Teacher { tasks, policies })
    }
}

/// The user message of a request, or an error naming the role.
fn user_message<'r>(r: &'r PolicyRequest, role: &str) -> Result<&'r str, String> {
    r.messages
        .get(1)
        .map(|m| m.content.as_str())
        .ok_or_else(|| format!("the {role}'s request has no user message"))
}

/// The chains of roles the `arith` teacher writes for: the MathChat shape
/// (`arith-compact`), and the five-agent chain (`arith-chain`) in which a
/// Plan Checker relays the plan and an Output Reader relays the printed
/// value.
const ARITH_CHAINS: [&[&str]; 2] = [
    &["problem_solver", "code_executor", "verifier"],
    &[
        "problem_solver",
        "plan_checker",
        "code_executor",
        "output_reader",
        "verifier",
    ],
];

/// The plan in a prompt: its first line starting with `Plan: `.
fn handed_plan(user: &str, role: &str) -> Result<String, String> {
    user.lines()
        .find_map(|l| l.strip_prefix("Plan: "))
        .map(str::to_string)
        .ok_or_else(|| {
            format!("the {role}'s prompt has no line starting with \"Plan: \" (the plan it is handed): {user:?}")
        })
}

/// The printed value in a prompt: the first line after `Output:`.
fn handed_output(user: &str, role: &str) -> Result<String, String> {
    let rest = user.split("Output:\n").nth(1).ok_or_else(|| {
        format!("the {role}'s prompt has no \"Output:\" section (the value it is handed): {user:?}")
    })?;
    Ok(rest.lines().next().unwrap_or("0").trim().to_string())
}

/// The arith teacher's policies, one per role of `roles` (one of
/// [`ARITH_CHAINS`]): the Problem Solver plans with the Python expression,
/// the Plan Checker restates the plan, the Code Executor prints the plan it
/// is handed, the Output Reader restates the printed value, the Verifier
/// boxes the value it is handed; each slips at its role's error rate,
/// tilted by the difficulty of the plan it writes when the weight (the
/// second of `slips`) is not 0 ([`mappa_env::slips::rate_for`]). A
/// prompt the teacher cannot read (a workflow whose wording changed) is an
/// error, never a made-up demonstration.
fn arith_teacher(
    problems: Arc<Vec<GeneratedProblem>>,
    roles: &[String],
    error_rates: &BTreeMap<String, f64>,
    (kind, difficulty_weight): (SlipKind, f64),
    seeds: SeedTree,
) -> Vec<ScriptedPolicy> {
    let find = |problems: &[GeneratedProblem], user: &str| -> Option<GeneratedProblem> {
        problems
            .iter()
            .find(|p| user.contains(p.statement()))
            .cloned()
    };
    roles
        .iter()
        .map(|role| {
            let (name, problems) = (role.clone(), problems.clone());
            let rate = error_rates.get(role).copied().unwrap_or(0.0);
            // The action right for its input, or this role's slip.
            let act = move |r: &PolicyRequest, right: String| {
                let mut rng = seeds.stream(&format!("teacher/{}", r.stream));
                if rng.uniform() < rate_for(rate, difficulty_weight, &right) {
                    slip(kind, &name, &right, &mut rng)
                } else {
                    right
                }
            };
            match role.as_str() {
                "problem_solver" => ScriptedPolicy::fallible("arith-teacher-solver", move |r| {
                    let user = user_message(r, "Problem Solver")?;
                    let p = find(&problems, user).ok_or_else(|| {
                        format!("no problem of the teacher's pool in the Problem Solver's prompt {user:?}")
                    })?;
                    Ok(format!("Plan: {}", act(r, p.expression().to_string())))
                }),
                "plan_checker" => ScriptedPolicy::fallible("arith-teacher-plan-checker", move |r| {
                    let plan = handed_plan(user_message(r, "Plan Checker")?, "Plan Checker")?;
                    Ok(format!("Plan: {}", act(r, plan)))
                }),
                "code_executor" => ScriptedPolicy::fallible("arith-teacher-executor", move |r| {
                    let user = user_message(r, "Code Executor")?;
                    let plan = handed_plan(user, "Code Executor")?;
                    let preamble = find(&problems, user).map(|p| p.preamble()).unwrap_or_default();
                    Ok(format!("```python\n{preamble}print({})\n```", act(r, plan)))
                }),
                "output_reader" => ScriptedPolicy::fallible("arith-teacher-output-reader", move |r| {
                    let value = handed_output(user_message(r, "Output Reader")?, "Output Reader")?;
                    Ok(act(r, value))
                }),
                _ => ScriptedPolicy::fallible("arith-teacher-verifier", move |r| {
                    let value = handed_output(user_message(r, "Verifier")?, "Verifier")?;
                    Ok(format!("\\boxed{{{}}}", act(r, value)))
                }),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_agents::{Message, Policy};

    /// A prompt whose wording the teacher cannot read stops the rollout
    /// with the reason, instead of demonstrating `\boxed{0}`.
    #[test]
    fn the_teacher_refuses_prompts_it_cannot_read() {
        let roles: Vec<String> = ARITH_CHAINS[0].iter().map(|r| r.to_string()).collect();
        let policies = arith_teacher(
            Arc::new(generate_mix_of(&Tier::ALL, 2, 3)),
            &roles,
            &BTreeMap::new(),
            (SlipKind::Digit, 0.0),
            SeedTree::new(1),
        );
        let request = |user: &str| PolicyRequest {
            messages: vec![Message::new("system", "s"), Message::new("user", user)],
            stream: "t".into(),
            reply: Default::default(),
        };
        let e = policies[1]
            .generate(&[request("The solver's work: 3 + 4")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Plan: ") && e.contains("arith-teacher-executor"), "{e}");
        let e = policies[2]
            .generate(&[request("Its result:\n7")])
            .unwrap_err()
            .to_string();
        assert!(e.contains("Output:"), "{e}");
        let ok = policies[2]
            .generate(&[request("Output:\n7\n")])
            .unwrap();
        assert_eq!(ok[0].text, "\\boxed{7}");
    }

    /// The five-agent chain's relays restate what they are handed, and slip
    /// the structural way at their error rates; other chains are refused.
    #[test]
    fn the_teacher_writes_for_the_five_agent_chain() {
        let roles: Vec<String> = ARITH_CHAINS[1].iter().map(|r| r.to_string()).collect();
        let request = |user: &str| PolicyRequest {
            messages: vec![Message::new("system", "s"), Message::new("user", user)],
            stream: "t".into(),
            reply: Default::default(),
        };
        let text = |policies: &[ScriptedPolicy], agent: usize, user: &str| {
            policies[agent].generate(&[request(user)]).unwrap()[0].text.clone()
        };
        let problems = Arc::new(generate_mix_of(&Tier::ALL, 2, 3));
        let exact = arith_teacher(
            problems.clone(),
            &roles,
            &BTreeMap::new(),
            (SlipKind::Structural, 0.0),
            SeedTree::new(1),
        );
        assert_eq!(exact.len(), 5);
        assert_eq!(text(&exact, 1, "Plan: (3 + 4) * 2"), "Plan: (3 + 4) * 2");
        assert_eq!(text(&exact, 3, "Output:\n14\n"), "14");
        assert_eq!(text(&exact, 4, "Output:\n14"), "\\boxed{14}");
        let always: BTreeMap<String, f64> = [("plan_checker", 1.0), ("output_reader", 1.0)]
            .into_iter()
            .map(|(r, p)| (r.to_string(), p))
            .collect();
        let slipping = arith_teacher(problems, &roles, &always, (SlipKind::Structural, 0.0), SeedTree::new(1));
        assert_eq!(text(&slipping, 1, "Plan: (3 + 4) * 2"), "Plan: (3 + 4)");
        assert_eq!(text(&slipping, 3, "Output:\n14"), "140");
        let e = slipping[3].generate(&[request("14")]).unwrap_err().to_string();
        assert!(e.contains("Output Reader") && e.contains("Output:"), "{e}");
        let four: Vec<String> = roles[..4].to_vec();
        let e = expect_roles("arith", &four, &ARITH_CHAINS).unwrap_err().to_string();
        assert!(e.contains("plan_checker -> code_executor -> output_reader"), "{e}");
    }

    fn settings(split: Option<Split>, train: usize, eval: usize) -> GeneratedMath {
        GeneratedMath {
            train,
            eval,
            seed: 5,
            coach_checkpoints: CheckpointKind::Steps,
            instruction: false,
            tiers: Some(vec![Tier::OneStep, Tier::SmallArithmetic]),
            answer_fallbacks: true,
            split,
        }
    }

    #[test]
    fn splits_partition_the_problems_whatever_the_seed() {
        let texts = |split, seed| -> HashSet<String> {
            let mut s = settings(Some(split), 40, 40);
            s.seed = seed;
            let tasks = s.load(Path::new(".")).unwrap();
            assert_eq!((tasks.train.len(), tasks.eval.len()), (40, 40));
            tasks
                .train
                .iter()
                .chain(&tasks.eval)
                .map(|t| normalize_problem_text(&t.text))
                .collect()
        };
        let validation: HashSet<String> = [1, 2, 3].iter().flat_map(|&seed| texts(Split::Validation, seed)).collect();
        let test: HashSet<String> = [1, 2, 3].iter().flat_map(|&seed| texts(Split::Test, seed)).collect();
        assert!(validation.is_disjoint(&test));
        // About a quarter of the space is validation's.
        let problems = generate_mix_of(&[Tier::SmallArithmetic], 2000, 9);
        let share = problems.iter().filter(|p| Split::Validation.holds(p)).count() as f64 / 2000.0;
        assert!((0.2..0.3).contains(&share), "{share}");
        assert!(problems.iter().all(|p| Split::Validation.holds(p) != Split::Test.holds(p)));
    }

    #[test]
    fn a_split_too_small_is_named_and_no_split_changes_nothing() {
        let mut s = settings(Some(Split::Validation), 300, 10);
        s.tiers = Some(vec![Tier::OneStep]);
        let Err(err) = s.load(Path::new(".")) else {
            panic!("300 one-step problems fit in the validation split");
        };
        let err = err.to_string();
        assert!(err.contains("data.split = \"validation\"") && err.contains("one_step"), "{err}");
        let plain = settings(None, 12, 4).load(Path::new(".")).unwrap();
        let expected = generate_mix_of(&[Tier::OneStep, Tier::SmallArithmetic], 12, 5);
        let ids: Vec<&str> = plain.train.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, expected.iter().map(|p| p.id.as_str()).collect::<Vec<_>>());
    }
}
