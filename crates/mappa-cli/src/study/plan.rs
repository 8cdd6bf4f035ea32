//! Planning a study: its arms (credit variants, and the method under other
//! scripted coaches), each arm's manifest per seed, and the run directory
//! each run goes to.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail};
use mappa_judge::config::Judge;
use mappa_judge::scripted::Strength;
use mappa_train::manifest::{Manifest, Study};

use super::{Arm, ArmGroup, Profile};
use crate::rundir::lock_and_id;

/// Apply one `--credit` variant to a manifest.
pub fn apply_variant(manifest: &mut Manifest, variant: &str) -> anyhow::Result<()> {
    let (key, value) = variant
        .split_once('=')
        .map_or((variant, None), |(k, v)| (k, Some(v)));
    let number = |v: Option<&str>| -> anyhow::Result<f64> {
        v.ok_or_else(|| anyhow!("{variant:?}: expected {key}=NUMBER"))?
            .parse()
            .map_err(|_| anyhow!("{variant:?}: {v:?} is not a number"))
    };
    let strategy = match key {
        "scope" => {
            let scope = value.ok_or_else(|| anyhow!("{variant:?}: expected scope=NAME"))?;
            manifest.credit.scope = serde_json::from_value(serde_json::json!(scope))
                .map_err(|_| anyhow!("{variant:?}: unknown scope (per_agent_global, all_agents_global, per_prompt_group, group_mean_then_global, none)"))?;
            return Ok(());
        }
        "uniform" | "uniform_floor" => {
            let handling = match (key, value) {
                ("uniform", Some(how @ ("keep" | "skip"))) => serde_json::json!(how),
                ("uniform_floor", _) => serde_json::json!({ "std_floor": number(value)? }),
                _ => bail!(
                    "{variant:?}: expected uniform=keep, uniform=skip or uniform_floor=NUMBER"
                ),
            };
            manifest.credit.uniform = serde_json::from_value(handling)?;
            return manifest.validate().map_err(|e| anyhow!("{variant:?}: {e}"));
        }
        "mixed" => serde_json::json!({ "kind": "mixed", "alpha": number(value)? }),
        "discounted_outcome" => {
            serde_json::json!({ "kind": "discounted_outcome", "gamma": number(value)? })
        }
        kind => serde_json::json!({ "kind": kind }),
    };
    manifest.credit.strategy = serde_json::from_value(strategy)
        .map_err(|e| anyhow!("{variant:?}: {e} (strategies: process, outcome, outcome_final_agent, mixed=A, discounted_outcome=G, min_form)"))?;
    manifest.validate().map_err(|e| anyhow!("{variant:?}: {e}"))
}

/// Apply a `+`-joined list of credit variants (`process+scope=none`).
pub fn apply_variants(manifest: &mut Manifest, variants: &str) -> anyhow::Result<()> {
    variants
        .split('+')
        .try_for_each(|v| apply_variant(manifest, v.trim()))
}

/// Set the scripted coach of a coach arm.
pub(super) fn apply_coach(
    manifest: &mut Manifest,
    coach: &str,
    study: &Study,
) -> anyhow::Result<()> {
    let Judge::Scripted(scripted) = &mut manifest.coach.judge else {
        bail!(
            "study.coaches = [{coach:?}]: the manifest's coach is not scripted ([coach.scripted])"
        );
    };
    if let Some(overrides) = study.coach_arms.get(coach) {
        let mut scripted = toml::Table::new();
        scripted.insert("scripted".into(), toml::Value::Table(overrides.clone()));
        let mut table = toml::Table::new();
        table.insert("coach".into(), toml::Value::Table(scripted));
        *manifest = manifest
            .with_overrides(&table)
            .map_err(|e| anyhow!("study.coach_arms.{coach}: {e}"))?;
        if let Judge::Scripted(scripted) = &manifest.coach.judge {
            scripted
                .validate()
                .map_err(|e| anyhow!("study.coach_arms.{coach}: {e}"))?;
        }
        return Ok(());
    }
    let (strength, bias) = match coach {
        "weak" => (Strength::Weak, Default::default()),
        "medium" => (Strength::Medium, Default::default()),
        "strong" => (Strength::Strong, Default::default()),
        "biased" if !study.coach_bias.is_empty() => (Strength::Strong, study.coach_bias.clone()),
        "biased" => {
            bail!("study.coaches has \"biased\": set study.coach_bias (an offset per task kind)")
        }
        other => {
            return Err(anyhow!(
                "study.coaches: {other:?} is not a name of study.coach_arms, nor weak, medium, strong or biased"
            ))
        }
    };
    scripted.strength = strength;
    scripted.bias = bias;
    scripted.noise_std = None;
    Ok(())
}

