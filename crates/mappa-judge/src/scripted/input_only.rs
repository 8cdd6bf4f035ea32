//! The input-only view: a simulated coach that does not know the answers.
//! It judges each action of the arith workflows (`arith-compact`: the
//! Problem Solver plans a Python expression, the Code Executor prints the
//! plan, the Verifier boxes the printed value; `arith-chain` adds a Plan
//! Checker restating the plan and an Output Reader restating the printed
//! value) from the action's input alone, by re-deriving the right action
//! itself and comparing:
//!
//! - its derivation starts from the task's right plan (it solves the
//!   problem exactly) and then slips at its own rate `epsilon`, making the
//!   agents' own kind of mistake ([`mappa_env::slips`]); when it slips the
//!   way the agent did, it accepts the agent's slip. Its slips are drawn per
//!   action, independently of the problem and of whether the agent slipped:
//!   alike in kind, not tied to the same hard instances, so they act as
//!   symmetric label noise;
//! - with probability `blame_leak` (`b`) it blames an action that faithfully
//!   relayed a wrong input (wrong by the task's answer, not by its own
//!   derivation);
//! - it adds `short_plan_bias` (`delta`) to a plan shorter than its own
//!   derivation: a surface feature of the commonest mistake (leaving out
//!   the last operation);
//! - the last agent's coach may see the ground truth (the reference
//!   answer), behind the same `coach_sees_ground_truth` switch as an LLM
//!   coach; then it judges the boxed answer against it.
//!
//! The task-tied view ([`TaskTied`]) changes two things, so that the coach
//! fails where the agents fail: its derivation is drawn once per task and
//! role (one uniform from a stream named after the task's text, shared by
//! every action on that task, in every step), with a slip probability that
//! grows with the difficulty of the plan it derives
//! ([`mappa_env::slips::difficulty`], the feature the warm-start teacher
//! tilts the agents' slips by; a relayed value's slip stays at the base
//! rate); and blame leaks onto a faithful relay of an
//! input that is wrong by the coach's own derivation of the plan (or of
//! its value), never by the task's answer.
//!
//! The simulation reads the task's known solution for two things only: the
//! right plan for the problem (what a solver re-derives from the problem
//! statement, the Problem Solver's input) and, for `blame_leak`, whether an
//! input was wrong. Every verdict comes with the truth it is measured
//! against: whether the agent did its own part right given its input (a
//! faithful relay of a wrong value is right), so the coach's accuracy per
//! role can be reported.

use mappa_core::hash::sha256_hex;
use mappa_core::rng::{RngStream, SeedTree};
use mappa_env::math::grade_response;
use mappa_env::slips::{evaluate, rate_for, slip, SlipKind};

use super::oracle::tool_failed;
use crate::context::{ActionContext, KnownSolution};
use crate::CoachError;

/// The input-only coach's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct InputOnly {
    /// Probability that its own derivation slips (`epsilon`).
    pub slip_rate: f64,
    /// The kind of slip it makes.
    pub slips: SlipKind,
    /// Probability of blaming a faithful relay of a wrong input (`b`).
    pub blame_leak: f64,
    /// Added to a plan shorter than its own derivation (`delta`).
    pub short_plan_bias: f64,
    /// Whether the last agent's coach sees the reference answer.
    pub sees_ground_truth: bool,
    /// `None`: slips drawn per action (the input-only view); `Some`: drawn
    /// once per task (the task-tied view).
    pub tied: Option<TaskTied>,
}

/// The task-tied view's derivation: one draw per task and role.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct TaskTied {
    /// How much the slip probability grows with difficulty (`w` in
    /// [`slip_probability`]).
    pub difficulty_weight: f64,
    /// Seeds of the per-task streams.
    pub seeds: SeedTree,
}

