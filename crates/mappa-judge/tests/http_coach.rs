//! The HTTP coach against a real local server: good replies, malformed ones,
//! 429 with Retry-After, 500s, slow replies, truncated JSON, refusals; the
//! record/replay cache; and no trace of the API key in any file.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{action, set_fake_key, FakeServer, FAKE_KEY, KEY_VAR};
use mappa_judge::cache::{CacheMode, CoachCache};
use mappa_judge::llm::{LlmCoach, LlmSettings};
use mappa_judge::openai::{OpenAiBackend, OpenAiConfig};
use mappa_judge::rubric::RubricSet;
use mappa_judge::{Coach, CoachError};

fn endpoint(base_url: &str) -> OpenAiConfig {
    set_fake_key();
    OpenAiConfig {
        base_url: base_url.into(),
        model: "judge-test".into(),
        api_key_env: Some(KEY_VAR.into()),
        timeout_s: 2.0,
        max_attempts: 3,
        initial_backoff_s: 0.05,
        max_backoff_s: 2.0,
        requests_per_minute: None,
        usd_per_million_prompt_tokens: 1.0,
        usd_per_million_completion_tokens: 4.0,
        seed: 0,
    }
}

fn coach(base_url: &str, cache: Option<CoachCache>) -> LlmCoach<OpenAiBackend> {
    let backend = OpenAiBackend::new(endpoint(base_url)).unwrap();
    LlmCoach::new(
        "openai:judge-test",
        backend,
        RubricSet::builtin("mathchat").unwrap(),
        LlmSettings::default(),
        cache,
    )
    .unwrap()
}

#[test]
fn every_server_behaviour_has_the_right_outcome() {
    let server = FakeServer::start();
    let coach = coach(&server.base_url, None);
    let scenarios = [
        "good",
        "malformed-then-good",
        "always-malformed",
        "rate-limited",
        "server-error",
        "slow",
        "truncated",
    ];
    let actions: Vec<_> = scenarios
        .iter()
        .enumerate()
        .map(|(i, s)| action(&format!("a{i}"), s, "problem_solver"))
        .collect();
    let start = Instant::now();
    let scores = coach.score_batch(&actions).unwrap();
    let elapsed = start.elapsed();
    let by = |s: &str| &scores[scenarios.iter().position(|x| *x == s).unwrap()];

    assert_eq!((by("good").score, by("good").fallback), (8.0, false));
    assert_eq!(by("good").rationale, "The step is right and clear.");
    assert_eq!(server.count("good"), 1);

    assert_eq!(
        (
            by("malformed-then-good").score,
            by("malformed-then-good").fallback
        ),
        (6.0, false)
    );
    assert_eq!(
        server.count("malformed-then-good"),
        2,
        "exactly one re-prompt"
    );

    let bad = by("always-malformed");
    assert!(bad.fallback && bad.score == 5.0, "{bad:?}");
    assert_eq!(bad.fallback_reason.as_deref(), Some("format"));
    assert_eq!(
        server.count("always-malformed"),
        2,
        "one re-prompt, then the fallback"
    );

    assert_eq!(by("rate-limited").score, 7.0);
    assert_eq!(server.count("rate-limited"), 2);

    let failed = by("server-error");
    assert!(failed.fallback, "{failed:?}");
    assert!(failed
        .fallback_reason
        .as_deref()
        .unwrap()
        .starts_with("request-failed after 3 attempts: HTTP 500"));
    assert_eq!(server.count("server-error"), 3, "bounded attempts");

    assert_eq!(
        by("slow").score,
        4.0,
        "the slow reply timed out and the retry succeeded"
    );
    assert_eq!(server.count("slow"), 2);

    assert_eq!(by("truncated").score, 3.0, "the truncated body was retried");
    assert_eq!(server.count("truncated"), 2);

    // Retry-After: 1 held the rate-limited action for a second; everything
    // ran concurrently, so the batch is bounded by the slowest chain.
    assert!(elapsed >= Duration::from_millis(950), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(12), "{elapsed:?}");

    let report = coach.report();
    let solver = &report.roles["problem_solver"];
    assert_eq!(solver.scored, 7);
    assert_eq!(solver.fallbacks, 2);
    assert_eq!(report.total_fallbacks(), 2);
    assert_eq!(report.usage.requests, server.total() as u64);
    assert!(report.usage.prompt_tokens > 0 && report.usage.estimated_cost_usd > 0.0);
    for seen in server.log.lock().unwrap().iter() {
        assert_eq!(
            seen.authorization.as_deref(),
            Some(format!("Bearer {FAKE_KEY}").as_str())
        );
    }
}