/// A file-name-safe form of an arm label.
pub(super) fn slug(label: &str) -> String {
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
) -> anyhow::Result<Manifest> {
    let Some(overrides) = profile.overrides(study)? else {
        return Ok(base.clone());
    };
    let key = profile.key().unwrap_or_default();
    let manifest = base
        .with_overrides(&overrides.manifest)
        .map_err(|e| anyhow!("study.{key}.manifest: {e}"))?;
    if profile == Profile::Validation && manifest.data == base.data {
        return Err(anyhow!(
            "study.validation.manifest: expected it to change [data] (e.g. data.seed): \
             as it stands the validation study would evaluate on {}'s held-out set",
            base.name
        ));
    }
    Ok(manifest)
}

/// The arms of a `[study]` and the manifest of each (seed not yet set):
/// the method, the baseline, further credit variants, then the coach arms.
pub fn arms(
    base: &Manifest,
    study: &Study,
    profile: Profile,
) -> anyhow::Result<Vec<(Arm, Manifest)>> {
    let overrides = profile.overrides(study)?;
    let credit = overrides
        .and_then(|p| p.credit.clone())
        .unwrap_or_else(|| study.credit.clone());
    let coaches = overrides
        .and_then(|p| p.coaches.clone())
        .unwrap_or_else(|| study.coaches.clone());
    if study.method == study.baseline {
        bail!(
            "study: method and baseline are both {:?}; a claim compares two different arms",
            study.method
        );
    }
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
    let base_coach = match &base.coach.judge {
        Judge::Scripted(s) => Some((s.strength, s.bias.is_empty())),
        _ => None,
    };
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
                group: ArmGroup::Coach(coach),
            },
            manifest,
        ));
    }
    Ok(out)
}

/// One run of a study: an arm at one seed.
pub struct PlannedRun {
    /// The arm's index.
    pub arm: usize,
    /// The run's manifest (seed and name set).
    pub manifest: Manifest,
    /// Its run directory.
    pub dir: PathBuf,
    /// The `done.json` of the warm start it makes or reuses, if any.
    pub warm_start_done: Option<PathBuf>,
}

/// Offset everything a warm start draws from (the teacher's and the
/// fine-tuning's seed, the models' initialisation) by `offset`.
fn offset_warm_start(manifest: &mut Manifest, offset: u64) {
    if let Some(warm) = &mut manifest.warm_start {
        warm.sft.seed = warm.sft.seed.wrapping_add(offset);
    }
    for model in manifest.models.values_mut() {
        model.init_seed = model.init_seed.map(|s| s.wrapping_add(offset));
    }
}