/// A verdict, the truth it is measured against, and the score offset.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Judgement {
    /// Whether the coach judged the action right.
    pub judged_right: bool,
    /// Whether the agent did its part right, given its input.
    pub truly_right: bool,
    /// Score offset from `short_plan_bias`.
    pub bias: f64,
    /// A short account, for the rationale.
    pub why: String,
}

/// An expression without whitespace, for comparison.
fn norm(expr: &str) -> String {
    expr.chars().filter(|c| !c.is_whitespace()).collect()
}

/// The value after the last line of `text` starting with `label` (`Plan: `).
fn labelled<'t>(text: &'t str, label: &str) -> Option<&'t str> {
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(label))
        .map(str::trim)
}

/// The expression a program prints: the argument of its last `print(...)`.
fn printed_expression(output: &str) -> Option<&str> {
    let line = output
        .lines()
        .rev()
        .find(|l| l.trim().starts_with("print("))?;
    let inner = line.trim().strip_prefix("print(")?;
    Some(inner.strip_suffix(')').unwrap_or(inner).trim())
}

/// The first line after `Output:` in the Verifier's input (the printed value).
fn printed_value(agent_input: &str) -> Option<&str> {
    let rest = agent_input.rsplit_once("Output:\n")?.1;
    Some(rest.lines().next().unwrap_or("").trim())
}

/// Whether `output` boxes a value equivalent to `value`.
fn boxes(value: &str, output: &str) -> bool {
    !value.is_empty() && grade_response(value, output, false).correct
}

impl InputOnly {
    /// A coach that never slips, leaks or favours anything: its judgements'
    /// `truly_right` is the truth for any view.
    pub(super) fn exact(slips: SlipKind) -> Self {
        Self {
            slip_rate: 0.0,
            slips,
            blame_leak: 0.0,
            short_plan_bias: 0.0,
            sees_ground_truth: false,
            tied: None,
        }
    }

    /// The coach's own derivation of `right` for `role` on `task`: `right`,
    /// or its slip, drawn from the action's stream `rng` (input-only) or
    /// from the task's stream for the role (task-tied).
    fn derive(&self, role: &str, right: &str, task: &str, rng: &mut RngStream) -> String {
        match self.tied {
            None if rng.uniform() < self.slip_rate => slip(self.slips, role, right, rng),
            None => right.to_string(),
            Some(tied) => self.derive_for_task(tied, role, right, task),
        }
    }

    /// The task-tied derivation: one uniform per (task, role), against a
    /// slip probability tilted by the difficulty of `right`.
    fn derive_for_task(&self, tied: TaskTied, role: &str, right: &str, task: &str) -> String {
        let key = sha256_hex(task.as_bytes());
        let mut draw = tied
            .seeds
            .stream(&format!("scripted-coach/task/{key}/{role}"));
        if draw.uniform() < rate_for(self.slip_rate, tied.difficulty_weight, right) {
            slip(self.slips, role, right, &mut draw)
        } else {
            right.to_string()
        }
    }

    /// Whether a handed plan is wrong, for blame leakage: against the
    /// task's plan (input-only), or against the coach's own derivation of
    /// it (task-tied).
    fn plan_looks_wrong(&self, handed: &str, right: &str, task: &str) -> bool {
        let believed = match self.tied {
            None => right.to_string(),
            Some(tied) => self.derive_for_task(tied, "problem_solver", right, task),
        };
        norm(handed) != norm(&believed)
    }

    /// Whether a handed value is wrong, for blame leakage: against the
    /// task's answer (input-only), or against the value of the coach's own
    /// plan (task-tied; no leak where that plan cannot be evaluated).
    fn value_looks_wrong(&self, handed: &str, solution: &KnownSolution, task: &str) -> bool {
        let handed = format!("\\boxed{{{handed}}}");
        let answer = solution.answer.as_deref().unwrap_or("");
        let (Some(tied), Some(right)) = (self.tied, solution.plan.as_deref()) else {
            return !boxes(answer, &handed);
        };
        let believed = self.derive_for_task(tied, "problem_solver", right, task);
        if norm(&believed) == norm(right) {
            return !boxes(answer, &handed);
        }
        evaluate(&believed).is_some_and(|v| !boxes(&v.to_string(), &handed))
    }

