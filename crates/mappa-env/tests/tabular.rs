//! Tabular (DSBench) tasks: loading the real task files, scoring joined by
//! id, error messages, fair aggregation and the seeded generator.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mappa_env::tabular::{
    evaluate, generate_task, load_tasks, score_submission, write_index, FairSummary, Metric,
    SpecKind, TabularTask, TaskKind, TaskSpec,
};

fn bench(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/bench")
        .join(name)
}

fn cleaned() -> PathBuf {
    bench("dsbench_modeling_cleaned_prompts.json")
}

fn count(tasks: &[TabularTask], f: impl Fn(&TabularTask) -> bool) -> usize {
    tasks.iter().filter(|t| f(t)).count()
}

#[test]
fn loads_the_real_task_lists() {
    let root = Path::new("/data-root");
    let train = load_tasks(&bench("dsbench_modeling_train.json"), &cleaned(), root).unwrap();
    let eval = load_tasks(&bench("dsbench_modeling_eval.json"), &cleaned(), root).unwrap();
    // 64 + 8 entries; one training entry has no cleaned prompt.
    assert_eq!(train.tasks.len() + train.skipped.len(), 64);
    assert_eq!(eval.tasks.len(), 8);
    assert!(eval.skipped.is_empty());
    assert_eq!(
        train
            .skipped
            .iter()
            .map(|s| s.id.as_str())
            .collect::<Vec<_>>(),
        ["liverpool-ion-switching"]
    );
    // The README's counts are the metadata data_type counts.
    let meta = |l: &mappa_env::tabular::LoadedTasks, k: TaskKind| {
        count(&l.tasks, |t| t.metadata_kind == k)
            + l.skipped.iter().filter(|s| s.metadata_kind == k).count()
    };
    assert_eq!(meta(&train, TaskKind::Classification), 30);
    assert_eq!(meta(&train, TaskKind::Regression), 34);
    assert_eq!(meta(&eval, TaskKind::Classification), 4);
    assert_eq!(meta(&eval, TaskKind::Regression), 4);
    // The decided kinds follow the cleaned prompts: string multi-class targets
    // that the metadata calls regression are classification.
    let s4e2 = eval
        .tasks
        .iter()
        .find(|t| t.id == "playground-series-s4e2")
        .unwrap();
    assert_eq!(s4e2.kind, TaskKind::Classification);
    assert_eq!(s4e2.metadata_kind, TaskKind::Regression);
    assert_eq!(s4e2.metric, Metric::Accuracy);
    assert_eq!(s4e2.target_column(), Some("NObeyesdad"));
    assert_eq!(
        count(&eval.tasks, |t| t.kind == TaskKind::Classification),
        6
    );
    assert_eq!(count(&eval.tasks, TabularTask::metadata_disagrees), 2);
    assert_eq!(count(&train.tasks, TabularTask::metadata_disagrees), 4);
    assert_eq!(count(&train.tasks, |t| t.kind == TaskKind::Extraction), 1);
    // Paths resolve against the root; the answer file is inside answer_dir.
    let titanic = train
        .tasks
        .iter()
        .find(|t| t.id == "spaceship-titanic")
        .unwrap();
    assert_eq!(
        titanic.train_csv,
        root.join("data/DSBench/data/data_resplit/spaceship-titanic/train.csv")
    );
    assert_eq!(
        titanic.answer_csv,
        root.join("data/DSBench/data/answers/spaceship-titanic/test_answer.csv")
    );
    assert_eq!(titanic.id_column, "PassengerId");
    assert!(!titanic.cleaned_prompt.is_empty() && !titanic.raw_prompt.is_empty());
    let err = titanic.check_files().unwrap_err().to_string();
    assert!(err.contains("spaceship-titanic/train.csv"), "{err}");
    assert!(err.contains("test_answer.csv"), "{err}");
    // Metrics parsed.
    let all: Vec<&TabularTask> = train.tasks.iter().chain(&eval.tasks).collect();
    assert_eq!(
        all.iter().filter(|t| t.metric == Metric::RocAuc).count(),
        24
    );
    assert_eq!(all.iter().filter(|t| t.metric == Metric::Rmsle).count(), 10);
    let multi = all.iter().filter(|t| t.target_column().is_none()).count();
    assert_eq!(multi, 9);
}

