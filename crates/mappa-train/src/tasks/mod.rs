//! Task families: where a manifest's tasks come from (`[data] kind = ...`),
//! what the agents see of a task, how a trajectory is graded, what the last
//! agent's coach is shown as the ground truth, what the reports call the
//! metric, and which scripted teacher can warm-start agents on them.
//!
//! | family | `data.kind` | graded on |
//! |---|---|---|
//! | [`generated_math::GeneratedMath`] | `generated_math` | the boxed answer |
//! | [`math_file::MathFile`] | `math_file` | the boxed answer |
//! | [`tabular::Tabular`] | `tabular` | the submission file |
//! | [`generated_tabular::GeneratedTabular`] | `generated_tabular` | the submission file |
//!
//! # Adding a task family
//!
//! Write one file in this folder: a settings struct (`serde`, with
//! `deny_unknown_fields`: its fields are the `[data]` table's keys besides
//! `kind`) that implements [`TaskFamily`] (its loader returns the tasks and
//! a [`Grader`]). Then add one line to the `families!` list below. Nothing
//! else changes: manifests, the lock file, `mappa reproduce`'s checks, the
//! trainer, evaluation, the reports and warm starts all go through the
//! trait. `crates/mappa-train/tests/task_family.rs` is a fifth family
//! written in one file (outside the registry, through [`DataSpec::new`])
//! that trains end to end.

use std::fmt;
use std::path::Path;

use mappa_agents::{TaskInput, Trajectory, Workflow};
use mappa_judge::GroundTruth;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod teacher;

pub use teacher::{Teacher, WarmStart};

use crate::TrainError;

/// A kind of task: loading, grading, the coach's view and a teacher.
pub trait TaskFamily: fmt::Debug + Send + Sync {
    /// The settings as the lock file records them (every default filled in).
    fn settings(&self) -> Value;

    /// A boxed copy.
    fn clone_box(&self) -> Box<dyn TaskFamily>;

    /// Make relative paths relative to `base`, the manifest's directory.
    fn rebase(&mut self, _base: &Path) {}

    /// Check the data files against their expected sha256 and return the
    /// hashes for the lock file (`"generated"` for generated tasks).
    fn resolve(&self) -> Result<Value, TrainError> {
        Ok(json!("generated"))
    }

    /// What a run needs that is not on this machine: (what, how to get it).
    fn missing(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// The number of held-out tasks when the settings fix it.
    fn held_out(&self) -> Option<usize> {
        None
    }

    /// The training and held-out tasks; generated files go under `data_dir`.
    fn load(&self, data_dir: &Path) -> Result<TaskSet, TrainError>;

    /// What "accuracy" means for these tasks, as a sentence for reports.
    fn metric(&self) -> &'static str;

    /// Where the tasks come from, as a phrase for reports; says
    /// "generated" (simulated) when they are.
    fn describe(&self) -> String;

    /// The scripted teacher `warm.teacher` names, for agents `roles`: its own
    /// pool of tasks (none of `held_out`) and one policy per role.
    fn teacher(
        &self,
        warm: &WarmStart,
        _roles: &[String],
        _held_out: &[TaskInput],
        _data_dir: &Path,
    ) -> Result<Teacher, TrainError> {
        Err(TrainError::Config(format!(
            "warm_start.teacher = {:?}: these tasks have no scripted teacher",
            warm.teacher
        )))
    }
}

/// Grades the trajectories of loaded tasks.
pub trait Grader: Send + Sync {
    /// The outcome of `trajectory` on `task`.
    fn grade(
        &self,
        workflow: &Workflow,
        task: &TaskInput,
        trajectory: &Trajectory,
    ) -> Result<Graded, TrainError>;
}

/// A graded trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct Graded {
    /// 1 for a success, 0 otherwise.
    pub outcome: f64,
    /// What the last agent's coach is shown as the ground truth.
    pub ground_truth: Option<GroundTruth>,
}

/// A manifest's tasks, and how to grade them.
pub struct TaskSet {
    /// Training tasks.
    pub train: Vec<TaskInput>,
    /// Held-out tasks.
    pub eval: Vec<TaskInput>,
    /// Grades trajectories of these tasks.
    pub grader: Box<dyn Grader>,
}

/// Checks that a teacher made for one of the `chains` of roles is used
/// with one of them.
pub(crate) fn expect_roles(
    teacher: &str,
    roles: &[String],
    chains: &[&[&str]],
) -> Result<(), TrainError> {
    if chains
        .iter()
        .any(|chain| roles.iter().map(String::as_str).eq(chain.iter().copied()))
    {
        return Ok(());
    }
    let known: Vec<String> = chains.iter().map(|c| c.join(" -> ")).collect();
    Err(TrainError::Config(format!(
        "warm_start.teacher = {teacher:?} writes for agents {} but the workflow has {}",
        known.join(" or "),
        roles.join(" -> ")
    )))
}

/// Grades a final answer against the task's reference answer: the last
/// `\boxed{}` of the final output, or with `fallbacks` also an unboxed
/// answer (the text after the last "the answer is", else the last number).
pub(crate) struct AnswerGrader {
    /// Accept unboxed answers.
    pub fallbacks: bool,
}

impl Grader for AnswerGrader {
    fn grade(
        &self,
        _workflow: &Workflow,
        task: &TaskInput,
        trajectory: &Trajectory,
    ) -> Result<Graded, TrainError> {
        let correct = match (&task.ground_truth, &trajectory.final_output) {
            (Some(gold), Some(output)) => {
                mappa_env::math::grade_response(gold, output, self.fallbacks).correct
            }
            _ => false,
        };
        Ok(Graded {
            outcome: correct as u8 as f64,
            ground_truth: task.ground_truth.as_deref().map(GroundTruth::from),
        })
    }
}

