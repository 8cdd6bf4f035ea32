//! The supervised warm start of CPU-scale experiments: the task family's
//! scripted teacher ([`crate::tasks::TaskFamily::teacher`]) runs the
//! workflow on a pool of tasks of its own (none held out), making mistakes
//! at a set rate per role; each agent's model is fine-tuned on its role's
//! demonstrations. The result is an imperfect starting system whose errors
//! come from known agents. Tuned models are cached under a hash of
//! everything they depend on, the code that makes them included, so
//! repeated runs (other seeds, other credit arms) reuse them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use mappa_agents::{RolloutEngine, TaskInput, Trajectory, Workflow};
use mappa_core::hash::sha256_hex;
use mappa_env::sandbox::Sandbox;
use mappa_model::weights::save_transformer;
use mappa_model::AutodiffModelBackend;
use mappa_model::{ChatTemplate, HfTokenizer, StorageDtype, Transformer};
use serde_json::{json, Value};

use crate::manifest::{Manifest, WarmStart};
use crate::sft::{encode_demonstration, supervised_finetune};
use crate::TrainError;

/// Files copied next to the tuned weights so that the directory is a full checkpoint.
const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

/// The source of the code that makes warm-started models: this file, the
/// supervised fine-tuning, and the task families (their teachers). Part of
/// the cache key, so that edited teacher or SFT code never reuses models it
/// did not make. (Changes to the model's numerics are covered by
/// [`mappa_model::kernels::SUMMATION_ORDER`] and the crate version.)
const CODE: &[&str] = &[
    include_str!("warm_start.rs"),
    include_str!("sft.rs"),
    include_str!("tasks/mod.rs"),
    include_str!("tasks/generated_math.rs"),
    include_str!("tasks/generated_tabular.rs"),
    include_str!("tasks/math_file.rs"),
    include_str!("tasks/tabular.rs"),
];

/// sha256 over [`CODE`].
fn code_sha256() -> String {
    sha256_hex(CODE.concat().as_bytes())
}

/// The directory of the tuned models for this manifest (under `cache_root`).
pub fn cache_dir(manifest: &Manifest, resolved: &Value, cache_root: &Path) -> PathBuf {
    let key = json!({
        "code_sha256": code_sha256(),
        "mappa": env!("CARGO_PKG_VERSION"),
        "warm_start": manifest.warm_start,
        "models": manifest.models.iter().map(|(r, m)| (r.clone(), json!({ "init_seed": m.init_seed }))).collect::<BTreeMap<_, _>>(),
        "resolved": resolved,
        "data": manifest.data,
        "summation_order": mappa_model::kernels::SUMMATION_ORDER,
    });
    cache_root.join(format!(
        "warm-start-{}",
        &sha256_hex(key.to_string().as_bytes())[..16]
    ))
}

/// The teacher's demonstrations: one rollout of its tasks (in `dir`'s
/// scratch directories, removed afterwards).
fn demonstrations(
    manifest: &Manifest,
    warm: &WarmStart,
    workflow: &Workflow,
    roles: &[String],
    held_out: &[TaskInput],
    sandbox: &Sandbox,
    dir: &Path,
) -> Result<Vec<Trajectory>, TrainError> {
    let work = dir.with_extension("work");
    let data = dir.with_extension("data");
    let teacher = manifest
        .data
        .family()
        .teacher(warm, roles, held_out, &data)?;
    let policies = teacher
        .policies
        .iter()
        .map(|p| p as &dyn mappa_agents::Policy)
        .collect();
    let trajectories =
        RolloutEngine::new(workflow, policies, sandbox, &work)?.run(&teacher.tasks, 1)?;
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(&data);
    Ok(trajectories)
}