/// Every run of `arms` over `seeds` seeds (the base seed, +1, +2, ...),
/// named `NAME-ARM-sSEED` in `study_dir`, seed by seed (every arm of a seed
/// before the next seed). With `vary_warm_start`, each seed makes its own
/// warm start ([`Study::vary_warm_start`]).
pub fn plan_runs(
    name: &str,
    base_seed: u64,
    arms: &[(Arm, Manifest)],
    seeds: u64,
    vary_warm_start: bool,
    study_dir: &Path,
) -> anyhow::Result<Vec<PlannedRun>> {
    let mut plan = Vec::new();
    for s in 0..seeds {
        for (index, (arm, manifest)) in arms.iter().enumerate() {
            let offset = vary_warm_start.then_some(s);
            let run_name = format!("{name}-{}-s{}", slug(&arm.label), base_seed + s);
            plan.push(plan_run(
                (index, &arm.label),
                manifest,
                (base_seed + s, offset),
                run_name,
                study_dir,
            )?);
        }
    }
    Ok(plan)
}

/// One run: arm `index` (`label`, for errors) from its `manifest`, at
/// `seed` with the warm start offset by `offset` (none: the manifest's
/// own), named `run_name`, in `study_dir`.
pub(super) fn plan_run(
    (index, label): (usize, &str),
    manifest: &Manifest,
    (seed, offset): (u64, Option<u64>),
    run_name: String,
    study_dir: &Path,
) -> anyhow::Result<PlannedRun> {
    let mut manifest = manifest.clone();
    manifest.study = None;
    manifest.seed = seed;
    if let Some(offset) = offset {
        offset_warm_start(&mut manifest, offset);
    }
    manifest.name = run_name;
    manifest.validate().map_err(|e| anyhow!("{label}: {e}"))?;
    let (lock, id) = lock_and_id(&manifest)?;
    let warm_start_done = manifest.warm_start.as_ref().map(|_| {
        mappa_train::warm_start::cache_dir(
            &manifest,
            &lock.resolved,
            &study_dir.join(".warm-start"),
        )
        .join("done.json")
    });
    let dir = study_dir.join(format!("{}-{}", manifest.name, &id[..12]));
    Ok(PlannedRun {
        arm: index,
        manifest,
        dir,
        warm_start_done,
    })
}

