//! The report of a study (`mappa reproduce NAME` with a `[study]`):
//! `report.md` with the verdict, final and over-training held-out accuracy
//! per arm (mean and standard deviation across seeds), the rollouts each arm
//! needed to reach the baseline's final accuracy, per-agent reward and coach
//! score curves; `summary.json` with the same numbers for machines; SVG plots.
//!
//! The verdict is computed, never written by hand: the method beats the
//! baseline when its mean final accuracy exceeds the baseline's by more than
//! twice the larger of the two arms' seed-to-seed standard deviations.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use mappa_train::manifest::{Manifest, Study};
use mappa_train::records::TrainLine;
use plotters::prelude::*;
use serde::Serialize;

use crate::report::RunData;
use crate::study::{Arm, ArmGroup, Profile};

/// Everything the report is made from.
pub struct StudyData<'a> {
    /// The study's name (`arith`, `arith-quick`, `arith-validation`).
    pub name: &'a str,
    /// The experiment's name (`arith`).
    pub base_name: &'a str,
    /// The manifest the study was made from.
    pub base: &'a Manifest,
    /// The study.
    pub study: &'a Study,
    /// Which version of the study.
    pub profile: Profile,
    /// The arms, in order.
    pub arms: &'a [Arm],
    /// Every run: its arm's index and its data.
    pub runs: &'a [(usize, RunData)],
    /// Seeds per arm.
    pub seeds: u64,
    /// Wall time of the study (runs reused from an earlier call count as zero).
    pub elapsed: Duration,
    /// Runs at once.
    pub jobs: usize,
    /// Where report.md, summary.json and the plots go.
    pub out: &'a Path,
}

/// Mean and sample standard deviation (0 for fewer than two values).
fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n.max(1.0);
    let std = if values.len() < 2 {
        0.0
    } else {
        (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt()
    };
    (mean, std)
}

/// One point of a curve averaged over seeds.
#[derive(Debug, Clone, Serialize)]
struct CurvePoint {
    step: f64,
    mean: f64,
    std: f64,
}

/// One arm's numbers.
#[derive(Debug, Clone, Serialize)]
struct ArmSummary {
    label: String,
    group: &'static str,
    /// Final held-out accuracy per seed.
    finals: Vec<f64>,
    mean: f64,
    std: f64,
    /// Held-out accuracy before training, mean over seeds.
    start: f64,
    /// Held-out accuracy over training steps.
    curve: Vec<CurvePoint>,
    /// Training trajectories until the mean curve first reached the
    /// baseline's final mean accuracy (None: never).
    rollouts_to_baseline_final: Option<u64>,
    /// Per agent: mean training reward per step, mean over seeds.
    reward: BTreeMap<String, Vec<CurvePoint>>,
    /// Per agent: mean coach score per step (0-10), mean over seeds.
    coach_score: BTreeMap<String, Vec<CurvePoint>>,
}

/// The verdict on the method against the baseline.
#[derive(Debug, Clone, Serialize)]
struct Verdict {
    method: String,
    baseline: String,
    difference: f64,
    threshold: f64,
    /// None when there are too few seeds to judge.
    holds: Option<bool>,
}

/// (step, value) per seed, averaged over seeds at the steps every seed has.
fn average(per_seed: &[Vec<(f64, f64)>]) -> Vec<CurvePoint> {
    let Some(first) = per_seed.first() else {
        return Vec::new();
    };
    first
        .iter()
        .filter_map(|&(step, _)| {
            let values: Vec<f64> = per_seed
                .iter()
                .map(|s| s.iter().find(|p| p.0 == step).map(|p| p.1))
                .collect::<Option<_>>()?;
            let (mean, std) = mean_std(&values);
            Some(CurvePoint { step, mean, std })
        })
        .collect()
}

fn eval_series(run: &RunData) -> Vec<(f64, f64)> {
    run.eval_series(|m| Some(m.accuracy))
}

/// Per agent: (step, value) of the train lines.
fn agent_series(
    run: &RunData,
    value: impl Fn(&TrainLine, &str) -> Option<f64>,
) -> BTreeMap<String, Vec<(f64, f64)>> {
    let mut out: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for m in run.train_steps() {
        for agent in &m.agents {
            if let Some(v) = value(m, &agent.agent) {
                out.entry(agent.agent.clone())
                    .or_default()
                    .push((m.step as f64, v));
            }
        }
    }
    out
}