    /// Judge one action; `rng` is the action's own stream.
    pub(super) fn judge(
        &self,
        ctx: &ActionContext,
        solution: &KnownSolution,
        rng: &mut RngStream,
    ) -> Result<Judgement, CoachError> {
        let plan = solution.plan.as_deref().ok_or_else(|| {
            CoachError::Config(format!(
                "action {:?}: the input-only scripted coach needs the problem's plan \
                 (generated math tasks carry it)",
                ctx.id
            ))
        })?;
        match ctx.role.as_str() {
            "problem_solver" => Ok(self.judge_plan(ctx, plan, rng)),
            "plan_checker" => Ok(self.judge_relayed_plan(ctx, plan, rng)),
            "code_executor" => Ok(self.judge_program(ctx, plan, rng)),
            "output_reader" => Ok(self.judge_read_value(ctx, solution, rng)),
            "verifier" => Ok(self.judge_boxed(ctx, solution, rng)),
            other => Err(CoachError::Config(format!(
                "action {:?}: the input-only scripted coach judges the arith workflows' roles \
                 (problem_solver, plan_checker, code_executor, output_reader, verifier), \
                 not {other:?}",
                ctx.id
            ))),
        }
    }

    /// The Problem Solver: its plan against the coach's own plan for the problem.
    fn judge_plan(&self, ctx: &ActionContext, right: &str, rng: &mut RngStream) -> Judgement {
        let written = labelled(&ctx.output, "Plan:").unwrap_or(ctx.output.trim());
        let derived = self.derive("problem_solver", right, &ctx.task, rng);
        let shorter = norm(written).len() < norm(&derived).len();
        Judgement {
            judged_right: norm(written) == norm(&derived),
            truly_right: norm(written) == norm(right),
            bias: if shorter { self.short_plan_bias } else { 0.0 },
            why: format!("plan {written:?}, the coach derives {derived:?}"),
        }
    }

    /// The Plan Checker (`arith-chain`): the plan it restates against the
    /// plan it was handed.
    fn judge_relayed_plan(
        &self,
        ctx: &ActionContext,
        right: &str,
        rng: &mut RngStream,
    ) -> Judgement {
        let handed = labelled(&ctx.agent_input, "Plan:").unwrap_or("");
        let written = labelled(&ctx.output, "Plan:").unwrap_or(ctx.output.trim());
        let derived = self.derive("plan_checker", handed, &ctx.task, rng);
        let faithful = !written.is_empty() && norm(written) == norm(handed);
        let leak = faithful
            && self.plan_looks_wrong(handed, right, &ctx.task)
            && rng.uniform() < self.blame_leak;
        let shorter = norm(written).len() < norm(&derived).len();
        Judgement {
            judged_right: norm(written) == norm(&derived) && !leak,
            truly_right: faithful,
            bias: if shorter { self.short_plan_bias } else { 0.0 },
            why: format!(
                "restates {written:?} for the plan {handed:?}{}",
                if leak { "; blamed for the plan" } else { "" }
            ),
        }
    }

    /// The Code Executor: the program must print the plan it was handed.
    fn judge_program(&self, ctx: &ActionContext, right: &str, rng: &mut RngStream) -> Judgement {
        let handed = labelled(&ctx.agent_input, "Plan:").unwrap_or("");
        let printed = printed_expression(&ctx.output).unwrap_or("");
        let ran = !tool_failed(ctx.tool_observation.as_deref()) && !printed.is_empty();
        let derived = self.derive("code_executor", handed, &ctx.task, rng);
        let faithful = ran && norm(printed) == norm(handed);
        let leak = faithful
            && self.plan_looks_wrong(handed, right, &ctx.task)
            && rng.uniform() < self.blame_leak;
        Judgement {
            judged_right: ran && norm(printed) == norm(&derived) && !leak,
            truly_right: faithful,
            bias: 0.0,
            why: format!(
                "prints {printed:?} for the plan {handed:?}{}",
                if leak { "; blamed for the plan" } else { "" }
            ),
        }
    }

