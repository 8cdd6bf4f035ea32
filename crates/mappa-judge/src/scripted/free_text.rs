//! The free-text view: a simulated coach for what a small pretrained model
//! writes in the MathChat roles on generated arithmetic, judged by the
//! numbers each action states against what its input implies.
//!
//! It reads each action the way its next agent would have to:
//!
//! - the Problem Solver's plan ([`read_plan`]): the first line after its
//!   last `Plan:`, cut at `=` into an integer expression (`+ - * % **`,
//!   parentheses) and the value it states, if any. Right when the
//!   expression's value is the answer the coach derives from the problem
//!   (it solves the problem exactly, as a capable judge would) and any
//!   stated value is that same value;
//! - the Code Executor's run ([`read_printed`]): the first integer its
//!   program printed (none when the program failed). Right when it is the
//!   value of the plan it was handed, or the problem's answer when the plan
//!   it was handed cannot be read;
//! - the Verifier's final answer ([`read_answer`]): its last boxed value,
//!   else its last number. Right when it is the number the program printed
//!   (after the last `Output:` of its input), or the answer when nothing
//!   was printed. When the coach is shown the ground truth
//!   (`coach_sees_ground_truth`, as the paper's coach is), it judges this
//!   last action against the reference answer instead.
//!
//! Its mistakes are symmetric label noise: each verdict is flipped with
//! probability `slip_rate`, drawn from the action's own stream. The truth
//! its verdicts are audited against is the same reading without the flips
//! (for the Verifier, against what it was handed, never the answer), so the
//! audit measures the noise; whether the reading itself matches what the
//! actions mean is checked against labels made by reading the actions
//! (`fixtures/smol-learn/`).

use mappa_core::rng::RngStream;
use mappa_env::math::extract_answer;
use mappa_env::slips::evaluate;

use super::input_only::Judgement;
use super::oracle::tool_failed;
use crate::context::{ActionContext, KnownSolution};
use crate::CoachError;

/// A Problem Solver's plan, as read from its reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The expression (before any `=`), as written.
    pub expression: String,
    /// Its value.
    pub value: i128,
    /// The value the plan states after `=`, if it states one.
    pub stated: Option<i128>,
}

/// The plan in `text`: the first non-empty line after its last `Plan:`
/// (the whole text's first non-empty line without one), cut at `=`; `None`
/// when the part before `=` is not an integer expression. `×`, `\times`
/// and `\cdot` read as `*`; surrounding `$` and a final `.` are ignored.
pub fn read_plan(text: &str) -> Option<Plan> {
    let after = text.rsplit_once("Plan:").map_or(text, |(_, rest)| rest);
    let line = after.lines().map(str::trim).find(|l| !l.is_empty())?;
    let (expression, stated) = match line.split_once('=') {
        Some((left, right)) => (left, first_integer(right)),
        None => (line, None),
    };
    let expression = expression
        .trim_start_matches(|c: char| c == '$' || c.is_whitespace())
        .trim_end_matches(|c: char| c == '$' || c == '.' || c.is_whitespace());
    let python = expression
        .replace("\\times", "*")
        .replace("\\cdot", "*")
        .replace('×', "*");
    let value = evaluate(&python)?;
    Some(Plan {
        expression: expression.to_string(),
        value,
        stated,
    })
}

/// The first integer a program printed: `None` when it failed (a traceback
/// or an error) or printed no integer.
pub fn read_printed(observation: Option<&str>) -> Option<i128> {
    let text = observation?;
    if tool_failed(Some(text)) {
        return None;
    }
    first_integer(text)
}

/// A final answer's value: the last boxed value, else the last number (as
/// the task's grader reads a small model's answer with fallbacks); `None`
/// when it is not an integer.
pub fn read_answer(text: &str) -> Option<i128> {
    let extracted = extract_answer(text, true)?;
    let answer = extracted.answer.trim().trim_end_matches('.');
    answer.parse().ok()
}

/// The first integer in `text` (a `-` right before it counts), not part of
/// a decimal number or a word.
fn first_integer(text: &str) -> Option<i128> {
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        if !bytes[at].is_ascii_digit() {
            at += 1;
            continue;
        }
        let start = at;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
        }
        let glued_before =
            start > 0 && (bytes[start - 1].is_ascii_alphabetic() || bytes[start - 1] == b'.');
        let decimal = at + 1 < bytes.len() && bytes[at] == b'.' && bytes[at + 1].is_ascii_digit();
        let glued_after = at < bytes.len() && bytes[at].is_ascii_alphabetic();
        if glued_before || decimal || glued_after {
            continue;
        }
        let value: i128 = text[start..at].parse().ok()?;
        let negative = start > 0 && bytes[start - 1] == b'-';
        return Some(if negative { -value } else { value });
    }
    None
}

