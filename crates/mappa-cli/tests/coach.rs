//! `mappa coach score` as a new user runs it: against a local
//! OpenAI-compatible server, with a scripted coach, and with a local
//! checkpoint as judge; and the coach's page, `docs/coach.md`, run as written.

use std::path::Path;
use std::process::Command;

use mappa_judge::testing::Reply;
use serde_json::Value;

mod common;
use common::*;

/// An OpenAI-compatible endpoint that scores the verifier 9 (answer correct)
/// and every other role 7; returns the base URL.
fn serve() -> String {
    mappa_judge::testing::serve(|request| {
        if request.message(1).contains("Agent being judged: Verifier") {
            Reply::content("Checked and right.\nPROCESS_SCORE: 9\nANSWER_CORRECT: 1")
        } else {
            Reply::content("Reasonable step.\nPROCESS_SCORE: 7")
        }
    })
}

fn actions_file(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("actions.jsonl");
    let solution = r#"{"task_kind": "math", "answer": "42", "checkpoints": ["42"]}"#;
    let lines = [
        format!(
            r#"{{"id": "a1", "task": "What is 6*7?", "role": "problem_solver", "agent_input": "Solve.", "output": "6*7 = 42", "solution": {solution}}}"#
        ),
        format!(
            r#"{{"id": "a2", "task": "What is 6*7?", "role": "verifier", "agent_input": "Check.", "output": "\\boxed{{42}}", "ground_truth": "42", "is_last_agent": true, "solution": {solution}}}"#
        ),
    ];
    std::fs::write(&path, lines.join("\n") + "\n").unwrap();
    path
}

/// A coach file in `dir` judging with the tiny fixture checkpoint: `max_tokens`
/// per reply, `extra` appended to its `[local]` table.
fn local_coach_config(dir: &Path, max_tokens: u32, extra: &str) -> std::path::PathBuf {
    let config = dir.join("coach.toml");
    let checkpoint = workspace().join("fixtures/models/qwen3-tiny");
    std::fs::write(
        &config,
        format!(
            "domain = \"mathchat\"\ncache_mode = \"off\"\n\n[settings]\nmax_tokens = {max_tokens}\n\n\
             [local]\ncheckpoint = \"{}\"\n{extra}",
            checkpoint.display()
        ),
    )
    .unwrap();
    config
}

/// `mappa coach score --config CONFIG --input INPUT`, more arguments to follow.
fn coach_score(config: impl AsRef<Path>, input: impl AsRef<Path>) -> Command {
    let mut cmd = mappa();
    cmd.args(["coach", "score", "--config"])
        .arg(config.as_ref())
        .arg("--input")
        .arg(input.as_ref());
    cmd
}

fn rows(stdout: &[u8]) -> Vec<Value> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn scores_actions_against_a_local_openai_compatible_server() {
    let dir = tempfile::tempdir().unwrap();
    let url = serve();
    let config = dir.path().join("coach.toml");
    std::fs::write(
        &config,
        format!(
            "domain = \"mathchat\"\ncache = \"cache.sqlite\"\n\n[openai]\nbase_url = \"{url}\"\nmodel = \"local-judge\"\n"
        ),
    )
    .unwrap();
    let input = actions_file(dir.path());
    let report = dir.path().join("report.json");
    let out = succeeds(coach_score(&config, &input).arg("--report").arg(&report));
    let scores = rows(&out.stdout);
    assert_eq!(scores.len(), 2);
    assert_eq!(scores[0]["id"], "a1");
    assert_eq!(scores[0]["score"]["score"], 7.0);
    assert_eq!(scores[1]["score"]["score"], 9.0);
    assert_eq!(scores[1]["score"]["answer_correct"], true);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("scored 2 actions with openai:local-judge"),
        "{stderr}"
    );
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(report["usage"]["requests"], 2);
    assert!(
        dir.path().join("cache.sqlite").exists(),
        "the cache path is relative to the config"
    );
}

#[test]
fn scripted_coach_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("coach.toml");
    std::fs::write(&config, "domain = \"mathchat\"\ncache_mode = \"off\"\n\n[scripted]\nview = \"oracle\"\nstrength = \"strong\"\nseed = 3\n")
        .unwrap();
    let input = actions_file(dir.path());
    let out = succeeds(&mut coach_score(&config, &input));
    let scores = rows(&out.stdout);
    for s in &scores {
        assert_eq!(s["score"]["coach"], "scripted-oracle-strong");
        assert!(s["score"]["raw_response"]
            .as_str()
            .unwrap()
            .contains("[scripted coach: oracle, strong]"));
    }
    assert!(
        scores[1]["score"]["score"].as_f64().unwrap() >= 8.5,
        "{scores:?}"
    );
}