#[test]
fn unknown_metric_names_task_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("t.jsonl");
    let cl = dir.path().join("c.json");
    std::fs::write(
        &jsonl,
        r#"{"prompt":"p","answer":null,"metadata":{"task_id":"foo","task_type":"data_modeling","data_type":"classification","train_file":"./a/train.csv","test_file":"./a/test.csv","answer_dir":"./ans/a"}}"#,
    )
    .unwrap();
    let write_cleaned = |metric: &str, task_type: &str| {
        std::fs::write(
            &cl,
            format!(
                r#"{{"foo":{{"cleaned_prompt":"c","metric":"{metric}","task_type":"{task_type}","target_column":"y","id_column":"id"}}}}"#
            ),
        )
        .unwrap();
    };
    write_cleaned("brier", "classification");
    let e = load_tasks(&jsonl, &cl, dir.path()).unwrap_err().to_string();
    assert!(e.contains("foo") && e.contains("brier"), "{e}");
    write_cleaned("rmse", "classification");
    let e = load_tasks(&jsonl, &cl, dir.path()).unwrap_err().to_string();
    assert!(e.contains("contradicts"), "{e}");
    write_cleaned("accuracy", "classification");
    let l = load_tasks(&jsonl, &cl, dir.path()).unwrap();
    assert_eq!(
        l.tasks[0].answer_csv,
        dir.path().join("ans/a/test_answer.csv")
    );
}

