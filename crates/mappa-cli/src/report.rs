//! `mappa report RUN_DIR...`: a markdown table comparing runs (with the
//! paper's numbers beside them where they exist) and SVG plots of held-out
//! accuracy, per-agent reward, tool-call rate and response length over
//! steps. `mappa inspect RUN_DIR --trajectory N`: one trajectory, readable.

use anyhow::anyhow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use mappa_train::lock::Lock;
use mappa_train::records::{read_jsonl, EvalLine, MetricsLine, TrainLine, TrajectoryLine};
use mappa_train::StepMetrics;

use crate::plot::{chart, Point, Series, Style};

/// Arguments of `mappa report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Run directories.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// Where to write report.md and the plots (default: the first run directory).
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Arguments of `mappa inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A run directory.
    run: PathBuf,
    /// Which trajectory (0-based line of trajectories.jsonl).
    #[arg(long)]
    trajectory: usize,
}

/// One run's data.
pub struct RunData {
    /// A label: name, credit strategy, seed.
    pub label: String,
    /// The lock file.
    pub lock: Lock,
    /// Every line of metrics.jsonl.
    pub metrics: Vec<MetricsLine>,
}

impl RunData {
    /// The evaluations, in order.
    pub fn evals(&self) -> impl Iterator<Item = &EvalLine> {
        self.metrics.iter().filter_map(MetricsLine::as_eval)
    }

    /// The training steps, in order.
    pub fn train_steps(&self) -> impl Iterator<Item = &TrainLine> {
        self.metrics.iter().filter_map(MetricsLine::as_train)
    }

    /// (step, value) of the evaluations.
    pub fn eval_series(&self, value: impl Fn(&EvalLine) -> Option<f64>) -> Vec<(f64, f64)> {
        self.evals()
            .filter_map(|m| Some((m.step as f64, value(m)?)))
            .collect()
    }

    /// (step, value) of the training steps.
    pub fn train_series(&self, value: impl Fn(&TrainLine) -> Option<f64>) -> Vec<(f64, f64)> {
        self.train_steps()
            .filter_map(|m| Some((m.step as f64, value(m)?)))
            .collect()
    }
}

/// Read a run directory.
pub fn load_run(dir: &Path) -> anyhow::Result<RunData> {
    let lock = Lock::read(dir)?;
    let metrics = read_jsonl(&dir.join("metrics.jsonl"))?;
    let m = &lock.manifest;
    let label = format!(
        "{} [{} / {}, seed {}]",
        m["name"].as_str().unwrap_or("?"),
        m["credit"]["strategy"]["kind"].as_str().unwrap_or("?"),
        m["credit"]["scope"].as_str().unwrap_or("?"),
        m["seed"]
    );
    Ok(RunData {
        label,
        lock,
        metrics,
    })
}

/// (step, value) pairs as chart points.
fn points(series: Vec<(f64, f64)>) -> Vec<Point> {
    series.into_iter().map(|(x, y)| Point::at(x, y)).collect()
}

fn fmt(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{v:.3}"))
}

/// The paper's numbers for a MathChat run (from experiments/paper-results.toml).
fn paper_lines(repo: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(repo.join("experiments/paper-results.toml")) else {
        return Vec::new();
    };
    let Ok(value) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let Some(rows) = value.get("mathchat").and_then(|v| v.as_array()) else {
        return Vec::new();
    };
    rows.iter()
        .filter_map(|r| {
            let get = |k: &str, w: &str| r.get(k)?.get(w)?.as_float();
            Some(format!(
                "| paper: {} (coach {}) | AIME 2025 {:.1} -> {:.1} | AMC {:.1} -> {:.1} |",
                r.get("base_model")?.as_str()?,
                r.get("coach")?.as_str()?,
                get("aime_2025", "before")?,
                get("aime_2025", "after")?,
                get("amc", "before")?,
                get("amc", "after")?
            ))
        })
        .collect()
}

/// Runs `mappa report`.
pub fn report(args: &ReportArgs) -> anyhow::Result<()> {
    let runs: Vec<RunData> = args
        .runs
        .iter()
        .map(|d| load_run(d))
        .collect::<Result<_, _>>()?;
    let out = args.out.clone().unwrap_or_else(|| args.runs[0].clone());
    std::fs::create_dir_all(&out).map_err(|e| anyhow!("{}: {e}", out.display()))?;
    let text = write_report(&runs, &out, &crate::rundir::repo_root())?;
    let path = out.join("report.md");
    mappa_core::fs::write_atomic(&path, text.as_bytes())?;
    println!("{}", path.display());
    Ok(())
}

/// Write the plots and return the markdown.
pub fn write_report(runs: &[RunData], out: &Path, repo: &Path) -> anyhow::Result<String> {
    let mut md = String::from("# mappa report\n\n| run | held-out accuracy: start | final | best | last train accuracy | tool-call rate: first -> last | steps |\n|---|---|---|---|---|---|---|\n");
    for run in runs {
        let eval = run.eval_series(|m| Some(m.accuracy));
        let train = run.train_series(|m| Some(m.train_accuracy));
        let tools = run.train_series(|m| m.tool_call_rate);
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} -> {} | {} |\n",
            run.label,
            fmt(eval.first().map(|p| p.1)),
            fmt(eval.last().map(|p| p.1)),
            fmt(eval.iter().map(|p| p.1).reduce(f64::max)),
            fmt(train.last().map(|p| p.1)),
            fmt(tools.first().map(|p| p.1)),
            fmt(tools.last().map(|p| p.1)),
            train.len()
        ));
    }
    if runs.iter().any(|r| {
        r.lock.manifest["coach"]["domain"] == "mathchat"
            && r.lock.manifest["data"]["kind"] == "math_file"
    }) {
        let paper = paper_lines(repo);
        if !paper.is_empty() {
            md.push_str("\nThe paper's reported numbers (arXiv 2601.23228), for comparison:\n\n| source | AIME 2025 | AMC |\n|---|---|---|\n");
            for line in paper {
                md.push_str(&line);
                md.push('\n');
            }
        }
    }
    charts(runs, out)?;
    md.push_str("\n![held-out accuracy](accuracy.svg)\n![mean reward per agent](reward.svg)\n![tool-call rate](tool_call_rate.svg)\n![response length](response_length.svg)\n");
    let by_label: BTreeMap<&str, usize> = runs
        .iter()
        .map(|r| (r.label.as_str(), r.metrics.len()))
        .collect();
    md.push_str(&format!(
        "\nRuns: {}.\n",
        by_label.keys().copied().collect::<Vec<_>>().join("; ")
    ));
    Ok(md)
}

/// The run report's plots: held-out accuracy, tool-call rate, and per agent
/// the mean reward and response length.
fn charts(runs: &[RunData], out: &Path) -> anyhow::Result<()> {
    let lines = |series: &dyn Fn(&RunData) -> Vec<(f64, f64)>| -> Vec<Series> {
        runs.iter()
            .map(|r| (r.label.clone(), points(series(r))))
            .filter(|(_, p)| !p.is_empty())
            .collect()
    };
    let (mut rewards, mut lengths) = (Vec::new(), Vec::new());
    for run in runs {
        let agents: Vec<String> = run
            .train_steps()
            .next()
            .map(|m| m.agents.iter().map(|a| a.agent.clone()).collect())
            .unwrap_or_default();
        for agent in agents {
            let label = format!("{} {agent}", run.label);
            let series = |f: &dyn Fn(&StepMetrics) -> f64| {
                points(run.train_series(|m| m.agent(&agent).map(f)))
            };
            rewards.push((label.clone(), series(&|a| a.mean_reward)));
            lengths.push((label, series(&|a| a.response_length)));
        }
    }
    for (file, title, y, series) in [
        (
            "accuracy.svg",
            "held-out accuracy",
            "accuracy",
            lines(&|r| r.eval_series(|m| Some(m.accuracy))),
        ),
        (
            "tool_call_rate.svg",
            "tool-call rate (actions of Python agents with code)",
            "rate",
            lines(&|r| r.train_series(|m| m.tool_call_rate)),
        ),
        ("reward.svg", "mean reward per agent", "reward", rewards),
        (
            "response_length.svg",
            "mean response length per agent",
            "tokens",
            lengths,
        ),
    ] {
        chart(&out.join(file), title, y, &series, Style::Markers)?;
    }
    Ok(())
}

/// Runs `mappa inspect`.
pub fn inspect(args: &InspectArgs) -> anyhow::Result<()> {
    let path = args.run.join("trajectories.jsonl");
    let rows: Vec<TrajectoryLine> = read_jsonl(&path)?;
    let t = rows.get(args.trajectory).ok_or_else(|| {
        anyhow!(
            "{}: {} trajectories; --trajectory {} is out of range",
            path.display(),
            rows.len(),
            args.trajectory
        )
    })?;
    println!(
        "trajectory {} (step {}, task {:?}, sample {}): outcome {}",
        args.trajectory, t.step, t.task_id, t.sample, t.outcome
    );
    for a in &t.actions {
        println!(
            "\n=== {} (action {}) | coach {} | reward {} | advantage {}",
            a.role, a.turn, a.score, a.reward, a.advantage_mean
        );
        println!("{}", a.text);
        if let Some(obs) = &a.tool_observation {
            let status = a
                .tool_status
                .and_then(|s| serde_json::to_value(s).ok())
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_else(|| "?".into());
            println!("--- tool output ({status})\n{obs}");
        }
        if !a.rationale.is_empty() {
            println!("--- coach: {}", a.rationale);
        }
    }
    Ok(())
}
