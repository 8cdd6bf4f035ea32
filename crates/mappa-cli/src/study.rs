//! `mappa reproduce NAME` for a manifest with a `[study]`: every arm (credit
//! variants, and the method under other scripted coaches) over every seed,
//! run as child `mappa run` processes a few at a time, then one report with
//! mean and spread across seeds and a verdict on the method against the
//! baseline (see [`crate::study_report`]).
//!
//! The warm start is shared: the first run makes it alone, the others start
//! once it is cached. A finished run (same manifest, same code) is reused,
//! an unfinished one started again.
//!
//! A study has up to three profiles: the study itself (the result),
//! `[study.quick]` (a smoke test for CI) and `[study.validation]` (the same
//! study on other generated problems, for choosing values without looking
//! at the held-out set).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mappa_judge::scripted::Strength;
use mappa_train::manifest::{Manifest, Study, StudyProfile};
use mappa_train::records::{read_jsonl, MetricsLine};

use crate::run::{apply_variant, lock_and_id};

/// Which question an arm answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArmGroup {
    /// A credit variant under the manifest's coach.
    Credit,
    /// The method under another scripted coach.
    Coach,
}

/// One arm of a study.
#[derive(Debug, Clone)]
pub struct Arm {
    /// Shown in the report: the credit variant, or `method, coach X`.
    pub label: String,
    /// The question it answers.
    pub group: ArmGroup,
}

/// One run of a study: an arm at one seed.
struct PlannedRun {
    arm: usize,
    manifest: Manifest,
    dir: PathBuf,
}

/// Which version of a study to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// The study as the manifest says it: the result.
    Full,
    /// `[study.quick]` (`--quick`): a smoke test for CI, not a result.
    Quick,
    /// `[study.validation]` (`--validation`): the study on other generated
    /// problems, where values may be tuned.
    Validation,
}

impl Profile {
    /// The profile's table under `[study]` and flag (`quick`), if any.
    pub fn key(self) -> Option<&'static str> {
        match self {
            Profile::Full => None,
            Profile::Quick => Some("quick"),
            Profile::Validation => Some("validation"),
        }
    }

    /// What the study's name gets: `""`, `"-quick"`, `"-validation"`.
    pub fn suffix(self) -> String {
        self.key().map(|k| format!("-{k}")).unwrap_or_default()
    }

    /// The profile's overrides; an error when the manifest lacks them.
    fn overrides(self, study: &Study) -> Result<Option<&StudyProfile>, String> {
        let table = match self {
            Profile::Full => return Ok(None),
            Profile::Quick => study.quick.as_ref(),
            Profile::Validation => study.validation.as_ref(),
        };
        let key = self.key().unwrap_or_default();
        table
            .map(Some)
            .ok_or_else(|| format!("--{key} needs a [study.{key}] profile in the manifest"))
    }

    /// Seeds per arm under this profile.
    pub fn seeds(self, study: &Study) -> Result<u64, String> {
        let seeds = self
            .overrides(study)?
            .and_then(|p| p.seeds)
            .unwrap_or(study.seeds);
        if seeds == 0 {
            return Err("study.seeds: expected at least 1".into());
        }
        Ok(seeds)
    }
}

/// How to run a study.
pub struct StudyOptions {
    /// Which version of the study.
    pub profile: Profile,
    /// Runs at once.
    pub jobs: usize,
    /// Where the study directory goes.
    pub runs_dir: PathBuf,
}

/// Apply a `+`-joined list of credit variants (`process+scope=none`).
fn apply_variants(manifest: &mut Manifest, variants: &str) -> Result<(), String> {
    variants
        .split('+')
        .try_for_each(|v| apply_variant(manifest, v.trim()))
}

