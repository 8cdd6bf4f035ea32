//! `mappa coach score --config COACH.toml --input actions.jsonl`: score a
//! file of action contexts with the configured coach (HTTP, local model or
//! scripted) and write one JSON line per action. The same code path as the
//! training pipelines; use it to try a rubric or a coach model without
//! training. A summary (scores, fallbacks per role, tokens, cost) goes to
//! stderr, and with `--report` to a JSON file. Input and output formats,
//! and the configuration: docs/coach.md.

use anyhow::anyhow;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};
use mappa_judge::cache::CacheMode;
use mappa_judge::config::CoachConfig;
use mappa_judge::ActionContext;
use serde_json::json;

/// Subcommands of `mappa coach`.
#[derive(Subcommand, Debug)]
pub enum CoachCommand {
    /// Score action contexts (JSON lines) and write scores (JSON lines).
    Score(ScoreArgs),
}

/// Arguments of `mappa coach score`.
#[derive(Args, Debug)]
pub struct ScoreArgs {
    /// The coach configuration (TOML; schema in docs/coach.md).
    #[arg(long)]
    config: PathBuf,
    /// Use the cache this way instead of the configuration's `cache_mode`
    /// (`replay`: cached answers only, no request, no API key needed).
    #[arg(long, value_enum)]
    cache_mode: Option<CacheModeArg>,
    /// Action contexts, one JSON object per line (`-` for standard input).
    #[arg(long)]
    input: PathBuf,
    /// Where to write the scores (default: standard output).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Also write the coach's report (counts per role, fallbacks, tokens, cost) as JSON.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Actions sent to the coach per batch.
    #[arg(long, default_value_t = 64)]
    batch: usize,
}

/// `--cache-mode` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum CacheModeArg {
    /// No cache: every action is asked.
    Off,
    /// Cached answers are used, the others asked and stored.
    ReadWrite,
    /// Cached answers only; a miss is an error.
    Replay,
}

impl From<CacheModeArg> for CacheMode {
    fn from(mode: CacheModeArg) -> Self {
        match mode {
            CacheModeArg::Off => CacheMode::Off,
            CacheModeArg::ReadWrite => CacheMode::ReadWrite,
            CacheModeArg::Replay => CacheMode::Replay,
        }
    }
}

/// Runs `mappa coach ...`.
pub fn run(command: &CoachCommand) -> anyhow::Result<()> {
    match command {
        CoachCommand::Score(args) => score(args),
    }
}

fn read_actions(args: &ScoreArgs) -> anyhow::Result<Vec<ActionContext>> {
    let source = args.input.display().to_string();
    let reader: Box<dyn BufRead> = if source == "-" {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(&args.input).map_err(|e| anyhow!("{source}: {e}"))?;
        Box::new(BufReader::new(file))
    };
    let mut actions = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| anyhow!("{source}:{}: {e}", i + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut action: ActionContext = serde_json::from_str(&line).map_err(|e| {
            anyhow!(
                "{source}:{}: {e} (expected an action context: task, role, agent_input, output, \
                 and optionally id, tool_observation, files, ground_truth, is_last_agent, solution)",
                i + 1
            )
        })?;
        if action.id.is_empty() {
            action.id = format!("line-{}", i + 1);
        }
        actions.push(action);
    }
    Ok(actions)
}

fn score(args: &ScoreArgs) -> anyhow::Result<()> {
    if args.batch == 0 {
        return Err(anyhow!("--batch 0: expected at least 1"));
    }
    let mut config = CoachConfig::load(&args.config)?;
    if let Some(mode) = args.cache_mode {
        config.cache_mode = mode.into();
    }
    let coach = config.build()?;
    let actions = read_actions(args)?;

    // Into a file: all or nothing (written whole at the end, through a
    // temporary file and a rename), so a failed run (a replay miss, a
    // refused request) leaves the previous file or none. To stdout: as it comes.
    let mut buffered = Vec::new();
    let mut stdout = std::io::stdout().lock();
    let out: &mut dyn Write = match &args.output {
        Some(_) => &mut buffered,
        None => &mut stdout,
    };
    let progress = mappa_train::progress::bar(
        actions.len(),
        "{msg} [{bar:30}] {pos}/{len} actions ({elapsed}, eta {eta})",
        true,
    );
    progress.set_message(format!("scoring with {}", coach.name()));
    let (mut answered, mut total) = (0usize, 0.0);
    for chunk in actions.chunks(args.batch) {
        let scores = coach.score_batch(chunk)?;
        for (action, score) in chunk.iter().zip(&scores) {
            if !score.fallback {
                answered += 1;
                total += score.score;
            }
            let line = json!({ "id": action.id, "role": action.role, "score": score });
            writeln!(out, "{line}").map_err(|e| anyhow!("writing scores: {e}"))?;
        }
        progress.inc(chunk.len() as u64);
    }
    out.flush().map_err(|e| anyhow!("writing scores: {e}"))?;
    if let Some(path) = &args.output {
        mappa_core::fs::write_atomic(path, &buffered)?;
    }
    progress.finish_and_clear();

    let report = coach.report();
    let mean = if answered > 0 {
        format!("{:.2}", total / answered as f64)
    } else {
        "-".into()
    };
    eprintln!(
        "scored {} actions with {}: mean score {mean} over the {answered} with a score \
         (fallbacks excluded)",
        actions.len(),
        report.coach,
    );
    for (role, c) in &report.roles {
        eprintln!(
            "  {role}: {} scored, {} fallbacks ({} format, {} request-failed), {} re-prompts, \
             {} from cache",
            c.scored,
            c.fallbacks,
            c.fallbacks - c.request_failures,
            c.request_failures,
            c.reprompts,
            c.cache_hits
        );
    }
    if report.usage.requests > 0 {
        eprintln!(
            "  {} requests, {} prompt + {} completion tokens, estimated cost {:.4} USD",
            report.usage.requests,
            report.usage.prompt_tokens,
            report.usage.completion_tokens,
            report.usage.estimated_cost_usd
        );
    }
    if let Some(path) = &args.report {
        let text = serde_json::to_string_pretty(&report)?;
        mappa_core::fs::write_atomic(path, text.as_bytes())?;
    }
    Ok(())
}
