//! The supervised warm start of CPU-scale experiments: a scripted teacher
//! runs the workflow on a pool of generated problems of its own (none held out), making mistakes at a set rate per
//! role; each agent's model is fine-tuned on its role's demonstrations. The
//! result is an imperfect starting system whose errors come from known
//! agents. Tuned models are cached under a hash of everything they depend
//! on, so repeated runs (other seeds, other credit arms) reuse them.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mappa_agents::{PolicyRequest, RolloutEngine, ScriptedPolicy, TaskInput, Workflow};
use mappa_core::hash::sha256_hex;
use mappa_core::rng::SeedTree;
use mappa_env::datasets::normalize_problem_text;
use mappa_env::math_tasks::{generate_mix_of, GeneratedProblem, Tier};
use mappa_env::sandbox::Sandbox;
use mappa_model::weights::save_transformer;
use mappa_model::AutodiffModelBackend;
use mappa_model::{
    ChatMessage, ChatRequest, ChatTemplate, HfTokenizer, StorageDtype, Tokenizer, Transformer,
};
use serde_json::{json, Value};

use crate::manifest::{DataSpec, Manifest, SlipKind, WarmStart};
use crate::sft::supervised_finetune;
use crate::TrainError;

/// Files copied next to the tuned weights so that the directory is a full checkpoint.
const TOKENIZER_FILES: [&str; 3] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
];

/// Change one number of `text` by a small non-zero amount (a plausible slip).
fn perturb_number(text: &str, rng: &mut mappa_core::rng::RngStream) -> String {
    let mut spans = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() {
            let start = i;
            while i < bytes.len() && bytes[i].is_ascii_digit() {
                i += 1;
            }
            spans.push((start, i));
        } else {
            i += 1;
        }
    }
    let Some(&(start, end)) = spans.get(rng.below(spans.len().max(1) as u64) as usize) else {
        return format!("{text}1");
    };
    let value: i64 = text[start..end].parse().unwrap_or(0);
    let delta = [1i64, -1, 2, -2, 3][rng.below(5) as usize];
    let new = if value + delta < 0 {
        value + 1
    } else {
        value + delta
    };
    format!("{}{new}{}", &text[..start], &text[end..])
}

/// `expr` with its last operation left out: `pow(a, k, m)` -> `pow(a, k)`,
/// `(a op b) op c` -> `(a op b)`; an expression of one term gains ` + 1`.
fn drop_last_step(expr: &str) -> String {
    if let Some(head) = expr
        .strip_prefix("pow(")
        .and_then(|e| e.rsplit_once(", "))
        .map(|(h, _)| h)
    {
        return format!("pow({head})");
    }
    match expr.rsplit_once(' ').and_then(|(h, _)| h.rsplit_once(' ')) {
        Some((head, _)) if !head.is_empty() => head.to_string(),
        _ => format!("{expr} + 1"),
    }
}

/// One role's mistake of `kind` on the text it would have written.
fn slip(kind: SlipKind, role: &str, text: &str, rng: &mut mappa_core::rng::RngStream) -> String {
    match (kind, role) {
        (SlipKind::Digit, _) => perturb_number(text, rng),
        (SlipKind::Structural, "verifier") => format!("{text}0"),
        (SlipKind::Structural, _) => drop_last_step(text),
    }
}

/// The arith teacher's policies: the Problem Solver plans with the Python
/// expression, the Code Executor prints the planned expression, the
/// Verifier boxes the printed value; each slips at its role's error rate.
fn arith_teacher(
    problems: Arc<Vec<GeneratedProblem>>,
    error_rates: &BTreeMap<String, f64>,
    kind: SlipKind,
    seeds: SeedTree,
) -> [ScriptedPolicy; 3] {
    let rate = |role: &str| error_rates.get(role).copied().unwrap_or(0.0);
    let slips = move |r: &PolicyRequest| seeds.stream(&format!("teacher/{}", r.stream));
    let find =
        move |problems: &[GeneratedProblem], r: &PolicyRequest| -> Option<GeneratedProblem> {
            let user = &r.messages.get(1)?.content;
            problems
                .iter()
                .find(|p| user.contains(p.statement()))
                .cloned()
        };
    let (p1, p2) = (problems.clone(), problems);
    let (r1, r2, r3) = (
        rate("problem_solver"),
        rate("code_executor"),
        rate("verifier"),
    );
    let solver = ScriptedPolicy::new("arith-teacher-solver", move |r| {
        let Some(p) = find(&p1, r) else {
            return "Plan: ?".into();
        };
        let mut rng = slips(r);
        let expr = if rng.uniform() < r1 {
            slip(kind, "problem_solver", p.expression(), &mut rng)
        } else {
            p.expression().to_string()
        };
        format!("Plan: {expr}")
    });
    let executor = ScriptedPolicy::new("arith-teacher-executor", move |r| {
        let user = &r.messages[1].content;
        let plan = user
            .lines()
            .find_map(|l| l.strip_prefix("Plan: "))
            .unwrap_or("0")
            .to_string();
        let preamble = find(&p2, r).map(|p| p.preamble()).unwrap_or_default();
        let mut rng = slips(r);
        let expr = if rng.uniform() < r2 {
            slip(kind, "code_executor", &plan, &mut rng)
        } else {
            plan
        };
        format!("```python\n{preamble}print({expr})\n```")
    });
    let verifier = ScriptedPolicy::new("arith-teacher-verifier", move |r| {
        let user = &r.messages[1].content;
        let printed = user
            .split("Output:\n")
            .nth(1)
            .and_then(|s| s.lines().next())
            .unwrap_or("0")
            .trim()
            .to_string();
        let mut rng = slips(r);
        let value = if rng.uniform() < r3 {
            slip(kind, "verifier", &printed, &mut rng)
        } else {
            printed
        };
        format!("\\boxed{{{value}}}")
    });
    [solver, executor, verifier]
}