/// Set the scripted coach of a coach arm.
fn apply_coach(manifest: &mut Manifest, coach: &str, study: &Study) -> Result<(), String> {
    let scripted = manifest.coach.scripted.as_mut().ok_or_else(|| {
        format!(
            "study.coaches = [{coach:?}]: the manifest's coach is not scripted ([coach.scripted])"
        )
    })?;
    let (strength, bias) = match coach {
        "weak" => (Strength::Weak, Default::default()),
        "medium" => (Strength::Medium, Default::default()),
        "strong" => (Strength::Strong, Default::default()),
        "biased" if !study.coach_bias.is_empty() => (Strength::Strong, study.coach_bias.clone()),
        "biased" => {
            return Err(
                "study.coaches has \"biased\": set study.coach_bias (an offset per task kind)"
                    .into(),
            )
        }
        other => {
            return Err(format!(
                "study.coaches: {other:?} is not weak, medium, strong or biased"
            ))
        }
    };
    scripted.strength = strength;
    scripted.bias = bias;
    scripted.noise_std = None;
    Ok(())
}

/// A file-name-safe form of an arm label.
fn slug(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect::<String>()
        .split('_')
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("_")
}

/// The manifest of a profile: the profile's `manifest` table merged in. A
/// validation profile must change `data`: otherwise it would evaluate on
/// the held-out set.
pub fn profile_manifest(
    base: &Manifest,
    study: &Study,
    profile: Profile,
) -> Result<Manifest, String> {
    let Some(overrides) = profile.overrides(study)? else {
        return Ok(base.clone());
    };
    let key = profile.key().unwrap_or_default();
    let manifest = base
        .with_overrides(&overrides.manifest)
        .map_err(|e| format!("study.{key}.manifest: {e}"))?;
    if profile == Profile::Validation && manifest.data == base.data {
        return Err(format!(
            "study.validation.manifest: expected it to change [data] (e.g. data.seed): \
             as it stands the validation study would evaluate on {}'s held-out set",
            base.name
        ));
    }
    Ok(manifest)
}

/// The arms of a study and the manifest of each (seed not yet set).
pub fn arms(
    base: &Manifest,
    study: &Study,
    profile: Profile,
) -> Result<Vec<(Arm, Manifest)>, String> {
    let overrides = profile.overrides(study)?;
    let credit = overrides
        .and_then(|p| p.credit.clone())
        .unwrap_or_else(|| study.credit.clone());
    let coaches = overrides
        .and_then(|p| p.coaches.clone())
        .unwrap_or_else(|| study.coaches.clone());
    let base = profile_manifest(base, study, profile)?;
    let mut variants = vec![study.method.clone(), study.baseline.clone()];
    variants.extend(credit);
    variants.dedup();
    let mut out = Vec::new();
    for variant in variants {
        if out
            .iter()
            .any(|(a, _): &(Arm, Manifest)| a.label == variant)
        {
            continue;
        }
        let mut manifest = base.clone();
        apply_variants(&mut manifest, &variant)?;
        out.push((
            Arm {
                label: variant,
                group: ArmGroup::Credit,
            },
            manifest,
        ));
    }
    let base_coach = base
        .coach
        .scripted
        .as_ref()
        .map(|s| (s.strength, s.bias.is_empty()));
    for coach in coaches {
        // The method arm already is the strong-coach arm when the manifest's coach is strong and unbiased.
        if coach == "strong" && base_coach == Some((Strength::Strong, true)) {
            continue;
        }
        let mut manifest = base.clone();
        apply_variants(&mut manifest, &study.method)?;
        apply_coach(&mut manifest, &coach, study)?;
        out.push((
            Arm {
                label: format!("{}, {coach} coach", study.method),
                group: ArmGroup::Coach,
            },
            manifest,
        ));
    }
    Ok(out)
}

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