/// The text after the last `Output:` of a Verifier's input (the printed
/// output it was handed).
fn handed_output(agent_input: &str) -> Option<&str> {
    agent_input.rsplit_once("Output:").map(|(_, rest)| rest)
}

/// The free-text coach's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct FreeText {
    /// Probability that a verdict is flipped.
    pub slip_rate: f64,
    /// Whether the last agent's coach sees the reference answer.
    pub sees_ground_truth: bool,
}

impl FreeText {
    /// Judge one action; `rng` is the action's own stream.
    pub(super) fn judge(
        &self,
        ctx: &ActionContext,
        solution: &KnownSolution,
        rng: &mut RngStream,
    ) -> Result<Judgement, CoachError> {
        let answer = solution
            .answer
            .as_deref()
            .and_then(|a| a.trim().parse::<i128>().ok())
            .ok_or_else(|| {
                CoachError::Config(format!(
                    "action {:?}: the free-text scripted coach needs an integer answer \
                     (generated arithmetic has one)",
                    ctx.id
                ))
            })?;
        let (truly_right, judged, why) = match ctx.role.as_str() {
            "problem_solver" => judge_plan(ctx, answer),
            "code_executor" => judge_run(ctx, answer),
            "verifier" => self.judge_final(ctx, answer),
            other => {
                return Err(CoachError::Config(format!(
                    "action {:?}: the free-text scripted coach judges the MathChat roles \
                     (problem_solver, code_executor, verifier), not {other:?}",
                    ctx.id
                )))
            }
        };
        let flipped = rng.uniform() < self.slip_rate;
        Ok(Judgement {
            judged_right: judged != flipped,
            truly_right,
            bias: 0.0,
            why: if flipped {
                format!("{why}; the coach slipped")
            } else {
                why
            },
        })
    }

    /// The Verifier: its answer against the printed number it was handed
    /// (the truth), and against the reference answer when the coach sees it.
    fn judge_final(&self, ctx: &ActionContext, answer: i128) -> (bool, bool, String) {
        let printed = handed_output(&ctx.agent_input).and_then(|o| read_printed(Some(o)));
        let given = read_answer(&ctx.output);
        let expected = printed.unwrap_or(answer);
        let truly_right = given == Some(expected);
        let sees_answer = self.sees_ground_truth && ctx.is_last_agent && ctx.ground_truth.is_some();
        let judged = if sees_answer {
            given == Some(answer)
        } else {
            truly_right
        };
        let why = format!(
            "answers {} for the printed {}{}",
            shown(given),
            shown(printed),
            if sees_answer {
                ", judged against the reference answer"
            } else {
                ""
            }
        );
        (truly_right, judged, why)
    }
}

/// The Problem Solver: (truly right, judged right before noise, account).
fn judge_plan(ctx: &ActionContext, answer: i128) -> (bool, bool, String) {
    match read_plan(&ctx.output) {
        Some(plan) => {
            let right = plan.value == answer && plan.stated.is_none_or(|s| s == plan.value);
            let why = format!(
                "plan {:?} = {}{}, the coach derives {answer}",
                plan.expression,
                plan.value,
                plan.stated
                    .map_or(String::new(), |s| format!(" (states {s})"))
            );
            (right, right, why)
        }
        None => (false, false, "no readable plan".into()),
    }
}

/// The Code Executor: what its program printed against the value of the
/// plan it was handed (the answer, when that plan cannot be read).
fn judge_run(ctx: &ActionContext, answer: i128) -> (bool, bool, String) {
    let handed = ctx
        .agent_input
        .rsplit_once("Plan:")
        .and_then(|(_, plan)| read_plan(plan))
        .map(|p| p.value);
    let printed = read_printed(ctx.tool_observation.as_deref());
    let expected = handed.unwrap_or(answer);
    let right = printed == Some(expected);
    let why = format!(
        "prints {} for a plan worth {}",
        shown(printed),
        shown(handed)
    );
    (right, right, why)
}

