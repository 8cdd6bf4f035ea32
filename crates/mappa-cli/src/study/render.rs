//! A study's report: `report.md` (the verdict for a study that makes a
//! claim, final and over-training held-out accuracy per arm, per-agent
//! curves, the coach-quality comparison, and a setup section generated from
//! the manifest: tasks, workflow and tool, models, coach and whether it is
//! simulated), `summary.json` with the same numbers for machines, and SVG
//! plots.
//!
//! The verdict is computed, never written by hand, by the pre-registered
//! analysis of [`super::verdict`]: a one-sided sign-flip test of the
//! per-seed differences in learning-curve area.

use std::collections::BTreeMap;

use anyhow::anyhow;
use mappa_agents::{Tool, Workflow};
use mappa_judge::config::{CoachConfig, Judge};
use mappa_judge::scripted::View;
use mappa_train::manifest::Manifest;

use super::summarise::{smooth, summarise, ArmSummary};
use super::verdict::Verdict;
use super::{ArmGroup, Profile, StudyData};
use crate::plot::{chart, Point, Series, Style};

/// A share as a percentage with one decimal.
pub(super) fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Write report.md, summary.json and the plots.
pub fn write(data: &StudyData) -> anyhow::Result<()> {
    let (arms, verdict) = summarise(data)?;
    let agents: Vec<String> = arms
        .first()
        .map(|a| a.reward.keys().cloned().collect())
        .unwrap_or_default();
    let mut md = header(data, verdict.as_ref());
    md.push_str(&verdict_section(data, &arms, verdict.as_ref()));
    md.push_str(&finals_section(data, &arms, verdict.as_ref()));
    md.push_str(&curves_section(&arms));
    md.push_str(&agents_section(&arms, &agents));
    md.push_str(&coach_section(data, &arms));
    md.push_str(&coach_accuracy_section(&arms));
    md.push_str(&setup_section(data)?);
    plots(data, &arms, &agents)?;
    let r = &data.base.rollout;
    let summary = serde_json::json!({
        "name": data.name,
        "profile": data.profile.key().unwrap_or("full"),
        "machine": mappa_train::machine::record(),
        "seeds": data.seeds,
        "steps": r.steps,
        "trajectories_per_step": r.prompts_per_step * r.samples_per_prompt,
        "arms": arms,
        "verdict": verdict,
        "registration": match &data.registration {
            Some(Ok(r)) => serde_json::to_value(r)?,
            Some(Err(why)) => serde_json::json!({ "unknown": why }),
            None => serde_json::Value::Null,
        },
    });
    let text = serde_json::to_string_pretty(&summary)?;
    mappa_core::fs::write_atomic(&data.out.join("summary.json"), text.as_bytes())?;
    mappa_core::fs::write_atomic(&data.out.join("report.md"), md.as_bytes())?;
    Ok(())
}

/// The title, the profile's warning, and what was compared on what.
fn header(data: &StudyData, verdict: Option<&Verdict>) -> String {
    let base = data.base;
    let r = &base.rollout;
    let mut md = match verdict {
        Some(v) => format!(
            "# {}: {} credit against {} credit\n\n",
            data.name, v.method, v.baseline
        ),
        None => format!("# {}: an ablation of credit assignment\n\n", data.name),
    };
    match data.profile {
        Profile::Full => md.push_str(&registration_note(data)),
        Profile::Quick => md.push_str(&format!("> **Quick profile** (`--quick`): a smoke test of the study for CI, with too few steps and seeds to support any claim. Run `just reproduce {}` for the result.\n\n", data.base_name)),
        Profile::Validation => md.push_str(&format!("> **Validation profile** (`--validation`): the study on other generated problems (`[study.validation]` changes the data), where values may be chosen; its \"held-out\" tasks are a validation set. The result is `just reproduce {}`, on the held-out set.\n\n", data.base_name)),
    }
    let family = base.data.family();
    md.push_str(&format!(
        "{}\n\nTasks: {}. Coach: {}. Arms: {}; {} seeds each; {} training steps of {} trajectories; held-out accuracy on {} tasks disjoint from training, sampled at temperature {}. {}\n\n",
        base.description,
        family.describe(),
        describe_coach(&base.coach),
        data.arms.len(),
        data.seeds,
        r.steps,
        r.prompts_per_step * r.samples_per_prompt,
        family.held_out().map_or("the held-out".to_string(), |n| n.to_string()),
        base.eval.temperature,
        family.metric(),
    ));
    md
}