/// Per agent, averaged over seeds.
fn agent_average(
    per_seed: &[BTreeMap<String, Vec<(f64, f64)>>],
) -> BTreeMap<String, Vec<CurvePoint>> {
    let agents: Vec<String> = per_seed
        .first()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    agents
        .into_iter()
        .map(|agent| {
            let series: Vec<Vec<(f64, f64)>> = per_seed
                .iter()
                .map(|m| m.get(&agent).cloned().unwrap_or_default())
                .collect();
            let curve = average(&series);
            (agent, curve)
        })
        .collect()
}

/// Trailing mean over `window` points (plots of noisy per-step values).
fn smooth(curve: &[CurvePoint], window: usize) -> Vec<(f64, f64)> {
    (0..curve.len())
        .map(|i| {
            let from = i.saturating_sub(window.saturating_sub(1));
            let part = &curve[from..=i];
            (
                curve[i].step,
                part.iter().map(|p| p.mean).sum::<f64>() / part.len() as f64,
            )
        })
        .collect()
}

fn summarise(data: &StudyData) -> (Vec<ArmSummary>, Verdict) {
    let mut arms: Vec<ArmSummary> = data
        .arms
        .iter()
        .enumerate()
        .map(|(index, arm)| {
            let runs: Vec<&RunData> = data
                .runs
                .iter()
                .filter(|(a, _)| *a == index)
                .map(|(_, r)| r)
                .collect();
            let evals: Vec<Vec<(f64, f64)>> = runs.iter().map(|r| eval_series(r)).collect();
            let finals: Vec<f64> = evals.iter().filter_map(|e| e.last().map(|p| p.1)).collect();
            let starts: Vec<f64> = evals
                .iter()
                .filter_map(|e| e.first().map(|p| p.1))
                .collect();
            let (mean, std) = mean_std(&finals);
            let rewards: Vec<_> = runs
                .iter()
                .map(|r| agent_series(r, |m, a| Some(m.agent(a)?.mean_reward)))
                .collect();
            let scores: Vec<_> = runs
                .iter()
                .map(|r| agent_series(r, |m, a| m.coach_mean_score.get(a).copied()))
                .collect();
            ArmSummary {
                label: arm.label.clone(),
                group: match arm.group {
                    ArmGroup::Credit => "credit",
                    ArmGroup::Coach => "coach",
                },
                finals,
                mean,
                std,
                start: mean_std(&starts).0,
                curve: average(&evals),
                rollouts_to_baseline_final: None,
                reward: agent_average(&rewards),
                coach_score: agent_average(&scores),
            }
        })
        .collect();
    // Arms 0 and 1 are the method and the baseline (see study::arms).
    let target = arms.get(1).map_or(f64::INFINITY, |b| b.mean);
    let per_step =
        (data.base.rollout.prompts_per_step * data.base.rollout.samples_per_prompt) as u64;
    for arm in &mut arms {
        arm.rollouts_to_baseline_final = arm
            .curve
            .iter()
            .find(|p| p.mean >= target - 1e-12)
            .map(|p| p.step as u64 * per_step);
    }
    let (m, b) = (&arms[0], &arms[1]);
    let threshold = 2.0 * m.std.max(b.std);
    let difference = m.mean - b.mean;
    let verdict = Verdict {
        method: m.label.clone(),
        baseline: b.label.clone(),
        difference,
        threshold,
        holds: (data.seeds >= 2).then_some(difference > threshold),
    };
    (arms, verdict)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// Write report.md, summary.json and the plots.
pub fn write(data: &StudyData) -> Result<(), String> {
    let (arms, verdict) = summarise(data);
    let base = data.base;
    let r = &base.rollout;
    let per_step = r.prompts_per_step * r.samples_per_prompt;
    let mut md = format!(
        "# {}: {} credit against {} credit\n\n",
        data.name, verdict.method, verdict.baseline
    );
    match data.profile {
        Profile::Full => {}
        Profile::Quick => md.push_str(&format!("> **Quick profile** (`--quick`): a smoke test of the study for CI, with too few steps and seeds to support any claim. Run `just reproduce {}` for the result.\n\n", data.base_name)),
        Profile::Validation => md.push_str(&format!("> **Validation profile** (`--validation`): the study on other generated problems (`[study.validation]` changes the data), where values may be chosen; its \"held-out\" tasks are a validation set. The result is `just reproduce {}`, on the held-out set.\n\n", data.base_name)),
    }
    md.push_str(&format!(
        "{}\n\nEverything here is simulated at CPU scale: generated problems, tiny models (one token per byte), and a **scripted coach** (a rule-based judge that knows each problem's solution, not an LLM). Arms: {}; {} seeds each; {} training steps of {} trajectories; held-out accuracy on {} tasks disjoint from training, sampled at temperature {}. {}\n\n",
        base.description,
        arms.len(),
        data.seeds,
        r.steps,
        per_step,
        held_out_count(base),
        base.eval.temperature,
        metric_note(base),
    ));
    md.push_str("## Verdict\n\n");
    let (m, b) = (&arms[0], &arms[1]);
    let numbers = format!(
        "`{}` ends at {} ± {} held-out accuracy, `{}` at {} ± {} (mean ± standard deviation over {} seeds). The difference is {:+.1} points; twice the larger seed-to-seed standard deviation is {:.1} points.",
        m.label, pct(m.mean), pct(m.std), b.label, pct(b.mean), pct(b.std), data.seeds,
        100.0 * verdict.difference, 100.0 * verdict.threshold
    );
    md.push_str(&match verdict.holds {
        Some(true) => format!("**The claim holds here:** {numbers}\n\n"),
        Some(false) => format!("**The claim does not hold here:** {numbers} The difference is within seed-to-seed noise (or negative), so this study does not show `{}` beating `{}`.\n\n", m.label, b.label),
        None => format!("**Not judged** (one seed gives no spread): {numbers}\n\n"),
    });
    md.push_str("## Final held-out accuracy\n\n| arm | start | final (mean ± std) | per seed | rollouts to reach the baseline's final |\n|---|---|---|---|---|\n");
    for arm in &arms {
        md.push_str(&format!(
            "| {}{} | {} | {} ± {} | {} | {} |\n",
            arm.label,
            if arm.group == "coach" {
                " *(coach arm)*"
            } else {
                ""
            },
            pct(arm.start),
            pct(arm.mean),
            pct(arm.std),
            arm.finals
                .iter()
                .map(|v| pct(*v))
                .collect::<Vec<_>>()
                .join(", "),
            arm.rollouts_to_baseline_final
                .map_or("not reached".to_string(), |n| n.to_string()),
        ));
    }
    md.push_str(&format!(
        "\nRollouts are training trajectories ({per_step} per step) until the arm's mean curve first reached `{}`'s final mean accuracy ({}); evaluations happen every {} steps, so this is resolved to that grain.\n\n",
        b.label,
        pct(b.mean),
        base.eval.every.max(1)
    ));
    md.push_str("## Held-out accuracy over training\n\n![held-out accuracy by credit arm](accuracy.svg)\n\n");
    let steps: Vec<f64> = arms[0].curve.iter().map(|p| p.step).collect();
    md.push_str(&format!(
        "| arm | {} |\n|---|{}\n",
        steps
            .iter()
            .map(|s| format!("step {s}"))
            .collect::<Vec<_>>()
            .join(" | "),
        "---|".repeat(steps.len())
    ));
    for arm in &arms {
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
    let agents: Vec<String> = arms[0].reward.keys().cloned().collect();
    md.push_str("\n## Per-agent curves\n\nTraining reward is what each arm optimises (coach score / 10 under process credit, the outcome under outcome credit), so its scale differs between arms; the coach score is the same scripted judge in every credit arm, so it compares how good each agent's actions are. Both are means over seeds, smoothed over 5 steps.\n\n");
    for agent in &agents {
        md.push_str(&format!(
            "![{agent}: training reward](reward-{agent}.svg)\n![{agent}: coach score](coach-score-{agent}.svg)\n\n"
        ));
    }
    md.push_str(
        "| credit arm | agent | coach score: first 5 steps | last 5 steps |\n|---|---|---|---|\n",
    );
    for arm in arms.iter().filter(|a| a.group == "credit") {
        for agent in &agents {
            let curve = arm.coach_score.get(agent).cloned().unwrap_or_default();
            let window = |part: &[CurvePoint]| {
                part.iter().map(|p| p.mean).sum::<f64>() / part.len().max(1) as f64
            };
            let k = curve.len().min(5);
            md.push_str(&format!(
                "| {} | {agent} | {:.2} | {:.2} |\n",
                arm.label,
                window(&curve[..k]),
                window(&curve[curve.len() - k..])
            ));
        }
    }
    if arms.iter().any(|a| a.group == "coach") {
        md.push_str(&format!(
            "\n## Coach quality\n\nThe `{}` arm again under the scripted coach's presets (weak: noise std 2.5, discrimination 0.4; medium: 1.2, 0.75; strong: 0.4, 1.0) and a biased coach (strong, plus {}).\n\n![held-out accuracy by coach](coach.svg)\n",
            m.label,
            data.study.coach_bias.iter().map(|(k, v)| format!("{v:+} on {k} problems")).collect::<Vec<_>>().join(", ")
        ));
    }
    let tool = "the real Python sandbox (one sandboxed process per Code Executor action)";
    let machine = mappa_train::machine::record();
    md.push_str(&format!(
        "\n## Setup\n\n- Workflow: `{}`; tool: {tool}.\n- Warm start: {}.\n- RL: learning rate {}, {} steps, {} prompts x {} samples per step, temperature {}.\n- Manifests of every run: `manifests/`; logs: `logs/`; numbers for machines: `summary.json`.\n- Wall time: {:.1} min with {} runs at once (runs reused from an earlier call count as zero).\n- Machine: {}, {} ({}), {} threads, {} build. Results are bit-identical on every x86-64 CPU with AVX2 and FMA (README, \"Reproducibility\").\n",
        base.workflow.file_name().map_or(String::new(), |f| f.to_string_lossy().into_owned()),
        base.warm_start.as_ref().map_or("none".to_string(), |w| format!(
            "{} demonstrations per role from the scripted `{}` teacher ({} slips at rates {}), {} epochs of supervised training",
            w.demonstrations, w.teacher, serde_json::to_value(w.slips).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
            w.error_rates.iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", "),
            w.sft.epochs
        )),
        base.train.lr, r.steps, r.prompts_per_step, r.samples_per_prompt, r.temperature,
        data.elapsed.as_secs_f64() / 60.0,
        data.jobs,
        machine["cpu_model"].as_str().unwrap_or("unknown CPU"),
        machine["arch"].as_str().unwrap_or(""),
        machine["simd"].as_array().map_or(String::new(), |f| f.iter().filter_map(|v| v.as_str()).collect::<Vec<_>>().join(", ")),
        machine["threads"],
        machine["build_profile"].as_str().unwrap_or(""),
    ));
    plots(data, &arms, &agents)?;
    let summary = serde_json::json!({
        "name": data.name,
        "profile": data.profile.key().unwrap_or("full"),
        "machine": machine,
        "seeds": data.seeds,
        "steps": r.steps,
        "trajectories_per_step": per_step,
        "arms": arms,
        "verdict": verdict,
    });
    let text = serde_json::to_string_pretty(&summary).map_err(|e| e.to_string())?;
    mappa_core::fs::write_atomic(&data.out.join("summary.json"), text.as_bytes())
        .map_err(|e| e.to_string())?;
    mappa_core::fs::write_atomic(&data.out.join("report.md"), md.as_bytes())
        .map_err(|e| e.to_string())
}

/// What "accuracy" means for the manifest's tasks.
fn metric_note(manifest: &Manifest) -> &'static str {
    manifest.data.family().metric()
}