/// Runs a study; returns the study directory (with `report.md`).
pub fn run_study(base: &Manifest, options: &StudyOptions) -> Result<PathBuf, String> {
    let study = base
        .study
        .as_ref()
        .ok_or_else(|| format!("{}: the manifest has no [study]", base.name))?;
    let profile = options.profile;
    let seeds = profile
        .seeds(study)
        .map_err(|e| format!("{}: {e}", base.name))?;
    let name = format!("{}{}", base.name, profile.suffix());
    let study_dir = options.runs_dir.join(format!("{name}-study"));
    let manifests_dir = study_dir.join("manifests");
    let logs_dir = study_dir.join("logs");
    for dir in [&manifests_dir, &logs_dir] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let arms = arms(base, study, profile)?;
    let mut plan = Vec::new();
    for (index, (arm, manifest)) in arms.iter().enumerate() {
        for s in 0..seeds {
            let mut manifest = manifest.clone();
            manifest.study = None;
            manifest.seed = base.seed + s;
            manifest.name = format!("{name}-{}-s{}", slug(&arm.label), manifest.seed);
            manifest
                .validate()
                .map_err(|e| format!("{}: {e}", arm.label))?;
            let (_, id) = lock_and_id(&manifest)?;
            let dir = study_dir.join(format!("{}-{}", manifest.name, &id[..12]));
            plan.push(PlannedRun {
                arm: index,
                manifest,
                dir,
            });
        }
    }
    let started = Instant::now();
    execute_plan(&plan, &study_dir, &manifests_dir, &logs_dir, options.jobs)?;
    let elapsed = started.elapsed();
    let runs: Vec<(usize, crate::report::RunData)> = plan
        .iter()
        .map(|r| Ok((r.arm, crate::report::load_run(&r.dir)?)))
        .collect::<Result<_, String>>()?;
    let arms: Vec<Arm> = arms.into_iter().map(|(a, _)| a).collect();
    crate::study_report::write(&crate::study_report::StudyData {
        name: &name,
        base_name: &base.name,
        base: &profile_manifest(base, study, profile)?,
        study,
        profile,
        arms: &arms,
        runs: &runs,
        seeds,
        elapsed,
        jobs: options.jobs,
        out: &study_dir,
    })?;
    Ok(study_dir)
}