/// A read value for an account.
fn shown(value: Option<i128>) -> String {
    value.map_or_else(|| "nothing readable".into(), |v| v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_core::rng::SeedTree;

    #[test]
    fn plans_are_read_up_to_the_equals_sign() {
        let plan = read_plan("Plan: 3 + 17 = 22\n").unwrap();
        assert_eq!((plan.value, plan.stated), (20, Some(22)));
        assert_eq!(read_plan("Plan: (7 + 5) \\times 3").unwrap().value, 36);
        assert_eq!(read_plan("Plan: $12 × 3$.").unwrap().value, 36);
        assert_eq!(read_plan("Plan:\n 4 * 5").unwrap().value, 20);
        assert_eq!(read_plan("Plan: 9 times 5"), None);
        assert_eq!(read_plan("Plan: \n"), None);
        assert_eq!(read_plan("12 - 7 = 5").unwrap().stated, Some(5));
    }

    #[test]
    fn printed_numbers_and_answers_are_read() {
        assert_eq!(read_printed(Some("15\n")), Some(15));
        assert_eq!(read_printed(Some("The result is -4.\n")), Some(-4));
        assert_eq!(read_printed(Some("(no output)")), None);
        assert_eq!(read_printed(Some("3.5\n")), None);
        assert_eq!(
            read_printed(Some("Traceback (most recent call last):\nNameError: x 3")),
            None
        );
        assert_eq!(read_printed(None), None);
        assert_eq!(read_answer("The answer is \\boxed{19}."), Some(19));
        assert_eq!(read_answer("The program will print 9."), Some(9));
        assert_eq!(read_answer("The answer is \\boxed{N/A}."), None);
    }

    fn ctx(role: &str, input: &str, output: &str, observation: Option<&str>) -> ActionContext {
        ActionContext {
            id: format!("t/{role}"),
            task: "What is 3 + 17?".into(),
            role: role.into(),
            agent_input: format!("[user]\n{input}"),
            output: output.into(),
            tool_observation: observation.map(String::from),
            ground_truth: Some("20".into()),
            is_last_agent: role == "verifier",
            ..Default::default()
        }
    }

    fn judge(coach: &FreeText, c: &ActionContext) -> Judgement {
        let solution = KnownSolution {
            answer: Some("20".into()),
            ..Default::default()
        };
        coach
            .judge(c, &solution, &mut SeedTree::new(1).stream("t"))
            .unwrap()
    }

    #[test]
    fn each_role_is_judged_against_what_its_input_implies() {
        let exact = FreeText {
            slip_rate: 0.0,
            sees_ground_truth: false,
        };
        let verdict = |c: &ActionContext| {
            let j = judge(&exact, c);
            assert_eq!(j.judged_right, j.truly_right, "{j:?}");
            j.judged_right
        };
        let task = "What is 3 + 17?";
        assert!(verdict(&ctx("problem_solver", task, "Plan: 3 + 17", None)));
        assert!(verdict(&ctx(
            "problem_solver",
            task,
            "Plan: 17 + 3 = 20",
            None
        )));
        assert!(!verdict(&ctx(
            "problem_solver",
            task,
            "Plan: 3 + 17 = 22",
            None
        )));
        assert!(!verdict(&ctx("problem_solver", task, "Plan: 3 + 12", None)));
        // A faithful run of a wrong plan is right; a wrong run of it is not.
        let code = "```python\nprint(3 + 12)\n```";
        assert!(verdict(&ctx(
            "code_executor",
            "Plan: 3 + 12",
            code,
            Some("15\n")
        )));
        assert!(!verdict(&ctx(
            "code_executor",
            "Plan: 3 + 12",
            code,
            Some("20\n")
        )));
        assert!(!verdict(&ctx(
            "code_executor",
            "Plan: 3 + 17",
            code,
            Some("(no output)")
        )));
        // An unreadable plan: the run is judged against the answer.
        assert!(verdict(&ctx(
            "code_executor",
            "Plan: add them",
            code,
            Some("20\n")
        )));
        // The Verifier copies what was printed, right or wrong.
        let final_answer = "The answer is \\boxed{15}.";
        assert!(verdict(&ctx(
            "verifier",
            "Output:\n15\n",
            final_answer,
            None
        )));
        assert!(!verdict(&ctx(
            "verifier",
            "Output:\n16\n",
            final_answer,
            None
        )));
        assert!(verdict(&ctx(
            "verifier",
            "Output:\n(no output)",
            "\\boxed{20}",
            None
        )));
    }

    #[test]
    fn the_verifier_is_judged_against_the_answer_when_the_coach_sees_it() {
        let seeing = FreeText {
            slip_rate: 0.0,
            sees_ground_truth: true,
        };
        let j = judge(
            &seeing,
            &ctx("verifier", "Output:\n15\n", "\\boxed{15}", None),
        );
        assert!(!j.judged_right && j.truly_right, "{j:?}");
    }

    #[test]
    fn slips_flip_verdicts_at_their_rate() {
        let noisy = FreeText {
            slip_rate: 0.2,
            sees_ground_truth: false,
        };
        let solution = KnownSolution {
            answer: Some("20".into()),
            ..Default::default()
        };
        let c = ctx("problem_solver", "What is 3 + 17?", "Plan: 3 + 17", None);
        let seeds = SeedTree::new(3);
        let flips = (0..2000)
            .filter(|i| {
                let j = noisy
                    .judge(&c, &solution, &mut seeds.stream(&format!("a{i}")))
                    .unwrap();
                assert!(j.truly_right);
                !j.judged_right
            })
            .count();
        assert!((340..460).contains(&flips), "{flips}");
    }
}
