//! The DSBench pipeline end to end on generated tabular tasks, with a
//! scripted policy that writes real pandas and scikit-learn code: the file
//! hand-offs produce a scored `submission.csv`, and the scripted coach's
//! blame chain lands on the agent that failed to save its files.

use std::path::{Path, PathBuf};

use mappa_agents::{PolicyRequest, RolloutEngine, ScriptedPolicy, TaskInput, Trajectory, Workflow};
use mappa_env::sandbox::{find_python, Sandbox, SandboxConfig};
use mappa_env::tabular::{evaluate, generate_task, GeneratedTask, SpecKind, TaskSpec};
use mappa_judge::scripted::{ScriptedCoach, ScriptedConfig, Strength, View};
use mappa_judge::{Coach, KnownSolution};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn scratch() -> tempfile::TempDir {
    mappa_env::sandbox::scratch_dir().unwrap()
}

const ENGINEER: &str = r#"Loading and preparing the data.
```python
import pandas as pd
train = pd.read_csv("train.csv")
test = pd.read_csv("test.csv")
target = "target"
features = [c for c in train.columns if c not in ("row_id", target)]
both = pd.get_dummies(pd.concat([train[features], test[features]]), columns=["color"], dtype=float)
both["aux"] = both["aux"].fillna(both["aux"].mean())
X_train, X_test = both.iloc[: len(train)], both.iloc[len(train):]
pd.to_pickle(X_train, "X_train.pkl")
pd.to_pickle(train[target], "y_train.pkl")
pd.to_pickle(X_test, "X_test.pkl")
print("features:", X_train.shape[1], "train rows:", len(X_train), "test rows:", len(X_test))
```"#;