/// The arith teacher's pool: generated problems of its own (none held out),
/// one demonstration per problem, and its policies.
fn arith_pool(
    manifest: &Manifest,
    warm: &WarmStart,
    held_out: &[TaskInput],
) -> Result<(Vec<TaskInput>, [ScriptedPolicy; 3]), TrainError> {
    let DataSpec::GeneratedMath {
        seed,
        instruction,
        tiers,
        ..
    } = &manifest.data
    else {
        return Err(TrainError::Config(
            "warm_start: the arith teacher needs data.kind = \"generated_math\"".into(),
        ));
    };
    // A pool of its own, one demonstration per problem, none of them held out:
    // demonstrations repeated over the RL training problems teach the models
    // to recall those problems rather than to copy numbers.
    let held_out: HashSet<String> = held_out
        .iter()
        .map(|t| normalize_problem_text(&t.text))
        .collect();
    let pool_seed = SeedTree::new(*seed).stream("warm-start/pool").next_u64();
    let problems = Arc::new(
        generate_mix_of(
            tiers.as_deref().unwrap_or(&Tier::ALL),
            warm.demonstrations + held_out.len(),
            pool_seed,
        )
        .into_iter()
        .filter(|p| !held_out.contains(&normalize_problem_text(&p.prompt)))
        .take(warm.demonstrations)
        .collect::<Vec<_>>(),
    );
    let tasks: Vec<TaskInput> = problems
        .iter()
        .enumerate()
        .map(|(group, p)| TaskInput {
            id: p.id.clone(),
            group,
            text: crate::run::problem_text(p, *instruction),
            ..Default::default()
        })
        .collect();
    let teacher = arith_teacher(
        problems.clone(),
        &warm.error_rates,
        warm.slips,
        SeedTree::new(warm.sft.seed),
    );
    Ok((tasks, teacher))
}

/// The tabular teacher's policies, for the `tabular-compact` workflow: the
/// Data Engineer one-hot encodes `color`, the Modeler regresses numeric
/// targets and classifies labels, the Analyst writes a `.csv`. Slips, at
/// each role's error rate: `raw` features (the program fails on the text
/// column), the other model kind (the program refuses it), a `.tsv` file
/// (the required `submission.csv` is never written).
fn tabular_teacher(error_rates: &BTreeMap<String, f64>, seeds: SeedTree) -> [ScriptedPolicy; 3] {
    let rate = |role: &str| error_rates.get(role).copied().unwrap_or(0.0);
    let (r1, r2, r3) = (rate("data_engineer"), rate("modeler"), rate("analyst"));
    let slipped = |seeds: &SeedTree, r: &PolicyRequest, p: f64| {
        seeds.stream(&format!("teacher/{}", r.stream)).uniform() < p
    };
    let engineer = ScriptedPolicy::new("tabular-teacher-data-engineer", move |r| {
        let mode = if slipped(&seeds, r, r1) {
            "raw"
        } else {
            "onehot"
        };
        format!("features: {mode}")
    });
    let modeler = ScriptedPolicy::new("tabular-teacher-modeler", move |r| {
        let numeric = r
            .messages
            .get(1)
            .is_some_and(|m| m.content.contains("Predict the numeric"));
        let right = if numeric { "regress" } else { "classify" };
        let wrong = if numeric { "classify" } else { "regress" };
        format!(
            "model: {}",
            if slipped(&seeds, r, r2) { wrong } else { right }
        )
    });
    let analyst = ScriptedPolicy::new("tabular-teacher-analyst", move |r| {
        format!(
            "write: {}",
            if slipped(&seeds, r, r3) { "tsv" } else { "csv" }
        )
    });
    [engineer, modeler, analyst]
}