/// Whether a full study is confirmatory, and if so where it was registered.
fn registration_note(data: &StudyData) -> String {
    registration_text(data.registration.as_ref())
}

/// The note on a full study's registration: none (exploratory), unknown,
/// broken by later changes, or intact.
pub(super) fn registration_text(
    registration: Option<&Result<super::registration::Registration, String>>,
) -> String {
    match registration {
        None => "> **Exploratory study**: no analysis was registered before it ran (`[study] confirmatory` is off), so its verdict describes these runs rather than testing a claim fixed in advance.\n\n".to_string(),
        Some(Err(why)) => format!("> **Confirmatory study, registration unknown**: its manifest and analysis code could not be traced to a commit ({why}).\n\n"),
        Some(Ok(r)) if !r.modified.is_empty() => format!(
            "> **Not the registered study**: `{}` changed since commit `{}` ({}), which registered the manifest and the analysis; these runs test the changed version, so read them as exploratory.\n\n",
            r.modified.join("`, `"), &r.commit[..12.min(r.commit.len())], r.date
        ),
        Some(Ok(r)) if !r.analysis_changed_since.is_empty() => format!(
            "> **Confirmatory study, analysis changed since registration**: commit `{}` ({}) registered the manifest (`{}`) and the analysis code (`{}`); the analysis code changed after it, in {}. The verdict below is computed by the changed code: it is the registered verdict only if those changes left the numbers as they were.\n\n",
            &r.commit[..12.min(r.commit.len())], r.date, r.files[0], r.files[1..].join("`, `"),
            r.analysis_changed_since.iter().map(|c| format!("`{}`", c.split(' ').next().unwrap_or(c))).collect::<Vec<_>>().join(", ")
        ),
        Some(Ok(r)) => format!(
            "> **Confirmatory study**, pre-registered: the manifest and the analysis code (`{}`) are as committed in `{}` ({}), before these runs began.\n\n",
            r.files.join("`, `"), &r.commit[..12.min(r.commit.len())], r.date
        ),
    }
}

/// The verdict (a claim), or why there is none (an ablation).
fn verdict_section(data: &StudyData, arms: &[ArmSummary], verdict: Option<&Verdict>) -> String {
    let mut md = String::from("## Verdict\n\n");
    let Some(v) = verdict else {
        md.push_str("None: an ablation registers no claim before its runs, so its numbers are exploratory. Put a claim (`method`, `baseline`) in the manifest's `[study]` to test one.\n\n");
        return md;
    };
    let label = |l: &str| arms.iter().find(|a| a.label == l).expect("a claim's arm");
    let (m, b) = (label(&v.method), label(&v.baseline));
    let p = &v.primary;
    let n = p.seeds.len();
    let test = format!(
        "Endpoint: the {}. `{}`: {} ± {}, `{}`: {} ± {} (mean ± standard deviation over seeds). Paired by seed (same data order and warm start), `{}` minus `{}` is {:+.1} points on average (95% bootstrap interval {:+.1} to {:+.1}); one-sided exact sign-flip test over {n} paired seeds: p = {:.4} (alpha = {}).",
        v.endpoint, m.label, pct(m.area_mean), pct(m.area_std), b.label, pct(b.area_mean), pct(b.area_std),
        m.label, b.label, 100.0 * p.mean_difference, 100.0 * v.interval_95.0, 100.0 * v.interval_95.1,
        p.p_value, v.alpha
    );
    md.push_str(&match v.holds {
        Some(true) => format!("**The claim holds:** `{}` beats `{}`. {test}\n\n", m.label, b.label),
        Some(false) => format!("**The claim does not hold:** this study does not show `{}` beating `{}`. {test}\n\n", m.label, b.label),
        None => format!("**Not judged:** {n} paired seeds, and the test needs at least {} to be able to reach alpha = {} (its smallest p-value is 2^-n). {test}\n\n", v.min_seeds, v.alpha),
    });
    md.push_str(&match v.detectable_effect {
        Some(d) => format!("Power: with the observed spread of the paired differences (standard deviation {:.1} points), {n} seeds detect a mean gain of {:.1} points with probability {:.0}% (simulated).\n\n", 100.0 * p.std_difference, 100.0 * d, 100.0 * super::verdict::POWER),
        None => format!("Power: none; {n} seeds cannot reach alpha = {} whatever the effect.\n\n", v.alpha),
    });
    let f = &v.final_accuracy;
    md.push_str(&format!(
        "Secondary, final held-out accuracy: {:+.1} points on average (sign-flip p = {:.4}).",
        100.0 * f.mean_difference,
        f.p_value
    ));
    if let Some(r) = &v.rollouts_to_threshold {
        let show = |xs: &[Option<u64>]| {
            xs.iter()
                .map(|x| x.map_or("never".into(), |x| x.to_string()))
                .collect::<Vec<String>>()
                .join(", ")
        };
        md.push_str(&format!(
            " Training rollouts until held-out accuracy first reached {} per seed: `{}` {}; `{}` {}.",
            pct(r.threshold),
            m.label,
            show(&r.method),
            b.label,
            show(&r.baseline)
        ));
    }
    md.push_str("\n\n| seed | ");
    md.push_str(&format!(
        "`{}` area | `{}` area | difference |\n|---|---|---|---|\n",
        m.label, b.label
    ));
    for (i, seed) in p.seeds.iter().enumerate() {
        let at = |a: &ArmSummary| {
            a.seeds
                .iter()
                .position(|s| s == seed)
                .map_or("-".into(), |j| pct(a.areas[j]))
        };
        md.push_str(&format!(
            "| {seed} | {} | {} | {:+.1} |\n",
            at(m),
            at(b),
            100.0 * p.differences[i]
        ));
    }
    md.push_str(&format!("\nThe analysis (endpoint, pairing, test, alpha) is fixed in `crates/mappa-cli/src/study/verdict.rs`; {} seeds were run.\n\n", data.seeds));
    md
}