/// Fine-tune one role's model on its demonstrations and save it (with the
/// tokenizer files) to `target`; returns the role's entry of `done.json`.
fn tune_role<B: AutodiffModelBackend>(
    warm: &WarmStart,
    agent: usize,
    (model, source): &(Transformer<B>, PathBuf),
    trajectories: &[Trajectory],
    target: &Path,
    progress: &mut dyn FnMut(usize, f64),
) -> Result<Value, TrainError> {
    let tokenizer = HfTokenizer::from_dir(source).map_err(|e| TrainError::model_at(source, e))?;
    let template = ChatTemplate::from_tokenizer(&tokenizer)?;
    let demos = trajectories
        .iter()
        .flat_map(|t| t.actions.iter().filter(|a| a.agent == agent))
        .take(warm.demonstrations)
        .map(|a| encode_demonstration(&a.messages, &a.text, &tokenizer, &template))
        .collect::<Result<Vec<_>, _>>()?;
    let (tuned, losses) = supervised_finetune(model.clone(), &demos, &warm.sft, progress)?;
    save_transformer(&tuned, target, StorageDtype::F32)?;
    for file in TOKENIZER_FILES {
        if source.join(file).exists() {
            std::fs::copy(source.join(file), target.join(file))
                .map_err(|e| TrainError::io(&target.join(file), e))?;
        }
    }
    Ok(json!({ "demonstrations": demos.len(), "epoch_losses": losses }))
}

/// Make (or reuse) the warm-started model of every role; returns their directories.
pub fn ensure<B: AutodiffModelBackend>(
    manifest: &Manifest,
    warm: &WarmStart,
    workflow: &Workflow,
    initial: BTreeMap<String, (Transformer<B>, PathBuf)>,
    held_out: &[TaskInput],
    sandbox: &Sandbox,
    dir: &Path,
) -> Result<BTreeMap<String, PathBuf>, TrainError> {
    let roles: Vec<String> = workflow.agents.iter().map(|a| a.role.clone()).collect();
    let out: BTreeMap<String, PathBuf> = roles.iter().map(|r| (r.clone(), dir.join(r))).collect();
    if dir.join("done.json").exists() {
        return Ok(out);
    }
    let started = std::time::Instant::now();
    let trajectories = demonstrations(manifest, warm, workflow, &roles, held_out, sandbox, dir)?;
    let demonstrated = started.elapsed();
    let bar = crate::progress::bar(
        roles.len() * warm.sft.epochs,
        "warm start [{bar:30}] {pos}/{len} epochs ({elapsed}, eta {eta}) {msg}",
        true,
    );
    // The roles' models are independent: tune them at once, one thread each.
    let results: Vec<Result<Value, TrainError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = roles
            .iter()
            .enumerate()
            .map(|(agent, role)| {
                let (bar, trajectories, out, initial) = (&bar, &trajectories, &out, &initial);
                scope.spawn(move || {
                    let model = initial.get(role).ok_or_else(|| {
                        TrainError::Config(format!("warm_start: no model for {role}"))
                    })?;
                    // The roles are this phase's parallelism. A role's
                    // kernels run on a one-thread pool of its own rather
                    // than splitting each small operation over the shared
                    // pool, which the other roles keep busy (same results:
                    // threads never split a sum).
                    let pool = rayon::ThreadPoolBuilder::new()
                        .num_threads(1)
                        .build()
                        .map_err(|e| {
                            TrainError::Config(format!("warm_start: a thread for {role}: {e}"))
                        })?;
                    pool.install(|| {
                        tune_role(
                            warm,
                            agent,
                            model,
                            trajectories,
                            &out[role],
                            &mut |epoch, loss| {
                                bar.set_message(format!(
                                    "{role}: epoch {} loss {loss:.3}",
                                    epoch + 1
                                ));
                                bar.inc(1);
                            },
                        )
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a warm-start thread panicked"))
            .collect()
    });
    let mut report = serde_json::Map::new();
    for (role, result) in roles.iter().zip(results) {
        report.insert(role.clone(), result?);
    }
    bar.finish_and_clear();
    eprintln!(
        "warm start: the teacher's demonstrations took {:.1} s, fine-tuning {} models {:.1} s",
        demonstrated.as_secs_f64(),
        roles.len(),
        (started.elapsed() - demonstrated).as_secs_f64()
    );
    mappa_core::fs::write_atomic(
        &dir.join("done.json"),
        Value::Object(report).to_string().as_bytes(),
    )?;
    Ok(out)
}