/// The tabular teacher's pool: generated tasks of its own (from a seed of
/// their own, so none is a held-out task), written under `data_dir`.
fn tabular_pool(
    manifest: &Manifest,
    warm: &WarmStart,
    data_dir: &Path,
) -> Result<(Vec<TaskInput>, [ScriptedPolicy; 3]), TrainError> {
    let DataSpec::GeneratedTabular { seed, .. } = &manifest.data else {
        return Err(TrainError::Config(
            "warm_start: the tabular teacher needs data.kind = \"generated_tabular\"".into(),
        ));
    };
    let pool_seed = SeedTree::new(*seed).stream("warm-start/pool").next_u64();
    let tasks = crate::run::generated_tabular(data_dir, warm.demonstrations, pool_seed, "pool")?
        .iter()
        .enumerate()
        .map(|(group, t)| crate::run::tabular_input(group, t))
        .collect();
    Ok((
        tasks,
        tabular_teacher(&warm.error_rates, SeedTree::new(warm.sft.seed)),
    ))
}

/// Tokenise one demonstration: the rendered conversation, and the completion with EOS.
fn encode(
    messages: &[mappa_agents::Message],
    text: &str,
    tokenizer: &HfTokenizer,
    template: &ChatTemplate,
) -> Result<(Vec<u32>, Vec<u32>), TrainError> {
    let model_err = |e: mappa_model::ModelError| TrainError::Model(e.to_string());
    let chat: Vec<ChatMessage> = messages
        .iter()
        .map(|m| ChatMessage::new(&m.role, &m.content))
        .collect();
    let prompt = template
        .render(&ChatRequest {
            messages: &chat,
            add_generation_prompt: true,
            ..Default::default()
        })
        .map_err(model_err)?;
    let mut completion = tokenizer.encode(text).map_err(model_err)?;
    completion.extend(tokenizer.eos_token_ids().first());
    Ok((tokenizer.encode(&prompt).map_err(model_err)?, completion))
}

