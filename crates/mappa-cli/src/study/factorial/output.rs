//! What a factorial study writes: `report.md` (the primary contrasts'
//! result first, then a table per factor, the interaction plot, the cells
//! with their warm starts, coach accuracy and error correlation, and
//! uniform batches per arm), `per_seed.csv` (one row per run),
//! `contrasts.json` (the registered contrasts with mappa's p-values),
//! `recompute.py` (recomputes every p-value from those two files with the
//! Python standard library only) and `summary.json`.

use std::path::Path;
use std::time::Duration;

use anyhow::anyhow;
use mappa_train::manifest::{Factorial, Manifest, Study};

use super::super::registration::Registration;
use super::super::render::{describe_coach, pct, registration_text};
use super::super::summarise::StepTally;
use super::super::verdict::{ALPHA, ENDPOINT};
use super::super::Profile;
use super::analysis::{cell_gains, contrasts, gain_by_level, rows, ContrastResult, SeedRow};
use super::design::{CellArms, CSV_COLUMNS};
use super::Ran;
use crate::plot::{chart_over, Point, Series, Style};
use crate::report::RunData;

/// The script that recomputes every p-value without mappa.
const RECOMPUTE_PY: &str = include_str!("recompute.py");

/// Everything a factorial study's outputs are made from.
pub struct FactorialData<'a> {
    /// The study's name (`arith-factorial`, `arith-factorial-quick`).
    pub name: &'a str,
    /// The profile's manifest (before the cells' overrides).
    pub base: &'a Manifest,
    /// The manifest's `[study]`.
    pub study: &'a Study,
    /// Its `[study.factorial]`.
    pub factorial: &'a Factorial,
    /// Which version of the study.
    pub profile: Profile,
    /// The cells and their arms.
    pub cells: &'a [CellArms],
    /// What ran.
    pub ran: &'a Ran,
    /// Seeds (blocks).
    pub seeds: u64,
    /// Wall time (runs reused from an earlier call count as zero).
    pub elapsed: Duration,
    /// Runs at once.
    pub jobs: usize,
    /// The study directory.
    pub out: &'a Path,
    /// A confirmatory study's registration (full profile only).
    pub registration: Option<Result<Registration, String>>,
}

/// Write every output of the study.
pub fn write(data: &FactorialData) -> anyhow::Result<()> {
    let rows = rows(data.cells, data.ran, data.base.seed);
    let results = contrasts(
        &rows,
        data.study,
        data.factorial,
        data.seeds,
        data.base.seed,
    );
    write_csv(&data.out.join("per_seed.csv"), &rows, data)?;
    let contrasts_json = serde_json::json!({
        "method": data.study.method,
        "baseline": data.study.baseline,
        "alpha": ALPHA,
        "contrasts": data.factorial.contrasts,
        "results": results,
    });
    write_file(
        &data.out.join("contrasts.json"),
        &serde_json::to_string_pretty(&contrasts_json)?,
    )?;
    write_file(&data.out.join("recompute.py"), RECOMPUTE_PY)?;
    interaction_plot(data, &rows)?;
    let mut md = header(data);
    md.push_str(&result_section(data, &results));
    md.push_str(&factor_section(data, &rows));
    md.push_str(&cell_section(data, &rows));
    md.push_str(&coach_section(data));
    md.push_str(&setup_section(data));
    write_file(&data.out.join("report.md"), &md)?;
    let summary = serde_json::json!({
        "name": data.name,
        "profile": data.profile.key().unwrap_or("full"),
        "machine": mappa_train::machine::record(),
        "seeds": data.seeds,
        "wall_seconds": data.elapsed.as_secs_f64(),
        "warm_starts": data.ran.tried.iter().map(|((s, c), t)| serde_json::json!({
            "seed": data.base.seed + s, "cell": data.cells[*c].cell.name, "tried": t,
        })).collect::<Vec<_>>(),
        "contrasts": results,
        "registration": match &data.registration {
            Some(Ok(r)) => serde_json::to_value(r)?,
            Some(Err(why)) => serde_json::json!({ "unknown": why }),
            None => serde_json::Value::Null,
        },
    });
    write_file(
        &data.out.join("summary.json"),
        &serde_json::to_string_pretty(&summary)?,
    )
}

/// Write `text` whole or not at all.
fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    Ok(mappa_core::fs::write_atomic(path, text.as_bytes())?)
}