/// A hand-made task with the given answer CSV text.
fn hand_task(dir: &Path, kind: TaskKind, metric: Metric, answer: &str) -> TabularTask {
    let answer_csv = dir.join("answers/hand/test_answer.csv");
    std::fs::create_dir_all(answer_csv.parent().unwrap()).unwrap();
    std::fs::write(&answer_csv, answer).unwrap();
    TabularTask {
        id: "hand".into(),
        kind,
        metadata_kind: kind,
        metric,
        target_columns: vec!["y".into()],
        id_column: "id".into(),
        cleaned_prompt: String::new(),
        raw_prompt: String::new(),
        url: None,
        train_csv: dir.join("hand/train.csv"),
        test_csv: dir.join("hand/test.csv"),
        answer_csv,
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn close(a: Option<f64>, b: f64) -> bool {
    a.is_some_and(|a| (a - b).abs() < 1e-9)
}

#[test]
fn binary_scores_hand_computed_and_joined_by_id() {
    let dir = tempfile::tempdir().unwrap();
    let task = hand_task(
        dir.path(),
        TaskKind::Classification,
        Metric::RocAuc,
        "id,y\n10,1\n20,1\n30,0\n40,0\n50,1\n",
    );
    // Probabilities, shuffled rows, an extra id, the prediction column named
    // differently (second column used).
    let sub = write(
        dir.path(),
        "s.csv",
        "id,prob\n50,0.9\n30,0.7\n99,0.5\n10,0.6\n40,0.2\n20,0.3\n",
    );
    let s = score_submission(&task, &sub).unwrap();
    assert_eq!(s.extra_ids, 1);
    assert_eq!(s.positive_label.as_deref(), Some("1"));
    assert_eq!(s.probabilities, Some(true));
    // Hard labels at 0.5: 10->1 ok, 20->0 wrong, 30->1 wrong, 40->0 ok, 50->1 ok.
    assert!(close(s.accuracy, 0.6));
    assert!(close(s.f1, 4.0 / 6.0)); // tp 2, fp 1, fn 1
                                     // Positives {0.6,0.3,0.9} vs negatives {0.7,0.2}: wins 1+1+2 = 4 of 6.
    assert!(close(s.roc_auc, 4.0 / 6.0));
    assert!(close(s.official, 4.0 / 6.0));
    // The same predictions in answer order score the same.
    let ordered = write(
        dir.path(),
        "o.csv",
        "id,y\n10,0.6\n20,0.3\n30,0.7\n40,0.2\n50,0.9\n",
    );
    let o = score_submission(&task, &ordered).unwrap();
    assert_eq!(o.accuracy, s.accuracy);
    assert_eq!(o.roc_auc, s.roc_auc);
    assert_eq!(o.f1, s.f1);
    // Hard labels, written as floats.
    let hard = write(
        dir.path(),
        "h.csv",
        "id,y\n10,1.0\n20,0.0\n30,1.0\n40,0.0\n50,1.0\n",
    );
    let h = score_submission(&task, &hard).unwrap();
    assert!(close(h.accuracy, 0.6));
    // Hard AUC: positives {1,0,1}, negatives {1,0}: 2*(1 + 0.5) + (0.5 + 0) = 3.5 / 6.
    assert!(close(h.roc_auc, 3.5 / 6.0));
}

#[test]
fn string_labels_and_multiclass() {
    let dir = tempfile::tempdir().unwrap();
    let task = hand_task(
        dir.path(),
        TaskKind::Classification,
        Metric::Accuracy,
        "id,y\na,True\nb,False\nc,True\nd,False\n",
    );
    let sub = write(
        dir.path(),
        "s.csv",
        "id,y\nd,false\nc,TRUE\nb,True\na,True\n",
    );
    let s = score_submission(&task, &sub).unwrap();
    assert_eq!(s.positive_label.as_deref(), Some("True"));
    assert_eq!(s.probabilities, Some(false));
    assert!(close(s.accuracy, 0.75));
    assert!(close(s.official, 0.75));
    assert!(close(s.f1, 0.8)); // tp 2, fp 1, fn 0

    let task = hand_task(
        dir.path(),
        TaskKind::Classification,
        Metric::Accuracy,
        "id,y\n1,cat\n2,dog\n3,dog\n4,bird\n5,cat\n",
    );
    let sub = write(
        dir.path(),
        "m.csv",
        "id,y\n5,cat\n4,cat\n3,dog\n2,bird\n1,cat\n",
    );
    let s = score_submission(&task, &sub).unwrap();
    assert_eq!(s.n_classes, Some(3));
    assert_eq!(s.roc_auc, None);
    assert!(close(s.accuracy, 0.6));
    // cat: tp2 fp1 -> 0.8 (w .4); dog: tp1 fn1 -> 2/3 (w .4); bird: tp0 fp1 fn1 -> 0 (w .2).
    assert!(close(s.f1, 0.4 * 0.8 + 0.4 * 2.0 / 3.0));
}

#[test]
fn regression_scores_hand_computed() {
    let dir = tempfile::tempdir().unwrap();
    let task = hand_task(
        dir.path(),
        TaskKind::Regression,
        Metric::Rmse,
        "id,y\n1,1\n2,2\n3,3\n4,4\n5,5\n",
    );
    let sub = write(dir.path(), "s.csv", "y,id\n3,3\n1,1\n4,2\n5,5\n2,4\n");
    let s = score_submission(&task, &sub).unwrap();
    // errors 0, 2, 0, -2, 0 -> rmse sqrt(8/5), mae 0.8, range 4.
    assert!(close(s.rmse, (8.0f64 / 5.0).sqrt()));
    assert!(close(s.mae, 0.8));
    assert!(close(s.rmse_pct_range, 100.0 * (8.0f64 / 5.0).sqrt() / 4.0));
    assert!(close(s.official, (8.0f64 / 5.0).sqrt()));
    let e = (3f64.ln() - 5f64.ln()).powi(2) + (5f64.ln() - 3f64.ln()).powi(2);
    assert!(close(s.rmsle, (e / 5.0).sqrt()));
    // Negative predictions: RMSLE is None, or an error under an RMSLE metric.
    let neg = write(dir.path(), "n.csv", "id,y\n1,-1\n2,2\n3,3\n4,4\n5,5\n");
    assert_eq!(score_submission(&task, &neg).unwrap().rmsle, None);
    let mut rmsle_task = task.clone();
    rmsle_task.metric = Metric::Rmsle;
    let e = score_submission(&rmsle_task, &neg).unwrap_err().to_string();
    assert!(
        e.contains("n.csv") && e.contains("line 2") && e.contains("-1"),
        "{e}"
    );
}

#[test]
fn errors_name_file_and_culprit() {
    let dir = tempfile::tempdir().unwrap();
    let task = hand_task(
        dir.path(),
        TaskKind::Regression,
        Metric::Rmse,
        "id,y\n1,1\n2,2\n3,3\n4,4\n5,5\n6,6\n7,7\n",
    );
    let err = |name: &str, text: &str| {
        let p = write(dir.path(), name, text);
        score_submission(&task, &p).unwrap_err().to_string()
    };
    let e = err("missing.csv", "id,y\n1,1\n2,2\n");
    assert!(
        e.contains("missing.csv") && e.contains("5 answer ids missing"),
        "{e}"
    );
    assert!(e.contains("3, 4, 5, 6, 7"), "{e}");
    let e = err("dup.csv", "id,y\n1,1\n2,2\n1,3\n");
    assert!(
        e.contains("dup.csv") && e.contains("duplicate id `1`") && e.contains("lines 2 and 4"),
        "{e}"
    );
    let e = err("nocol.csv", "row,y\n1,1\n");
    assert!(
        e.contains("nocol.csv") && e.contains("missing column `id`"),
        "{e}"
    );
    let e = err("onecol.csv", "id\n1\n");
    assert!(
        e.contains("onecol.csv") && e.contains("missing column `y`"),
        "{e}"
    );
    let e = err("bad.csv", "id,y\n1,1\n2,2\n3,abc\n4,4\n5,5\n6,6\n7,7\n");
    assert!(
        e.contains("bad.csv") && e.contains("line 4") && e.contains("`y`") && e.contains("`abc`"),
        "{e}"
    );
    let e = err("blank.csv", "id,y\n1,1\n2,\n3,3\n4,4\n5,5\n6,6\n7,7\n");
    assert!(e.contains("blank.csv") && e.contains("line 3"), "{e}");
    let e = err("ragged.csv", "id,y\n1,1,9\n");
    assert!(
        e.contains("ragged.csv") && e.contains("malformed CSV"),
        "{e}"
    );
    // Answer-file problems.
    let dup = hand_task(
        dir.path(),
        TaskKind::Regression,
        Metric::Rmse,
        "id,y\n1,1\n1,2\n",
    );
    let sub = write(dir.path(), "ok.csv", "id,y\n1,1\n");
    let e = score_submission(&dup, &sub).unwrap_err().to_string();
    assert!(
        e.contains("test_answer.csv") && e.contains("duplicate id"),
        "{e}"
    );
    let mut multi = dup.clone();
    multi.target_columns = vec!["a".into(), "b".into()];
    let e = score_submission(&multi, &sub).unwrap_err().to_string();
    assert!(e.contains("hand") && e.contains("2 target columns"), "{e}");
}

#[test]
fn fair_summary_counts_failures_at_fallbacks() {
    let dir = tempfile::tempdir().unwrap();
    let cls = hand_task(
        dir.path(),
        TaskKind::Classification,
        Metric::RocAuc,
        "id,y\n1,1\n2,0\n3,1\n4,0\n",
    );
    let perfect = write(dir.path(), "p.csv", "id,y\n1,0.9\n2,0.1\n3,0.8\n4,0.2\n");
    let wrong_ids = write(dir.path(), "w.csv", "id,y\n7,1\n");
    let ok = evaluate(&cls, Some(&perfect)).unwrap();
    let failed = evaluate(&cls, Some(&wrong_ids)).unwrap();
    let absent = evaluate(&cls, None).unwrap();
    assert!(ok.success && !failed.success && !absent.success);
    assert!(failed.failure.as_deref().unwrap().contains("w.csv"));
    let reg_dir = tempfile::tempdir().unwrap();
    let reg = hand_task(
        reg_dir.path(),
        TaskKind::Regression,
        Metric::Rmse,
        "id,y\n1,0\n2,10\n",
    );
    let r = write(reg_dir.path(), "r.csv", "id,y\n1,1\n2,9\n");
    let reg_ok = evaluate(&reg, Some(&r)).unwrap();
    let reg_fail = evaluate(&reg, Some(&reg_dir.path().join("nothing.csv"))).unwrap();
    let f = FairSummary::from_outcomes(&[ok, failed, absent, reg_ok, reg_fail]);
    assert_eq!((f.n, f.successes), (5, 2));
    assert!((f.success_rate - 0.4).abs() < 1e-12);
    assert!(close(f.accuracy, 1.0));
    assert!(close(f.fair_accuracy, (1.0 + 0.5 + 0.5) / 3.0));
    assert!(close(f.fair_f1, 1.0 / 3.0));
    assert!(close(f.fair_roc_auc, 2.0 / 3.0));
    assert!(close(f.rmse_pct_range, 10.0));
    assert!(close(f.fair_rmse_pct_range, 55.0));
}

fn specs() -> Vec<TaskSpec> {
    let spec = |id: &str, kind, noise| TaskSpec {
        id: id.into(),
        kind,
        n_train: 400,
        n_test: 2000,
        n_features: 5,
        noise,
    };
    vec![
        spec("gen-binary", SpecKind::Binary, 0.1),
        spec("gen-multi", SpecKind::Multiclass { classes: 4 }, 0.2),
        spec("gen-reg", SpecKind::Regression, 0.5),
    ]
}

/// Reads test.csv and writes the noiseless model's predictions, in reverse
/// order (scoring joins by id).
fn oracle_submission(g: &mappa_env::tabular::GeneratedTask, out: &Path) {
    let text = std::fs::read_to_string(&g.task.test_csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col: HashMap<&str, usize> = header.iter().enumerate().map(|(i, h)| (*h, i)).collect();
    let mut rows = vec!["row_id,target".to_string()];
    for line in lines {
        let cells: Vec<&str> = line.split(',').collect();
        let x: Vec<f64> = (0..g.spec.n_features)
            .map(|j| cells[col[format!("f{j}").as_str()]].parse().unwrap())
            .collect();
        let pred = g.model.predict(&x, cells[col["color"]]).unwrap();
        rows.push(format!("{},{pred}", cells[0]));
    }
    rows[1..].reverse();
    std::fs::write(out, rows.join("\n") + "\n").unwrap();
}

#[test]
fn generator_is_deterministic_and_oracle_reaches_optimum() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    for spec in specs() {
        let ga = generate_task(a.path(), &spec, 7).unwrap();
        let gb = generate_task(b.path(), &spec, 7).unwrap();
        let read = |p: &Path| std::fs::read(p).unwrap();
        for (pa, pb) in [
            (&ga.task.train_csv, &gb.task.train_csv),
            (&ga.task.test_csv, &gb.task.test_csv),
            (&ga.task.answer_csv, &gb.task.answer_csv),
        ] {
            assert_eq!(read(pa), read(pb), "{}", pa.display());
        }
        assert_eq!(ga.model, gb.model);
        ga.task.check_files().unwrap();
        let sample = a.path().join(&spec.id).join("sample_submission.csv");
        assert!(sample.is_file() && a.path().join(&spec.id).join("prompt.txt").is_file());
        let train = std::fs::read_to_string(&ga.task.train_csv).unwrap();
        assert!(train
            .lines()
            .skip(1)
            .any(|l| l.contains(",,") || l.ends_with(',')));

        // Oracle reaches the stated optimum; a constant prediction is worse.
        let oracle = a.path().join(format!("{}-oracle.csv", spec.id));
        oracle_submission(&ga, &oracle);
        let s = score_submission(&ga.task, &oracle).unwrap();
        let constant = score_submission(&ga.task, &sample).unwrap();
        let (got, base) = (s.official.unwrap(), constant.official.unwrap());
        match spec.kind {
            SpecKind::Regression => {
                assert!(
                    (got - ga.optimal_score).abs() < 0.05,
                    "{got} vs {}",
                    ga.optimal_score
                );
                assert!(base > 2.0 * got, "constant {base} vs oracle {got}");
            }
            _ => {
                assert!(
                    (got - ga.optimal_score).abs() < 0.03,
                    "{got} vs {}",
                    ga.optimal_score
                );
                assert!(base < got - 0.2, "constant {base} vs oracle {got}");
            }
        }
    }
    // A different seed gives different data.
    let c = tempfile::tempdir().unwrap();
    let g7 = generate_task(c.path(), &specs()[2], 8).unwrap();
    let ga = std::fs::read(a.path().join("gen-reg/train.csv")).unwrap();
    assert_ne!(std::fs::read(&g7.task.train_csv).unwrap(), ga);
}

#[test]
fn generated_suite_round_trips_through_the_loader() {
    let dir = tempfile::tempdir().unwrap();
    let tasks: Vec<TabularTask> = specs()
        .iter()
        .map(|s| generate_task(dir.path(), s, 3).unwrap().task)
        .collect();
    let (jsonl, cl) = write_index(dir.path(), &tasks).unwrap();
    let loaded = load_tasks(&jsonl, &cl, dir.path()).unwrap();
    assert!(loaded.skipped.is_empty());
    assert_eq!(loaded.tasks, tasks);
}
