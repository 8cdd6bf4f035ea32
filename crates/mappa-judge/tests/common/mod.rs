//! A fake OpenAI-compatible server on 127.0.0.1 whose behaviour per request
//! is chosen by a scenario word in the action's task text, and action
//! contexts that name those scenarios.

#![allow(dead_code)] // each test binary uses its own part of these helpers

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mappa_judge::testing::{serve, Reply, Request};
use mappa_judge::ActionContext;

/// The fake API key the tests set; no file may contain it.
pub(crate) const FAKE_KEY: &str = "sk-mappa-test-FAKE-KEY-1234567890";
/// The environment variable holding it.
pub(crate) const KEY_VAR: &str = "MAPPA_TEST_COACH_API_KEY";

/// One request the server saw.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub scenario: String,
    pub reprompt: bool,
    pub authorization: Option<String>,
}

/// The running server.
pub(crate) struct FakeServer {
    pub base_url: String,
    pub log: Arc<Mutex<Vec<Seen>>>,
}

impl FakeServer {
    pub(crate) fn start() -> Self {
        let log = Arc::new(Mutex::new(Vec::new()));
        let shared = log.clone();
        let base_url = serve(move |request| respond(request, &shared));
        Self { base_url, log }
    }

    /// Requests seen for a scenario.
    pub(crate) fn count(&self, scenario: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.scenario == scenario)
            .count()
    }

    pub(crate) fn total(&self) -> usize {
        self.log.lock().unwrap().len()
    }
}

fn respond(request: &Request, log: &Mutex<Vec<Seen>>) -> Reply {
    let scenario = request
        .message(1)
        .split_whitespace()
        .find_map(|w| w.strip_prefix("SCENARIO="))
        .unwrap_or("good")
        .to_string();
    let reprompt = request.turns() > 2;
    let attempt = {
        let mut log = log.lock().unwrap();
        log.push(Seen {
            scenario: scenario.clone(),
            reprompt,
            authorization: request.headers.get("authorization").cloned(),
        });
        log.iter().filter(|s| s.scenario == scenario).count()
    };
    match (scenario.as_str(), attempt) {
        ("good", _) => Reply::content("The step is right and clear.\nPROCESS_SCORE: 8"),
        ("verdict", _) => {
            Reply::content("Correct final answer.\nPROCESS_SCORE: 9\nANSWER_CORRECT: 1")
        }
        ("malformed-then-good", _) if !reprompt => Reply::content("I would rate this highly."),
        ("malformed-then-good", _) => Reply::content("Fine.\nPROCESS_SCORE: 6"),
        ("always-malformed", _) => Reply::content("No score from me."),
        ("rate-limited", 1) => {
            Reply::raw(429, "{\"error\": \"slow down\"}").header("Retry-After", "1")
        }
        ("rate-limited", _) => Reply::content("PROCESS_SCORE: 7"),
        ("server-error", _) => Reply::raw(500, "{\"error\": \"boom\"}"),
        ("slow", 1) => Reply::content("PROCESS_SCORE: 1").after(Duration::from_secs(5)),
        ("slow", _) => Reply::content("PROCESS_SCORE: 4"),
        ("truncated", 1) => {
            let full = Reply::content("PROCESS_SCORE: 2");
            Reply::raw(200, &full.body[..40])
        }
        ("truncated", _) => Reply::content("PROCESS_SCORE: 3"),
        ("unauthorized", _) => Reply::raw(401, "{\"error\": \"bad key\"}"),
        (other, _) => panic!("unknown scenario {other}"),
    }
}

/// An action whose task names a scenario.
pub(crate) fn action(id: &str, scenario: &str, role: &str) -> ActionContext {
    ActionContext {
        id: id.into(),
        task: format!("What is 6 * 7? SCENARIO={scenario}"),
        role: role.into(),
        agent_input: "Solve the problem.".into(),
        output: "6 * 7 = 42, so \\boxed{42}".into(),
        tool_observation: None,
        ground_truth: Some("42".into()),
        is_last_agent: role == "verifier",
        ..Default::default()
    }
}

/// Set the fake key once for the whole test binary.
pub(crate) fn set_fake_key() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var(KEY_VAR, FAKE_KEY));
}