#[test]
fn the_last_agent_reports_answer_correct_and_refusals_stop_the_run() {
    let server = FakeServer::start();
    let coach = coach(&server.base_url, None);
    let verdict = coach
        .score_one(&action("v", "verdict", "verifier"))
        .unwrap();
    assert_eq!(verdict.answer_correct, Some(true));
    assert_eq!(verdict.score, 9.0);
    // A verifier reply without ANSWER_CORRECT is a format failure: one re-prompt.
    let no_verdict = coach.score_one(&action("w", "good", "verifier")).unwrap();
    assert_eq!(no_verdict.score, 8.0);
    assert_eq!(server.count("good"), 2);
    match coach.score_one(&action("u", "unauthorized", "problem_solver")) {
        Err(CoachError::Refused(message)) => assert!(message.contains("401"), "{message}"),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(server.count("unauthorized"), 1, "a 401 is not retried");
}

fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            hits.extend(files_containing(&path, needle));
        } else if std::fs::read(&path)
            .unwrap()
            .windows(needle.len())
            .any(|w| w == needle)
        {
            hits.push(path.display().to_string());
        }
    }
    hits
}

#[test]
fn replay_reproduces_a_recorded_batch_without_network_and_no_file_holds_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cache_path = dir.path().join("coach-cache.sqlite");
    let server = FakeServer::start();
    let actions: Vec<_> = [
        "good",
        "malformed-then-good",
        "always-malformed",
        "server-error",
    ]
    .iter()
    .enumerate()
    .map(|(i, s)| {
        action(
            &format!("r{i}"),
            s,
            if i == 0 { "verifier" } else { "code_executor" },
        )
    })
    .collect();
    let recorded = {
        let cache = CoachCache::open(&cache_path, CacheMode::ReadWrite).unwrap();
        let coach = coach(&server.base_url, Some(cache));
        let scores = coach.score_batch(&actions).unwrap();
        let report = serde_json::to_string_pretty(&coach.report()).unwrap();
        std::fs::write(dir.path().join("report.json"), report).unwrap();
        std::fs::write(
            dir.path().join("scores.json"),
            serde_json::to_string_pretty(&scores).unwrap(),
        )
        .unwrap();
        std::fs::write(
            dir.path().join("debug.txt"),
            format!("{coach:?}", coach = coach.backend()),
        )
        .unwrap();
        scores
    };
    let requests = server.total();

    // Replay against an address where nothing listens: every score must come
    // from the cache. The failed request (`server-error`) was never the
    // coach's answer, so it was not recorded: it misses.
    let cache = CoachCache::open(&cache_path, CacheMode::Replay).unwrap();
    let replayer = coach("http://127.0.0.1:9/v1", Some(cache));
    let answered = &actions[..3];
    let replayed = replayer.score_batch(answered).unwrap();
    assert_eq!(server.total(), requests);
    for (a, b) in recorded.iter().zip(&replayed) {
        assert!(b.cached);
        assert_eq!(
            (a.score, a.fallback, &a.raw_response, &a.rationale),
            (b.score, b.fallback, &b.raw_response, &b.rationale)
        );
    }
    assert_eq!(replayer.report().roles["code_executor"].cache_hits, 2);
    assert_eq!(
        replayer.report().total_fallbacks(),
        1,
        "the malformed answer (the coach's) replays as a fallback"
    );
    assert!(recorded[3].request_failed());
    assert!(matches!(
        replayer.score_one(&actions[3]),
        Err(CoachError::ReplayMiss { .. })
    ));

    let mut unseen = action("r9", "good", "problem_solver");
    unseen.output = "a different output".into();
    match replayer.score_one(&unseen) {
        Err(CoachError::ReplayMiss { action, key, .. }) => {
            assert_eq!(action, "r9");
            assert_eq!(key.len(), 64);
        }
        other => panic!("expected a replay miss, got {other:?}"),
    }
    drop(replayer);

    let leaks = files_containing(dir.path(), FAKE_KEY.as_bytes());
    assert!(leaks.is_empty(), "the API key leaked into {leaks:?}");
    assert!(
        !files_containing(dir.path(), b"PROCESS_SCORE").is_empty(),
        "the search can find what is there"
    );
}

