//! `mappa grade` as a user runs it: JSON lines in a file or on stdin.

use std::io::Write;
use std::process::Stdio;

use serde_json::Value;

mod common;
use common::*;

fn rows(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn grades_responses_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"gold": "023", "response": "So the total is $\\boxed{23}$."}"#,
            "\n",
            r#"{"gold": 0.5, "response": "We get \\boxed{\\dfrac{1}{2}}"}"#,
            "\n",
            r#"{"gold": "7", "response": "I think the answer is 7."}"#,
            "\n",
        ),
    )
    .unwrap();
    let out = mappa().arg("grade").arg(&input).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let graded = rows(&out.stdout);
    assert_eq!(graded.len(), 3);
    assert_eq!(graded[0]["correct"], true);
    assert_eq!(graded[0]["extracted"], "23");
    assert_eq!(graded[1]["correct"], true);
    // Without --fallbacks, "the answer is 7" is not extracted.
    assert_eq!(graded[2]["correct"], false);
    assert_eq!(graded[2]["extracted"], Value::Null);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("graded 3: 2 correct"), "{stderr}");

    let out = mappa()
        .args(["grade", "--fallbacks"])
        .arg(&input)
        .output()
        .unwrap();
    let rows = rows(&out.stdout);
    assert_eq!(rows[2]["correct"], true);
    assert_eq!(rows[2]["method"], "answer_is");
}

#[test]
fn grades_bare_answers_from_stdin() {
    let mut child = mappa()
        .args(["grade", "--answer"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"{\"gold\": \"12\", \"pred\": \"12.0\"}\n{\"gold\": \"12\", \"pred\": \"12.5\"}\n",
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let graded = rows(&out.stdout);
    assert_eq!(graded[0]["correct"], true);
    assert_eq!(graded[1]["correct"], false);
}

#[test]
fn bad_input_names_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("bad.jsonl");
    std::fs::write(
        &input,
        "{\"gold\": \"1\", \"response\": \"\\\\boxed{1}\"}\n{\"response\": \"x\"}\n",
    )
    .unwrap();
    let out = mappa().arg("grade").arg(&input).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.jsonl:2") && stderr.contains("`gold`"),
        "{stderr}"
    );
}