#[test]
fn local_checkpoint_as_judge_is_deterministic_and_counts_fallbacks() {
    let dir = tempfile::tempdir().unwrap();
    let config = local_coach_config(dir.path(), 8, "");
    let input = actions_file(dir.path());
    let run = || {
        let out = succeeds(&mut coach_score(&config, &input));
        (
            rows(&out.stdout),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (first, stderr) = run();
    let (second, _) = run();
    assert_eq!(first, second, "greedy decoding repeats exactly");
    // A tiny random model never writes the score line: each action is re-prompted once, then falls back.
    assert!(
        stderr.contains("mean score - over the 0 with a score (fallbacks excluded)"),
        "{stderr}"
    );
    for s in &first {
        assert_eq!(s["score"]["fallback"], true);
        assert_eq!(s["score"]["fallback_reason"], "format");
        assert!(s["score"]["coach"].as_str().unwrap().starts_with("local:"));
    }
    assert!(
        stderr.contains(
            "problem_solver: 1 scored, 1 fallbacks (1 format, 0 request-failed), 1 re-prompts"
        ),
        "{stderr}"
    );
}

#[test]
fn a_reply_prefix_begins_every_local_reply_and_is_parsed_with_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = local_coach_config(dir.path(), 4, "reply_prefix = \"PROCESS_SCORE: 7\\n\"\n");
    let input = actions_file(dir.path());
    let out = succeeds(&mut coach_score(&config, &input));
    let scores = rows(&out.stdout);
    assert!(!scores.is_empty());
    for s in &scores {
        let score = &s["score"];
        assert_eq!(score["score"], 7.0, "{s}");
        assert_eq!(score["fallback"], false, "{s}");
        assert!(
            score["raw_response"]
                .as_str()
                .unwrap()
                .starts_with("PROCESS_SCORE: 7\n"),
            "{s}"
        );
    }
}

#[test]
fn bad_input_lines_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("coach.toml");
    std::fs::write(
        &config,
        "domain = \"mathchat\"\ncache_mode = \"off\"\n[scripted]\nview = \"oracle\"\nstrength = \"weak\"\n",
    )
    .unwrap();
    let input = dir.path().join("actions.jsonl");
    std::fs::write(&input, "{\"task\": \"t\", \"role\": \"verifier\"}\n").unwrap();
    let out = coach_score(&config, &input).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("actions.jsonl:1") && stderr.contains("agent_input"),
        "{stderr}"
    );
    std::fs::write(
        &config,
        "domain = \"mathchat\"\n[scripted]\nview = \"oracle\"\nstrength = \"mighty\"\n",
    )
    .unwrap();
    let out = coach_score(&config, &input).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("coach.toml") && stderr.contains("mighty"),
        "{stderr}"
    );
}

/// A replay that misses stops with an error and leaves the output file as
/// it was (all or nothing), and replaying needs no API key.
#[test]
fn a_failed_replay_leaves_the_previous_output_and_needs_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let url = serve();
    let config = |mode: &str| {
        let path = dir.path().join(format!("coach-{mode}.toml"));
        std::fs::write(
            &path,
            format!(
                "domain = \"mathchat\"\ncache = \"cache.sqlite\"\ncache_mode = \"{mode}\"\n\n[openai]\nbase_url = \"{url}\"\nmodel = \"local-judge\"\napi_key_env = \"MAPPA_TEST_KEY_THAT_IS_NEVER_SET\"\n"
            ),
        )
        .unwrap();
        path
    };
    let input = actions_file(dir.path());
    // Record the first action only (the key is needed to send requests).
    let first = dir.path().join("first.jsonl");
    std::fs::write(
        &first,
        std::fs::read_to_string(&input)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    succeeds(
        coach_score(config("read-write"), &first)
            .env("MAPPA_TEST_KEY_THAT_IS_NEVER_SET", "sk-test"),
    );
    // Replay both, one per batch, into a file that already exists: the
    // second misses, and the file keeps what it held.
    let output = dir.path().join("scores.jsonl");
    std::fs::write(&output, "previous\n").unwrap();
    let stderr = fails(
        coach_score(config("replay"), &input)
            .args(["--batch", "1"])
            .env_remove("MAPPA_TEST_KEY_THAT_IS_NEVER_SET")
            .arg("--output")
            .arg(&output),
    );
    assert!(stderr.contains("replay"), "{stderr}");
    assert!(
        !stderr.contains("is not set"),
        "replay asked for the key: {stderr}"
    );
    assert_eq!(std::fs::read_to_string(&output).unwrap(), "previous\n");
    // The recorded action alone replays, without the key, into the file.
    succeeds(
        coach_score(config("replay"), &first)
            .env_remove("MAPPA_TEST_KEY_THAT_IS_NEVER_SET")
            .arg("--output")
            .arg(&output),
    );
    let text = std::fs::read_to_string(&output).unwrap();
    assert_eq!(rows(text.as_bytes()).len(), 1, "{text}");
    assert_eq!(rows(text.as_bytes())[0]["score"]["cached"], true);
}