/// A coach that could not be reached leaves nothing in the cache: the next
/// run asks again instead of replaying the fallback as the coach's score.
#[test]
fn failed_requests_are_not_cached_and_are_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let cache_path = dir.path().join("coach-cache.sqlite");
    let server = FakeServer::start();
    let actions = vec![
        action("f0", "good", "problem_solver"),
        action("f1", "server-error", "problem_solver"),
    ];
    for run in 1..=2 {
        let cache = CoachCache::open(&cache_path, CacheMode::ReadWrite).unwrap();
        let scores = coach(&server.base_url, Some(cache))
            .score_batch(&actions)
            .unwrap();
        assert_eq!(scores[0].cached, run == 2, "the answer is cached");
        assert!(scores[1].request_failed() && !scores[1].cached);
        assert_eq!(server.count("good"), 1, "run {run}");
        assert_eq!(
            server.count("server-error"),
            3 * run,
            "run {run}: asked again"
        );
    }
}

/// Replaying needs no API key: no request is sent.
#[test]
fn replay_needs_no_api_key() {
    let dir = tempfile::tempdir().unwrap();
    let cache_path = dir.path().join("coach-cache.sqlite");
    drop(CoachCache::open(&cache_path, CacheMode::ReadWrite).unwrap());
    let mut config: mappa_judge::config::CoachConfig = toml::from_str(&format!(
        "domain = \"mathchat\"\ncache = {cache_path:?}\ncache_mode = \"replay\"\n\
         [openai]\nbase_url = \"http://127.0.0.1:9/v1\"\nmodel = \"m\"\n\
         api_key_env = \"MAPPA_TEST_KEY_THAT_IS_NEVER_SET\"\n"
    ))
    .unwrap();
    assert!(config.build().is_ok(), "replay built without the key");
    config.cache_mode = CacheMode::ReadWrite;
    let e = config.build().err().unwrap().to_string();
    assert!(e.contains("MAPPA_TEST_KEY_THAT_IS_NEVER_SET"), "{e}");
}

#[test]
fn requests_per_minute_spaces_request_starts() {
    let server = FakeServer::start();
    let mut config = endpoint(&server.base_url);
    config.requests_per_minute = Some(600.0); // one start per 100 ms
    let backend = OpenAiBackend::new(config).unwrap();
    let coach = LlmCoach::new(
        "openai:judge-test",
        backend,
        RubricSet::builtin("mathchat").unwrap(),
        LlmSettings::default(),
        None,
    )
    .unwrap();
    let actions: Vec<_> = (0..5)
        .map(|i| action(&format!("q{i}"), "good", "problem_solver"))
        .collect();
    let start = Instant::now();
    coach.score_batch(&actions).unwrap();
    let elapsed = start.elapsed();
    assert_eq!(server.count("good"), 5);
    // Five starts 100 ms apart, even with eight workers free.
    assert!(elapsed >= Duration::from_millis(390), "{elapsed:?}");
}