/// `per_seed.csv`: one row per run (its cell's level of every factor in a
/// column of its own), with full-precision numbers.
fn write_csv(path: &Path, rows: &[SeedRow], data: &FactorialData) -> anyhow::Result<()> {
    let err = |e: csv::Error| anyhow!("{}: {e}", path.display());
    let factors: Vec<&str> = data
        .factorial
        .factors
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    let mut out = csv::Writer::from_writer(Vec::new());
    // CSV_COLUMNS's seed and cell, the factors, then the rest of them.
    let (key, values) = CSV_COLUMNS.split_at(2);
    let header: Vec<&str> = [key, &factors, values].concat();
    out.write_record(&header).map_err(err)?;
    for row in rows {
        let cell = data
            .cells
            .iter()
            .find(|c| c.cell.name == row.cell)
            .map(|c| &c.cell.levels);
        let mut record = vec![row.seed.to_string(), row.cell.clone()];
        record.extend(
            factors
                .iter()
                .map(|f| cell.and_then(|l| l.get(*f)).cloned().unwrap_or_default()),
        );
        record.extend([
            row.arm.clone(),
            row.warm_start.to_string(),
            row.start.to_string(),
            row.area.to_string(),
            row.final_accuracy.to_string(),
        ]);
        out.write_record(&record).map_err(err)?;
    }
    let bytes = out
        .into_inner()
        .map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(mappa_core::fs::write_atomic(path, &bytes)?)
}

/// The title, the profile's or registration's note, and the design.
fn header(data: &FactorialData) -> String {
    let mut md = format!(
        "# {}: {} credit against {} credit, factorial\n\n",
        data.name, data.study.method, data.study.baseline
    );
    md.push_str(&match data.profile {
        Profile::Full => registration_text(data.registration.as_ref()),
        Profile::Quick => "> **Quick profile** (`--quick`): a smoke test of the study for CI (warm starts are not held to their bands), with too few steps and seeds to support any claim.\n\n".into(),
        Profile::Validation => "> **Validation profile** (`--validation`): the study on other generated problems, where values may be chosen; not the result.\n\n".into(),
    });
    let factors: Vec<String> = data
        .factorial
        .factors
        .iter()
        .map(|f| format!("{} ({})", f.name, f.levels.join(", ")))
        .collect();
    md.push_str(&format!(
        "{}\n\nFactors: {}; {} cells, each running `{}` and `{}` at every one of {} seeds (a seed is a block: one data order per seed, one warm start per cell and seed, shared by the cell's arms). Endpoint: the {ENDPOINT}. Coach: {}.\n\n",
        data.base.description,
        factors.join(" x "),
        data.cells.len(),
        data.study.method,
        data.study.baseline,
        data.seeds,
        describe_coach(&data.base.coach),
    ));
    md
}

/// The contrasts: the primary ones (Holm) first, then the secondary ones.
fn result_section(data: &FactorialData, results: &[ContrastResult]) -> String {
    let mut md = String::from("## Result\n\n");
    let primary: Vec<&ContrastResult> = results.iter().filter(|r| r.primary).collect();
    let held: Vec<&str> = primary
        .iter()
        .filter(|r| r.holds)
        .map(|r| r.name.as_str())
        .collect();
    md.push_str(&if held.is_empty() {
        format!("**No primary hypothesis holds** at alpha = {ALPHA} after Holm's correction over {} primary contrasts.\n\n", primary.len())
    } else {
        format!("**Holds** at alpha = {ALPHA} after Holm's correction over {} primary contrasts: `{}`.\n\n", primary.len(), held.join("`, `"))
    });
    md.push_str("Each contrast is a per-seed weighted sum of the cells' learning-curve area differences (`process` minus `outcome`, points), tested one-sided by exact sign flips over seeds; the interval is a 95% bootstrap interval of the mean; \"detectable\" is the smallest mean the test detects with 80% power at the seeds run, simulated before the run from the registered spread (`prior_sd`).\n\n| contrast | kind | hypothesis | mean | 95% interval | p | Holm p | holds | detectable (planned sd) |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in results {
        md.push_str(&format!(
            "| `{}` | {} | {} | {:+.1} | {:+.1} to {:+.1} | {:.4} | {} | {} | {} ({:.1}) |\n",
            r.name,
            if r.primary {
                "primary"
            } else {
                "secondary (unadjusted)"
            },
            r.hypothesis,
            100.0 * r.mean,
            100.0 * r.interval.0,
            100.0 * r.interval.1,
            r.p_value,
            r.holm_p_value.map_or("-".into(), |p| format!("{p:.4}")),
            if r.holds { "yes" } else { "no" },
            r.detectable
                .map_or("none".into(), |d| format!("{:+.1}", 100.0 * d)),
            100.0 * r.planned_sd,
        ));
    }
    md.push_str(&format!("\nPer-seed values: `per_seed.csv`; `python3 recompute.py` recomputes every p-value from it and `contrasts.json` without mappa. Seeds: {}.\n\n", data.seeds));
    md
}