    /// The Verifier: the boxed value against the printed one, or against the
    /// reference answer when the coach sees it.
    fn judge_boxed(
        &self,
        ctx: &ActionContext,
        solution: &KnownSolution,
        rng: &mut RngStream,
    ) -> Judgement {
        let handed = printed_value(&ctx.agent_input).unwrap_or("");
        let sees_answer = self.sees_ground_truth && ctx.is_last_agent && ctx.ground_truth.is_some();
        if sees_answer {
            let answer = solution.answer.as_deref().unwrap_or("");
            return Judgement {
                judged_right: boxes(answer, &ctx.output),
                truly_right: boxes(handed, &ctx.output),
                bias: 0.0,
                why: format!("boxes the reference answer: {}", boxes(answer, &ctx.output)),
            };
        }
        self.judge_value_relay(ctx, "boxes", (handed, &ctx.output), solution, rng)
    }

    /// The Output Reader (`arith-chain`): the value it restates (its first
    /// line) against the printed value it was handed.
    fn judge_read_value(
        &self,
        ctx: &ActionContext,
        solution: &KnownSolution,
        rng: &mut RngStream,
    ) -> Judgement {
        let handed = printed_value(&ctx.agent_input).unwrap_or("");
        let written = ctx
            .output
            .lines()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        let shown = format!("\\boxed{{{}}}", written.trim());
        self.judge_value_relay(ctx, "restates", (handed, &shown), solution, rng)
    }

