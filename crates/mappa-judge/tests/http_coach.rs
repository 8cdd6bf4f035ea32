//! The HTTP coach against a real local server: good replies, malformed ones,
//! 429 with Retry-After, 500s, slow replies, truncated JSON, refusals; the
//! record/replay cache; no trace of the API key in any file; and a coach
//! that goes away (the batch stops, or waits for it, as configured).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{action, set_fake_key, FakeServer, FAKE_KEY, KEY_VAR};
use mappa_judge::cache::{CacheMode, CoachCache};
use mappa_judge::llm::{LlmCoach, LlmSettings, OnOutage};
use mappa_judge::openai::{OpenAiBackend, OpenAiConfig};
use mappa_judge::rubric::RubricSet;
use mappa_judge::testing::Reply;
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

/// A coach for the protocol tests: any share of failed requests is
/// accepted (the outage policy has its own tests below).
fn coach(base_url: &str, cache: Option<CoachCache>) -> LlmCoach<OpenAiBackend> {
    let settings = LlmSettings {
        max_failed_fraction: 1.0,
        ..LlmSettings::default()
    };
    coach_with(base_url, cache, settings)
}

fn coach_with(
    base_url: &str,
    cache: Option<CoachCache>,
    settings: LlmSettings,
) -> LlmCoach<OpenAiBackend> {
    let backend = OpenAiBackend::new(endpoint(base_url)).unwrap();
    LlmCoach::new(
        "openai:judge-test",
        backend,
        RubricSet::builtin("mathchat").unwrap(),
        settings,
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

/// A server that answers `PROCESS_SCORE: 8` while `up`, and 503 otherwise;
/// it counts the requests that were answered.
fn switchable_server(up: Arc<AtomicBool>, answered: Arc<AtomicUsize>) -> String {
    mappa_judge::testing::serve(move |_| {
        if up.load(Ordering::SeqCst) {
            answered.fetch_add(1, Ordering::SeqCst);
            Reply::content("Fine.\nPROCESS_SCORE: 8")
        } else {
            Reply::raw(503, "{\"error\": \"down\"}")
        }
    })
}

fn solver_actions(n: usize) -> Vec<mappa_judge::ActionContext> {
    (0..n)
        .map(|i| {
            let mut a = action(&format!("o{i}"), "good", "problem_solver");
            a.output = format!("step {i}");
            a
        })
        .collect()
}

/// With the default `on_outage = "stop"`, a batch whose coach is down stops
/// with an error that says what to do; the answers that came are cached.
#[test]
fn a_batch_without_a_coach_stops_with_a_clear_error() {
    let (up, answered) = (Arc::new(AtomicBool::new(false)), Arc::default());
    let url = switchable_server(up.clone(), answered);
    let dir = tempfile::tempdir().unwrap();
    let cache = CoachCache::open(&dir.path().join("c.sqlite"), CacheMode::ReadWrite).unwrap();
    let coach = coach_with(&url, Some(cache), LlmSettings::default());
    let e = coach.score_batch(&solver_actions(4)).unwrap_err();
    match &e {
        CoachError::Unavailable { failed, total, .. } => assert_eq!((*failed, *total), (4, 4)),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    let message = e.to_string();
    for needle in [
        "did not answer 4 of 4",
        "max_failed_fraction",
        "--resume",
        "HTTP 503",
    ] {
        assert!(message.contains(needle), "{needle:?} not in {message}");
    }
    assert_eq!(
        coach.report().roles.get("problem_solver"),
        None,
        "no action counts as scored"
    );
    // Within the limit, the failures are counted fallbacks.
    let lenient = coach_with(
        &url,
        None,
        LlmSettings {
            max_failed_fraction: 1.0,
            ..LlmSettings::default()
        },
    );
    let scores = lenient.score_batch(&solver_actions(2)).unwrap();
    assert!(scores.iter().all(|s| s.request_failed()));
    let counts = &lenient.report().roles["problem_solver"];
    assert_eq!((counts.fallbacks, counts.request_failures), (2, 2));
}

/// With `on_outage = "wait"`, the batch asks again until the coach is back,
/// and ends as if it had never been away.
#[test]
fn a_waiting_batch_continues_when_the_coach_comes_back() {
    let (up, answered) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let url = switchable_server(up.clone(), answered.clone());
    let settings = LlmSettings {
        on_outage: OnOutage::Wait,
        outage_poll_s: 0.2,
        max_outage_wait_s: 30.0,
        ..LlmSettings::default()
    };
    let coach = coach_with(&url, None, settings.clone());
    let back = {
        let up = up.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(800));
            up.store(true, Ordering::SeqCst);
        })
    };
    let scores = coach.score_batch(&solver_actions(3)).unwrap();
    back.join().unwrap();
    assert!(
        scores.iter().all(|s| !s.fallback && s.score == 8.0),
        "{scores:?}"
    );
    assert_eq!(answered.load(Ordering::SeqCst), 3);
    let counts = &coach.report().roles["problem_solver"];
    assert_eq!(
        (counts.scored, counts.fallbacks, counts.request_failures),
        (3, 0, 0)
    );

    // A coach that stays away past `max_outage_wait_s` stops the batch after all.
    up.store(false, Ordering::SeqCst);
    let impatient = coach_with(
        &url,
        None,
        LlmSettings {
            max_outage_wait_s: 0.5,
            ..settings
        },
    );
    let start = Instant::now();
    match impatient.score_batch(&solver_actions(2)) {
        Err(CoachError::Unavailable { waited_s, .. }) => assert!(waited_s >= 0.2, "{waited_s}"),
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}