/// The directory of the tuned models for this manifest (under `cache_root`).
pub fn cache_dir(manifest: &Manifest, resolved: &Value, cache_root: &Path) -> PathBuf {
    let key = json!({
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
    let work = dir.with_extension("work");
    let (tasks, teacher) = match (warm.teacher.as_str(), roles.as_slice()) {
        ("arith", [a, b, c]) if [a, b, c] == ["problem_solver", "code_executor", "verifier"] => {
            arith_pool(manifest, warm, held_out)?
        }
        ("tabular", [a, b, c]) if [a, b, c] == ["data_engineer", "modeler", "analyst"] => {
            tabular_pool(manifest, warm, &dir.with_extension("data"))?
        }
        (teacher, _) => {
            return Err(TrainError::Config(format!(
                "warm_start.teacher = {teacher:?} with agents {roles:?}: expected \"arith\" (problem_solver -> code_executor -> verifier) or \"tabular\" (data_engineer -> modeler -> analyst)"
            )))
        }
    };
    let engine = RolloutEngine::new(
        workflow,
        teacher
            .iter()
            .map(|p| p as &dyn mappa_agents::Policy)
            .collect(),
        sandbox,
        &work,
    )
    .map_err(|e| TrainError::Input(e.to_string()))?;
    let trajectories = engine
        .run(&tasks, 1)
        .map_err(|e| TrainError::Input(e.to_string()))?;
    let _ = std::fs::remove_dir_all(&work);
    let _ = std::fs::remove_dir_all(dir.with_extension("data"));

    let bar = indicatif::ProgressBar::new((roles.len() * warm.sft.epochs) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "warm start [{bar:30}] {pos}/{len} epochs ({elapsed}, eta {eta}) {msg}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    // The roles' models are independent: tune them at once, one thread each.
    let tune_role = |agent: usize, role: &String| -> Result<Value, TrainError> {
        let (model, source) = initial
            .get(role)
            .ok_or_else(|| TrainError::Config(format!("warm_start: no model for {role}")))?;
        let tokenizer =
            HfTokenizer::from_dir(source).map_err(|e| TrainError::Model(e.to_string()))?;
        let template = ChatTemplate::from_tokenizer(&tokenizer)
            .map_err(|e| TrainError::Model(e.to_string()))?;
        let demos = trajectories
            .iter()
            .flat_map(|t| t.actions.iter().filter(|a| a.agent == agent))
            .take(warm.demonstrations)
            .map(|a| encode(&a.messages, &a.text, &tokenizer, &template))
            .collect::<Result<Vec<_>, _>>()?;
        let (tuned, losses) =
            supervised_finetune(model.clone(), &demos, &warm.sft, &mut |epoch, loss| {
                bar.set_message(format!("{role}: epoch {} loss {loss:.3}", epoch + 1));
                bar.inc(1);
            })?;
        let target = &out[role];
        save_transformer(&tuned, target, StorageDtype::F32)
            .map_err(|e| TrainError::Model(e.to_string()))?;
        for file in TOKENIZER_FILES {
            if source.join(file).exists() {
                std::fs::copy(source.join(file), target.join(file))
                    .map_err(|e| TrainError::Model(format!("{file}: {e}")))?;
            }
        }
        Ok(json!({ "demonstrations": demos.len(), "epoch_losses": losses }))
    };
    let results: Vec<Result<Value, TrainError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = roles
            .iter()
            .enumerate()
            .map(|(agent, role)| scope.spawn(move || tune_role(agent, role)))
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
    mappa_core::fs::write_atomic(
        &dir.join("done.json"),
        Value::Object(report).to_string().as_bytes(),
    )
    .map_err(|e| TrainError::Model(e.to_string()))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structural_slips_leave_out_the_last_operation() {
        assert_eq!(drop_last_step("pow(45, 3, 4)"), "pow(45, 3)");
        assert_eq!(drop_last_step("(51 * 29 + 39) % 81"), "(51 * 29 + 39)");
        assert_eq!(drop_last_step("(12 - 7) * 3"), "(12 - 7)");
        assert_eq!(drop_last_step("17"), "17 + 1");
        let mut rng = SeedTree::new(1).stream("t");
        assert_eq!(
            slip(SlipKind::Structural, "verifier", "42", &mut rng),
            "420"
        );
        assert_eq!(
            slip(
                SlipKind::Structural,
                "code_executor",
                "pow(2, 5, 7)",
                &mut rng
            ),
            "pow(2, 5)"
        );
        let digit = slip(SlipKind::Digit, "verifier", "42", &mut rng);
        assert_ne!(digit, "42");
        assert_eq!(digit.len(), 2);
    }

    /// The tabular teacher on the tabular-compact workflow: without slips
    /// every submission is scored near the optimum; each role's slip leaves
    /// that role's required file unwritten (blame along the file chain).
    #[test]
    fn tabular_teacher_runs_the_pipeline_and_its_slips_break_the_chain() {
        use mappa_env::sandbox::SandboxConfig;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let workflow =
            Workflow::load(&root.join("experiments/workflows/tabular-compact.toml")).unwrap();
        let sandbox = Sandbox::new(SandboxConfig::discover().unwrap()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let tasks = crate::run::generated_tabular(&dir.path().join("data"), 3, 9, "t").unwrap();
        let inputs: Vec<TaskInput> = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| crate::run::tabular_input(i, t))
            .collect();
        for (slipping, missing) in [
            (None, None),
            (Some("data_engineer"), Some("X_train.npy")),
            (Some("modeler"), Some("model.json")),
            (Some("analyst"), Some("submission.csv")),
        ] {
            let rates: BTreeMap<String, f64> =
                slipping.map(|r| (r.to_string(), 1.0)).into_iter().collect();
            let teacher = tabular_teacher(&rates, SeedTree::new(1));
            let work = dir.path().join(format!("work-{slipping:?}"));
            let engine = RolloutEngine::new(
                &workflow,
                teacher
                    .iter()
                    .map(|p| p as &dyn mappa_agents::Policy)
                    .collect(),
                &sandbox,
                &work,
            )
            .unwrap();
            for (trajectory, task) in engine.run(&inputs, 1).unwrap().iter().zip(&tasks) {
                let submission = trajectory.workdir.join("analyst/submission.csv");
                match (slipping, missing) {
                    (None, _) => {
                        let outcome =
                            mappa_env::tabular::evaluate(task, Some(&submission)).unwrap();
                        assert!(outcome.success, "{:?}", trajectory.actions);
                        let scores = outcome.scores.unwrap();
                        let fit = scores.accuracy.or(scores.r2).unwrap();
                        assert!(fit > 0.75, "{}: accuracy or r2 {fit}", task.id);
                    }
                    (Some(role), Some(file)) => {
                        let action = trajectory.actions.iter().find(|a| a.role == role).unwrap();
                        assert!(!action.files_saved.iter().any(|f| f == file), "{role}");
                        assert!(!submission.exists(), "{role}: no submission after a slip");
                    }
                    _ => unreachable!(),
                }
            }
        }
    }
}
