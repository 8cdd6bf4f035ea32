//! `data.kind = "generated_tabular"`: generated data-analysis tasks
//! (`mappa_env::tabular::generate_task`: binary, multi-class and regression
//! in turn), written into the run directory and graded like DSBench tasks.
//! Its teacher, `tabular`, drives the `tabular-compact` workflow and slips
//! at a set rate per role.

use std::collections::BTreeMap;
use std::path::Path;

use mappa_agents::{PolicyRequest, ScriptedPolicy, TaskInput};
use mappa_core::rng::SeedTree;
use mappa_env::tabular::{generate_task, SpecKind, TabularTask, TaskSpec};
use serde::{Deserialize, Serialize};

use super::tabular::{task_input, task_set, METRIC};
use super::{expect_roles, settings_boilerplate, TaskFamily, TaskSet, Teacher, WarmStart};
use crate::TrainError;

/// How many tasks, from which seed, and their size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GeneratedTabular {
    /// Training tasks.
    pub train: usize,
    /// Held-out tasks.
    pub eval: usize,
    /// Generator seed (the held-out set uses a seed derived from it).
    pub seed: u64,
    /// Training rows per task.
    #[serde(default = "rows_train")]
    pub rows_train: usize,
    /// Test rows per task.
    #[serde(default = "rows_test")]
    pub rows_test: usize,
    /// Informative numeric features per task.
    #[serde(default = "features")]
    pub features: usize,
    /// Label-noise rate (classification) or noise standard deviation (regression).
    #[serde(default = "noise")]
    pub noise: f64,
}

fn rows_train() -> usize {
    300
}

fn rows_test() -> usize {
    100
}

fn features() -> usize {
    3
}

fn noise() -> f64 {
    0.1
}

impl GeneratedTabular {
    /// `n` tasks named `prefix-i` from `seed`, written under `dir`.
    fn generate(
        &self,
        dir: &Path,
        n: usize,
        seed: u64,
        prefix: &str,
    ) -> Result<Vec<TabularTask>, TrainError> {
        (0..n)
            .map(|i| {
                let kind = match i % 3 {
                    0 => SpecKind::Binary,
                    1 => SpecKind::Multiclass { classes: 3 },
                    _ => SpecKind::Regression,
                };
                let spec = TaskSpec {
                    id: format!("{prefix}-{i}"),
                    kind,
                    n_train: self.rows_train,
                    n_test: self.rows_test,
                    n_features: self.features,
                    noise: self.noise,
                };
                generate_task(dir, &spec, seed + i as u64)
                    .map(|g| g.task)
                    .map_err(|e| TrainError::Config(format!("data: {e}")))
            })
            .collect()
    }
}

impl TaskFamily for GeneratedTabular {
    settings_boilerplate!();

    fn held_out(&self) -> Option<usize> {
        Some(self.eval)
    }

    fn load(&self, data_dir: &Path) -> Result<TaskSet, TrainError> {
        let train = self.generate(data_dir, self.train, self.seed, "train")?;
        let eval = self.generate(
            data_dir,
            self.eval,
            self.seed.wrapping_add(1_000_003),
            "eval",
        )?;
        Ok(task_set(train, eval))
    }

    fn metric(&self) -> &'static str {
        METRIC
    }

    fn describe(&self) -> String {
        format!(
            "generated data-analysis tasks (simulated; {} for training, {} held out)",
            self.train, self.eval
        )
    }

    /// The `tabular` teacher: generated tasks of its own (from a seed of
    /// their own, so none is a held-out task), written under `data_dir`.
    fn teacher(
        &self,
        warm: &WarmStart,
        roles: &[String],
        _held_out: &[TaskInput],
        data_dir: &Path,
    ) -> Result<Teacher, TrainError> {
        if warm.teacher != "tabular" {
            return Err(TrainError::Config(format!(
                "warm_start.teacher = {:?}: generated_tabular tasks have the \"tabular\" teacher",
                warm.teacher
            )));
        }
        expect_roles(
            &warm.teacher,
            roles,
            &[&["data_engineer", "modeler", "analyst"]],
        )?;
        if warm.difficulty_weight != 0.0 {
            return Err(TrainError::Config(
                "warm_start.difficulty_weight: the tabular teacher's mistakes do not depend                  on a task's difficulty (only the arith teacher's do); leave it out"
                    .into(),
            ));
        }
        let pool_seed = SeedTree::new(self.seed)
            .stream("warm-start/pool")
            .next_u64();
        let tasks = self
            .generate(data_dir, warm.demonstrations, pool_seed, "pool")?
            .iter()
            .enumerate()
            .map(|(group, t)| task_input(group, t))
            .collect();
        Ok(Teacher {
            tasks,
            policies: tabular_teacher(&warm.error_rates, SeedTree::new(warm.sft.seed)),
        })
    }
}

/// The tabular teacher's policies, for the `tabular-compact` workflow: the
/// Data Engineer one-hot encodes `color`, the Modeler regresses numeric
/// targets and classifies labels, the Analyst writes a `.csv`. Slips, at
/// each role's error rate: `raw` features (the program fails on the text
/// column), the other model kind (the program refuses it), a `.tsv` file
/// (the required `submission.csv` is never written).
fn tabular_teacher(error_rates: &BTreeMap<String, f64>, seeds: SeedTree) -> Vec<ScriptedPolicy> {
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
    let modeler = ScriptedPolicy::fallible("tabular-teacher-modeler", move |r| {
        let user = r
            .messages
            .get(1)
            .map(|m| m.content.as_str())
            .ok_or("the Modeler's request has no user message")?;
        let numeric = user.contains("Predict the numeric");
        if !numeric && !user.contains("Predict the class") {
            return Err(format!(
                "the Modeler's prompt says neither \"Predict the numeric\" nor \"Predict the class\": {user:?}"
            ));
        }
        let right = if numeric { "regress" } else { "classify" };
        let wrong = if numeric { "classify" } else { "regress" };
        Ok(format!(
            "model: {}",
            if slipped(&seeds, r, r2) { wrong } else { right }
        ))
    });
    let analyst = ScriptedPolicy::new("tabular-teacher-analyst", move |r| {
        format!(
            "write: {}",
            if slipped(&seeds, r, r3) { "tsv" } else { "csv" }
        )
    });
    vec![engineer, modeler, analyst]
}

#[cfg(test)]
mod tests {
    use super::*;
    use mappa_agents::{RolloutEngine, Workflow};
    use mappa_env::sandbox::{Sandbox, SandboxConfig};

    /// The tabular teacher on the tabular-compact workflow: without slips
    /// every submission is scored near the optimum; each role's slip leaves
    /// that role's required file unwritten (blame along the file chain).
    #[test]
    fn tabular_teacher_runs_the_pipeline_and_its_slips_break_the_chain() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let workflow =
            Workflow::load(&root.join("experiments/workflows/tabular-compact.toml")).unwrap();
        let sandbox = Sandbox::new(SandboxConfig::discover().unwrap()).unwrap();
        let dir = mappa_env::sandbox::scratch_dir().unwrap();
        let family: GeneratedTabular =
            serde_json::from_value(serde_json::json!({ "train": 3, "eval": 0, "seed": 9 }))
                .unwrap();
        let tasks = family
            .generate(&dir.path().join("data"), 3, 9, "t")
            .unwrap();
        let inputs: Vec<TaskInput> = tasks
            .iter()
            .enumerate()
            .map(|(i, t)| task_input(i, t))
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