fn held_out_count(manifest: &Manifest) -> String {
    match manifest.data.family().held_out() {
        Some(n) => n.to_string(),
        None => "the held-out".to_string(),
    }
}

fn plots(data: &StudyData, arms: &[ArmSummary], agents: &[String]) -> Result<(), String> {
    let bands = |group: Option<&str>, include_method: bool| -> Vec<(String, Vec<CurvePoint>)> {
        arms.iter()
            .enumerate()
            .filter(|(i, a)| group.is_none_or(|g| a.group == g) || (include_method && *i == 0))
            .map(|(_, a)| (a.label.clone(), a.curve.clone()))
            .collect()
    };
    band_chart(
        &data.out.join("accuracy.svg"),
        "held-out accuracy (mean ± std over seeds)",
        "accuracy",
        &bands(Some("credit"), false),
    )?;
    if arms.iter().any(|a| a.group == "coach") {
        band_chart(
            &data.out.join("coach.svg"),
            "held-out accuracy by coach (mean ± std over seeds)",
            "accuracy",
            &bands(Some("coach"), true),
        )?;
    }
    for agent in agents {
        for (file, title, pick) in [
            ("reward", "training reward", true),
            ("coach-score", "coach score (0-10)", false),
        ] {
            let lines: Vec<(String, Vec<CurvePoint>)> = arms
                .iter()
                .filter(|a| a.group == "credit")
                .map(|a| {
                    let curve = if pick { &a.reward } else { &a.coach_score };
                    let points = smooth(curve.get(agent).map_or(&[][..], |c| c), 5)
                        .into_iter()
                        .map(|(step, mean)| CurvePoint {
                            step,
                            mean,
                            std: 0.0,
                        })
                        .collect();
                    (a.label.clone(), points)
                })
                .collect();
            band_chart(
                &data.out.join(format!("{file}-{agent}.svg")),
                &format!("{agent}: {title}"),
                title,
                &lines,
            )?;
        }
    }
    Ok(())
}