/// Final held-out accuracy per arm, and the rollouts to the reference arm's final.
fn finals_section(data: &StudyData, arms: &[ArmSummary], verdict: Option<&Verdict>) -> String {
    let reference = verdict.map_or(arms[0].label.as_str(), |v| v.baseline.as_str());
    let target = arms
        .iter()
        .find(|a| a.label == reference)
        .map_or(0.0, |a| a.mean);
    let mut md = format!("## Final held-out accuracy\n\n| arm | start | final (mean ± std) | per seed | learning-curve area (mean ± std) | rollouts to reach `{reference}`'s final | steps all failed / all succeeded |\n|---|---|---|---|---|---|---|\n");
    for arm in arms {
        let coach_arm = if arm.group == "coach" {
            " *(coach arm)*"
        } else {
            ""
        };
        let each: Vec<String> = arm.finals.iter().map(|v| pct(*v)).collect();
        md.push_str(&format!(
            "| {}{coach_arm} | {} | {} ± {} | {} | {} ± {} | {} | {} / {} |\n",
            arm.label,
            pct(arm.start),
            pct(arm.mean),
            pct(arm.std),
            each.join(", "),
            pct(arm.area_mean),
            pct(arm.area_std),
            arm.rollouts_to_baseline_final
                .map_or("not reached".to_string(), |n| n.to_string()),
            pct(arm.all_failed_steps),
            pct(arm.all_succeeded_steps),
        ));
    }
    for arm in arms {
        if let Some(share) = arm.uniform_sets {
            md.push_str(&format!(
                "\n`{}`: {} of its normalisation sets had equal rewards (`[credit] uniform`).\n",
                arm.label,
                pct(share)
            ));
        }
    }
    let r = &data.base.rollout;
    md.push_str(&format!(
        "\nRollouts are training trajectories ({} per step) until the arm's mean curve first reached `{reference}`'s final mean accuracy ({}); evaluations happen every {} steps, so this is resolved to that grain. The last column is the share of training steps (over all seeds) in which every trajectory failed, or every one succeeded: in such a step outcome-only credit has nothing to compare and learns only from the KL term.\n\n",
        r.prompts_per_step * r.samples_per_prompt,
        pct(target),
        data.base.eval.every.max(1)
    ));
    md
}

/// Held-out accuracy per arm at every evaluated step.
fn curves_section(arms: &[ArmSummary]) -> String {
    let mut md = String::from(
        "## Held-out accuracy over training\n\n![held-out accuracy by credit arm](accuracy.svg)\n\n",
    );
    let steps: Vec<f64> = arms[0].curve.iter().map(|p| p.step).collect();
    let header: Vec<String> = steps.iter().map(|s| format!("step {s}")).collect();
    md.push_str(&format!(
        "| arm | {} |\n|---|{}\n",
        header.join(" | "),
        "---|".repeat(steps.len())
    ));
    for arm in arms {
        let cells: Vec<String> = steps
            .iter()
            .map(|s| {
                arm.curve
                    .iter()
                    .find(|p| p.step == *s)
                    .map_or("-".into(), |p| format!("{} ± {}", pct(p.mean), pct(p.std)))
            })
            .collect();
        md.push_str(&format!("| {} | {} |\n", arm.label, cells.join(" | ")));
    }
    md
}

