//! Executing a study's plan: every run not already finished, as child
//! `mappa run` processes a few at a time, a run never beside another that is
//! making the warm start it needs; a failed run stops the others and reports
//! its log.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{anyhow, bail};
use mappa_train::records::{read_jsonl, MetricsLine};

use super::plan::PlannedRun;

/// Whether a run directory holds a finished run: its last line is the final evaluation.
fn finished(dir: &Path, steps: usize) -> bool {
    read_jsonl::<MetricsLine>(&dir.join("metrics.jsonl"))
        .ok()
        .and_then(|lines| lines.last().cloned())
        .is_some_and(|m| m.as_eval().is_some_and(|e| e.step == steps))
}

/// The last lines of a child's log, for an error message.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A child `mappa run` in progress: its run, process and log.
type Running<'p> = (&'p PlannedRun, Child, PathBuf);

/// Start one planned run as a child process writing to its log; an
/// unfinished run of the same id is started again from scratch.
fn spawn(
    run: &PlannedRun,
    exe: &Path,
    manifests_dir: &Path,
    logs_dir: &Path,
) -> anyhow::Result<(Child, PathBuf)> {
    if run.dir.exists() {
        std::fs::remove_dir_all(&run.dir).map_err(|e| anyhow!("{}: {e}", run.dir.display()))?;
    }
    let manifest_path = manifests_dir.join(format!("{}.toml", run.manifest.name));
    let text = toml::to_string(&run.manifest).map_err(|e| anyhow!("{}: {e}", run.manifest.name))?;
    mappa_core::fs::write_atomic(&manifest_path, text.as_bytes())?;
    let log = logs_dir.join(format!("{}.log", run.manifest.name));
    let log_file = std::fs::File::create(&log).map_err(|e| anyhow!("{}: {e}", log.display()))?;
    let child = Command::new(exe)
        .arg("run")
        .arg(&manifest_path)
        .arg("--run-dir")
        .arg(&run.dir)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .map_err(|e| anyhow!("{}: {e}", exe.display()))?;
    Ok((child, log))
}

/// Collect the children that ended; a failed one stops all the others and
/// is reported with the end of its log.
fn reap(running: &mut Vec<Running<'_>>, bar: &indicatif::ProgressBar) -> anyhow::Result<()> {
    let mut i = 0;
    while i < running.len() {
        let Some(status) = running[i].1.try_wait()? else {
            i += 1;
            continue;
        };
        let (run, _, log) = running.remove(i);
        if !status.success() || !finished(&run.dir, run.manifest.rollout.steps) {
            for (_, child, _) in running.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
            bail!(
                "run {} failed ({status}); its log {}:\n{}",
                run.manifest.name,
                log.display(),
                log_tail(&log)
            );
        }
        bar.set_message(format!("{} done", run.manifest.name));
        bar.inc(1);
    }
    Ok(())
}

/// Run every planned run not already finished, `jobs` at a time, in plan
/// order, except that a run waiting while another makes the warm start it
/// needs lets later runs go first. Each child gets the directory
/// planned here (`--run-dir`): its own run id could differ, since the code
/// version in the lock may change (a file edited) while the study runs.
pub fn execute_plan(
    plan: &[PlannedRun],
    manifests_dir: &Path,
    logs_dir: &Path,
    jobs: usize,
) -> anyhow::Result<()> {
    let exe = std::env::current_exe().map_err(|e| anyhow!("the mappa executable: {e}"))?;
    let todo: Vec<&PlannedRun> = plan
        .iter()
        .filter(|r| !finished(&r.dir, r.manifest.rollout.steps))
        .collect();
    let bar = mappa_train::progress::bar(
        plan.len(),
        "study [{bar:30}] {pos}/{len} runs ({elapsed}, eta {eta}) {msg}",
        true,
    );
    bar.inc((plan.len() - todo.len()) as u64);
    let warm_ready = |run: &PlannedRun| run.warm_start_done.as_ref().is_none_or(|d| d.exists());
    // A run waits while another run is making the warm start it needs.
    let may_start = |run: &PlannedRun, running: &[Running<'_>]| {
        warm_ready(run)
            || !running
                .iter()
                .any(|(other, ..)| other.warm_start_done == run.warm_start_done)
    };
    let mut queue = todo;
    let mut running: Vec<Running<'_>> = Vec::new();
    while !queue.is_empty() || !running.is_empty() {
        // The first queued run that may start (a later seed's run goes ahead
        // of one waiting for its warm start).
        while running.len() < jobs.max(1) {
            let Some(next) = queue.iter().position(|run| may_start(run, &running)) else {
                break;
            };
            let run = queue.remove(next);
            let (child, log) = spawn(run, &exe, manifests_dir, logs_dir)?;
            running.push((run, child, log));
        }
        std::thread::sleep(Duration::from_millis(200));
        reap(&mut running, &bar)?;
    }
    bar.finish_and_clear();
    Ok(())
}
