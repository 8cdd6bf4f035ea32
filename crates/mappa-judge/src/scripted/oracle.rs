//! The oracle view: the action's quality from the task's known solution
//! (its intermediate values, final answer, required files or achieved
//! quality), whatever the action's input was.

use crate::context::{ActionContext, KnownSolution};

/// The quality of an action that faithfully carried forward its input
/// (`judge_against_input`).
pub const CARRIED_FORWARD: f64 = 0.6;

/// Whether the tool output shows a failure.
pub(super) fn tool_failed(observation: Option<&str>) -> bool {
    observation.is_some_and(|o| {
        o.contains("Traceback")
            || o.split(|c: char| !c.is_alphanumeric())
                .any(|w| w.ends_with("Error"))
    })
}

/// Whether `value` appears in `text` as a whole token: not inside a longer
/// word or number (`51` is not in `512`, `51.5` or `0.51`).
pub(super) fn mentions(text: &str, value: &str) -> bool {
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
pub(super) fn carried_forward(ctx: &ActionContext) -> bool {
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
pub(super) fn quality(ctx: &ActionContext, solution: &KnownSolution) -> (f64, String) {
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