/// A table per factor (the mean gain at each level), and the interaction plot.
fn factor_section(data: &FactorialData, rows: &[SeedRow]) -> String {
    let mut md = String::from("## By factor\n\nThe mean `process` minus `outcome` learning-curve area difference at each level, over seeds and the other factors' levels.\n\n");
    for factor in &data.factorial.factors {
        md.push_str(&format!(
            "| {} | mean gain | cell-seeds |\n|---|---|---|\n",
            factor.name
        ));
        let gains = gain_by_level(rows, data.cells, data.study, &factor.name);
        for level in &factor.levels {
            if let Some((_, gain, n)) = gains.iter().find(|(l, ..)| l == level) {
                md.push_str(&format!("| {level} | {:+.1} | {n} |\n", 100.0 * gain));
            }
        }
        md.push('\n');
    }
    if data.factorial.factors.len() == 2 {
        md.push_str("![the gain per cell: the interaction plot](interaction.svg)\n\n");
    }
    md
}

/// The mean gain of the cell with these levels, over seeds.
fn cell_gain(rows: &[SeedRow], cell: &str, study: &Study) -> Option<(f64, f64)> {
    let gains = cell_gains(rows, cell, study);
    (!gains.is_empty()).then(|| mappa_core::stats::mean_sample_std(&gains))
}

/// The interaction plot (two factors): the mean gain against the first
/// factor's levels, one line per level of the second.
fn interaction_plot(data: &FactorialData, rows: &[SeedRow]) -> anyhow::Result<()> {
    let [x, lines] = &data.factorial.factors[..] else {
        return Ok(());
    };
    let x_of = |i: usize, level: &str| level.parse::<f64>().unwrap_or(i as f64);
    let series: Vec<Series> = lines
        .levels
        .iter()
        .map(|line| {
            let points = x.levels.iter().enumerate().filter_map(|(i, level)| {
                let cell = data.cells.iter().find(|c| {
                    c.cell.levels.get(&x.name) == Some(level)
                        && c.cell.levels.get(&lines.name) == Some(line)
                })?;
                let (mean, std) = cell_gain(rows, &cell.cell.name, data.study)?;
                Some(Point {
                    step: x_of(i, level),
                    mean: 100.0 * mean,
                    std: 100.0 * std,
                })
            });
            (format!("{} = {line}", lines.name), points.collect())
        })
        .collect();
    chart_over(
        &data.out.join("interaction.svg"),
        "process minus outcome, per cell (mean ± std over seeds)",
        (&x.name, "learning-curve area gain (points)"),
        &series,
        Style::Markers,
    )
}

/// Per cell: warm starts (tried and replaced), start accuracy, the arms'
/// areas, the gain, and the uniform batches per arm.
fn cell_section(data: &FactorialData, rows: &[SeedRow]) -> String {
    let mut md = String::from("## Cells\n\n| cell | warm starts replaced | start (mean, range) | arm | area (mean ± std) | steps all failed | uniform sets |\n|---|---|---|---|---|---|---|\n");
    for (c, cell) in data.cells.iter().enumerate() {
        let replaced: usize = data
            .ran
            .tried
            .iter()
            .filter(|((_, ci), _)| *ci == c)
            .map(|(_, t)| t.len() - 1)
            .sum();
        let starts: Vec<f64> = rows
            .iter()
            .filter(|r| r.cell == cell.cell.name && r.arm == data.study.method)
            .map(|r| r.start)
            .collect();
        let (lo, hi) = starts
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), s| {
                (lo.min(*s), hi.max(*s))
            });
        let start = format!(
            "{} ({} to {})",
            pct(starts.iter().sum::<f64>() / starts.len().max(1) as f64),
            pct(lo),
            pct(hi)
        );
        for (a, (arm, _)) in cell.arms.iter().enumerate() {
            let areas: Vec<f64> = rows
                .iter()
                .filter(|r| r.cell == cell.cell.name && r.arm == arm.label)
                .map(|r| r.area)
                .collect();
            let (mean, std) = mappa_core::stats::mean_sample_std(&areas);
            let stats = StepTally::of(runs_of(data.ran, c, a));
            md.push_str(&format!(
                "| {} | {} | {} | {} | {} ± {} | {} | {} |\n",
                if a == 0 { cell.cell.name.as_str() } else { "" },
                if a == 0 {
                    replaced.to_string()
                } else {
                    String::new()
                },
                if a == 0 { start.as_str() } else { "" },
                arm.label,
                pct(mean),
                pct(std),
                pct(stats.share(stats.all_failed)),
                stats.uniform_share().map_or("-".into(), pct),
            ));
        }
    }
    md.push_str("\nA warm start is used only if its step-0 held-out accuracy lies in the cell's registered band; one outside it is replaced by the next (counted above). \"Steps all failed\": the share of training steps in which every trajectory failed. \"Uniform sets\": the share of normalisation sets whose rewards were all equal, where `[credit] uniform` recorded them.\n\n");
    md
}