/// The arms of an ablation: one per credit variant, in order.
pub fn variant_arms(base: &Manifest, variants: &[String]) -> anyhow::Result<Vec<(Arm, Manifest)>> {
    let mut out: Vec<(Arm, Manifest)> = Vec::new();
    for variant in variants {
        if out.iter().any(|(a, _)| &a.label == variant) {
            bail!("--credit names {variant:?} twice");
        }
        let mut manifest = base.clone();
        apply_variants(&mut manifest, variant)?;
        out.push((
            Arm {
                label: variant.clone(),
                group: ArmGroup::Credit,
            },
            manifest,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn experiment(name: &str) -> Manifest {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../experiments")
            .join(format!("{name}.toml"));
        Manifest::load(&root).unwrap()
    }

    fn arith() -> Manifest {
        experiment("arith")
    }

    #[test]
    fn arms_cover_credit_variants_and_coaches_once() {
        let base = experiment("arith-sweep");
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
            if matches!(arm.group, ArmGroup::Coach(_)) {
                assert!(matches!(manifest.coach.judge, Judge::Scripted(_)));
            }
        }
        assert!(arms
            .iter()
            .any(|(a, _)| matches!(a.group, ArmGroup::Coach(_))));
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
        let err = arms(&base, &study, Profile::Full).unwrap_err().to_string();
        assert!(err.contains("\"wise\""), "{err}");
        study.coaches = vec![];
        study.credit = vec!["processs".into()];
        let err = arms(&base, &study, Profile::Full).unwrap_err().to_string();
        assert!(err.contains("processs"), "{err}");
        study.credit = vec![];
        study.baseline = study.method.clone();
        let err = arms(&base, &study, Profile::Full).unwrap_err().to_string();
        assert!(err.contains("method and baseline"), "{err}");
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
        let err = profile_manifest(&base, &study, Profile::Validation)
            .unwrap_err()
            .to_string();
        assert!(err.contains("study.validation.manifest"), "{err}");
        study.validation = None;
        let err = arms(&base, &study, Profile::Validation)
            .unwrap_err()
            .to_string();
        assert!(err.contains("[study.validation]"), "{err}");
        assert_eq!(Profile::Validation.suffix(), "-validation");
        assert_eq!(Profile::Full.suffix(), "");
    }

    #[test]
    fn a_confirmatory_study_needs_enough_seeds_to_reach_alpha() {
        let mut study = arith().study.unwrap();
        assert!(study.confirmatory);
        assert_eq!(Profile::Full.seeds(&study).unwrap(), study.seeds);
        study.seeds = 4;
        let err = Profile::Full.seeds(&study).unwrap_err().to_string();
        assert!(
            err.contains("study.seeds = 4") && err.contains("at least 5"),
            "{err}"
        );
        // Its smoke test, and an exploratory study, may have fewer.
        assert!(Profile::Quick.seeds(&study).unwrap() < 5);
        study.confirmatory = false;
        assert_eq!(Profile::Full.seeds(&study).unwrap(), 4);
    }

    #[test]
    fn seeds_share_a_warm_start_unless_they_vary_it() {
        let base = arith();
        let study = base.study.clone().unwrap();
        let arms: Vec<_> = arms(&base, &study, Profile::Full)
            .unwrap()
            .into_iter()
            .take(2)
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let warm_starts = |vary: bool| {
            let plan = plan_runs("s", 1, &arms, 2, vary, dir.path()).unwrap();
            // Seed by seed: both arms of seed 1, then both of seed 2.
            let order: Vec<(usize, u64)> = plan.iter().map(|r| (r.arm, r.manifest.seed)).collect();
            assert_eq!(order, [(0, 1), (1, 1), (0, 2), (1, 2)]);
            let mut paths: Vec<_> = plan
                .into_iter()
                .map(|r| r.warm_start_done.unwrap())
                .collect();
            // The arms of one seed always share theirs.
            assert_eq!(paths[0], paths[1]);
            assert_eq!(paths[2], paths[3]);
            paths.dedup();
            paths.len()
        };
        assert_eq!(warm_starts(false), 1);
        assert_eq!(warm_starts(true), 2);
    }

    #[test]
    fn coach_arms_override_the_scripted_coach() {
        let base = arith();
        let mut study = base.study.clone().unwrap();
        study.credit = vec![];
        study
            .coach_arms
            .insert("eps_0_3".into(), toml::toml! { slip_rate = 0.3 });
        study.coaches = vec!["eps_0_3".into()];
        let arms = arms(&base, &study, Profile::Full).unwrap();
        let (arm, manifest) = arms.last().unwrap();
        assert_eq!(arm.label, format!("{}, eps_0_3 coach", study.method));
        let Judge::Scripted(scripted) = &manifest.coach.judge else {
            panic!("scripted")
        };
        assert_eq!(scripted.slip_rate, 0.3);
        // The other arms keep the manifest's coach.
        let Judge::Scripted(first) = &arms[0].1.coach.judge else {
            panic!("scripted")
        };
        assert_ne!(first.slip_rate, 0.3);
        // Bad values and unknown keys are named.
        for (name, table, key) in [
            ("bad", toml::toml! { slip_rate = 1.5 }, "slip_rate"),
            ("typo", toml::toml! { slip_rat = 0.1 }, "slip_rat"),
        ] {
            study.coach_arms.insert(name.into(), table);
            study.coaches = vec![name.into()];
            let err = arms_err(&base, &study);
            let named = format!("study.coach_arms.{name}");
            assert!(err.contains(&named) && err.contains(key), "{err}");
        }
    }

    fn arms_err(base: &Manifest, study: &Study) -> String {
        arms(base, study, Profile::Full).unwrap_err().to_string()
    }

    #[test]
    fn slugs_are_file_names() {
        assert_eq!(slug("process, weak coach"), "process_weak_coach");
        assert_eq!(slug("scope=per_prompt_group"), "scope_per_prompt_group");
        assert_eq!(slug("mixed=0.5"), "mixed_0_5");
    }
}