/// One SVG chart of mean lines with a shaded ± std band.
fn band_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    lines: &[(String, Vec<CurvePoint>)],
) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let points: Vec<&CurvePoint> = lines.iter().flat_map(|(_, p)| p).collect();
    if points.is_empty() {
        return Ok(());
    }
    let x_max = points.iter().map(|p| p.step).fold(1.0, f64::max);
    let y_min = points
        .iter()
        .map(|p| p.mean - p.std)
        .fold(f64::INFINITY, f64::min)
        .min(0.0);
    let y_max = points
        .iter()
        .map(|p| p.mean + p.std)
        .fold(f64::NEG_INFINITY, f64::max)
        .max(y_min + 1e-3);
    let pad = (y_max - y_min) * 0.05;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, (y_min - pad)..(y_max + pad))
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("step")
        .y_desc(y_label)
        .draw()
        .map_err(|e| err(&e))?;
    for (i, (label, pts)) in lines.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        if pts.iter().any(|p| p.std > 0.0) {
            let mut band: Vec<(f64, f64)> = pts.iter().map(|p| (p.step, p.mean + p.std)).collect();
            band.extend(pts.iter().rev().map(|p| (p.step, p.mean - p.std)));
            chart
                .draw_series(std::iter::once(Polygon::new(
                    band,
                    color.mix(0.15).filled(),
                )))
                .map_err(|e| err(&e))?;
        }
        chart
            .draw_series(LineSeries::new(
                pts.iter().map(|p| (p.step, p.mean)),
                color.stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label(label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_std_and_averages() {
        assert_eq!(mean_std(&[0.5]), (0.5, 0.0));
        let (m, s) = mean_std(&[0.1, 0.3]);
        assert!((m - 0.2).abs() < 1e-12 && (s - 0.1414213562).abs() < 1e-9);
        let curve = average(&[vec![(0.0, 0.1), (5.0, 0.3)], vec![(0.0, 0.3)]]);
        assert_eq!(curve.len(), 1, "only steps every seed has");
        assert!((curve[0].mean - 0.2).abs() < 1e-12);
        let smoothed = smooth(
            &[0.0, 1.0, 2.0].map(|mean| CurvePoint {
                step: mean,
                mean,
                std: 0.0,
            }),
            2,
        );
        assert_eq!(smoothed, vec![(0.0, 0.0), (1.0, 0.5), (2.0, 1.5)]);
    }
}