/// The runs of arm `a` of cell `c`, over seeds.
fn runs_of(ran: &Ran, c: usize, a: usize) -> impl Iterator<Item = &RunData> {
    ran.runs
        .iter()
        .filter(move |((_, ci, ai), _)| *ci == c && *ai == a)
        .map(|(_, r)| r)
}

/// Per cell and arm: the coach's measured accuracy and the correlation of
/// its errors with the agents', per role.
fn coach_section(data: &FactorialData) -> String {
    let mut md = String::from("## The coach\n\nPer cell and arm, each role's coach accuracy (the share of training actions whose verdict agreed with the truth) and, after the slash, the correlation (phi) between the coach being wrong and the agent being wrong on the same action (- where undefined).\n\n");
    let mut roles: Vec<String> = Vec::new();
    let mut lines = Vec::new();
    for (c, cell) in data.cells.iter().enumerate() {
        for (a, (arm, _)) in cell.arms.iter().enumerate() {
            let stats = StepTally::of(runs_of(data.ran, c, a));
            for role in stats.errors.keys() {
                if !roles.contains(role) {
                    roles.push(role.clone());
                }
            }
            lines.push((cell.cell.name.clone(), arm.label.clone(), stats.errors));
        }
    }
    if roles.is_empty() {
        md.push_str("Not measured: the coach's truth is unknown (not a scripted coach).\n\n");
        return md;
    }
    md.push_str(&format!(
        "| cell | arm | {} |\n|---|---|{}\n",
        roles.join(" | "),
        "---|".repeat(roles.len())
    ));
    for (cell, arm, errors) in lines {
        let cells: Vec<String> = roles
            .iter()
            .map(|role| {
                errors.get(role).map_or("-".into(), |t| {
                    let phi = t.phi().map_or("-".into(), |p| format!("{p:+.2}"));
                    format!("{} / {phi}", t.coach_accuracy().map_or("-".into(), pct))
                })
            })
            .collect();
        md.push_str(&format!("| {cell} | {arm} | {} |\n", cells.join(" | ")));
    }
    md.push('\n');
    md.push_str(&coach_arms_matched(data));
    md
}

/// The role whose coach accuracy the coach arms are matched on.
const SOLVER: &str = "problem_solver";

/// For each cell with coach arms: the Problem Solver's coach accuracy under
/// each coach arm against the method arm's (a coach arm meant to be as
/// accurate as the manifest's coach should be within 2 points).
fn coach_arms_matched(data: &FactorialData) -> String {
    let mut md = String::new();
    for (c, cell) in data
        .cells
        .iter()
        .enumerate()
        .filter(|(_, c)| c.arms.len() > 2)
    {
        let accuracy = |a: usize| {
            let stats = StepTally::of(runs_of(data.ran, c, a));
            stats.errors.get(SOLVER)?.coach_accuracy()
        };
        let Some(method) = accuracy(0) else {
            continue;
        };
        for a in 2..cell.arms.len() {
            if let Some(other) = accuracy(a) {
                md.push_str(&format!(
                    "In cell {}, the {SOLVER}'s coach accuracy under `{}` is {} against {} under the manifest's coach: {:+.1} points{}.\n\n",
                    cell.cell.name,
                    cell.arms[a].0.label,
                    pct(other),
                    pct(method),
                    100.0 * (other - method),
                    if (other - method).abs() <= 0.02 { " (within 2 points)" } else { " (**not within 2 points**)" },
                ));
            }
        }
    }
    md
}

/// Seeds, warm starts, time and machine.
fn setup_section(data: &FactorialData) -> String {
    let replaced: usize = data.ran.tried.values().map(|t| t.len() - 1).sum();
    let m = mappa_train::machine::record();
    format!(
        "## Setup\n\n- Seeds {} to {} ({} blocks); {} warm starts replaced in all.\n- Manifests of every run: `manifests/`; logs: `logs/`; numbers: `per_seed.csv`, `contrasts.json`, `summary.json`.\n- Wall time: {:.1} min with {} runs at once (runs reused from an earlier call count as zero).\n- Machine: {}, {}, {} threads, {} build.\n",
        data.base.seed,
        data.base.seed + data.seeds.max(1) - 1,
        data.seeds,
        replaced,
        data.elapsed.as_secs_f64() / 60.0,
        data.jobs,
        m["cpu_model"].as_str().unwrap_or("unknown CPU"),
        m["arch"].as_str().unwrap_or(""),
        m["threads"],
        m["build_profile"].as_str().unwrap_or(""),
    )
}