/// Per-agent reward and coach-score plots, and the coach score early and late.
fn agents_section(arms: &[ArmSummary], agents: &[String]) -> String {
    let mut md = String::from("\n## Per-agent curves\n\nTraining reward is what each arm optimises (coach score / 10 under process credit, the outcome under outcome credit), so its scale differs between arms; the coach score is the same judge in every credit arm, so it compares how good each agent's actions are. Both are means over seeds, smoothed over 5 steps.\n\n");
    for agent in agents {
        md.push_str(&format!(
            "![{agent}: training reward](reward-{agent}.svg)\n![{agent}: coach score](coach-score-{agent}.svg)\n\n"
        ));
    }
    md.push_str(
        "| credit arm | agent | coach score: first 5 steps | last 5 steps |\n|---|---|---|---|\n",
    );
    let window =
        |part: &[Point]| part.iter().map(|p| p.mean).sum::<f64>() / part.len().max(1) as f64;
    for arm in arms.iter().filter(|a| a.group == "credit") {
        for agent in agents {
            let curve = arm.coach_score.get(agent).cloned().unwrap_or_default();
            let k = curve.len().min(5);
            md.push_str(&format!(
                "| {} | {agent} | {:.2} | {:.2} |\n",
                arm.label,
                window(&curve[..k]),
                window(&curve[curve.len() - k..])
            ));
        }
    }
    md
}

/// The coach arms, if any.
fn coach_section(data: &StudyData, arms: &[ArmSummary]) -> String {
    let (Some(study), true) = (data.study, arms.iter().any(|a| a.group == "coach")) else {
        return String::new();
    };
    let describe = |name: &str| -> String {
        if let Some(overrides) = study.coach_arms.get(name) {
            let settings: Vec<String> = overrides
                .iter()
                .map(|(k, v)| format!("{k} = {v}"))
                .collect();
            return format!("the manifest's coach with {}", settings.join(", "));
        }
        match name {
            "weak" => "the weak preset (noise std 2.5, discrimination 0.4)".into(),
            "medium" => "the medium preset (noise std 1.2, discrimination 0.75)".into(),
            "strong" => "the strong preset (noise std 0.4, discrimination 1.0)".into(),
            "biased" => {
                let bias: Vec<String> = study
                    .coach_bias
                    .iter()
                    .map(|(k, v)| format!("{v:+} on {k} problems"))
                    .collect();
                format!("the strong preset plus {}", bias.join(", "))
            }
            other => other.to_string(),
        }
    };
    let mut md = format!(
        "\n## Coach quality\n\nThe `{}` arm again under other scripted coaches:\n\n",
        study.method
    );
    for arm in data.arms {
        if let ArmGroup::Coach(name) = &arm.group {
            md.push_str(&format!("- `{}`: {}.\n", arm.label, describe(name)));
        }
    }
    md.push_str("\n![held-out accuracy by coach](coach.svg)\n");
    md
}