/// A coach that cannot be reached stops `coach score` with an error (no
/// output, nothing cached); once it is reachable, the same cache asks it.
/// `--cache-mode replay` then replays the same configuration's cache.
#[test]
fn an_unreachable_coach_stops_and_is_asked_again_later() {
    let dir = tempfile::tempdir().unwrap();
    let config = |url: &str| {
        let path = dir.path().join("coach.toml");
        std::fs::write(
            &path,
            format!(
                "domain = \"mathchat\"\ncache = \"cache.sqlite\"\n\n[openai]\nbase_url = \"{url}\"\n\
                 model = \"local-judge\"\nmax_attempts = 2\ninitial_backoff_s = 0.01\n"
            ),
        )
        .unwrap();
        path
    };
    let input = actions_file(dir.path());
    let output = dir.path().join("scores.jsonl");
    // Nothing listens on port 9.
    let stderr = fails(
        coach_score(config("http://127.0.0.1:9/v1"), &input)
            .arg("--output")
            .arg(&output),
    );
    assert!(stderr.contains("did not answer 2 of 2 actions"), "{stderr}");
    assert!(!output.exists(), "no output from a failed command");

    let url = serve();
    let out = succeeds(&mut coach_score(config(&url), &input));
    let scores = rows(&out.stdout);
    assert_eq!(
        (&scores[0]["score"]["score"], &scores[0]["score"]["cached"]),
        (&Value::from(7.0), &Value::from(false)),
        "asked, not a cached fallback"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("mean score 8.00 over the 2 with a score"),
        "{stderr}"
    );

    let out = succeeds(
        coach_score(config("http://127.0.0.1:9/v1"), &input).args(["--cache-mode", "replay"]),
    );
    assert_eq!(rows(&out.stdout)[1]["score"]["cached"], true);
    assert_eq!(rows(&out.stdout)[1]["score"]["score"], 9.0);
}

/// The coach's page, `docs/coach.md`: its configuration example parses with
/// every `[settings]` key at its default, the example files load, and the
/// scripted example prints what the page shows.
#[test]
fn the_coach_docs_are_true() {
    let section = std::fs::read_to_string(workspace().join("docs/coach.md")).unwrap();
    let toml_block = section
        .split("```toml\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("a toml example");
    let config: mappa_judge::config::CoachConfig = toml::from_str(toml_block).unwrap();
    assert_eq!(
        config.settings,
        mappa_judge::llm::LlmSettings::default(),
        "docs/coach.md shows the defaults"
    );
    for settings_key in [
        "coach_sees_ground_truth",
        "fallback_score",
        "max_failed_fraction",
        "on_outage",
        "max_outage_wait_s",
        "outage_poll_s",
    ] {
        assert!(
            section.contains(&format!("| `{settings_key}` |")),
            "{settings_key} is not in the table"
        );
    }
    for example in ["scripted", "gemini", "local-server"] {
        let path = workspace().join(format!("experiments/coach/{example}.toml"));
        mappa_judge::config::CoachConfig::load(&path).unwrap();
    }
    let out = succeeds(mappa().args([
        "coach",
        "score",
        "--config",
        "experiments/coach/scripted.toml",
        "--input",
        "experiments/coach/actions.jsonl",
    ]));
    let first = String::from_utf8_lossy(&out.stdout);
    let first = first.lines().next().unwrap();
    let shown = section
        .lines()
        .find(|l| l.starts_with("{\"id\":\"t1/problem_solver/0\""))
        .expect("an output line in docs/coach.md");
    let prefix = &shown[..shown.find("\"raw_response\"").unwrap()];
    assert!(
        first.starts_with(prefix),
        "docs/coach.md: {shown}\nactual: {first}"
    );
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        assert!(section.contains(line), "{line:?} is not in docs/coach.md");
    }
}