    /// A role that hands on the printed value `handed` (what it wrote,
    /// boxed: `shown`; `verb` says how, in the account): judged against the
    /// coach's own reading of it, with blame leaking onto a faithful relay
    /// of a value that is not the answer (by the task's answer, or by the
    /// coach's own plan when task-tied).
    fn judge_value_relay(
        &self,
        ctx: &ActionContext,
        verb: &str,
        (handed, shown): (&str, &str),
        solution: &KnownSolution,
        rng: &mut RngStream,
    ) -> Judgement {
        let faithful = boxes(handed, shown);
        let derived = self.derive(&ctx.role, handed, &ctx.task, rng);
        let leak = faithful
            && self.value_looks_wrong(handed, solution, &ctx.task)
            && rng.uniform() < self.blame_leak;
        Judgement {
            judged_right: boxes(&derived, shown) && !leak,
            truly_right: faithful,
            bias: 0.0,
            why: format!(
                "{verb} the printed {handed:?}: {faithful}{}",
                if leak { "; blamed for the value" } else { "" }
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_core::rng::SeedTree;

    fn solution() -> KnownSolution {
        KnownSolution {
            task_kind: "small_arithmetic".into(),
            answer: Some("26".into()),
            plan: Some("(12 - 7) * 5 + 1".into()),
            ..Default::default()
        }
    }

    fn ctx(role: &str, input: &str, output: &str, observation: Option<&str>) -> ActionContext {
        ActionContext {
            id: format!("t/{role}"),
            task: "Compute (12 - 7) * 5 + 1.".into(),
            role: role.into(),
            agent_input: format!("[user]\n{input}"),
            output: output.into(),
            tool_observation: observation.map(String::from),
            ground_truth: Some("26".into()),
            is_last_agent: role == "verifier",
            solution: Some(solution()),
            ..Default::default()
        }
    }

    fn exact(sees_ground_truth: bool) -> InputOnly {
        InputOnly {
            sees_ground_truth,
            ..InputOnly::exact(SlipKind::Structural)
        }
    }

    fn judge(coach: &InputOnly, c: &ActionContext) -> Judgement {
        coach
            .judge(c, &solution(), &mut SeedTree::new(1).stream("t"))
            .unwrap()
    }

    #[test]
    fn without_slips_it_judges_each_action_against_its_input() {
        let coach = exact(false);
        let task = "Compute (12 - 7) * 5 + 1.";
        let right = judge(
            &coach,
            &ctx("problem_solver", task, "Plan: (12 - 7) * 5 + 1", None),
        );
        assert!(right.judged_right && right.truly_right);
        let short = judge(
            &coach,
            &ctx("problem_solver", task, "Plan: (12 - 7) * 5", None),
        );
        assert!(!short.judged_right && !short.truly_right);
        // A faithful relay of a wrong plan is right, and judged so.
        let relay = ctx(
            "code_executor",
            "Plan: (12 - 7) * 5",
            "```python\nprint((12 - 7) * 5)\n```",
            Some("25\n"),
        );
        let j = judge(&coach, &relay);
        assert!(j.judged_right && j.truly_right, "{j:?}");
        let error = ctx(
            "code_executor",
            "Plan: (12 - 7) * 5",
            "```python\nprint((12 - 7) * 5)\n```",
            Some("Traceback (most recent call last):\nSyntaxError: x"),
        );
        assert!(!judge(&coach, &error).judged_right);
        let boxed = judge(&coach, &ctx("verifier", "Output:\n25", "\\boxed{25}", None));
        assert!(boxed.judged_right && boxed.truly_right);
    }

    #[test]
    fn the_long_chains_relays_are_judged_against_what_they_were_handed() {
        let coach = exact(false);
        let checker = |handed: &str, written: &str| {
            judge(
                &coach,
                &ctx(
                    "plan_checker",
                    &format!("Plan: {handed}"),
                    &format!("Plan: {written}"),
                    None,
                ),
            )
        };
        let faithful_wrong = checker("(12 - 7) * 5", "(12 - 7) * 5");
        assert!(faithful_wrong.judged_right && faithful_wrong.truly_right);
        let dropped = checker("(12 - 7) * 5 + 1", "(12 - 7) * 5");
        assert!(!dropped.judged_right && !dropped.truly_right);
        let reader = |handed: &str, written: &str| {
            judge(
                &coach,
                &ctx(
                    "output_reader",
                    &format!("Output:\n{handed}"),
                    written,
                    None,
                ),
            )
        };
        let read = reader("26", "26");
        assert!(read.judged_right && read.truly_right, "{read:?}");
        let misread = reader("26", "260");
        assert!(!misread.judged_right && !misread.truly_right);
        // Blame leaks onto a faithful relay of a value that is not the answer,
        // and a relayed short plan gets the short-plan bias.
        let leaky = InputOnly {
            blame_leak: 1.0,
            short_plan_bias: 2.0,
            ..exact(false)
        };
        let j = judge(&leaky, &ctx("output_reader", "Output:\n25", "25", None));
        assert!(
            !j.judged_right && j.truly_right && j.why.contains("blamed"),
            "{j:?}"
        );
        let j = judge(
            &leaky,
            &ctx(
                "plan_checker",
                "Plan: (12 - 7) * 5 + 1",
                "Plan: (12 - 7) * 5",
                None,
            ),
        );
        assert_eq!(j.bias, 2.0);
    }

    #[test]
    fn the_last_coach_may_see_the_answer() {
        let verifier = ctx("verifier", "Output:\n25", "\\boxed{25}", None);
        let seeing = judge(&exact(true), &verifier);
        assert!(
            !seeing.judged_right && seeing.truly_right,
            "blames the relay of a wrong value"
        );
        assert!(
            judge(
                &exact(true),
                &ctx("verifier", "Output:\n26", "\\boxed{26}", None)
            )
            .judged_right
        );
    }

    #[test]
    fn its_own_slips_accept_the_agents_slips() {
        // Always slipping the structural way, it derives the short plan and
        // accepts it, and rejects the right one.
        let slipping = InputOnly {
            slip_rate: 1.0,
            ..exact(false)
        };
        let task = "Compute (12 - 7) * 5 + 1.";
        let short = judge(
            &slipping,
            &ctx("problem_solver", task, "Plan: (12 - 7) * 5", None),
        );
        assert!(short.judged_right && !short.truly_right);
        let right = judge(
            &slipping,
            &ctx("problem_solver", task, "Plan: (12 - 7) * 5 + 1", None),
        );
        assert!(!right.judged_right && right.truly_right);
    }

    #[test]
    fn blame_leaks_onto_faithful_relays_of_wrong_inputs_and_short_plans_get_the_bias() {
        let leaky = InputOnly {
            blame_leak: 1.0,
            short_plan_bias: 2.0,
            ..exact(false)
        };
        let relay_wrong = ctx(
            "code_executor",
            "Plan: (12 - 7) * 5",
            "```python\nprint((12 - 7) * 5)\n```",
            Some("25\n"),
        );
        let j = judge(&leaky, &relay_wrong);
        assert!(!j.judged_right && j.truly_right && j.why.contains("blamed"));
        let relay_right = ctx(
            "code_executor",
            "Plan: (12 - 7) * 5 + 1",
            "```python\nprint((12 - 7) * 5 + 1)\n```",
            Some("26\n"),
        );
        assert!(
            judge(&leaky, &relay_right).judged_right,
            "no leak onto right inputs"
        );
        let task = "Compute (12 - 7) * 5 + 1.";
        let short = judge(
            &leaky,
            &ctx("problem_solver", task, "Plan: (12 - 7) * 5", None),
        );
        assert_eq!(short.bias, 2.0);
        let full = judge(
            &leaky,
            &ctx("problem_solver", task, "Plan: (12 - 7) * 5 + 1", None),
        );
        assert_eq!(full.bias, 0.0);
    }

    #[test]
    fn other_roles_and_tasks_without_a_plan_are_refused() {
        let coach = exact(false);
        let mut c = ctx("analyst", "x", "y", None);
        let e = coach
            .judge(&c, &solution(), &mut SeedTree::new(1).stream("t"))
            .unwrap_err();
        assert!(e.to_string().contains("analyst"), "{e}");
        c.role = "verifier".into();
        let e = coach
            .judge(
                &c,
                &KnownSolution::default(),
                &mut SeedTree::new(1).stream("t"),
            )
            .unwrap_err();
        assert!(e.to_string().contains("plan"), "{e}");
    }

    fn tied(slip_rate: f64, difficulty_weight: f64, blame_leak: f64) -> InputOnly {
        InputOnly {
            slip_rate,
            blame_leak,
            tied: Some(TaskTied {
                difficulty_weight,
                seeds: SeedTree::new(7),
            }),
            ..exact(false)
        }
    }

    /// A Problem Solver's action on the problem with plan `plan`.
    fn solver_on(plan: &str, written: &str) -> (ActionContext, KnownSolution) {
        let solution = KnownSolution {
            task_kind: "small_arithmetic".into(),
            answer: mappa_env::slips::evaluate(plan).map(|v| v.to_string()),
            plan: Some(plan.into()),
            ..Default::default()
        };
        let c = ActionContext {
            id: "t/problem_solver".into(),
            task: format!("Compute ${plan}$."),
            role: "problem_solver".into(),
            agent_input: format!("[user]\nCompute ${plan}$."),
            output: format!("Plan: {written}"),
            solution: Some(solution.clone()),
            ..Default::default()
        };
        (c, solution)
    }

    #[test]
    fn the_task_tied_derivation_is_drawn_once_per_task() {
        let coach = tied(0.5, 0.0, 0.0);
        let mut slipped = 0;
        for a in 2..42 {
            let plan = format!("({a} + 3) * 4");
            let verdicts: Vec<bool> = (0..6)
                .map(|i| {
                    // Every action on the task, whatever its stream.
                    let (c, sol) = solver_on(&plan, &plan);
                    let mut rng = SeedTree::new(i).stream("action");
                    coach.judge(&c, &sol, &mut rng).unwrap().judged_right
                })
                .collect();
            assert!(
                verdicts.iter().all(|&v| v == verdicts[0]),
                "{plan}: {verdicts:?}"
            );
            slipped += usize::from(!verdicts[0]);
        }
        assert!(
            (8..=32).contains(&slipped),
            "{slipped} of 40 tasks slipped at 0.5"
        );
        // The input-only view draws per action: the same task gets both verdicts.
        let per_action = InputOnly {
            tied: None,
            ..coach
        };
        let (c, sol) = solver_on("(5 + 3) * 4", "(5 + 3) * 4");
        let verdicts: Vec<bool> = (0..40)
            .map(|i| {
                let mut rng = SeedTree::new(i).stream("action");
                per_action.judge(&c, &sol, &mut rng).unwrap().judged_right
            })
            .collect();
        assert!(verdicts.contains(&true) && verdicts.contains(&false));
    }

    #[test]
    fn the_task_tied_coach_slips_more_on_harder_instances() {
        let coach = tied(0.3, 1.0, 0.0);
        let share_slipped = |op: &str| {
            let slips = (2..202)
                .filter(|a| {
                    let plan = format!("({a} * 2) {op} 19");
                    let (c, sol) = solver_on(&plan, &plan);
                    let mut rng = SeedTree::new(1).stream("action");
                    !coach.judge(&c, &sol, &mut rng).unwrap().judged_right
                })
                .count();
            slips as f64 / 200.0
        };
        let (easy, hard) = (share_slipped("+"), share_slipped("*"));
        // d = 0.11 (+ 19) against 0.86 (* 19): p = 0.06 against 0.51.
        assert!(easy < 0.22 && hard > 0.33, "easy {easy}, hard {hard}");
    }

    #[test]
    fn task_tied_blame_follows_the_coachs_own_derivation() {
        // Always slipping, the coach believes the short plan (12 - 7) * 5.
        let coach = tied(1.0, 0.0, 1.0);
        let plan = "(12 - 7) * 5 + 1";
        let (solver, sol) = solver_on(plan, plan);
        let relay = |handed: &str| ActionContext {
            role: "code_executor".into(),
            agent_input: format!("[user]\nPlan: {handed}"),
            output: format!("```python\nprint({handed})\n```"),
            tool_observation: Some("x\n".into()),
            ..solver.clone()
        };
        let judge = |c: &ActionContext| {
            coach
                .judge(c, &sol, &mut SeedTree::new(1).stream("t"))
                .unwrap()
        };
        let short = judge(&relay("(12 - 7) * 5"));
        assert!(
            !short.why.contains("blamed"),
            "no blame for what it believes: {short:?}"
        );
        let right = judge(&relay(plan));
        assert!(
            right.why.contains("blamed") && right.truly_right,
            "{right:?}"
        );
        // The input-only view blames by the truth instead.
        let by_truth = InputOnly {
            tied: None,
            ..coach
        };
        let short = by_truth
            .judge(
                &relay("(12 - 7) * 5"),
                &sol,
                &mut SeedTree::new(1).stream("t"),
            )
            .unwrap();
        assert!(short.why.contains("blamed"), "{short:?}");
        // A relayed value is wrong by the value of the coach's own plan (25).
        let verifier = |handed: &str| ActionContext {
            role: "verifier".into(),
            agent_input: format!("[user]\nOutput:\n{handed}"),
            output: format!("\\boxed{{{handed}}}"),
            is_last_agent: true,
            ..solver.clone()
        };
        assert!(!judge(&verifier("25")).why.contains("blamed"));
        assert!(judge(&verifier("26")).why.contains("blamed"));
    }
}