/// A simulated coach's measured accuracy per arm and role, when known.
fn coach_accuracy_section(arms: &[ArmSummary]) -> String {
    let roles: Vec<&String> = arms
        .iter()
        .flat_map(|a| a.coach_accuracy.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if roles.is_empty() {
        return String::new();
    }
    let mut md = String::from("\n## The coach's accuracy\n\nThe share of training actions whose verdict (right or wrong) agreed with the truth: whether the agent did its own part right, given its input. Measured by the simulated coach's audit, over every step and seed.\n\n| arm |");
    for role in &roles {
        md.push_str(&format!(" {role} |"));
    }
    md.push_str(&format!("\n|---|{}\n", "---|".repeat(roles.len())));
    for arm in arms.iter().filter(|a| !a.coach_accuracy.is_empty()) {
        md.push_str(&format!("| {} |", arm.label));
        for role in &roles {
            let cell = arm
                .coach_accuracy
                .get(*role)
                .map_or("-".into(), |a| pct(*a));
            md.push_str(&format!(" {cell} |"));
        }
        md.push('\n');
    }
    md.push_str(&coach_error_correlation(arms, &roles));
    md
}

/// Per arm and role, the correlation (phi) between the coach being wrong
/// and the agent being wrong on the same action, where recorded: near 0
/// when the coach's mistakes are independent of the agents', positive when
/// it tends to fail where they fail.
fn coach_error_correlation(arms: &[ArmSummary], roles: &[&String]) -> String {
    let arms: Vec<&ArmSummary> = arms.iter().filter(|a| !a.coach_errors.is_empty()).collect();
    if arms.is_empty() {
        return String::new();
    }
    let mut md = String::from("\nThe correlation (phi) between the coach being wrong and the agent being wrong on the same action: about 0 when the coach's mistakes are independent of the agents', positive when it tends to fail where they fail (- where either never or always happened).\n\n| arm |");
    for role in roles {
        md.push_str(&format!(" {role} |"));
    }
    md.push_str(&format!("\n|---|{}\n", "---|".repeat(roles.len())));
    for arm in arms {
        md.push_str(&format!("| {} |", arm.label));
        for role in roles {
            let cell = arm
                .coach_errors
                .get(*role)
                .and_then(|t| t.phi())
                .map_or("-".into(), |phi| format!("{phi:+.2}"));
            md.push_str(&format!(" {cell} |"));
        }
        md.push('\n');
    }
    md
}

/// The coach, and whether it is simulated.
pub(super) fn describe_coach(coach: &CoachConfig) -> String {
    match &coach.judge {
        Judge::Scripted(s) => match s.view {
            View::Oracle => format!("a **scripted coach**, oracle view ({} preset): simulated, a rule-based judge that reads each generated task's known solution for every action, not an LLM", s.strength.name()),
            View::InputOnly => format!("a **scripted coach**, input-only view ({} preset, slip rate {}, blame leak {}, short-plan bias {:+}): simulated, a rule-based judge that re-derives each action from its input, with only the last agent's coach seeing the answer, not an LLM", s.strength.name(), s.slip_rate, s.blame_leak, s.short_plan_bias),
            View::TaskTied => format!("a **scripted coach**, task-tied view ({} preset, slip rate {} tilted by difficulty with weight {}, blame leak {}, short-plan bias {:+}): simulated, a rule-based judge that re-derives each action from its input once per task, slipping more on harder instances as the agents do, with only the last agent's coach seeing the answer, not an LLM", s.strength.name(), s.slip_rate, s.difficulty_weight, s.blame_leak, s.short_plan_bias),
            View::FreeText => format!("a **scripted coach**, free-text view ({} preset, verdicts flipped at rate {}): simulated, a rule-based judge that reads the numbers each action states (the plan's expression, the printed value, the final answer) and checks them against what the action's input implies, with only the last agent's coach seeing the answer, not an LLM", s.strength.name(), s.slip_rate),
        },
        Judge::OpenAi(o) => format!("an LLM coach, `{}` at {}", o.model, o.base_url),
        Judge::Local(l) => format!("a local model as LLM coach ({})", l.checkpoint.display()),
    }
}

/// Each role's model: its size and where its weights come from.
fn describe_models(manifest: &Manifest) -> String {
    let mut by_description: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (role, spec) in &manifest.models {
        let size = mappa_model::TransformerConfig::from_hf_file(&spec.path.join("config.json"))
            .map(|c| format!("{:.2}M parameters", c.num_params() as f64 / 1e6))
            .unwrap_or_else(|_| "size unknown".into());
        let source = match spec.init_seed {
            Some(seed) => format!("random weights from seed {seed}"),
            None => format!("weights from {}", spec.path.display()),
        };
        by_description
            .entry(format!("{size}, {source}"))
            .or_default()
            .push(role);
    }
    let parts: Vec<String> = by_description
        .iter()
        .map(|(d, roles)| format!("{} ({d})", roles.join(", ")))
        .collect();
    parts.join("; ")
}

/// What the workflow's tool does.
fn describe_tool(workflow: &Workflow) -> String {
    let parts: Vec<String> = workflow
        .agents
        .iter()
        .filter(|a| a.tool == Tool::Python)
        .map(|a| match a.program {
            Some(_) => format!("a fixed program carries out the {}'s choice", a.role),
            None => format!("the {} writes Python", a.role),
        })
        .collect();
    match parts.is_empty() {
        true => "none".into(),
        false => format!(
            "{}; it runs in the real Python sandbox (one sandboxed process per action)",
            parts.join(", ")
        ),
    }
}

/// How the study was set up and where it ran.
fn setup_section(data: &StudyData) -> anyhow::Result<String> {
    let base = data.base;
    let r = &base.rollout;
    let workflow =
        Workflow::load(&base.workflow).map_err(|e| anyhow!("{}: {e}", base.workflow.display()))?;
    let warm = base.warm_start.as_ref().map_or("none".to_string(), |w| {
        let slips = serde_json::to_value(w.slips)
            .ok()
            .and_then(|v| v.as_str().map(String::from))
            .unwrap_or_default();
        let rates: Vec<String> = w.error_rates.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let per_seed = match data.study.is_some_and(|s| s.vary_warm_start) {
            true => "; each seed its own (seed index added to the fine-tuning seed and to every model's initialisation seed above), shared by its arms",
            false => "; one, shared by every run",
        };
        format!(
            "{} demonstrations per role from the scripted `{}` teacher ({slips} slips at rates {}), {} epochs of supervised training{per_seed}",
            w.demonstrations, w.teacher, rates.join(", "), w.sft.epochs
        )
    });
    let machine = mappa_train::machine::record();
    let simd: Vec<&str> = machine["simd"]
        .as_array()
        .map(|f| f.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    Ok(format!(
        "\n## Setup\n\n- Workflow: `{}` ({}); tool: {}.\n- Models: {}.\n- Coach: {}.\n- Warm start: {warm}.\n- RL: learning rate {}, {} steps, {} prompts x {} samples per step, temperature {}.\n- Manifests of every run: `manifests/`; logs: `logs/`; numbers for machines: `summary.json`.\n- Wall time: {:.1} min with {} runs at once (runs reused from an earlier call count as zero).\n- Machine: {}, {} ({}), {} threads, {} build. Results are bit-identical on every x86-64 CPU with AVX2 and FMA (README, \"Reproducibility\").\n",
        workflow.name,
        workflow.agents.iter().map(|a| a.role.as_str()).collect::<Vec<_>>().join(" -> "),
        describe_tool(&workflow),
        describe_models(base),
        describe_coach(&base.coach),
        base.train.lr, r.steps, r.prompts_per_step, r.samples_per_prompt, r.temperature,
        data.elapsed.as_secs_f64() / 60.0,
        data.jobs,
        machine["cpu_model"].as_str().unwrap_or("unknown CPU"),
        machine["arch"].as_str().unwrap_or(""),
        simd.join(", "),
        machine["threads"],
        machine["build_profile"].as_str().unwrap_or(""),
    ))
}

/// Accuracy by credit arm and by coach, and per agent reward and coach score.
fn plots(data: &StudyData, arms: &[ArmSummary], agents: &[String]) -> anyhow::Result<()> {
    let method = data.question.arms(data.arms).map(|(m, _)| m);
    let bands = |group: &str| -> Vec<Series> {
        arms.iter()
            .enumerate()
            .filter(|(i, a)| a.group == group || (group == "coach" && Some(*i) == method))
            .map(|(_, a)| (a.label.clone(), a.curve.clone()))
            .collect()
    };
    let title = "held-out accuracy (mean ± std over seeds)";
    chart(
        &data.out.join("accuracy.svg"),
        title,
        "accuracy",
        &bands("credit"),
        Style::Bands,
    )?;
    if arms.iter().any(|a| a.group == "coach") {
        let title = "held-out accuracy by coach (mean ± std over seeds)";
        chart(
            &data.out.join("coach.svg"),
            title,
            "accuracy",
            &bands("coach"),
            Style::Bands,
        )?;
    }
    for agent in agents {
        for (file, title, reward) in [
            ("reward", "training reward", true),
            ("coach-score", "coach score (0-10)", false),
        ] {
            let lines: Vec<Series> = arms
                .iter()
                .filter(|a| a.group == "credit")
                .map(|a| {
                    let curve = if reward { &a.reward } else { &a.coach_score };
                    let points = smooth(curve.get(agent).map_or(&[][..], |c| c), 5)
                        .into_iter()
                        .map(|(step, mean)| Point::at(step, mean))
                        .collect();
                    (a.label.clone(), points)
                })
                .collect();
            let path = data.out.join(format!("{file}-{agent}.svg"));
            chart(
                &path,
                &format!("{agent}: {title}"),
                title,
                &lines,
                Style::Bands,
            )?;
        }
    }
    Ok(())
}