/// Parses a family's settings.
type Parse = fn(Value) -> Result<Box<dyn TaskFamily>, serde_json::Error>;

fn parse_as<T: TaskFamily + DeserializeOwned + 'static>(
    value: Value,
) -> Result<Box<dyn TaskFamily>, serde_json::Error> {
    Ok(Box::new(serde_json::from_value::<T>(value)?))
}

/// Declares the family modules and the registry that maps `data.kind` to them.
macro_rules! families {
    ($($kind:ident => $family:ident),* $(,)?) => {
        $(pub mod $kind;)*
        /// Every family: its `data.kind` and settings parser.
        const REGISTRY: &[(&str, Parse)] = &[$((stringify!($kind), parse_as::<$kind::$family>)),*];
    };
}

families! {
    generated_math => GeneratedMath,
    math_file => MathFile,
    tabular => Tabular,
    generated_tabular => GeneratedTabular,
}

/// The `data.kind` values this build knows.
pub fn kinds() -> Vec<&'static str> {
    REGISTRY.iter().map(|(kind, _)| *kind).collect()
}

/// A manifest's `[data]` table: a task family and its settings. In TOML
/// and JSON, `kind` and the family's own keys side by side.
pub struct DataSpec {
    kind: String,
    family: Box<dyn TaskFamily>,
}

impl DataSpec {
    /// A family built in code, under the `data.kind` name `kind` (a family
    /// not in the registry: its manifests cannot be read back from TOML
    /// until it is registered).
    pub fn new(kind: &str, family: Box<dyn TaskFamily>) -> Self {
        Self {
            kind: kind.to_string(),
            family,
        }
    }

    /// Parse a `[data]` table (with its `kind`).
    pub fn from_value(mut value: Value) -> Result<Self, String> {
        let object = value
            .as_object_mut()
            .ok_or("data: expected a table with a `kind`")?;
        let kind = match object.remove("kind") {
            Some(Value::String(kind)) => kind,
            _ => return Err(format!("data.kind: expected one of {}", kinds().join(", "))),
        };
        let parse = REGISTRY
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, parse)| parse)
            .ok_or_else(|| {
                format!(
                    "data.kind = {kind:?}: expected one of {}",
                    kinds().join(", ")
                )
            })?;
        let family = parse(value).map_err(|e| format!("data ({kind}): {e}"))?;
        Ok(Self { kind, family })
    }

    /// The `data.kind`.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The task family.
    pub fn family(&self) -> &dyn TaskFamily {
        self.family.as_ref()
    }

    /// The task family, to rebase its paths.
    pub fn family_mut(&mut self) -> &mut dyn TaskFamily {
        self.family.as_mut()
    }

    /// The table as the lock file records it: `kind` first, then the settings.
    pub fn to_value(&self) -> Value {
        let mut object = serde_json::Map::new();
        object.insert("kind".into(), json!(self.kind));
        if let Value::Object(settings) = self.family.settings() {
            object.extend(settings);
        }
        Value::Object(object)
    }
}

impl Clone for DataSpec {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind.clone(),
            family: self.family.clone_box(),
        }
    }
}

impl fmt::Debug for DataSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataSpec({})", self.to_value())
    }
}

impl PartialEq for DataSpec {
    fn eq(&self, other: &Self) -> bool {
        self.to_value() == other.to_value()
    }
}

impl Serialize for DataSpec {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        NullAsNone(&self.to_value()).serialize(serializer)
    }
}

/// A JSON value whose nulls serialize as `None`: `null` in JSON, as before,
/// and a left-out key in TOML (which has no null).
struct NullAsNone<'a>(&'a Value);

impl Serialize for NullAsNone<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self.0 {
            Value::Null => serializer.serialize_none(),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&NullAsNone(item))?;
                }
                seq.end()
            }
            Value::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, &NullAsNone(value))?;
                }
                map.end()
            }
            other => other.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for DataSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        DataSpec::from_value(value).map_err(serde::de::Error::custom)
    }
}

/// Implements the boilerplate of [`TaskFamily`] for a settings struct.
macro_rules! settings_boilerplate {
    () => {
        fn settings(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("settings serialise")
        }

        fn clone_box(&self) -> Box<dyn crate::tasks::TaskFamily> {
            Box::new(self.clone())
        }
    };
}
pub(crate) use settings_boilerplate;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_tables_round_trip_with_defaults_filled_in_and_bad_kinds_named() {
        let spec: DataSpec =
            toml::from_str("kind = \"generated_math\"\ntrain = 4\neval = 2\nseed = 1").unwrap();
        let value = spec.to_value();
        assert_eq!(value["kind"], "generated_math");
        assert_eq!(value["instruction"], true, "{value}");
        assert_eq!(DataSpec::from_value(value).unwrap(), spec);

        // TOML has no null: an absent option is left out, and reads back the same.
        let text = toml::to_string(&spec).unwrap();
        assert!(!text.contains("tiers"), "{text}");
        assert_eq!(toml::from_str::<DataSpec>(&text).unwrap(), spec);
        assert!(serde_json::to_string(&spec)
            .unwrap()
            .contains("\"tiers\":null"));

        let e = toml::from_str::<DataSpec>("kind = \"poetry\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("poetry") && e.contains("generated_math"), "{e}");
        let e = toml::from_str::<DataSpec>(
            "kind = \"generated_math\"\ntrain = 4\neval = 2\nseed = 1\ntrian = 3",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("trian"), "{e}");
    }
}