/// Run every planned run not already finished, `jobs` at a time (one alone
/// until the shared warm start is cached). Each child gets the directory
/// planned here (`--run-dir`): its own run id could differ, since the code
/// version in the lock may change (a file edited) while the study runs.
fn execute_plan(
    plan: &[PlannedRun],
    study_dir: &Path,
    manifests_dir: &Path,
    logs_dir: &Path,
    jobs: usize,
) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("the mappa executable: {e}"))?;
    let todo: Vec<&PlannedRun> = plan
        .iter()
        .filter(|r| !finished(&r.dir, r.manifest.rollout.steps))
        .collect();
    let bar = indicatif::ProgressBar::new(plan.len() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "study [{bar:30}] {pos}/{len} runs ({elapsed}, eta {eta}) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar.inc((plan.len() - todo.len()) as u64);
    let warm_ready = |run: &PlannedRun| -> bool {
        let Some(_) = &run.manifest.warm_start else {
            return true;
        };
        let resolved = run.manifest.resolve().ok();
        resolved.is_some_and(|r| {
            mappa_train::warm_start::cache_dir(&run.manifest, &r, &study_dir.join(".warm-start"))
                .join("done.json")
                .exists()
        })
    };
    let mut queue = todo.into_iter();
    let mut running: Vec<(&PlannedRun, Child, PathBuf)> = Vec::new();
    let mut next = queue.next();
    loop {
        loop {
            // One run alone until the warm start it makes is cached.
            let capacity = match running.first() {
                Some((first, ..)) if !warm_ready(first) => 1,
                _ => jobs.max(1),
            };
            let Some(run) = next.filter(|_| running.len() < capacity) else {
                break;
            };
            if run.dir.exists() {
                // An unfinished run of the same id: start it again from scratch.
                std::fs::remove_dir_all(&run.dir)
                    .map_err(|e| format!("{}: {e}", run.dir.display()))?;
            }
            let manifest_path = manifests_dir.join(format!("{}.toml", run.manifest.name));
            let text = toml::to_string(&run.manifest)
                .map_err(|e| format!("{}: {e}", run.manifest.name))?;
            mappa_core::fs::write_atomic(&manifest_path, text.as_bytes())
                .map_err(|e| e.to_string())?;
            let log = logs_dir.join(format!("{}.log", run.manifest.name));
            let log_file =
                std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
            let child = Command::new(&exe)
                .arg("run")
                .arg(&manifest_path)
                .arg("--run-dir")
                .arg(&run.dir)
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
                .stderr(log_file)
                .spawn()
                .map_err(|e| format!("{}: {e}", exe.display()))?;
            running.push((run, child, log));
            next = queue.next();
        }
        if running.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut i = 0;
        while i < running.len() {
            let status = running[i].1.try_wait().map_err(|e| e.to_string())?;
            let Some(status) = status else {
                i += 1;
                continue;
            };
            let (run, _, log) = running.remove(i);
            if !status.success() || !finished(&run.dir, run.manifest.rollout.steps) {
                for (_, child, _) in &mut running {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(format!(
                    "run {} failed ({status}); its log {}:\n{}",
                    run.manifest.name,
                    log.display(),
                    log_tail(&log)
                ));
            }
            bar.set_message(format!("{} done", run.manifest.name));
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arith() -> Manifest {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../experiments/arith.toml");
        Manifest::load(&root).unwrap()
    }

    #[test]
    fn arms_cover_credit_variants_and_coaches_once() {
        let base = arith();
        let study = base.study.clone().expect("arith.toml has a [study]");
        let arms = arms(&base, &study, Profile::Full).unwrap();
        let labels: Vec<&str> = arms.iter().map(|(a, _)| a.label.as_str()).collect();
        assert_eq!(labels[0], study.method);
        assert_eq!(labels[1], study.baseline);
        let mut unique = labels.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), labels.len(), "{labels:?}");
        for (arm, manifest) in &arms {
            if arm.group == ArmGroup::Coach {
                assert!(manifest.coach.scripted.is_some());
            }
        }
        assert!(arms.iter().any(|(a, _)| a.group == ArmGroup::Coach));
    }

    #[test]
    fn a_run_manifest_round_trips_through_toml() {
        let mut manifest = arith();
        manifest.study = None;
        let text = toml::to_string(&manifest).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.toml");
        std::fs::write(&path, text).unwrap();
        assert_eq!(Manifest::load(&path).unwrap(), manifest);
    }

    #[test]
    fn bad_arms_are_named() {
        let base = arith();
        let mut study = base.study.clone().unwrap();
        study.coaches = vec!["wise".into()];
        let err = arms(&base, &study, Profile::Full).unwrap_err();
        assert!(err.contains("\"wise\""), "{err}");
        study.coaches = vec![];
        study.credit = vec!["processs".into()];
        let err = arms(&base, &study, Profile::Full).unwrap_err();
        assert!(err.contains("processs"), "{err}");
    }

    #[test]
    fn a_validation_profile_must_draw_other_problems() {
        let base = arith();
        let mut study = base.study.clone().unwrap();
        let validation = profile_manifest(&base, &study, Profile::Validation).unwrap();
        assert_ne!(validation.data, base.data);
        assert_eq!(validation.rollout, base.rollout);
        // Overrides that leave [data] alone would evaluate on the held-out set.
        study.validation.as_mut().unwrap().manifest = toml::toml! {
            [rollout]
            steps = 3
        };
        let err = profile_manifest(&base, &study, Profile::Validation).unwrap_err();
        assert!(err.contains("study.validation.manifest"), "{err}");
        study.validation = None;
        let err = arms(&base, &study, Profile::Validation).unwrap_err();
        assert!(err.contains("[study.validation]"), "{err}");
        assert_eq!(Profile::Validation.suffix(), "-validation");
        assert_eq!(Profile::Full.suffix(), "");
    }

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(slug("process, weak coach"), "process_weak_coach");
        assert_eq!(slug("scope=per_prompt_group"), "scope_per_prompt_group");
        assert_eq!(slug("mixed=0.5"), "mixed_0_5");
    }
}