const BROKEN_ENGINEER: &str = r#"```python
import pandas as pd
train = pd.read_csv("train.csv")
pd.to_pickle(train.drop(columns=["row_id", "target"]), "X_train.pkl")
print("saved X_train.pkl only")
```"#;

const MODELER: &str = r#"Fitting a model.
```python
import pickle
import pandas as pd
from sklearn.linear_model import LinearRegression, LogisticRegression
X = pd.read_pickle("X_train.pkl")
y = pd.read_pickle("y_train.pkl")
regression = y.dtype.kind == "f" and y.nunique() > 20
model = LinearRegression() if regression else LogisticRegression(max_iter=2000)
model.fit(X, y)
pickle.dump(model, open("model.pkl", "wb"))
print("problem:", "regression" if regression else "classification", "train score:", round(model.score(X, y), 3))
```"#;

const ANALYST: &str = r#"Writing the submission.
```python
import pickle
import pandas as pd
model = pickle.load(open("model.pkl", "rb"))
X_test = pd.read_pickle("X_test.pkl")
test = pd.read_csv("test.csv")
sample = pd.read_csv("sample_submission.csv")
pd.DataFrame({sample.columns[0]: test["row_id"], sample.columns[1]: model.predict(X_test)}).to_csv("submission.csv", index=False)
print("rows written:", len(test))
```"#;

fn tasks(dir: &Path) -> Vec<GeneratedTask> {
    let spec = |id: &str, kind| TaskSpec {
        id: id.into(),
        kind,
        n_train: 300,
        n_test: 100,
        n_features: 3,
        noise: 0.1,
    };
    vec![
        generate_task(dir, &spec("gen-binary", SpecKind::Binary), 1).unwrap(),
        generate_task(dir, &spec("gen-regression", SpecKind::Regression), 2).unwrap(),
    ]
}

fn input(g: &GeneratedTask, group: usize) -> TaskInput {
    let dir = g.task.train_csv.parent().unwrap();
    TaskInput {
        id: g.task.id.clone(),
        group,
        text: g.task.cleaned_prompt.clone(),
        coach_text: Some(g.task.raw_prompt.clone()),
        inputs: vec![
            g.task.train_csv.clone(),
            g.task.test_csv.clone(),
            dir.join("sample_submission.csv"),
        ],
        ..Default::default()
    }
}

fn run(engineer: &'static str, work: &Path, generated: &[GeneratedTask]) -> Vec<Trajectory> {
    let workflow = Workflow::load(&workspace().join("experiments/workflows/dsbench.toml")).unwrap();
    let reply = |code: &'static str| {
        move |r: &PolicyRequest| {
            if r.messages.len() == 2 {
                code.to_string()
            } else {
                "Done.".to_string()
            }
        }
    };
    let engineer = ScriptedPolicy::new("pandas-engineer", reply(engineer));
    let modeler = ScriptedPolicy::new("sklearn-modeler", reply(MODELER));
    let analyst = ScriptedPolicy::new("pandas-analyst", reply(ANALYST));
    let mut config = SandboxConfig::with_python(
        find_python(Some(&workspace())).expect("run `just setup-python`"),
    );
    config.uid_base = 1_960_400_000;
    let sandbox = Sandbox::new(config).unwrap();
    let engine = RolloutEngine::new(
        &workflow,
        vec![&engineer, &modeler, &analyst],
        &sandbox,
        work,
    )
    .unwrap();
    let inputs: Vec<TaskInput> = generated
        .iter()
        .enumerate()
        .map(|(i, g)| input(g, i))
        .collect();
    engine.run(&inputs, 1).unwrap()
}

fn coach_scores(t: &Trajectory, g: &GeneratedTask, quality: Option<f64>) -> Vec<f64> {
    let workflow = Workflow::load(&workspace().join("experiments/workflows/dsbench.toml")).unwrap();
    let mut task = input(g, 0);
    task.solution = Some(KnownSolution {
        task_kind: g.task.kind.name().into(),
        ..Default::default()
    });
    let mut contexts = t.coach_contexts(&workflow, &task);
    for c in contexts.iter_mut().filter(|c| c.role == "analyst") {
        c.solution.as_mut().unwrap().quality = quality;
    }
    let coach = ScriptedCoach::new(ScriptedConfig {
        noise_std: Some(0.0),
        ..ScriptedConfig::new(View::Oracle, Strength::Strong)
    })
    .unwrap();
    coach
        .score_batch(&contexts)
        .unwrap()
        .iter()
        .map(|s| s.score)
        .collect()
}

#[test]
fn scripted_pandas_pipeline_writes_a_scored_submission() {
    let data = scratch();
    let generated = tasks(data.path());
    let work = scratch();
    let trajectories = run(ENGINEER, work.path(), &generated);
    for (t, g) in trajectories.iter().zip(&generated) {
        let roles: Vec<&str> = t.actions.iter().map(|a| a.role.as_str()).collect();
        assert_eq!(
            roles,
            ["data_engineer", "modeler", "analyst"],
            "each agent stops once its files exist"
        );
        for a in &t.actions {
            assert_eq!(
                a.tool_status,
                Some(mappa_env::sandbox::Status::Ok),
                "{}: {:?}",
                a.role,
                a.tool_observation
            );
        }
        assert!(t.actions[2]
            .files_saved
            .contains(&"submission.csv".to_string()));
        assert!(
            t.actions[1]
                .files_available
                .contains(&"X_train.pkl".to_string()),
            "the hand-off passed the engineer's files"
        );
        let submission = t.workdir.join("analyst/submission.csv");
        let outcome = evaluate(&g.task, Some(&submission)).unwrap();
        assert!(outcome.success, "{:?}", outcome.failure);
        let scores = outcome.scores.unwrap();
        match g.spec.kind {
            SpecKind::Regression => assert!(
                scores.rmse.unwrap() < 2.0 * g.optimal_score + 0.05,
                "{scores:?} vs {}",
                g.optimal_score
            ),
            _ => assert!(
                scores.accuracy.unwrap() > g.optimal_score - 0.12,
                "{scores:?} vs {}",
                g.optimal_score
            ),
        }
        let coach = coach_scores(t, g, Some(0.9));
        assert!(coach.iter().all(|&s| s >= 8.0), "{coach:?}");
    }
}

#[test]
fn a_missing_file_is_blamed_on_the_agent_that_should_have_saved_it() {
    let data = scratch();
    let generated = tasks(data.path());
    let work = scratch();
    let trajectories = run(BROKEN_ENGINEER, work.path(), &generated[..1]);
    let t = &trajectories[0];
    // The engineer never saved y_train.pkl or X_test.pkl, so it used all its actions; later agents fail.
    assert!(
        t.actions
            .iter()
            .filter(|a| a.role == "data_engineer")
            .count()
            >= 2
    );
    let outcome = evaluate(
        &generated[0].task,
        Some(&t.workdir.join("analyst/submission.csv")),
    )
    .unwrap();
    assert!(!outcome.success);
    let coach = coach_scores(t, &generated[0], None);
    let engineer = coach[0];
    assert!(engineer <= 2.0, "the culprit scores low: {coach:?}");
}
